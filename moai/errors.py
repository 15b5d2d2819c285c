"""Errors a user can act on. Each message names the file, row or setting at fault."""


class DataError(ValueError):
    """The input data cannot be used as configured (no files, bad rows, nothing left, ...)."""


class TokenizerError(ValueError):
    """The tokenizer cannot be used (not fast, no EOS, no tokenizer.json, ...)."""

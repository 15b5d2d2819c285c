"""Errors a user can act on. Each message names the file, row or setting at fault, and the fix.

Every one derives from `MoaiError`: the CLI turns that one class into a one-line
`moai: error: ...` (a traceback is reserved for moai's own bugs). They are also `ValueError`s
(a `RuntimeError` for a failed training launch), as callers caught before there was a base.
"""


class MoaiError(Exception):
    """A mistake or fault a user can act on; the message says what and how."""


class ConfigError(MoaiError, ValueError):
    """A config file, preset, setting or environment variable is wrong; the message names it."""


class DataError(MoaiError, ValueError):
    """The input data cannot be used as configured (no files, bad rows, nothing left, ...)."""


class TokenizerError(MoaiError, ValueError):
    """The tokenizer cannot be used (not fast, no EOS, no tokenizer.json, ...)."""


class CacheError(MoaiError, ValueError):
    """A stage output on disk does not match what was written: a file truncated, altered or gone."""

    @classmethod
    def damaged(cls, folder, problem: str, what: str = "cache entry") -> "CacheError":
        """The one-line error for a damaged output folder: what is wrong, and the fix (rebuild it)."""
        import shlex

        return cls(
            f"{what} {folder} is damaged: {problem}; remove the folder (rm -rf {shlex.quote(str(folder))}) "
            "and rerun: it will be rebuilt"
        )

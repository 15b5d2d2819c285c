"""Errors a user can act on. Each message names the file, row or setting at fault."""


class DataError(ValueError):
    """The input data cannot be used as configured (no files, bad rows, nothing left, ...)."""


class TokenizerError(ValueError):
    """The tokenizer cannot be used (not fast, no EOS, no tokenizer.json, ...)."""


class CacheError(ValueError):
    """A stage output on disk does not match what was written: a file truncated, altered or gone."""

    @classmethod
    def damaged(cls, folder, problem: str, what: str = "cache entry") -> "CacheError":
        """The one-line error for a damaged output folder: what is wrong, and the fix (rebuild it)."""
        import shlex

        return cls(f"{what} {folder} is damaged: {problem}; remove the folder (rm -rf {shlex.quote(str(folder))}) "
                   "and rerun: it will be rebuilt")

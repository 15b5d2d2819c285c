"""The encoders the tokenize stage runs, and exact encoding of very large documents.

An encoder is `encode(texts, add_special_tokens) -> list of id lists` and must give the ids
transformers gives: `tokenizer(text)["input_ids"]` (the engines in `engines` each have one).

Very large documents. Encoding one string holds per-token state for the whole string (a 50 MB
document peaked at 6.6 GB in `tokenizers`), so a document over `LARGE_DOCUMENT_BYTES` is cut
into pieces of about `PIECE_BYTES` and encoded piece by piece. A cut goes only where the
tokenization of the two sides cannot interact:

- after a lone "\\n" between a non-whitespace character and a letter or digit ("x\\ny"), else
- before a lone space between a non-whitespace character and a letter or digit ("x y").

Every regex pre-tokenizer in use (GPT-2, Llama 3, Qwen, Tekken) ends a pre-token there, and
SentencePiece-style BPE never merges across a newline. The letter or digit matters: Tekken's
pattern glues punctuation, newlines and a following "/" into one pre-token (" */\\n/"), so a cut
before punctuation is not safe. A piece after a cut is encoded with the
"\\n" in front of it (so a "prepend ▁ to the first word" rule or a leading-space rule sees what it
would see in the whole text) and the ids of that "\\n" are removed. The rule is checked for each
tokenizer on real text before it is used (`check_cut_rule`): where it does not hold, large
documents are encoded whole and the report says so. A stretch of `MAX_SEARCH_PIECES` pieces with
no such place at all (one giant line without spaces) is cut anyway: those cuts are counted in
the report as `forced_cuts` (ids near them may differ from transformers) and logged.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np

log = logging.getLogger(__name__)

Encode = Callable[[list[str], bool], list[list[int]]]

LARGE_DOCUMENT_BYTES = 8 << 20
PIECE_BYTES = 1 << 20
MAX_SEARCH_PIECES = 8
CONTEXT = "\n"


def affixes(encode: Encode) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text (BOS, EOS, ...)."""
    bare = encode(["a"], False)[0]
    full = encode(["a"], True)[0]
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None)
    if at is None:
        raise ValueError("the post-processor changes the text's ids")
    return full[:at], full[at + len(bare) :]


def _ascii_graphic(b: int) -> bool:
    return 0x21 <= b <= 0x7E


def _char_before(arr: np.ndarray, i: int) -> str:
    """The character that ends just before byte i (UTF-8)."""
    j = i - 1
    while j > 0 and i - j < 4 and arr[j] & 0xC0 == 0x80:
        j -= 1
    return arr[max(j, 0) : i].tobytes().decode("utf-8", errors="replace")


def _char_at(arr: np.ndarray, i: int) -> str:
    lead = int(arr[i])
    n = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return arr[i : i + n].tobytes().decode("utf-8", errors="replace")


def _solid(ch: str) -> bool:
    """Not whitespace of any Unicode kind, not a control character, not broken bytes."""
    return len(ch) == 1 and not ch.isspace() and ch.isprintable() and ch != "\ufffd"


def _word(ch: str) -> bool:
    """A letter or a digit (what no pre-tokenizer glues to the punctuation or space before it)."""
    return len(ch) == 1 and ch.isalnum()


def _is_cut(arr: np.ndarray, i: int) -> bool:
    """May the text be cut before byte i? After "x\\n" or before " " in "x y" (see module doc)."""
    if i < 1 or i >= len(arr) - 1:
        return False
    if arr[i - 1] == 0x0A and i >= 2:
        lo, hi = i - 2, i  # the characters around the newline
    elif arr[i] == 0x20:
        lo, hi = i - 1, i + 1  # the characters around the space
    else:
        return False
    before, after = int(arr[lo]), int(arr[hi])
    if before < 0x80 and after < 0x80:
        return _ascii_graphic(before) and chr(after).isalnum()
    return _solid(_char_before(arr, lo + 1)) and _word(_char_at(arr, hi))


def _cuts_in(arr: np.ndarray, lo: int, hi: int) -> tuple[list[int], list[int]]:
    """Allowed cuts in [lo, hi): after-newline ones first, then before-space ones, each ascending."""
    window = arr[lo:hi]
    after_nl = [int(j) + lo + 1 for j in np.flatnonzero(window == 0x0A)]
    before_sp = [int(j) + lo for j in np.flatnonzero(window == 0x20)]
    return [c for c in after_nl if lo <= c < hi and _is_cut(arr, c)], [c for c in before_sp if _is_cut(arr, c)]


def cut_points(
    data, piece_bytes: int, max_search: int = MAX_SEARCH_PIECES, force: bool = True
) -> tuple[list[int], int]:
    """Byte offsets where a document (UTF-8 bytes) is cut into pieces of at most about
    `piece_bytes`, and how many of them are forced (no allowed place within `max_search` pieces;
    with `force` off the rest stays one piece)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n = len(arr)
    cuts: list[int] = []
    forced = 0
    p = 0
    while n - p > piece_bytes:
        nl, sp = _cuts_in(arr, p + piece_bytes // 2, p + piece_bytes + 1)
        c = nl[-1] if nl else sp[-1] if sp else None
        if c is None:  # look further ahead before giving up: the first allowed place after this piece
            nl, sp = _cuts_in(arr, p + piece_bytes + 1, min(n, p + max_search * piece_bytes))
            c = min(nl[:1] + sp[:1]) if nl or sp else None
        if c is None and not force:
            break
        if c is None:
            c = p + piece_bytes
            while c < n and arr[c] & 0xC0 == 0x80:  # never inside a UTF-8 sequence
                c += 1
            if c >= n:
                break
            forced += 1
        cuts.append(c)
        p = c
    return cuts, forced


def pieces(data, cuts: Sequence[int]) -> Iterator[str]:
    arr = np.frombuffer(data, dtype=np.uint8)
    bounds = [0, *cuts, len(arr)]
    for a, b in itertools.pairwise(bounds):
        yield arr[a:b].tobytes().decode("utf-8")


class PieceEncoder:
    """Encodes a document from its pieces, with exactly the ids of encoding it whole."""

    def __init__(self, encode: Encode):
        self.encode = encode
        self.prefix, self.suffix = affixes(encode)
        self.context = encode([CONTEXT], False)[0]

    def encode_pieces(self, texts: Iterator[str], batch_bytes: int = 4 << 20) -> list[np.ndarray]:
        """Id arrays (prefix, pieces..., suffix) of the document the pieces make up."""
        out = [np.asarray(self.prefix, dtype=np.uint32)]
        first = True
        batch: list[str] = []
        size = 0

        def flush():
            nonlocal first
            texts_in = [t if (first and i == 0) else CONTEXT + t for i, t in enumerate(batch)]
            for i, ids in enumerate(self.encode(texts_in, False)):
                if not (first and i == 0):
                    if ids[: len(self.context)] != self.context:
                        raise ValueError("a piece's context did not encode on its own")
                    ids = ids[len(self.context) :]
                out.append(np.asarray(ids, dtype=np.uint32))
            first = False
            batch.clear()

        for t in texts:
            batch.append(t)
            size += len(t)
            if size >= batch_bytes:
                flush()
                size = 0
        if batch:
            flush()
        out.append(np.asarray(self.suffix, dtype=np.uint32))
        return out

    def encode_document(self, data, piece_bytes: int | None = None) -> tuple[np.ndarray, int]:
        """(ids of the document, forced cuts) for a document given as UTF-8 bytes."""
        cuts, forced = cut_points(data, piece_bytes or PIECE_BYTES)
        return np.concatenate(self.encode_pieces(pieces(data, cuts))), forced


def check_cut_rule(
    encode: Encode, texts: list[str], want: list[list[int]], piece_bytes: int = 256, budget_bytes: int = 512 << 10
) -> str | None:
    """None when encoding `texts` (about `budget_bytes` of them) in small pieces gives `want`, their
    reference ids, else what differs."""
    try:
        enc = PieceEncoder(encode)
    except ValueError as err:
        return str(err)
    used = 0
    step = max(1, sum(len(t) for t in texts) // budget_bytes)  # spread over the sample
    for i in range(0, len(texts), step):
        if used >= budget_bytes:
            break
        text, ids = texts[i], want[i]
        data = text.encode("utf-8")
        cuts = cut_points(data, piece_bytes, max_search=1 << 30, force=False)[0]
        if not cuts:
            continue
        used += len(data)
        try:
            got = np.concatenate(enc.encode_pieces(pieces(data, cuts))).tolist()
        except ValueError as err:
            return str(err)
        if got != list(ids):
            return f"sample document {i} ({texts[i][:40]!r}) cut into {len(cuts) + 1} pieces differs from its whole ids"
    return None

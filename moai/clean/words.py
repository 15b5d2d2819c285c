"""Words, lines and scripts of a document, for the quality rules.

Words (`words`) are segmented by script, so that statistics mean the same in every language:

- Spaced scripts (Latin, Hangul, Cyrillic, Greek, Arabic, Devanagari, ...): a word is a
  whitespace-separated token with its leading and trailing punctuation and symbols stripped. A
  Korean eojeol (`학교에서`) is one word, as the space is where Korean writes word boundaries.
  Punctuation inside a token stays (`don't`, `3.14`, `e-mail`); a token of punctuation or
  symbols alone (`—`, `...`, `🙂`) is no word. Numbers are words.
- Unspaced scripts (Han, Hiragana, Katakana; Thai, Lao, Khmer, Myanmar): a run of these is cut
  into pieces of 2 characters for Han and kana (the mean length of a Chinese or Japanese word in
  segmented corpora is 1.5–2 characters) and of 4 code points for Thai, Lao, Khmer and Myanmar
  (~4 per word, counting vowel and tone marks). Pieces are an estimate of the word count, not a
  dictionary segmentation: a real segmenter (jieba, MeCab, PyThaiNLP) costs 10–100× more per
  document and the rules only need counts and repetitions. Counting every CJK character as a
  word (datatrove #135, #202) doubles the count and halves the mean word length.

Everything is a few regular expressions over the whole text (no Python loop per character);
the character classes are built once per process from `unicodedata`.

Whether a document is code is `moai.clean.code`'s question.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Iterator
from functools import cached_property

# Unspaced scripts: (first, last) code points. Han (with 々 〆 〇) and kana are cut into pieces of 2.
_HAN_KANA = [
    (0x3005, 0x3007),
    (0x3021, 0x3029),
    (0x3040, 0x309F),
    (0x30A0, 0x30FF),
    (0x31F0, 0x31FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0xFF66, 0xFF9F),
    (0x20000, 0x3134F),
]
# Thai, Lao, Myanmar, Khmer (and their extensions): cut into pieces of 4 code points.
_SOUTHEAST_ASIAN = [
    (0x0E00, 0x0EFF),
    (0x1000, 0x109F),
    (0x1780, 0x17FF),
    (0x19E0, 0x19FF),
    (0xA9E0, 0xA9FF),
    (0xAA60, 0xAA7F),
]
_HAN_KANA_PIECE = 2
_SOUTHEAST_ASIAN_PIECE = 4


def _is_punct(cp: int) -> bool:
    """Punctuation, symbols, controls and format characters: what is stripped from a word's edges."""
    cat = unicodedata.category(chr(cp))
    return cat[0] in "PSC" and cat not in ("Co", "Cn")


def _runs(cps: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Consecutive code points as (first, last) ranges."""
    start = prev = -2
    for cp in cps:
        if cp != prev + 1:
            if start >= 0:
                yield start, prev
            start = cp
        prev = cp
    if start >= 0:
        yield start, prev


def _char_class(cps: Iterable[int]) -> str:
    """A regex character class body (without brackets) holding `cps`."""
    return "".join(
        re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in _runs(cps)
    )


def _in_ranges(ranges: list[tuple[int, int]], *, limit: int = 0x10000) -> Iterator[int]:
    """The code points of `ranges` below `limit` that are not punctuation."""
    return (cp for lo, hi in ranges for cp in range(lo, min(hi, limit - 1) + 1) if not _is_punct(cp))


@functools.cache
def _patterns() -> dict[str, re.Pattern[str]]:
    # Built on first use (~50 ms: one `unicodedata.category` per code point of the BMP). Classes
    # hold BMP code points plus a few whole astral ranges: `re` tests a BMP class in one bitmap
    # look-up, while a class with many astral ranges is searched range by range (7× slower).
    punct = _char_class(cp for cp in range(0x10000) if _is_punct(cp)) + "\U0001f000-\U0001faff\U000e0000-\U000e007f"
    han_kana = _char_class(_in_ranges(_HAN_KANA)) + "\U00020000-\U0003134f"
    sea = _char_class(_in_ranges(_SOUTHEAST_ASIAN))
    unspaced = han_kana + sea
    spaced_char = f"[^\\s{punct}{unspaced}]"
    return {
        "word": re.compile(
            f"[{han_kana}]{{1,{_HAN_KANA_PIECE}}}"
            f"|[{sea}]{{1,{_SOUTHEAST_ASIAN_PIECE}}}"
            f"|{spaced_char}(?:[^\\s{unspaced}]*{spaced_char})?"
        ),
        # text without unspaced scripts (most of it): the same words, with one alternative
        "spaced_word": re.compile(f"[^\\s{punct}](?:\\S*[^\\s{punct}])?"),
        "unspaced": re.compile(f"[{unspaced}]+"),
    }


# Scripts by UTF-8 lead byte: one `bytes.translate` and four counts instead of a regex per script.
# A lead byte names a block of code points: ASCII and C3–C9 are Latin (U+00C0–024F), CE–DF are
# Greek to NKo ('other'), E3–E9 kana and Han (U+3000–9FFF, with CJK punctuation), EA–ED Hangul
# syllables (U+AC00–D7A3, with the rare blocks at U+A000–ABFF), E0 and E1 mixed blocks counted as
# 'other' (Indic, Georgian, Ethiopic, ...) except Thai, Lao, Myanmar and Khmer, looked up when
# present. Continuation bytes, punctuation (E2), symbols, digits and emoji (F0) count for none.


def _lead_table() -> bytes:
    """A `bytes.translate` table: a UTF-8 byte to L (Latin), O (other), U (unspaced), H (Hangul) or x."""
    table = bytearray(b"x" * 256)
    for b in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\xc3\xc4\xc5\xc6\xc7\xc8\xc9":
        table[b] = ord("L")
    table[0xCE:0xE2] = b"O" * (0xE2 - 0xCE)
    table[0xE3:0xEA] = b"U" * (0xEA - 0xE3)
    table[0xEA:0xEE] = b"H" * (0xEE - 0xEA)
    return bytes(table)


_LEAD_TABLE = _lead_table()
_UNSPACED_IN_OTHER = (
    b"\xe0\xb8",
    b"\xe0\xb9",
    b"\xe0\xba",
    b"\xe0\xbb",
    b"\xe1\x80",
    b"\xe1\x81",
    b"\xe1\x82",
    b"\xe1\x9e",
    b"\xe1\x9f",
)
_NOT_UNSPACED_LEAD = bytes(b for b in range(256) if b not in (0xE0, 0xE1, *range(0xE3, 0xEA), 0xF0))


def script_counts(text: str) -> dict[str, int]:
    """Letters (Hangul syllables, Han and kana characters) of `text` per script: 'latin', 'hangul',
    'unspaced' (Han, kana, Thai, Lao, Myanmar, Khmer) and 'other' (Cyrillic, Greek, Arabic, Indic,
    ...), estimated from UTF-8 lead bytes (see the comment above)."""
    raw = text.encode("utf-8", "surrogatepass")
    leads = raw.translate(_LEAD_TABLE)
    counts = {"latin": leads.count(b"L"), "hangul": leads.count(b"H"), "unspaced": leads.count(b"U")}
    other = leads.count(b"O")
    if other and (b"\xe0" in raw or b"\xe1" in raw):
        moved = sum(map(raw.count, _UNSPACED_IN_OTHER))
        counts["unspaced"] += moved
        other -= moved
    counts["other"] = other
    return counts


def _maybe_unspaced(text: str) -> bool:
    """False when `text` surely has no Han, kana, Thai, Lao, Myanmar or Khmer (no such lead byte)."""
    return bool(text.encode("utf-8", "surrogatepass").translate(None, _NOT_UNSPACED_LEAD))


def words(text: str) -> list[str]:
    """The words of `text`, segmented by script (see the module docstring)."""
    p = _patterns()
    spaced = not _maybe_unspaced(text) or p["unspaced"].search(text) is None
    return (p["spaced_word"] if spaced else p["word"]).findall(text)


def script(text: str) -> str:
    """The script most of the letters of `text` are in: 'latin', 'hangul', 'unspaced' (Han, kana,
    Thai, ...), 'other' (Cyrillic, Greek, Arabic, Devanagari, ...) or 'none' (no letters)."""
    return TextStats(text).script


class TextStats:
    """Statistics of one document, each computed on first use and kept, so rules share them."""

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def lines(self) -> list[str]:
        """Non-empty lines, with surrounding whitespace stripped."""
        return [s for s in (line.strip() for line in self.text.splitlines()) if s]

    @cached_property
    def words(self) -> list[str]:
        return words(self.text)

    @cached_property
    def num_words(self) -> int:
        return len(self.words)

    @cached_property
    def num_word_chars(self) -> int:
        """Characters in words (without spaces and the punctuation stripped from their edges)."""
        return sum(map(len, self.words))

    @cached_property
    def script(self) -> str:
        counts = script_counts(self.text)
        top = max(counts, key=counts.__getitem__)
        return top if counts[top] else "none"


__all__ = ["TextStats", "script", "script_counts", "words"]

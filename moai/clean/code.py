"""Whether a document is code: source files, config files, and prose records that carry code.

The quality rules (word counts, stop words, line repetition) and language identification are made
for prose: they drop code files and instruction records whose answer is a program (an English or
Korean task, then a Python solution) for being code. `is_code` finds both, from the text alone,
so a source needs no setting and a corpus may mix prose and code row by row:

1. A code file: lines that look like code (`_CODE_LINE`: they start like a statement, a
   declaration, a comment, markup or a config key, end like code, or are indented and short with
   no sentence end) hold at least half of the characters of the non-empty lines, and code symbols
   are at least 2% of the non-space characters. Weighing by characters keeps a long article with a
   short snippet prose (its paragraphs are long lines) and a code file with Korean comments code.
2. A record that carries code: a block of consecutive code-like lines (blank lines allowed;
   statements, and every line of a ``` fence or of a Python docstring, count) with at least two
   statements (`_STATEMENT`: `def f(x):`, `import os`, `x = 1`, `print(x)`, `if (a) {`, `}`, a
   fence that names a language, ...), holding at least `MIN_BLOCK_SHARE` (5%) of the document's
   line characters. Instruction + solution pairs count, also a long problem statement with a
   5-line solution (~14% code), and so do answers with a fenced program and tutorials that quote
   one: mixed prose and code is code. A long page with a stray two-line snippet (under 5%) stays
   prose.

A line ending in a sentence mark (. ! ? 。) is never a statement, so prose keeps out of rule 2;
symbol soup has no statement (statements need letters). A heuristic: measured on the held-out
corpus of benchmarks/clean_corpus.py (docs/cleaning.md).

Cost: rule 1 is two regular-expression scans of the whole text; rule 2 runs only when rule 1 says
no and the text has a `(`, `=`, ``` or `import`, and is two matches per line. On one core of a
Xeon (loaded, two runs): 60–100 µs for a 2.2 KB prose document, 56–61 µs for a 0.4 KB
instruction record (25–47 µs with rule 1 alone), 360–400 µs for a 4 KB code file (the quality
rules take ~800 µs a document).
"""

from __future__ import annotations

import re

# --- rule 1: a code file ----------------------------------------------------------------------

_KEYWORDS = (
    # Python, JS/TS, Java, C/C++, C#, Go, Rust, Kotlin, Swift, PHP, shell: words that rarely start a
    # line of English or Korean prose (a wrapped prose line can start with 'for', 'if', 'with').
    "def class import return elif except finally raise yield lambda async await pass "
    "function const let var export interface enum public private protected static void int char float "
    "double bool boolean unsigned struct typedef namespace template package func impl pub fn mod trait "
    "val fun echo sudo apt-get pip npm yarn git docker kubectl curl wget chmod mkdir fi esac done"
).split()
_SQL = "SELECT INSERT UPDATE DELETE CREATE ALTER DROP FROM WHERE JOIN GROUP ORDER VALUES".split()
_CODE_START = (
    r"(?:" + "|".join(map(re.escape, _KEYWORDS)) + r")(?:[ \t(:{;<]|$)"
    r"|(?:" + "|".join(_SQL) + r")\b"
    r"|from [\w.]+ import |(?:if|for|while|switch|catch) ?\("
    r"|#(?:include|define|ifn?def|endif|pragma|!)"  # C preprocessor, shebang
    r"|(?://|/\*|\*/|\*[ \t]|<!--|-- |#|;;)"  # comments (# also Python, shell, YAML)
    r"|</?[A-Za-z!?][^>]*>"  # markup
    r"|@[A-Za-z_]\w*"  # decorators, annotations
    r"|\$ "  # shell prompt
    r"|[\w.\"'\[\]]+[ \t]*(?:[-+*/%|&^]?=|:=|=>|->)(?!=)"  # assignment
    r"|[\"']?[\w.-]+[\"']?[ \t]*:(?:[ \t]+\S.{0,60})?$(?<![.!?。])"  # config key: short value
    r"|- [\w\"'-]+:"  # YAML list of mappings
    r"|[)}\]]"  # closing brackets
    r"|```"  # a markdown fence
)
_CODE_END = r"(?:[;{}\[(\\,:]|=>|->|:=)"
_CODE_LINE_BODY = rf"(?=[ \t]*(?:{_CODE_START})|.*{_CODE_END}[ \t]*$|(?:\t|  +)\S.{{0,120}}$(?<![.!?。]))"
_CODE_LINE = re.compile(rf"^{_CODE_LINE_BODY}(.*)$", re.M)
_CODE_SYMBOLS = re.compile(r"[{}\[\]();=<>_*/\\|&$#@:]")
_SPACE = re.compile(r"\s+")

# --- rule 2: a record that carries code -------------------------------------------------------

MIN_BLOCK_SHARE = 0.05  # of the document's line characters, in blocks with two statements or more
_NAME = r"[A-Za-z_$][\w$]*"
_STATEMENT = re.compile(
    r"[ \t]*(?:"
    rf"(?:async[ \t]+)?(?:def|fn|func|fun|function)[ \t]*\*?[ \t]*(?:{_NAME})?[ \t]*[(<].*"  # function
    rf"|(?:class|struct|interface|enum|trait|impl|namespace|package)[ \t]+{_NAME}.*[:({{<;]?$"
    r"|import[ \t]+[\w.*{}, ]+(?:[ \t]+(?:as|from)[ \t]+\S+)?;?$|from[ \t]+[\w.]+[ \t]+import[ \t].*"
    r"|#(?:include|define|ifn?def|endif|pragma|!).*"
    r"|(?:return|yield|raise|throw|await)(?:[ \t].*)?;?$|(?:pass|break|continue)[ \t]*;?$"
    r"|(?:if|elif|while|for|with|except|else|try|finally)\b.*:$"  # Python block headers
    r"|(?:else[ \t]+)?(?:if|for|while|switch|catch)[ \t]*\(.*[){]$"  # C-like block headers
    r"|(?:const|let|var|val|auto|int|long|float|double|char|bool|string|String)[ \t]+\*?" + _NAME + r"[ \t]*[=;,\[(].*"
    r"|(?:public|private|protected|static|export)[ \t]+.*[(){;=].*"
    rf"|{_NAME}(?:[.][\w$]+|\[[^\]\n]*\])*(?:[ \t]*,[ \t]*{_NAME})*[ \t]*"
    r"(?:[-+*/%|&^]|//|\*\*|<<|>>)?=(?!=)[ \t]*\S.*"  # assignment
    rf"|{_NAME}[ \t]*:[ \t]*[\w.\[\], |]+=(?!=)[ \t]*\S.*"  # annotated assignment
    rf"|{_NAME}(?:[.][\w$]+)*[ \t]*\(.*\)[ \t]*;?"  # a call
    r"|[)}\]]+[ \t]*[;,)]?"  # closing brackets
    r"|(?:SELECT|INSERT[ \t]+INTO|UPDATE|DELETE[ \t]+FROM|CREATE[ \t]+TABLE)\b.*"
    r"|```[\w+#.-]+"  # a fence that names its language
    r")[ \t]*(?:(?:#|//).*)?$(?<![.!?。])"
)
_FENCE = re.compile(r"[ \t]*```")
_CODE_LINE_ONE = re.compile(_CODE_LINE_BODY)


def is_code(text: str) -> bool:
    """Whether `text` is source code or a config file (Python, JS/TS, C/C++, Java, Go, Rust, shell,
    SQL, HTML, JSON, YAML, ...), or prose that carries a program (an instruction and its solution),
    rather than prose. A heuristic; see the module docstring."""
    nonspace = len(text) - sum(map(len, _SPACE.findall(text)))
    if nonspace == 0:
        return False
    line_chars = sum(len(line.strip()) for line in text.splitlines())
    if len(_CODE_SYMBOLS.findall(text)) >= 0.02 * nonspace:
        code_chars = sum(len(line.strip()) for line in _CODE_LINE.findall(text))
        if code_chars >= 0.5 * line_chars:
            return True
    return _carries_code(text, line_chars)


def _carries_code(text: str, line_chars: int) -> bool:
    """Rule 2 of the module docstring: blocks of code-like lines with two statements or more hold
    at least MIN_BLOCK_SHARE of the line characters."""
    if "(" not in text and "=" not in text and "```" not in text and "import" not in text:
        return False  # every statement but a few bare keywords has one of these; prose is done here
    in_fence = in_string = False
    block = statements = 0
    found = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        fence = _FENCE.match(raw) is not None
        quotes = (line.count('"""') + line.count("'''")) % 2 == 1  # opens or closes a docstring
        statement = _STATEMENT.match(raw) is not None  # a statement is code-like (`print(x)` is not by rule 1)
        if statement or in_fence or in_string or fence or quotes or _CODE_LINE_ONE.match(raw):
            block += len(line)
            statements += statement
        else:
            found += block if statements >= 2 else 0
            block = statements = 0
        in_fence ^= fence
        in_string ^= quotes and not in_fence
    found += block if statements >= 2 else 0
    return found > 0 and found >= MIN_BLOCK_SHARE * line_chars


__all__ = ["MIN_BLOCK_SHARE", "is_code"]

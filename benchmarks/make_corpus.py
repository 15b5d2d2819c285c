"""Build a benchmark corpus from text already on this machine, and a tokenizer trained on it.

Real text, no download: source code (.py, .c, .h, .js) and prose (.md, .rst, .txt) found under
the given roots (default: this Python's installation and /usr/share), one document per file, in
sorted order, written as JSONL until --mb megabytes of text. --repeat N writes the same documents
N times (a 4× corpus for the memory check).

    python benchmarks/make_corpus.py --out bench/corpus.jsonl --mb 50 --tokenizer-out bench/tok

--records N instead writes N instruction records of about --record-bytes each (fields
`instruction`, `input`, `output`, cut from the same files: a file's first line asks, its next
lines are the input, the rest the answer), for the many-small-documents case:

    python benchmarks/make_corpus.py --out bench/instruct.jsonl --records 40000 --tokenizer-out bench/tok-instruct

--korean DIR makes every --korean-every'th record's output Korean prose of the same size in bytes:
sentences of the .txt files under DIR, drawn at random (seeded). The Korean text of the docs'
runs is the corpus konlpy's wheel ships (constitution, news, Wikipedia extracts):

    pip download konlpy==0.6.0 --no-deps -d bench/kp && unzip -q bench/kp/konlpy-0.6.0-*.whl -d bench/kp
    python benchmarks/make_corpus.py --out bench/ko.jsonl --records 360000 --korean bench/kp/konlpy/data/corpus
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (imported by transformers via
# linecache) when a script of this folder runs, because Python puts the script's folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import random
import re
from pathlib import Path

EXTENSIONS = {".py", ".c", ".h", ".js", ".md", ".rst", ".txt"}


def documents(roots: list[Path]):
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.suffix not in EXTENSIONS or path.is_symlink():
                    continue
                try:
                    if not 64 <= path.stat().st_size <= 1 << 20:
                        continue
                    yield path.read_bytes().decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue


def records(texts, n: int, size: int):
    """n instruction records of about `size` bytes, cut from the texts in order (cycled if short)."""
    made = 0
    while made < n:
        for text in texts:
            for at in range(0, len(text) - size // 2, size):
                chunk = text[at : at + size]
                lines = chunk.split("\n")
                yield {
                    "instruction": "Explain or continue: " + lines[0][:120],
                    "input": "\n".join(lines[1:4]),
                    "output": "\n".join(lines[4:]),
                }
                made += 1
                if made == n:
                    return


def korean_outputs(recs: list[dict], folder: Path, every: int) -> None:
    """Every `every`th record's output (from the first) replaced by Korean sentences from the .txt
    files under `folder`, drawn at random (seed 0) until it is at least as long in bytes."""
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob("**/*.txt")))
    sentences = [s.strip() for s in re.split(r"(?<=[.다])\s+|\n+", text) if len(s.strip()) > 10]
    if not sentences:
        raise SystemExit(f"--korean {folder}: no sentences in its .txt files")
    rng = random.Random(0)
    for r in recs[::every]:
        want, parts, size = len(r["output"].encode()), [], 0
        while size < want:
            s = rng.choice(sentences)
            parts.append(s)
            size += len(s.encode()) + 1
        r["output"] = " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mb", type=float, default=50.0, help="megabytes of text (UTF-8) before --repeat")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--roots", nargs="*", type=Path, default=[Path(sys.prefix), Path(sys.base_prefix), Path("/usr/share")]
    )
    parser.add_argument("--records", type=int, help="write this many instruction records instead")
    parser.add_argument("--record-bytes", type=int, default=1600)
    parser.add_argument("--korean", type=Path, help="with --records: a folder of Korean .txt files (see above)")
    parser.add_argument("--korean-every", type=int, default=3, help="with --korean: one record in this many")
    parser.add_argument("--tokenizer-out", type=Path, help="also train a byte-level BPE on the corpus, saved here")
    parser.add_argument("--vocab-size", type=int, default=32000)
    args = parser.parse_args()

    if args.records:
        args.mb = args.records * args.record_bytes * 1.1 / 1e6
    budget = int(args.mb * 1e6)
    docs, size = [], 0
    for text in documents(args.roots):
        docs.append(text)
        size += len(text.encode())
        if size >= budget:
            break
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.records:  # the records' text, as the tokenize stage will see it (text_template)
        recs = list(records(docs, args.records, args.record_bytes))
        if args.korean:
            korean_outputs(recs, args.korean, args.korean_every)
        lines = [json.dumps(r, ensure_ascii=False) for r in recs]
        docs = [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in recs]
        size = sum(len(t.encode()) for t in docs)
    else:
        lines = [json.dumps({"text": text}, ensure_ascii=False) for text in docs]
    with open(args.out, "w", encoding="utf-8") as f:
        for _ in range(args.repeat):
            for line in lines:
                f.write(line + "\n")
    print(
        f"{args.out}: {len(docs) * args.repeat} documents, {size * args.repeat / 1e6:.1f} MB of text", file=sys.stderr
    )

    if args.tokenizer_out:
        from moai.stages.tokenizer import build_bpe

        batches = (docs[i : i + 1000] for i in range(0, len(docs), 1000))
        build_bpe(batches, args.vocab_size, length=len(docs)).save_pretrained(str(args.tokenizer_out))
        print(f"{args.tokenizer_out}: byte-level BPE, vocab {args.vocab_size}", file=sys.stderr)


if __name__ == "__main__":
    main()

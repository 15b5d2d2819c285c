#!/usr/bin/env bash
# Issue 23's many-core measurements, in one command on a machine without network that has the
# scientific stack (the lent 16-core GPU machine; Python 3.12):
#   1. the corpus: --records instruction records cut from that machine's own source files and docs
#      (benchmarks/make_corpus.py; 1,600 bytes each), in RAM (/dev/shm);
#   2. a cold `moai prepare` of the corpus repeated REPEAT times (10 GB with the defaults), its
#      stages' seconds and the prepare process's peak RSS;
#   3. benchmarks/convert_workers.py on the corpus: convert alone, one thread against CONVERT_WORKERS processes;
#   4. benchmarks/prepare_e2e.py on it: a cold `moai prepare` (the plan's split and each of SPLITS)
#      against the raw engines on the same texts, all cores.
# Here, first (what travels: .whl with the wheels and the tokenizer, under the 64 MiB a call carries):
#   bash benchmarks/device_wheels.sh --pyarrow
#   tar -C bench -cf - tok-tekken | xz -T0 > .whl/tokenizer.tar.xz     # a Llama-3-style tokenizer.json
# There, from the repository root, with .whl carried: bash benchmarks/many_cores.sh  (OUT: results)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/many-cores}"
RECORDS="${RECORDS:-750000}"    # ~1.27 GB of JSONL
REPEAT="${REPEAT:-8}"           # the big run: the corpus 8 times (~10 GB)
SPLITS="${SPLITS-1x16 4x4}"     # processes x threads for tokenize, beside the plan's own (may be empty)
W="${WORK:-/dev/shm/moai-many-cores}"
STEPS="${STEPS:-big convert e2e}"   # which of steps 2-4 to run
TEMPLATE=$'{instruction}\n{input}\n{output}'
mkdir -p "$OUT" "$W"
say() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }

say "packages"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
[ -f .whl/pyarrow.tar.xz ] && tar -xJf .whl/pyarrow.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p "$W/tok" && tar -xJf .whl/tokenizer.tar.xz -C "$W/tok" && TOK=$(dirname "$(ls "$W"/tok/*/tokenizer.json)")
python3 - <<'PY' 2>&1 | tee -a "$OUT/log.txt" || exit 1
import importlib.metadata as m, os, platform
import moai.pipeline, moai.stages.tokenize  # noqa: F401  what is missing fails here
print(platform.python_version(), os.cpu_count(), "cores", {p: m.version(p) for p in
      ("pyarrow", "numpy", "transformers", "tokenizers", "fastokens", "gigatoken", "tiktoken", "datasets")})
PY
free -g | tee -a "$OUT/log.txt"; df -h / /dev/shm | tee -a "$OUT/log.txt"

say "corpus: $RECORDS records"
python3 benchmarks/make_corpus.py --out "$W/corpus.jsonl" --records "$RECORDS" 2>&1 | tee -a "$OUT/log.txt"

if [[ " $STEPS " == *" big "* ]]; then
say "big corpus: $REPEAT times"
for _ in $(seq "$REPEAT"); do cat "$W/corpus.jsonl"; done > "$W/big.jsonl"
ls -la "$W/big.jsonl" | tee -a "$OUT/log.txt"
size_gb=$(( $(stat -c %s "$W/big.jsonl") / 1000000000 + 1 ))
# the store holds ~4.5x the JSONL (convert, filter, save, tokens): on disk when it has room
cache=/root/moai-many-cores-cache
(( $(df --output=avail -B1G /root | tail -1) < size_gb * 5 )) && cache="$W/cache"
printf '{"cache_dir": "%s", "source": {"path": "%s", "text_template": %s}, "tokenizer": {"path": "%s"}, "pack": {"seq_len": 2048}}\n' \
  "$cache" "$W/big.jsonl" "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$TEMPLATE")" "$TOK" > "$W/big.json"
say "cold moai prepare of the big corpus (cache in $cache)"
start=$(date +%s.%N)
timeout 300 python3 -m moai.cli prepare "$W/big.json" > "$OUT/big.out" 2> "$OUT/big.err"
rc=$?
say "big prepare exit $rc in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
tail -n 5 "$OUT/big.err"
python3 - "$OUT/big.out" "$W/big.jsonl" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, os, sys
from pathlib import Path
s = json.loads(Path(sys.argv[1]).read_text().strip().splitlines()[-1])
r = json.loads((Path(s["token_store"]) / "_manifest.json").read_text())["report"]
mb = os.path.getsize(sys.argv[2]) / 1e6
print(f"{mb:,.0f} MB of JSONL; tokens {s['num_tokens']:,}; stages (s):",
      {k: v.get("seconds") for k, v in s["stages"].items()})
print("tokenize:", {k: r.get(k) for k in ("engine", "processes", "threads_per_process", "stage_seconds", "seconds", "mb_per_s",
                                         "check_seconds", "check_parts", "peak_rss_mb", "profile")})
PY
rm -rf "$cache"
rm "$W/big.jsonl"
fi

if [[ " $STEPS " == *" convert "* ]]; then
say "convert_workers"
# shellcheck disable=SC2086
timeout 120 python3 benchmarks/convert_workers.py --corpus "$W/corpus.jsonl" --text-template "$TEMPLATE" \
  --workers ${CONVERT_WORKERS:-1 4 8 $(( $(nproc) - 1 ))} --work "$W/convert" > "$OUT/convert.md" 2> "$OUT/convert.err"
say "convert_workers exit $?"; cat "$OUT/convert.md"; tail -n 5 "$OUT/convert.err"
fi

[[ " $STEPS " == *" e2e "* ]] || exit 0
say "prepare_e2e"
# shellcheck disable=SC2086
timeout 200 python3 benchmarks/prepare_e2e.py --corpus "$W/corpus.jsonl" --tokenizer "$TOK" \
  --text-template "$TEMPLATE" --raw fastokens gigatoken --encode-files --splits $SPLITS --work "$W/e2e" \
  > "$OUT/e2e.md" 2> "$OUT/e2e.err"
say "prepare_e2e exit $?"; cat "$OUT/e2e.md"; tail -n 20 "$OUT/e2e.err"
rm -rf "$W/e2e"

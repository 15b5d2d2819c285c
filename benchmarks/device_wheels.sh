#!/usr/bin/env bash
# Wheels for running moai's benchmarks on a machine that has no network but already has the
# scientific stack (numpy, pyarrow, torch, transformers, tokenizers, tiktoken, pandas, psutil, ...),
# such as the 16-core GPU machine lent for measurements (Python 3.12, x86-64). What moai needs
# beyond that is ~4 MB: pydantic and datasets with their own needs, at the versions of this
# checkout's .venv, so both machines run the same code. They go to .whl/ (ignored by git).
#
#   bash benchmarks/device_wheels.sh            # here, where pip reaches a registry
#   # there, from the repository root, with .whl carried along:
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   python3 -c "import moai.pipeline"           # the check that nothing else is missing
#
# PYVER (default 3.12) is the other machine's Python. With --pyarrow, pyarrow comes along too
# (~45 MB; datasets needs pyarrow >= 24).
set -euo pipefail
cd "$(dirname "$0")/.."
pyver="${PYVER:-3.12}"
packages=(pydantic pydantic_core annotated_types typing_inspection datasets dill multiprocess fsspec)
[ "${1:-}" = "--pyarrow" ] && packages+=(pyarrow)
[ -x .venv/bin/python ] || { echo "no .venv here: run bash scripts/setup.sh first" >&2; exit 1; }
specs=()
for p in "${packages[@]}"; do
  v=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p") \
    || { echo "$p is not installed in .venv" >&2; exit 1; }
  specs+=("$p==$v")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${specs[@]}"
echo "wheels in .whl ($(du -sh .whl | cut -f1)): ${specs[*]}"

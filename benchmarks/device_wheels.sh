#!/usr/bin/env bash
# What moai's benchmarks need on a machine that has no network but already has the scientific
# stack (numpy, torch, transformers, tokenizers, tiktoken, pandas, psutil, ...), such as the 16-core
# GPU machine lent for measurements (Python 3.12, x86-64): pydantic, datasets, the fast engines
# (fastokens, gigatoken with awkward) and orjson, with their own needs, at the versions of this
# checkout's .venv, so both machines run the same code. They go to .whl/ (ignored by git).
#
#   bash benchmarks/device_wheels.sh            # here, where pip reaches a registry
#   # there, from the repository root, with .whl carried along:
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   python3 -c "import moai.pipeline"           # the check that nothing else is missing
#
# PYVER (default 3.12) is the other machine's Python. With --pyarrow, this checkout's pyarrow comes
# too, as .whl/pyarrow.tar.xz (unpacked into the target folder there): the wheel is 50 MB, over
# what a lent machine's call carries beside the rest, so it goes without Arrow Flight and its
# headers and tests (25 MB compressed). benchmarks/many_cores.sh uses all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver="${PYVER:-3.12}"
packages=(pydantic pydantic_core annotated_types typing_inspection datasets dill multiprocess fsspec
  fastokens gigatoken awkward awkward_cpp orjson)
[ -x .venv/bin/python ] || { echo "no .venv here: run bash scripts/setup.sh first" >&2; exit 1; }
version() { .venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
specs=()
for p in "${packages[@]}"; do
  v=$(version "$p") || { echo "$p is not installed in .venv" >&2; exit 1; }
  specs+=("$p==$v")
done
mkdir -p .whl
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$1" "${@:2}"
}
download .whl "${specs[@]}"
if [ "${1:-}" = "--pyarrow" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  download "$tmp" "pyarrow==$(version pyarrow)"
  (cd "$tmp" && unzip -q pyarrow-*.whl && rm pyarrow-*.whl \
    && rm -rf pyarrow/libarrow_flight.so* pyarrow/_flight*.so pyarrow/include pyarrow/src pyarrow/tests \
    && tar -cf - pyarrow pyarrow-*.dist-info | xz -T0 -6) > .whl/pyarrow.tar.xz
  specs+=("pyarrow==$(version pyarrow) (trimmed)")
fi
echo "in .whl ($(du -sh .whl | cut -f1)): ${specs[*]}"

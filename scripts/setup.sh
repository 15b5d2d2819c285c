#!/usr/bin/env bash
# Creates .venv and installs moai into it. `bash scripts/setup.sh dev` adds the test tools.
# Where no NVIDIA GPU is present, the CPU build of PyTorch goes in first: a bare `torch`
# requirement would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "dev" ] && extras="[dev]"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q torch
  else
    .venv/bin/python -m pip install -q "torch==${MOAI_CPU_TORCH:-2.13.0}" \
      || .venv/bin/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
.venv/bin/python -m pip install -q -e ".${extras}"
echo "moai installed in .venv"

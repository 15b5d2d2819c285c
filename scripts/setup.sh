#!/usr/bin/env bash
# Creates .venv and installs moai into it. `bash scripts/setup.sh dev` adds the test tools.
# Where no NVIDIA GPU is present, the CPU build of PyTorch goes in first: a bare `torch`
# requirement would otherwise pull a multi-GB CUDA build. MOAI_TORCH=cpu or cuda forces the
# choice (the worker image is built where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "dev" ] && extras="[dev]"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
want="${MOAI_TORCH:-auto}"
if [ "$want" = auto ]; then
  want=cpu
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && want=cuda
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ "$want" = cuda ]; then
    .venv/bin/python -m pip install -q torch
  else
    # PyTorch's CPU index first (PyPI's Linux wheels are CUDA builds); then whatever pip is configured with.
    .venv/bin/python -m pip install -q --retries 1 --timeout 20 "torch==${MOAI_CPU_TORCH:-2.13.0}" \
        --index-url https://download.pytorch.org/whl/cpu \
      || .venv/bin/python -m pip install -q "torch==${MOAI_CPU_TORCH:-2.13.0}"
  fi
fi
.venv/bin/python -m pip install -q -e ".${extras}"
if [ -n "$extras" ]; then
  # the hf:// tests' Hub server (tests/hf_server.py), beside moai's environment: its needs
  # (psutil < 6) are not moai's. Pinned: the tests rely on how its mirrors behave.
  [ -x .venv-olah/bin/python ] || python3 -m venv .venv-olah
  .venv-olah/bin/python -m pip install -q "olah==${MOAI_OLAH:-0.5.4}"
  # llama.cpp's tokenizer test files (GGUF vocabularies of Llama 3, Qwen2, DeepSeek, Falcon, GPT-2,
  # StarCoder, Phi-3 ... and its test strings), for the exactness tests (tests/real_tokenizers.py):
  # from llama-cpp-python's source archive on PyPI (not built), pinned, into .venv/share/llama-vocab
  vocab=.venv/share/llama-vocab
  if [ ! -f "$vocab/ggml-vocab-llama-bpe.gguf" ]; then
    tmp=$(mktemp -d)
    .venv/bin/python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d "$tmp"
    tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*'
    mkdir -p "$vocab"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-* "$vocab"/
    rm -rf "$tmp"
  fi
fi
# Create Prefect's local database now: on a machine without one, the temporary server that
# `python flows/pretrain.py` starts runs the migrations first and misses Prefect's 20 s start-up
# limit ("Timed out while attempting to connect to ephemeral Prefect API server").
if .venv/bin/prefect server database upgrade -y >/dev/null 2>&1; then
  echo "Prefect's local database is ready (${PREFECT_HOME:-~/.prefect})"
else
  echo "warning: could not create Prefect's local database; the first flow run may time out starting its server" >&2
fi
echo "moai installed in .venv"

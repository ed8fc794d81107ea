#!/usr/bin/env bash
# Install ctxkit with what the quickstart needs (the `quickstart` extra: MiniLM + faiss, matplotlib; CPU
# torch, no CUDA wheels, nothing compiled) into .venv and run the main job: the quickstart A/B compression
# ablation into runs/quick. Extra arguments go to `ctxkit ablate`.
# CTXKIT_SKIP_INSTALL=1 skips creating .venv and installing (the `ctxkit` already on PATH runs the job);
# tests/test_readme.py uses it to run this script as the README writes it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CTXKIT_SKIP_INSTALL:-0}" != "1" ]; then
    python3 -m venv .venv
    . .venv/bin/activate
    # --no-compile: pip would byte-compile every installed module (~330 MB of __pycache__, mostly torch
    # and sympy modules never imported); Python compiles the modules it imports on first use.
    pip install -q --prefer-binary --no-compile torch==2.13.0 -e '.[quickstart]'
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ctxkit ablate experiments/quickstart.toml --out runs/quick "$@"

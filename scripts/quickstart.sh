#!/usr/bin/env bash
# Install ctxkit (CPU torch, no CUDA wheels) into .venv and run the main job: the quickstart A/B
# compression ablation. Extra arguments go to `ctxkit ablate`.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e '.[all]'
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ctxkit ablate experiments/quickstart.toml --out runs/quick "$@"

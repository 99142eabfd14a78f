#!/usr/bin/env bash
# The torch floor lane (not CI): the core suite on an older torch, to test the floor pyproject declares.
#
# CI runs torch 2.13 only. For each torch version given, this builds (or reuses) a venv with that torch, the
# declared dependencies and the test extras except deepspeed and hivemind, then runs
#   1. scripts/plain_install_check.py (2-process ddp and fsdp: fit, validate, resume), and
#   2. the core suite: every test except tests/xla, tests/gpu, the deepspeed and hivemind tests and the
#      comparisons with Lightning (TF_LIGHTNING_PYTHON points nowhere, so those skip, saying why),
# and prints a summary per version. On x86_64 PyPI has only CUDA builds of torch (the CPU wheels live on
# download.pytorch.org): each venv downloads ~3 GB of nvidia packages and takes ~5-7 GB of disk. A CUDA build
# runs on the CPU here as the CPU build does.
#
#   scripts/torch_floor_lane.sh 2.7.0                  # venvs under $FLOOR_VENVS (default ~/.cache/torchfleet)
#   FLOOR_VENVS=/path FLOOR_LANE_TIMEOUT=5400 scripts/torch_floor_lane.sh 2.6.0 2.7.0
#   FLOOR_LANE_TESTS="tests/test_trainer.py tests/distributed/test_fsdp.py" scripts/torch_floor_lane.sh 2.7.0
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="${FLOOR_VENVS:-$HOME/.cache/torchfleet}"
TIMEOUT="${FLOOR_LANE_TIMEOUT:-5400}"
PYTHON_FOR_VENV="${PYTHON:-python3}"
# the core suite: what needs no deepspeed, hivemind, torch_xla, GPU or Lightning environment
NOT_CORE=(--ignore=tests/xla --ignore=tests/gpu --ignore=tests/test_hivemind.py
          --ignore=tests/strategies/test_deepspeed.py --ignore=tests/distributed/test_deepspeed.py)
# the declared dependencies and the test extras, less deepspeed and hivemind (pyproject.toml)
DEPS=("tqdm>=4.60" "jsonargparse[signatures]>=4.27" "pyyaml>=5.4" "numpy>=1.22" "pytest>=7" "pytest-timeout>=2.1"
      "matplotlib>=3.5" "tensorboard>=2.9" "mlflow-skinny>=3" "sqlalchemy>=2" "alembic>=1.8" "wandb>=0.18"
      "rich>=13" "torchmetrics>=1.0" "omegaconf>=2.1")

say() { printf 'floor lane: %s\n' "$*"; }
[ "$#" -gt 0 ] || { say "give one or more torch versions, e.g. scripts/torch_floor_lane.sh 2.7.0"; exit 2; }

SUMMARY=()
WORST=0
for VERSION in "$@"; do
    VENV="$VENVS/venv-torch-$VERSION"
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating $VENV"
        "$PYTHON_FOR_VENV" -m venv "$VENV" || { say "could not create $VENV"; exit 2; }
    fi
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$VERSION')" 2>/dev/null; then
        say "installing torch==$VERSION (~3 GB with its nvidia packages)"
        "$VENV/bin/pip" install -q "torch==$VERSION" || { say "installing torch==$VERSION failed"; exit 2; }
    fi
    # torch stays pinned while the rest installs (torchmetrics would otherwise be free to upgrade it)
    "$VENV/bin/pip" install -q --no-deps -e "$ROOT" && "$VENV/bin/pip" install -q "torch==$VERSION" "${DEPS[@]}" \
        || { say "installing the project and its test dependencies failed"; exit 2; }

    LOG="$VENVS/floor-lane-torch-$VERSION.log"  # the whole pytest -v output, kept for the failures' details
    START=$(date +%s)
    say "torch $VERSION: scripts/plain_install_check.py"
    CHECK="$(cd "$ROOT" && PYTHONPATH="$ROOT/src" timeout 300 "$VENV/bin/python" scripts/plain_install_check.py 2>&1 \
             | grep -E '^(ok  |FAIL|passed|FAILED)')"
    echo "$CHECK"
    say "torch $VERSION: the core suite (hard timeout ${TIMEOUT}s)"
    cd "$ROOT" && TF_LIGHTNING_PYTHON=/nonexistent/lightning-python PYTHONPATH="$ROOT/src" \
        timeout --kill-after=30 "$TIMEOUT" "$VENV/bin/python" -m pytest -v -p no:cacheprovider "${NOT_CORE[@]}" \
        ${FLOOR_LANE_TESTS:-tests} 2>&1 | tee "$LOG" | grep -E '(FAILED|ERROR)( |$)' 
    STATUS=${PIPESTATUS[0]}
    ELAPSED=$(( $(date +%s) - START ))
    if [ "$STATUS" -eq 124 ] || [ "$STATUS" -eq 137 ]; then
        RESULT="TIMED OUT after ${TIMEOUT}s"
    else
        RESULT="$(grep -E '^=* ?[0-9]+ (passed|failed|skipped|error).* in [0-9.]+s' "$LOG" | tail -1 | tr -d '=' | xargs)"
    fi
    SUMMARY+=("torch $VERSION: plain install check: $(echo "$CHECK" | tail -1)"
              "torch $VERSION: core suite: $RESULT (exit $STATUS), ${ELAPSED}s in all")
    while read -r line; do SUMMARY+=("    $line"); done < <(grep -E '^(FAILED|ERROR) ' "$LOG")
    [ "$STATUS" -ne 0 ] && WORST=1
    echo "$CHECK" | grep -q '^passed' || WORST=1
done

echo
echo "==================== torch floor lane summary ===================="
printf '%s\n' "${SUMMARY[@]}"
echo "=================================================================="
exit "$WORST"

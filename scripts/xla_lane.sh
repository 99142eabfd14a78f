#!/usr/bin/env bash
# The XLA lane (not CI): tests/xla on XLA's CPU backend, in an environment of its own.
#
# torch_xla 2.9.0 is built for torch 2.9 (with newer torch it fails at import), and on x86_64 that torch is a CUDA
# build: the environment downloads ~4 GB and takes ~7 GB of disk, too much for every CI run, so CI skips tests/xla
# and this script runs it. It builds (or reuses) the venv, installs the project into it, runs tests/xla with
# PJRT_DEVICE=CPU under a hard timeout and prints a summary.
#
#   scripts/xla_lane.sh                      # venv at $XLA_VENV (default ~/.cache/torchfleet/venv-xla)
#   XLA_VENV=/path/to/venv XLA_LANE_TIMEOUT=2400 scripts/xla_lane.sh
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${XLA_VENV:-$HOME/.cache/torchfleet/venv-xla}"
TIMEOUT="${XLA_LANE_TIMEOUT:-2400}"
TORCH="torch==2.9.1"
TORCH_XLA="torch_xla==2.9.0"
PYTHON_FOR_VENV="${PYTHON:-python3}"

say() { printf 'xla lane: %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON_FOR_VENV" -m venv "$VENV" || { say "could not create the venv"; exit 2; }
fi
if ! "$VENV/bin/python" -c "import torch_xla" >/dev/null 2>&1; then
    say "installing $TORCH $TORCH_XLA (~4 GB)"
    "$VENV/bin/pip" install -q "$TORCH" "$TORCH_XLA" || { say "installing torch/torch_xla failed"; exit 2; }
fi
# the project itself (its sources are read from this checkout) and what tests/xla needs; torch stays at 2.9
"$VENV/bin/pip" install -q --no-deps -e "$ROOT" || { say "installing the project failed"; exit 2; }
"$VENV/bin/pip" install -q "tqdm>=4.60" "jsonargparse[signatures]>=4.27" "pyyaml>=5.4" "pytest>=7" \
    "pytest-timeout>=2.1" numpy || { say "installing the test dependencies failed"; exit 2; }

VERSIONS="$(PJRT_DEVICE=CPU "$VENV/bin/python" -c \
    'import torch, torch_xla; print(f"torch {torch.__version__}, torch_xla {torch_xla.__version__}")' 2>/dev/null)"
FIGURES="$(mktemp)"
LOG="$(mktemp)"
say "$VERSIONS; running tests/xla (PJRT_DEVICE=CPU, hard timeout ${TIMEOUT}s)"
START=$(date +%s)
cd "$ROOT" && PJRT_DEVICE=CPU XLA_LANE_FIGURES="$FIGURES" PYTHONPATH="$ROOT/src" \
    timeout --kill-after=30 "$TIMEOUT" "$VENV/bin/python" -m pytest -q -rA -p no:cacheprovider tests/xla 2>&1 | tee "$LOG"
STATUS=${PIPESTATUS[0]}
ELAPSED=$(( $(date +%s) - START ))

echo
echo "==================== xla lane summary ===================="
echo "environment: $VERSIONS ($VENV)"
echo "backend:     PJRT_DEVICE=CPU, CPU_NUM_DEVICES set per run (1 or 2)"
if [ "$STATUS" -eq 124 ] || [ "$STATUS" -eq 137 ]; then
    echo "result:      TIMED OUT after ${TIMEOUT}s"
else
    echo "result:      $(grep -E '^[0-9]+ (passed|failed|skipped|error)|^=+ .*(passed|failed|error).* =+$' "$LOG" | tail -1) (exit $STATUS)"
fi
grep -E '^(PASSED|FAILED|SKIPPED|ERROR) ' "$LOG" | sed 's/^/  /'
if [ -s "$FIGURES" ]; then
    echo "largest weight difference after 6 steps (tolerance 1e-6; bf16 0.05):"
    "$VENV/bin/python" -c 'import json, sys
for name, value in json.load(open(sys.argv[1])).items():
    print(f"  {name:<40} {value:.2e}")' "$FIGURES"
fi
echo "time:        ${ELAPSED}s"
echo "=========================================================="
rm -f "$FIGURES" "$LOG"
exit "$STATUS"

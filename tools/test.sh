#!/usr/bin/env bash
# Set up .venv (fresh machine: only Python 3.11 and pip needed) and run the test suite.
# Usage: bash tools/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned to the CPU wheel; MindSpore needs numpy 1.26.4 pinned in the same command;
# the examples extra (transformers...) is there for the test that runs the main job
.venv/bin/pip install -q torch==2.13.0 mindspore==2.10.0 numpy==1.26.4 -e ".[dev,examples,torch,mindspore]"
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q "$@"

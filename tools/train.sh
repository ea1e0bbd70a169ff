#!/usr/bin/env bash
# Set up .venv (fresh machine) and run the main job: a model trained with tensor
# parallelism over 2 CPU processes. Extra args go to the training script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q torch==2.13.0 -e ".[examples]"
export OMP_NUM_THREADS=1
exec .venv/bin/python examples/train_tp.py "$@"

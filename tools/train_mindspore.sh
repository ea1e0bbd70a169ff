#!/usr/bin/env bash
# Set up .venv (fresh machine) and run the MindSpore main job: a Llama decoder built from
# mint.nn Cells trained with tensor parallelism over 2 CPU processes (mccl), next to the same
# model in one process (examples/mindspore_llama_tp.py). Extra args go to the script,
# e.g. --cp 2 --check (context parallelism).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# the versions tools/test.sh pins (MindSpore and torch share .venv)
.venv/bin/pip install -q mindspore==2.10.0 numpy==1.26.4 -e ".[examples-mindspore,mindspore]"
export OMP_NUM_THREADS=1 GLOG_v=3
exec .venv/bin/python examples/mindspore_llama_tp.py "$@"

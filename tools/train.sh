#!/usr/bin/env bash
# Set up .venv (fresh machine) and run the main job: a Hugging Face Llama trained with tensor
# parallelism over 2 CPU processes (examples/train_llama_tp.py). Extra args go to the script,
# e.g. --cp 2 --tp 2 --check (context x tensor parallelism on 4 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned to the CPU wheel; numpy pinned as tools/test.sh pins it (MindSpore shares .venv)
.venv/bin/pip install -q torch==2.13.0 numpy==1.26.4 -e ".[examples,torch]"
export OMP_NUM_THREADS=1
exec .venv/bin/python examples/train_llama_tp.py "$@"

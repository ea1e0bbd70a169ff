#!/usr/bin/env bash
# Create .venv and install hyper_shard with every extra the tests, the lint and the examples
# use, in one pip command (fresh machine: only Python 3.11 and pip needed). Skipped when
# .venv already holds exactly this set: a stamp of the pins and pyproject.toml, written
# after a successful install (delete .venv to start over).
# Usage: bash tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
# torch is pinned to the CPU wheel; MindSpore needs numpy 1.26.4 pinned in the same command;
# the examples extra (transformers...) is there for the test that runs the main job
PKGS=(torch==2.13.0 mindspore==2.10.0 numpy==1.26.4 -e ".[dev,examples,torch,mindspore]")
STAMP=.venv/.hyper_shard_setup
want=$( (echo "${PKGS[*]}"; cat pyproject.toml) | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "setup: .venv is up to date (pins and pyproject.toml unchanged)"
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# --no-compile: Python compiles the modules a run imports (seconds) when it first imports
# them, instead of every file of every package at install time (~45 s of CPU)
.venv/bin/pip install -q --no-compile "${PKGS[@]}"
echo "$want" > "$STAMP"
echo "setup: installed in $((SECONDS - start)) s"

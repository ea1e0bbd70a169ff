#!/usr/bin/env bash
# Set up .venv (tools/setup.sh: once; fresh machine: only Python 3.11 and pip needed) and
# run the test suite; prints pytest's summary and the time taken.
# Usage: bash tools/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export OMP_NUM_THREADS=1
start=$SECONDS
rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
echo "tests: pytest took $((SECONDS - start)) s"
if [ "$rc" -eq 5 ]; then  # pytest's "no tests collected": never a success, never silent
  echo "tools/test.sh: no test was collected (pytest exit status 5); check the arguments" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# Set up .venv (tools/setup.sh: once; fresh machine: only Python 3.11 and pip needed) and
# run the test suite; prints pytest's summary, the time taken and one closing line.
# Usage: bash tools/test.sh [pytest args...]
#
# Without a path among the arguments, the suite runs as two pytest sessions at once: the
# MindSpore tests (tests/mindspore, their own pools of MindSpore ranks) followed by the
# OpInfo conformance suite (tests/conformance), and everything else. Each MindSpore rank
# spends much of its time waiting (its start-up and teardown, its collectives), which the
# other session's ranks fill; the two never share a process (every rank is spawned, and
# the pytest processes never import MindSpore). The conformance suite (about 3 minutes)
# rides with the MindSpore tests so that the two sessions end at about the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export OMP_NUM_THREADS=1
start=$SECONDS
PYTEST=(.venv/bin/python -m pytest -q)

paths=0
for a in "$@"; do
  case "$a" in
    -*) ;;
    *) if [ -e "${a%%::*}" ]; then paths=1; fi ;;
  esac
done

# "N passed, N failed..." of pytest's last line (0 when it has none)
count() { { grep -Eo "[0-9]+ $2" "$1" || true; } | tail -1 | grep -Eo "^[0-9]+" || echo 0; }

if [ "$paths" -eq 1 ] || [ ! -d tests/mindspore ]; then
  rc=0
  "${PYTEST[@]}" "$@" || rc=$?
  echo "tests: pytest took $((SECONDS - start)) s"
  if [ "$rc" -eq 5 ]; then  # pytest's "no tests collected": never a success, never silent
    echo "tools/test.sh: no test was collected (pytest exit status 5); check the arguments" >&2
    exit 1
  fi
  exit "$rc"
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
rc_ms=0
first=(tests/mindspore)
[ -d tests/conformance ] && first+=(tests/conformance)
"${PYTEST[@]}" "$@" "${first[@]}" > "$logs/ms.txt" 2>&1 &
ms_pid=$!
rc_main=0
ignore=()
for d in "${first[@]}"; do ignore+=("--ignore=$d"); done
"${PYTEST[@]}" "$@" "${ignore[@]}" 2>&1 | tee "$logs/main.txt" || rc_main=${PIPESTATUS[0]}
wait "$ms_pid" || rc_ms=$?
echo
echo "---------------------------------------- ${first[*]} (run at the same time)"
cat "$logs/ms.txt"
echo "tests: pytest took $((SECONDS - start)) s (two sessions at once)"
# exit 5 (no test collected) is fine for one session (e.g. -m "not mindspore"), not both
if [ "$rc_main" -eq 5 ] && [ "$rc_ms" -eq 5 ]; then
  echo "tools/test.sh: no test was collected (pytest exit status 5); check the arguments" >&2
  exit 1
fi
[ "$rc_main" -eq 5 ] && rc_main=0
[ "$rc_ms" -eq 5 ] && rc_ms=0
n() { echo $(( $(count "$logs/main.txt" "$1") + $(count "$logs/ms.txt" "$1") )); }
echo "tests: both sessions: $(n xfailed) xfailed, $(n "errors?") errors"
echo "tests: $(n passed) passed, $(( $(n failed) + $(n "errors?") )) failed, $(n skipped) skipped"
if [ "$rc_main" -ne 0 ]; then exit "$rc_main"; fi
exit "$rc_ms"

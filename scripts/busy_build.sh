#!/usr/bin/env bash
# Runs a command (default: the strict book build) with one core taken by another process, as
# on a shared CI runner: the book must pass with one of two cores busy (issue 21, item 2).
#
#   scripts/busy_build.sh                      # make book, one CPU-bound process beside it
#   BUSY_CPU=0 scripts/busy_build.sh           # the busy process pinned to core 0 (taskset)
#   scripts/busy_build.sh make chapter N=06    # any other command
#
# The busy process is a pure-Python loop that never sleeps; it is stopped (by its own process
# id) when the command ends, however it ends, and the command's exit status is returned.
set -euo pipefail

PYTHON=${PYTHON:-python3}
busy=("$PYTHON" -c "while True: pass")
if [[ -n "${BUSY_CPU:-}" ]]; then
  command -v taskset >/dev/null || { echo "BUSY_CPU needs taskset (util-linux)" >&2; exit 1; }
  busy=(taskset -c "$BUSY_CPU" "${busy[@]}")
fi

"${busy[@]}" &
busy_pid=$!
trap 'kill "$busy_pid" 2>/dev/null || true; wait "$busy_pid" 2>/dev/null || true' EXIT
echo "busy_build: CPU-bound process $busy_pid started${BUSY_CPU:+ on core $BUSY_CPU}" >&2

if [[ $# -eq 0 ]]; then
  set -- make book
fi
status=0
"$@" || status=$?
echo "busy_build: '$*' exited with $status; stopping process $busy_pid" >&2
exit "$status"

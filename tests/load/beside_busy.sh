#!/usr/bin/env bash
# Runs the test suite (or the pytest arguments given) beside one process that keeps a core
# busy the whole time, as a laptop or a shared CI machine does: the suite must pass there too.
# Run it inside the environment the README's test command sets up:
#   bash tests/load/beside_busy.sh                 # the whole suite, on two workers as CI runs it
#   bash tests/load/beside_busy.sh -m "not slow"   # the quick tier
# The busy process runs at normal priority and is ended when the suite ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/../.."

python3 -c 'while True: pass' &
busy=$!
trap 'kill "$busy" 2>/dev/null || true' EXIT INT TERM
echo "beside_busy: process $busy keeps a core busy" >&2

[ "$#" -gt 0 ] || set -- -n 2 --dist loadgroup
started=$(date +%s)
status=0
python -m pytest "$@" || status=$?
echo "beside_busy: pytest exited $status after $(( $(date +%s) - started )) s beside a busy core" >&2
exit "$status"

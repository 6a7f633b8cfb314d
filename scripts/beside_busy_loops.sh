#!/usr/bin/env bash
# Run a command beside N busy loops (default 2), as on a site's busy login node: the suite must hold there.
#
#   scripts/beside_busy_loops.sh [N] -- COMMAND...      e.g. scripts/beside_busy_loops.sh 2 -- make test
#
# The loops are plain shell spins, one per loop, ended with the command whatever way it ends.
set -euo pipefail
n=2
if [ "${1:-}" != "--" ]; then n=$1; shift; fi
[ "${1:-}" = "--" ] && shift
loops=()
for _ in $(seq "$n"); do
    sh -c 'while :; do :; done' &
    loops+=($!)
done
trap 'kill "${loops[@]}" 2>/dev/null || true' EXIT
start=$(date +%s)
status=0
"$@" || status=$?
echo "beside $n busy loops: exit $status after $(( $(date +%s) - start )) s" >&2
exit $status

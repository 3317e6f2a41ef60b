#!/usr/bin/env bash
# An aggregator rank killed with SIGKILL mid-run: mpirun ends (no hang), the command fails, and
# the store that was there before is untouched (the new one is built under a temporary name).
#   test_killed_aggregator.sh MEMSNAP BENCH_AGGREGATE
set -euo pipefail
memsnap="$1" gen="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
"$gen" gen "$work/run" 4 2000000 >/dev/null
# The store a user already has: a small run aggregated earlier.
"$gen" gen "$work/small" 1 1000 >/dev/null
"$memsnap" aggregate "$work/small" -o "$work/run/memsnap.h5" >/dev/null
before="$(sha256sum "$work/run/memsnap.h5" | cut -d' ' -f1)"

mpirun -np 2 "$memsnap" aggregate --overwrite "$work/run" > "$work/log" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 1 100); do  # the ranks start within seconds; kill the second one
  victim="$(pgrep -f "$memsnap aggregate --overwrite $work/run" | grep -v "^$launcher\$" | tail -1 || true)"
  [ -n "$victim" ] && break
  sleep 0.1
done
[ -n "$victim" ] || { echo "FAIL: no aggregator rank to kill"; exit 1; }
sleep 0.3
kill -9 "$victim"
for _ in $(seq 1 1200); do  # 120 s at most
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  kill -9 "$launcher"
  echo "FAIL: mpirun still runs 120 s after a rank was killed"
  exit 1
fi
code=0
wait "$launcher" || code=$?
[ "$code" -ne 0 ] || { echo "FAIL: the aggregation reported success after a rank was killed"; cat "$work/log"; exit 1; }
after="$(sha256sum "$work/run/memsnap.h5" | cut -d' ' -f1)"
[ "$before" = "$after" ] || { echo "FAIL: the earlier store was changed"; exit 1; }
"$memsnap" info "$work/run/memsnap.h5" >/dev/null || { echo "FAIL: the earlier store no longer reads"; exit 1; }
echo "1 passed, 0 failed"

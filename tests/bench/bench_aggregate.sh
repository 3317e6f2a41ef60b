#!/bin/sh
# Aggregation benchmark: 64 ranks x 1M events (and 16 ranks, to show that per-rank memory does
# not grow with the job), aggregated with -np 1 and -np 2.
#   tests/bench/bench_aggregate.sh BUILD_DIR [WORK_DIR]
set -eu
build=${1:?usage: bench_aggregate.sh BUILD_DIR [WORK_DIR]}
work=${2:-$(mktemp -d)}
bench="$build/bin/memsnap_bench_aggregate"
mpi="mpirun --oversubscribe"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for ranks in 16 64; do
  rm -rf "$work/r$ranks"
  "$bench" gen "$work/r$ranks" "$ranks" 1000000
  for np in 1 2; do
    $mpi -np $np "$bench" run "$work/r$ranks"
  done
done
rm -rf "$work"

#!/bin/sh
# Compression threads follow the CPUs the user gave: an aggregation no launcher started keeps its
# CPU mask (taskset -c 0: one thread), while a rank that mpirun bound to one core spreads its
# threads over the CPUs this test may use (nproc).
#   test_threads_binding.sh BENCH_AGGREGATE MPIEXEC
set -eu
bench=$1
mpiexec=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$bench" gen "$d" 2 20000 >/dev/null
threads() { sed -n 's/.*; \([0-9]*\) threads;.*/\1/p'; }
alone=$(taskset -c 0 "$bench" run "$d" | threads)
if [ "$alone" != 1 ]; then
  echo "taskset -c 0 $bench run: ${alone:-no} compression threads, expected 1"
  exit 1
fi
launched=$("$mpiexec" -n 1 "$bench" run "$d" | threads)
if [ "$launched" != "$(nproc)" ]; then
  echo "$mpiexec -n 1 $bench run: ${launched:-no} compression threads, expected $(nproc) (nproc)"
  exit 1
fi
echo "compression threads: $alone under taskset -c 0, $launched under $mpiexec -n 1"

#!/usr/bin/env bash
# Report benchmark: one window of EVENTS events (default 1M) per rank, RANKS ranks (default 4):
# time of `memsnap report` serially and under mpirun -np 2, page sizes, and the time headless
# Chromium takes until the biggest page is drawn and interactive (data-render-ms).
#   tests/bench/bench_report.sh BUILD_DIR [EVENTS] [RANKS]
set -euo pipefail
build="${1:?usage: bench_report.sh BUILD_DIR [EVENTS] [RANKS]}"
events="${2:-1000000}" ranks="${3:-4}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
"$build/bin/memsnap_bench_aggregate" gen "$work/run" "$ranks" "$events"
"$build/bin/memsnap" aggregate "$work/run" >/dev/null
t() { local s=$(date +%s.%N); "$@" >/dev/null; echo "$(date +%s.%N) - $s" | bc; }
echo "report, 1 process:   $(t "$build/bin/memsnap" report "$work/run/memsnap.h5" -o "$work/r1") s"
echo "report, mpirun -np 2: $(t mpirun -np 2 "$build/bin/memsnap" report "$work/run/memsnap.h5" -o "$work/r2") s"
page="$(ls -S "$work/r1"/rank*.html | head -1)"
echo "largest rank page:   $(du -h "$page" | cut -f1) ($(basename "$page")), index.html $(du -h "$work/r1/index.html" | cut -f1)"
dom="$(chromium --headless=new --no-sandbox --disable-gpu --virtual-time-budget=30000 --dump-dom "file://$page" 2>/dev/null)"
echo "chromium: page ready, render $(grep -o 'data-render-ms="[0-9.]*"' <<<"$dom" | head -1)"

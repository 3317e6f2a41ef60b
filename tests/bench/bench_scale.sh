#!/usr/bin/env bash
# Scale benchmark: a synthetic run of RANKS ranks (default 1024) x EVENTS events per rank (default
# 50000, one window each), aggregated with mpirun -np 1, 2 and 8 on one machine, then reported;
# the same with RANKS/4 ranks under -np 8 to show that memory per aggregator rank does not grow
# with the job. Prints for each run: wall time, events/s, MB/s of spills read, peak RSS of every
# aggregator (and report) rank; the store's and the report's sizes and file counts; and the time
# headless Chromium takes from navigation start until the cross-rank page has drawn its charts
# (body[data-ready-at-ms], median and worst of TRIES loads), and until the largest rank page has
# drawn its timeline.
#   tests/bench/bench_scale.sh BUILD_DIR [RANKS] [EVENTS] [WORK_DIR]
# KEEP=DIR keeps the cross-rank page, summary.json and the largest rank page there.
# Needs about RANKS x EVENTS x 70 bytes of disk in WORK_DIR (default: a new folder in /tmp, removed
# at the end): 1024 x 50000 takes 2 GB of spills, about 1 GB of store and 1 GB of pages.
set -euo pipefail
build="${1:?usage: bench_scale.sh BUILD_DIR [RANKS] [EVENTS] [WORK_DIR]}"
ranks="${2:-1024}" events="${3:-50000}"
work="${4:-$(mktemp -d)}"
tries="${TRIES:-5}"
bench="$build/bin/memsnap_bench_aggregate" memsnap="$build/bin/memsnap"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
trap 'rm -rf "$work"' EXIT
small=$((ranks / 4))

size_of() { du -sb "$@" | awk '{s += $1} END {printf "%.1f MB", s / 1e6}'; }
now() { date +%s.%N; }

# Each rank of `memsnap report` under GNU time, so every rank's peak RSS is printed.
report() {  # NP OUT
  local np="$1" out="$2" t0 t1
  t0=$(now)
  mpirun -np "$np" sh -c 'exec /usr/bin/time -f "  report rank ${OMPI_COMM_WORLD_RANK:-0}: peak RSS %M KB" "$@"' sh \
    "$memsnap" report "$work/big/bench.h5" -o "$out" --overwrite --no-upload >/dev/null 2>"$work/report.err" ||
    { cat "$work/report.err"; return 1; }
  t1=$(now)
  local sec; sec=$(echo "$t1 - $t0" | bc)
  printf 'report -np %d: %.2f s  %.2f Mevents/s\n' "$np" "$sec" "$(echo "$ranks * $events / $sec / 1000000" | bc -l)"
  sort -t: -k1,1V "$work/report.err" | grep 'peak RSS' | awk '{printf "  report rank %s peak RSS %.1f MiB\n", $3, $6 / 1024}'
}

# Milliseconds from navigation start until PAGE set body[data-ready] (charts drawn), over TRIES loads.
first_draw() {  # PAGE FLAGS...
  local page="$1" i dom
  shift
  : >"$work/ready.txt"
  for ((i = 0; i < tries; i++)); do
    dom=$(timeout 120 chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
      --no-default-browser-check --user-data-dir="$work/chromium-profile" --window-size=1400,1000 "$@" --dump-dom \
      "file://$page" 2>/dev/null)
    grep -q 'data-ready="1"' <<<"$dom" || { echo "  $(basename "$page"): not drawn"; return 1; }
    grep -q 'data-error=' <<<"$dom" && { echo "  $(basename "$page"): script error"; return 1; }
    grep -o 'data-ready-at-ms="[0-9.]*"' <<<"$dom" | head -1 | grep -o '[0-9.]*' >>"$work/ready.txt"
  done
  sort -n "$work/ready.txt" | awk -v n="$tries" '{v[NR] = $1} END {printf "median %.0f ms, worst %.0f ms (%d loads)", v[int((NR + 1) / 2)], v[NR], n}'
}

echo "== generate: $ranks ranks x $events events, and $small ranks x $events events"
"$bench" gen "$work/big" "$ranks" "$events"
"$bench" gen "$work/small" "$small" "$events"
df -h "$work" | tail -1 | awk '{print "disk: " $4 " free in " $6}'

echo "== aggregate ($ranks ranks)"
for np in 1 2 8; do mpirun -np "$np" "$bench" run "$work/big"; done
echo "== aggregate ($small ranks, memory per aggregator rank against the $ranks-rank run above)"
mpirun -np 8 "$bench" run "$work/small"
rm -rf "$work/small"
store_files=$(find "$work/big/bench.h5" "$work/big/bench.h5.d" -type f | wc -l)
echo "store: $(size_of "$work/big/bench.h5" "$work/big/bench.h5.d") in $store_files files (root file $(size_of "$work/big/bench.h5"))"
rm -rf "$work/big/spill"

echo "== report ($ranks ranks)"
for np in 1 8; do report "$np" "$work/report$np"; done
rep="$work/report8"
echo "report: $(size_of "$rep") in $(find "$rep" -type f | wc -l) files; index.html $(size_of "$rep/index.html"), summary.json $(size_of "$rep/summary.json")"

echo "== headless Chromium, navigation start to first drawn"
echo "cross-rank page ($ranks ranks): $(first_draw "$rep/index.html")"
page=$(find "$rep" -name 'rank*.html' -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
echo "largest rank page ($(basename "$page"), $(size_of "$page")): $(first_draw "$page" --virtual-time-budget=30000)"
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$rep/index.html" "$rep/summary.json" "$page" "$KEEP/"; fi

#!/usr/bin/env bash
# memsnap diff at scale: two synthetic runs of RANKS ranks (default 1024) x EVENTS events per rank
# (default 50000, one window each; the generator of bench_scale.sh), the second with a planted
# change on a few ranks (512 MiB more at the peak, at a site of its own), each aggregated with
# mpirun -np 2; then `memsnap diff` of the two: wall time and peak RSS, what it printed, and the
# time headless Chromium takes from navigation start until the diff's cross page and a rank page
# have drawn (body[data-ready-at-ms], median and worst of TRIES loads). Target: <= 10 s, pages
# <= 1 s, on the 2-core VM.
#   tests/bench/bench_diff.sh BUILD_DIR [RANKS] [EVENTS] [PLANTED] [WORK_DIR]
set -euo pipefail
build="${1:?usage: bench_diff.sh BUILD_DIR [RANKS] [EVENTS] [PLANTED] [WORK_DIR]}"
ranks="${2:-1024}" events="${3:-50000}" planted="${4:-3,500,1000}"
work="${5:-$(mktemp -d)}"
tries="${TRIES:-5}"
gen="$build/bin/memsnap_bench_diff_gen" memsnap="$build/bin/memsnap"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }

echo "== generate and aggregate: $ranks ranks x $events events, twice (planted on ranks $planted of the second)"
"$gen" "$work/base" "$ranks" "$events"
"$gen" "$work/new" "$ranks" "$events" "$planted"
for side in base new; do
  t0=$(now)
  mpirun -np 2 "$memsnap" aggregate "$work/$side" >/dev/null
  rm -rf "$work/$side/spill"
  printf 'aggregate %s: %.1f s\n' "$side" "$(echo "$(now) - $t0" | bc)"
done

echo "== memsnap diff ($ranks ranks against $ranks ranks)"
t0=$(now)
/usr/bin/time -f "%M" -o "$work/rss" "$memsnap" diff "$work/base" "$work/new" -o "$work/diff" >"$work/out.txt" 2>&1 || {
  cat "$work/out.txt"; exit 1; }
sec=$(echo "$(now) - $t0" | bc)
sed 's/^/  | /' "$work/out.txt"
printf 'diff: %.2f s wall, peak RSS %.1f MiB\n' "$sec" "$(echo "$(cat "$work/rss") / 1024" | bc -l)"
printf 'pages: %s in %d files; diff.json %s\n' "$(du -sh "$work/diff" | cut -f1)" "$(find "$work/diff" -type f | wc -l)" \
  "$(du -h "$work/diff/diff.json" | cut -f1)"

# Milliseconds from navigation start until PAGE set body[data-ready] (drawn), over TRIES loads.
first_draw() {
  local page="$1" i dom
  : >"$work/ready.txt"
  for ((i = 0; i < tries; i++)); do
    dom=$(timeout 120 chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
      --no-default-browser-check --user-data-dir="$work/chromium-profile" --window-size=1400,1000 --dump-dom \
      "file://$page" 2>/dev/null)
    grep -q 'data-ready="1"' <<<"$dom" || { echo "$(basename "$page"): not drawn"; return 1; }
    grep -q 'data-error=' <<<"$dom" && { echo "$(basename "$page"): script error"; return 1; }
    grep -o 'data-ready-at-ms="[0-9.]*"' <<<"$dom" | head -1 | grep -o '[0-9.]*' >>"$work/ready.txt"
  done
  sort -n "$work/ready.txt" | awk -v n="$tries" '{v[NR] = $1} END {printf "median %.0f ms, worst %.0f ms (%d loads)", v[int((NR + 1) / 2)], v[NR], n}'
}
echo "== headless Chromium, navigation start to first drawn"
echo "diff cross page: $(first_draw "$work/diff/index.html")"
page=$(find "$work/diff" -name 'rank*.html' | head -1)
[ -n "$page" ] && echo "rank page ($(basename "$page")): $(first_draw "$page")"

#!/usr/bin/env bash
# Export of one large window as a torch snapshot pickle: for each size (trace entries),
# gen_torch_snapshot writes a pickle and `memsnap import` stores it (setup, not timed), then
# `memsnap export --format torch` writes the window back, ROUNDS times; prints the pickle's size
# and, for each round, wall time and peak RSS (GNU time), then the median and the minimum.
# With BASELINE=PATH (another build's memsnap binary), that one exports the same window too,
# interleaved round by round, and the two outputs must be the same bytes (cmp).
# Then Python's pickle.load reads the export back and must find every generated trace entry
# (VERIFY=0 skips it; 3M entries take it about 2 GB). A run past LIMIT seconds (default 900) is
# stopped and shows as "timeout". The exit code is 1 when an export failed, the outputs differ or
# the read-back found another count.
#   tests/bench/bench_export.sh BUILD_DIR [SIZES] [ROUNDS] [WORK_DIR]
#   SIZES default "100k 1M 3M", ROUNDS default 3.
# FRAMES=F sets the frames per entry (default 16), LAYOUT the frame layout (shared, torch or
# separate; default shared: see gen_torch_snapshot). Needs about 80 bytes per entry twice in
# WORK_DIR (default: a new folder in /tmp, removed at the end).
set -euo pipefail
build="${1:?usage: bench_export.sh BUILD_DIR [SIZES] [ROUNDS] [WORK_DIR]}"
sizes="${2:-100k 1M 3M}" rounds="${3:-3}"
work="${4:-$(mktemp -d)}"
limit="${LIMIT:-900}" frames="${FRAMES:-16}" layout="${LAYOUT:-shared}" baseline="${BASELINE:-}" verify="${VERIFY:-1}"
gen="$build/bin/gen_torch_snapshot" memsnap="$build/bin/memsnap"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"

source "$(dirname "$0")/bench_common.sh"  # timed, median, minimum

exporters="memsnap"
[ -n "$baseline" ] && exporters="memsnap baseline"
printf '%-6s %9s %-9s %5s %9s %10s\n' entries "pickle_MB" exporter round wall_s peak_MiB
summary=""
for n in $sizes; do
  "$gen" "$work/in.pickle" --entries "$n" --frames-per-entry "$frames" "--$layout-frames" 2>"$work/gen.err" ||
    { cat "$work/gen.err"; exit 1; }
  rm -rf "$work/store"*
  "$memsnap" import "$work/in.pickle" --rank 0 --batch 1 -o "$work/store.h5" >"$work/import.log" 2>&1 ||
    { cat "$work/import.log"; exit 1; }
  rm -f "$work/in.pickle"
  entries=$(sed -n 's/.*: \([0-9]*\) trace entries.*/\1/p' "$work/gen.err")
  for e in $exporters; do : >"$work/$e.txt"; done
  mb="-"
  for ((r = 1; r <= rounds; r++)); do
    for e in $exporters; do
      bin="$memsnap"
      [ "$e" = baseline ] && bin="$baseline"
      rm -f "$work/$e.pickle"
      t=$(timed "$work/$e.log" "$bin" export "$work/store.h5" --rank 0 --batch 1 --format torch -o "$work/$e.pickle")
      case "$t" in failed*) sed 's/^/  | /' "$work/$e.log" ;; esac
      [ -f "$work/$e.pickle" ] && mb=$(du -b "$work/$e.pickle" | awk '{printf "%.0f", $1 / 1e6}')
      printf '%-6s %9s %-9s %5d %9s %10s\n' "$n" "$mb" "$e" "$r" ${t}
      echo "$t" >>"$work/$e.txt"
    done
    if [ -n "$baseline" ] && [ -f "$work/memsnap.pickle" ] && [ -f "$work/baseline.pickle" ] &&
      ! cmp -s "$work/memsnap.pickle" "$work/baseline.pickle"; then
      echo "  | $n entries: memsnap's and the baseline's exports differ"
      echo "differ $n" >>"$work/failures"
    fi
  done
  if [ "$verify" = 1 ] && [ -f "$work/memsnap.pickle" ]; then
    got=$(python3 -c 'import pickle, sys; s = pickle.load(open(sys.argv[1], "rb")); print(sum(len(t) for t in s["device_traces"] if t))' \
      "$work/memsnap.pickle" 2>&1 || true)
    if [ "$got" != "$entries" ]; then
      echo "  | $n entries: pickle.load of the export found $got trace entries, not $entries"
      echo "verify $n" >>"$work/failures"
    fi
  fi
  for e in $exporters; do
    f="$work/$e.txt"
    summary+=$(printf '%-6s %9s %-9s %9s %9s %10s %10s' "$n" "$mb" "$e" \
      "$(awk '$1 ~ /^[0-9.]+$/ {print $1}' "$f" | median)" "$(awk '$1 ~ /^[0-9.]+$/ {print $1}' "$f" | minimum)" \
      "$(awk '$2 ~ /^[0-9.]+$/ {print $2}' "$f" | median)" "$(awk '$2 ~ /^[0-9.]+$/ {print $2}' "$f" | minimum)")$'\n'
  done
  rm -rf "$work/store"* "$work/"*.pickle
done
echo
echo "== over $rounds rounds (LIMIT=$limit s, $frames frames per entry, $layout frames; load: $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-6s %9s %-9s %9s %9s %10s %10s\n' entries "pickle_MB" exporter wall_med wall_min MiB_med MiB_min
printf '%s' "$summary"
[ ! -s "$work/failures" ]

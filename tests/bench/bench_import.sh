#!/usr/bin/env bash
# Import of one large PyTorch snapshot pickle: for each size (trace entries) and frame layout
# (separate: every entry its own frames list and frame dicts; shared: a pool of stacks, each
# frames list written once and shared by memo; torch: as torch 2.11 writes them, a frames list per
# entry and the frame dicts shared), gen_torch_snapshot writes the pickle, then `memsnap import` and
# Python's `pickle.load` read the same file, interleaved over ROUNDS rounds; prints the file's
# size and, for each reader and round, wall time and peak RSS (GNU time), then the medians (and
# the fastest round's wall time).
# A reader that runs past LIMIT seconds (default 900) is stopped and shows as "timeout"; with
# MEM_LIMIT=GB each reader runs under ulimit -v of that many GB (an allocation past it fails: the
# 3M separate pickle takes the tree-building importer about 20 GB). The exit code is 1 when a
# reader failed (not when it ran out of time).
#   tests/bench/bench_import.sh BUILD_DIR [SIZES] [MODES] [ROUNDS] [WORK_DIR]
#   SIZES default "100k 1M 3M", MODES default "separate shared", ROUNDS default 3.
# FRAMES=F sets the frames per entry (default 16: 3M separate entries make about 2 GB).
# BASELINE=PATH also runs another memsnap binary (an earlier build) in each round, as "baseline",
# so that a change is timed against it on the same machine at the same time.
# Needs the largest pickle's size in WORK_DIR (default: a new folder in /tmp, removed at the end)
# and, for pickle.load of 3M separate entries, more than 10 GB of memory.
set -euo pipefail
build="${1:?usage: bench_import.sh BUILD_DIR [SIZES] [MODES] [ROUNDS] [WORK_DIR]}"
sizes="${2:-100k 1M 3M}" modes="${3:-separate shared}" rounds="${4:-3}"
work="${5:-$(mktemp -d)}"
limit="${LIMIT:-900}" frames="${FRAMES:-16}" mem_limit="${MEM_LIMIT:-}" baseline="${BASELINE:-}"
gen="$build/bin/gen_torch_snapshot" memsnap="$build/bin/memsnap"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"

source "$(dirname "$0")/bench_common.sh"  # timed, median, minimum

printf '%-6s %-9s %9s %-8s %5s %9s %10s\n' entries frames "file_MB" reader round wall_s peak_MiB
summary=""
for n in $sizes; do
  for mode in $modes; do
    pickle="$work/bench.pickle"
    "$gen" "$pickle" --entries "$n" --frames-per-entry "$frames" "--$mode-frames" 2>"$work/gen.err" ||
      { cat "$work/gen.err"; exit 1; }
    mb=$(du -b "$pickle" | awk '{printf "%.0f", $1 / 1e6}')
    : >"$work/memsnap.txt"
    : >"$work/baseline.txt"
    : >"$work/python.txt"
    m="" b="" p=""
    for ((r = 1; r <= rounds; r++)); do
      # A reader that timed out is not run again at this size.
      if [ "$m" != timeout ]; then
        rm -rf "$work/store"*
        m=$(timed "$work/memsnap.log" "$memsnap" import "$pickle" --rank 0 --batch 1 -o "$work/store.h5")
        case "$m" in failed*) sed 's/^/  | /' "$work/memsnap.log" ;; esac
        printf '%-6s %-9s %9s %-8s %5d %9s %10s\n' "$n" "$mode" "$mb" memsnap "$r" ${m}
        echo "$m" >>"$work/memsnap.txt"
      fi
      if [ -n "$baseline" ] && [ "$b" != timeout ]; then
        rm -rf "$work/store"*
        b=$(timed "$work/baseline.log" "$baseline" import "$pickle" --rank 0 --batch 1 -o "$work/store.h5")
        case "$b" in failed*) sed 's/^/  | /' "$work/baseline.log" ;; esac
        printf '%-6s %-9s %9s %-8s %5d %9s %10s\n' "$n" "$mode" "$mb" baseline "$r" ${b}
        echo "$b" >>"$work/baseline.txt"
      fi
      if [ "$p" != timeout ]; then
        p=$(timed "$work/python.log" python3 -c 'import pickle, sys; pickle.load(open(sys.argv[1], "rb"))' "$pickle")
        case "$p" in failed*) tail -3 "$work/python.log" | sed 's/^/  | /' ;; esac
        printf '%-6s %-9s %9s %-8s %5d %9s %10s\n' "$n" "$mode" "$mb" python "$r" ${p}
        echo "$p" >>"$work/python.txt"
      fi
    done
    rm -rf "$work/store"*
    for reader in memsnap ${baseline:+baseline} python; do
      wall=$(awk '$1 ~ /^[0-9.]+$/ {print $1}' "$work/$reader.txt" | median)
      fastest=$(awk '$1 ~ /^[0-9.]+$/ {print $1}' "$work/$reader.txt" | sort -n | head -1)
      rss=$(awk '$2 ~ /^[0-9.]+$/ {print $2}' "$work/$reader.txt" | median)
      other=$(grep -cv '^[0-9]' "$work/$reader.txt" || true)
      summary+=$(printf '%-6s %-9s %9s %-8s %9s %9s %10s%s' "$n" "$mode" "$mb" "$reader" "$wall" "${fastest:--}" "$rss" \
        "$([ "$other" -gt 0 ] && echo " ($other rounds: $(grep -v '^[0-9]' "$work/$reader.txt" | sort -u | tr '\n' ' '))")")$'\n'
    done
    rm -f "$pickle"
  done
done
echo
echo "== medians over $rounds rounds (wall s, and the fastest round's; peak RSS MiB; LIMIT=$limit s${mem_limit:+, MEM_LIMIT=$mem_limit GB}, $frames frames per entry)"
printf '%-6s %-9s %9s %-8s %9s %9s %10s\n' entries frames "file_MB" reader wall_s min_s peak_MiB
printf '%s' "$summary"
[ ! -s "$work/failures" ]

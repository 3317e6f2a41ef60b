#!/bin/bash
# Two builds of the recorder side by side, on one machine: memsnap_bench_recorder of each, run in
# interleaved rounds (A B A B ...), each process pinned, then min and median per benchmark.
#   tests/bench/bench_recorder_ab.sh DIR_A DIR_B [ROUNDS] [FILTER]
# Each DIR holds memsnap_bench_recorder and the libmemsnap.so.0 it was built with (LD_LIBRARY_PATH
# puts DIR first). ROUNDS defaults to 5, FILTER to every benchmark. PIN (default 2-7) is the
# taskset CPU list; TMPDIR is where the spills go. Prints a table; the raw JSON of every round
# stays in $OUT (default a temporary folder).
set -euo pipefail
a=$1
b=$2
rounds=${3:-5}
filter=${4:-.}
pin=${PIN:-2-7}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in A B; do
    dir=$a
    [ "$side" = B ] && dir=$b
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" taskset -c "$pin" "$dir/memsnap_bench_recorder" \
      --benchmark_filter="$filter" --benchmark_min_time=1 --benchmark_format=json \
      >"$out/$side.$r.json" 2>"$out/$side.$r.err"
  done
done
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for side in "AB":
    for r in range(1, rounds + 1):
        for bm in json.load(open(f"{out}/{side}.{r}.json"))["benchmarks"]:
            v = bm.get("per_event")
            if v is not None and v < 1e-3:
                v *= 1e9  # a rate counter inverted: seconds per event
            rows.setdefault(bm["name"], {}).setdefault(side, []).append(
                (v, bm.get("items_per_second", 0) / 1e6, bm.get("batch_end_us")))
print(f"{'benchmark':58} {'A ns/event min/med':>20} {'B ns/event min/med':>20} {'B/A med':>8} {'A Mev/s med':>11} {'B Mev/s med':>11}")
for name, sides in rows.items():
    def stat(side, i, f=min):
        vals = [x[i] for x in sides.get(side, []) if x[i] is not None]
        return f(vals) if vals else float("nan")
    a_med, b_med = stat("A", 0, statistics.median), stat("B", 0, statistics.median)
    print(f"{name:58} {stat('A',0):9.1f}/{a_med:<9.1f} {stat('B',0):9.1f}/{b_med:<9.1f} {b_med / a_med:8.2f} "
          f"{stat('A',1,statistics.median):11.2f} {stat('B',1,statistics.median):11.2f}")
    if any(x[2] is not None for x in sides.get("A", [])):
        print(f"{'  batch_end_us (min/med)':58} {stat('A',2):9.1f}/{stat('A',2,statistics.median):<9.1f} "
              f"{stat('B',2):9.1f}/{stat('B',2,statistics.median):<9.1f}")
print(f"{rounds} rounds, interleaved A B; raw JSON in {out}")
EOF

#!/bin/bash
# Builds of the recorder side by side, on one machine: memsnap_bench_recorder of each, run in
# interleaved rounds (A B C A B C ...), each process pinned, then min and median per benchmark.
#   tests/bench/bench_recorder_ab.sh DIR_A DIR_B [DIR_C ...]
# Each DIR holds memsnap_bench_recorder and the libmemsnap.so.0 it was built with (LD_LIBRARY_PATH
# puts DIR first). ROUNDS (default 5), FILTER (a --benchmark_filter, default all), PIN (the
# taskset CPU list, default 2-7); TMPDIR is where the spills go. Prints a table, the first DIR
# as the baseline; the raw JSON of every round stays in $RAW (default a temporary folder).
set -euo pipefail
rounds=${ROUNDS:-5}
filter=${FILTER:-.}
pin=${PIN:-2-7}
raw=${RAW:-$(mktemp -d)}
mkdir -p "$raw"
for r in $(seq 1 "$rounds"); do
  i=0
  for dir in "$@"; do
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" taskset -c "$pin" "$dir/memsnap_bench_recorder" \
      --benchmark_filter="$filter" --benchmark_min_time=1 --benchmark_format=json \
      >"$raw/$i.$r.json" 2>"$raw/$i.$r.err"
    i=$((i + 1))
  done
done
python3 - "$raw" "$rounds" "$@" <<'PY'
import json, statistics, sys
raw, rounds, dirs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for i in range(len(dirs)):
    for r in range(1, rounds + 1):
        for bm in json.load(open(f"{raw}/{i}.{r}.json"))["benchmarks"]:
            v = bm.get("per_event")
            if v is None:
                continue  # no per-event counter (BM_RecordInactive): nothing to compare here
            if v < 1e-3:
                v *= 1e9  # a rate counter inverted: seconds per event
            rows.setdefault(bm["name"], {}).setdefault(i, []).append(
                (v, bm.get("items_per_second", 0) / 1e6, bm.get("batch_end_us")))
for i, d in enumerate(dirs):
    print(f"[{i}] {d}")
print("per benchmark and build: ns per event min / median, M events/s median (all threads), vs [0]")
for name, by in rows.items():
    print(name)
    base = statistics.median(x[0] for x in by[0])
    for i, xs in sorted(by.items()):
        ns = [x[0] for x in xs]
        med = statistics.median(ns)
        line = f"  [{i}] {min(ns):7.1f} / {med:7.1f} ns   {statistics.median(x[1] for x in xs):7.2f} M/s   x{med / base:.2f}"
        ends = [x[2] for x in xs if x[2] is not None]
        if ends:
            line += f"   batch_end_us {min(ends):.1f} / {statistics.median(ends):.1f}"
        print(line)
print(f"{rounds} rounds, builds interleaved; raw JSON in {raw}")
PY
# A run that dropped events measured less than the whole record: say so next to the table.
grep -H "dropped" "$raw"/*.err || true

#!/bin/bash
# memsnap's PyTorch attachment (lib/torch/) on a machine with a GPU and torch:
#   count   every trace entry of torch's allocator is one memsnap event, for the same batches
#           (attached by hand, and through `memsnap run` with CUPTI beside it: no segment twice),
#           with the default allocator and with expandable segments;
#   ranks   `mpirun -np 4 memsnap run -- python3 attach_train.py` (4 processes on one GPU, batches
#           from optimizer steps, Python stacks for allocations >= 1 MiB): every rank's pages, and
#           findings that name the planted leak, spike and unsharded rank;
#   cost    ns per trace entry on the allocating thread (tests/bench/bench_torch_tracker.cpp, no
#           Python in the loop): no tracker, a tracker that does nothing (PyTorch's own cost),
#           memsnap outside and inside windows, with native stacks; and what a batch end takes
#   bench   step time (tests/bench/bench_gpu_step.py): no memsnap, the attachment without stacks,
#           with Python stacks >= 1 MiB, memsnap run's default (CUPTI + attachment), torch's
#           _record_memory_history (all, state); BENCH_ROUNDS interleaved rounds, BENCH_PIN cpus.
# Here first: a build configured with MEMSNAP_TORCH_PREFIX, then tests/gpu/stage.sh BUILD; there,
# from the repo root: SECTIONS="count ranks" tests/gpu/torch_attachment.sh  (results under $OUT)
set -u
SECTIONS=${SECTIONS:-count ranks bench}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
root=$(pwd)
C=$root/.carry
OUT=${OUT:-/tmp/memsnap-gpu-out}
W=/tmp/memsnap-attach
rm -rf "$W"
mkdir -p "$OUT" "$W/deps"
exec > >(tee -a "$OUT/attach_log.txt") 2>&1
fails=()
fail() { echo "FAIL: $*"; fails+=("$*"); }
step() { echo; echo "=== $* ($(date +%T))"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LD_LIBRARY_PATH=$C/lib:$W/deps
for _ in 1 2 3; do
  for n in $(ldd "$C/bin/memsnap" "$C/lib/libmemsnap.so.0" $W/deps/*.so* 2>/dev/null | awk '/not found/{print $1}' | sort -u); do
    [ -e "$C/deps/$n" ] && cp -L "$C/deps/$n" "$W/deps/$n"
  done
done
d=$(dirname "$(find /usr/local/cuda*/ -name 'libcupti.so.13' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
MS=$C/bin/memsnap
PY=$C/lib/memsnap/python
[ -e "$C/lib/libmemsnap_pytorch.so" ] || fail "the attachment was not staged"

# window events by action in a spill folder, against torch's trace (attach_count.py's JSON)
compare_counts() {  # label folder torch.json
  $C/bin/spill_dump "$2" >"$2.jsonl" || { fail "$1: spill_dump"; return; }
  python3 - "$1" "$2.jsonl" "$3" <<'PY' || fail "$1: counts differ"
import collections, json, sys
label, dump, torch_json = sys.argv[1:]
t = json.load(open(torch_json))
ev = [json.loads(l) for l in open(dump)]
meta = [e for e in ev if e["kind"] == "meta"]
ev = [e for e in ev if e["kind"] == "event"]
mine = collections.Counter(e["action"] for e in ev)
theirs = collections.Counter(t["by_action"])
torch_segs = set(t["segment_addrs"])
seg_events = [e for e in ev if e["action"].startswith("segment")]
extra = [e for e in seg_events if e["addr"] not in torch_segs]
print(f"{label}: source {meta[0]['source'] if meta else '?'}; memsnap {sum(mine.values())} events {dict(mine)}")
print(f"{label}: torch   {sum(theirs.values())} entries {dict(theirs)}")
print(f"{label}: segment events not torch's (CUPTI, other allocators): {len(extra)} {[(e['action'], e['size']) for e in extra][:8]}")
ok = all(mine[a] == theirs[a] for a in ("alloc", "free_requested", "free_completed"))
seg_mine = collections.Counter(e["action"] for e in seg_events if e["addr"] in torch_segs)
seg_theirs = collections.Counter({a: n for a, n in theirs.items() if a.startswith("segment")})
ok = ok and seg_mine == seg_theirs
print(f"{label}: {'EQUAL' if ok else 'DIFFERENT'} (blocks alike; torch's segments once each: {dict(seg_mine)} vs {dict(seg_theirs)})")
sys.exit(0 if ok else 1)
PY
}

step "machine"
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
ldd $C/lib/libmemsnap_pytorch.so | grep -E "not found|c10|memsnap"

if want count; then
WIN="MEMSNAP_SKIP_BATCHES=3 MEMSNAP_INTERVAL=5 MEMSNAP_OVERWRITE=true"
for conf in default expandable; do
  AC=$([ $conf = expandable ] && echo "expandable_segments:True" || echo "")
  step "count ($conf): attached by hand, no CUPTI"
  env $WIN MEMSNAP_FOLDER=$W/hand_$conf PYTORCH_CUDA_ALLOC_CONF=$AC PYTHONPATH=$PY \
    timeout 300 python3 tests/gpu/attach_count.py --attach --out $W/hand_$conf.torch.json || fail "attach_count by hand $conf"
  compare_counts "by hand, $conf" $W/hand_$conf $W/hand_$conf.torch.json
  step "count ($conf): memsnap run (CUPTI injection and the startup hook)"
  env $WIN MEMSNAP_FOLDER=$W/run_$conf PYTORCH_CUDA_ALLOC_CONF=$AC \
    timeout 300 $MS run -- python3 tests/gpu/attach_count.py --out $W/run_$conf.torch.json || fail "memsnap run attach_count $conf"
  compare_counts "memsnap run, $conf" $W/run_$conf $W/run_$conf.torch.json
  ls $W/run_$conf $W/run_$conf/report 2>/dev/null | head
done
fi

if want ranks; then
step "ranks: mpirun -np 4 memsnap run -- python3 attach_train.py (Python stacks >= 1 MiB)"
MEMSNAP_FOLDER=$W/ranks MEMSNAP_SKIP_BATCHES=2 MEMSNAP_INTERVAL=6 MEMSNAP_STACKS=python MEMSNAP_STACK_MIN_BYTES=1048576 \
  timeout 400 mpirun --oversubscribe -np 4 -x LD_LIBRARY_PATH -x PATH $MS run -- python3 tests/gpu/attach_train.py --batches 10
echo "mpirun exit: $?"
ls $W/ranks $W/ranks/report | head -30
$MS info $W/ranks/memsnap.h5 --json >$OUT/ranks_info.json || fail "memsnap info ranks"
cp $W/ranks/report/summary.json $OUT/ranks_summary.json || fail "no summary.json"
python3 - $OUT/ranks_summary.json <<'PY' || fail "findings"
import json, sys
s = json.load(open(sys.argv[1]))
for f in s["findings"]:
    print("finding:", f["kind"], "rank", f.get("rank"), "batch", f.get("batch"), f.get("bytes"), f.get("site"), "|", f.get("detail", "")[:160])
kinds = {(f["kind"], f.get("rank")) for f in s["findings"]}
want = {("leak", 1), ("spike", 2), ("shard_imbalance", 3)}
missing = want - kinds
flagged0 = [f for f in s["findings"] if f.get("rank") == 0]
print("missing:", missing, "rank 0 flagged:", len(flagged0))
sys.exit(1 if missing or flagged0 else 0)
PY
(cd $W && tar czf $OUT/ranks.tgz --exclude=spill ranks)
fi

if want cost; then
step "cost: per trace entry on the allocating thread, ${BENCH_ROUNDS:=5} interleaved rounds, pinned to ${BENCH_PIN:=2-7}"
# tests/bench/bench_torch_tracker.cpp: PyTorch's allocator called from C++ (no interpreter in the
# loop); no tracker, a tracker that does nothing (PyTorch's own cost), memsnap outside windows,
# inside windows (every batch written), inside windows with native stacks >= 1 MiB.
TL=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
CU=$(dirname "$( (find "$(dirname "$TL")/../nvidia" /usr/local/cuda*/ -name 'libcudart.so.13' 2>/dev/null; echo /x/x) | head -1)")
[ -x $C/bin/memsnap_bench_torch_tracker ] || fail "memsnap_bench_torch_tracker was not staged"
T="env LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$TL:$CU timeout 120 taskset -c $BENCH_PIN $C/bin/memsnap_bench_torch_tracker --out $OUT/tracker_bench.jsonl"
IN="MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=10 MEMSNAP_REPEAT=-1 MEMSNAP_OVERWRITE=true"
for r in $(seq $BENCH_ROUNDS); do
  $T --mode plain
  $T --mode empty_tracker
  env MEMSNAP_SKIP_BATCHES=100000 MEMSNAP_OVERWRITE=true MEMSNAP_FOLDER=$W/t_out $T --mode attach --label attach_outside_windows
  env $IN MEMSNAP_FOLDER=$W/t_in $T --mode attach --label attach_in_windows
  env $IN MEMSNAP_FOLDER=$W/t_st MEMSNAP_STACKS=native MEMSNAP_STACK_MIN_BYTES=1048576 $T --mode attach --label attach_in_windows_native_stacks_1MiB
  # memsnap's own share in one process: its tracker bypassed in every other batch
  env $IN MEMSNAP_FOLDER=$W/t_p $T --mode paired --label paired_in_windows
  env $IN MEMSNAP_FOLDER=$W/t_ps MEMSNAP_STACKS=native MEMSNAP_STACK_MIN_BYTES=1048576 $T --mode paired --label paired_native_stacks_1MiB
done
python3 - "$OUT/tracker_bench.jsonl" <<'PY' || fail "cost summary"
import collections, json, statistics, sys
by = collections.defaultdict(list)
for l in open(sys.argv[1]):
    r = json.loads(l)
    by[r["label"]].append(r)
med = lambda k, key: statistics.median(r[key] for r in by[k])
low = lambda k, key: min(r[key + "_min"] for r in by[k])
for k, v in by.items():
    print(f"{k:38s} n={len(v)} wall ns/entry median {med(k, 'ns_per_entry'):6.1f} (+{med(k, 'ns_per_entry') - med('plain', 'ns_per_entry'):6.1f}) "
          f"min {low(k, 'ns_per_entry'):6.1f}; cpu median {med(k, 'cpu_ns_per_entry'):6.1f} (+{med(k, 'cpu_ns_per_entry') - med('plain', 'cpu_ns_per_entry'):6.1f}) "
          f"min {low(k, 'cpu_ns_per_entry'):6.1f}; spread of medians {min(r['ns_per_entry'] for r in v):.1f}-{max(r['ns_per_entry'] for r in v):.1f}; "
          f"batch end median {med(k, 'batch_end_us_median'):6.1f} us, max {max(r['batch_end_us_max'] for r in v):7.1f} us; events/batch {v[0]['events_per_batch']}")
    if "memsnap_share_ns_per_entry" in v[0]:
        sh = sorted(r["memsnap_share_ns_per_entry"] for r in v)
        print(f"{k:38s} memsnap's share, paired in-process: median {statistics.median(sh):.1f} ns/entry, rounds {sh[0]:.1f}..{sh[-1]:.1f}")
PY
fi

if want bench; then
summarise=1
step "bench: step time, ${BENCH_ROUNDS:=5} interleaved rounds, pinned to ${BENCH_PIN:=2-7}"
B="timeout 240 taskset -c $BENCH_PIN python3 tests/bench/bench_gpu_step.py --warmup 15 --steps ${BENCH_STEPS:-60} --out $OUT/attach_bench.jsonl"
REC="MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=10 MEMSNAP_REPEAT=-1 MEMSNAP_OVERWRITE=true"
# BENCH_ONLY="label ...": only those modes.
b() { local label=$1; shift; if [[ -z ${BENCH_ONLY:-} || " $BENCH_ONLY " == *" $label "* ]]; then "$@" --label "$label"; fi; }
for r in $(seq $BENCH_ROUNDS); do
  b plain $B
  b empty_tracker env MEMSNAP_TORCH_ATTACHMENT=0 PYTHONPATH=$PY $B --mode empty_tracker
  b attach_no_stacks env $REC MEMSNAP_FOLDER=$W/b_attach PYTHONPATH=$PY $B --mode attach
  b attach_python_stacks_1MiB env $REC MEMSNAP_FOLDER=$W/b_py PYTHONPATH=$PY MEMSNAP_STACKS=python MEMSNAP_STACK_MIN_BYTES=1048576 $B --mode attach
  # memsnap's own share in one process: its tracker bypassed in every other step
  b paired_no_stacks env $REC MEMSNAP_FOLDER=$W/b_pa PYTHONPATH=$PY $B --mode attach_paired
  b paired_python_stacks_1MiB env $REC MEMSNAP_FOLDER=$W/b_pp PYTHONPATH=$PY MEMSNAP_STACKS=python MEMSNAP_STACK_MIN_BYTES=1048576 $B --mode attach_paired
  b memsnap_run_cupti_and_attach env $REC MEMSNAP_FOLDER=$W/b_run$r $MS run --no-aggregate -- $B
  b torch_record_all $B --mode torch
  b torch_record_state $B --mode torch_state
done
fi

if [ -n "${summarise:-}" ]; then
python3 - "$OUT/attach_bench.jsonl" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[r["label"]].append(r)
def base_of(key):
    v = [r[key] for r in by.get("plain", []) if key in r] or [float("nan")]
    return statistics.median(v), min(v)
for key, what in (("median_ms", "wall"), ("cpu_median_ms", "cpu")):
    base, base_min = base_of(key)
    for k, v in by.items():
        med = [r[key] for r in v if key in r]
        if not med:
            continue
        m, lo = statistics.median(med), min(med)
        ev = [r.get("events_per_step") for r in v if r.get("events_per_step")]
        print(f"{what} {k:30s} n={len(med)} median {m:7.3f} ms ({100*(m/base-1):+5.2f} %)  min {lo:7.3f} ms ({100*(lo/base_min-1):+5.2f} %)"
              f"  spread {min(med):.2f}-{max(med):.2f}  events/step {ev[0] if ev else '-'}")
for k, v in by.items():
    for key, what in (("memsnap_share_pct", "wall"), ("memsnap_cpu_share_pct", "cpu")):
        sh = sorted(r[key] for r in v if key in r)
        if sh:
            print(f"{what} {k:30s} memsnap's share, paired in-process: median {statistics.median(sh):+.2f} %, rounds {sh[0]:+.2f}..{sh[-1]:+.2f} %")
PY
fi

step "done"
if [ ${#fails[@]} -eq 0 ]; then echo "ALL CHECKS PASSED"; else printf 'FAILED: %s\n' "${fails[@]}"; exit 1; fi

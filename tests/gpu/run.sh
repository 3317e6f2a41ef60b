#!/bin/bash
# memsnap's CUPTI capture on a machine with a GPU: correctness against programs whose allocations
# are known, PyTorch with its three allocator setups, aggregate/report on the runs, and the step
# time overhead (tests/bench/bench_gpu_step.py).
#
# Builds nothing but the CUDA test programs (nvcc). Here first: build, then tests/gpu/stage.sh
# (copies the binaries and the shared libraries the GPU machine lacks into .carry/); there, from
# the repo root:  tests/gpu/run.sh     (results under $OUT, default /tmp/memsnap-gpu-out)
# SECTIONS picks parts (default all): pattern torch sites profiler bench. BENCH_ROUNDS (default 3)
# repeats each bench mode, interleaved, to see through run-to-run noise; BENCH_STEPS (default 60)
# timed steps per run; BENCH_ASYNC=0 skips the cudaMallocAsync rounds; BENCH_PIN=CPUS pins each
# bench process with taskset.
set -u
SECTIONS=${SECTIONS:-pattern torch sites profiler bench}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
root=$(pwd)
C=$root/.carry
OUT=${OUT:-/tmp/memsnap-gpu-out}
W=/tmp/memsnap-gpu
rm -rf "$W"
mkdir -p "$OUT" "$W/deps"
exec > >(tee -a "$OUT/log.txt") 2>&1
fails=()
fail() { echo "FAIL: $*"; fails+=("$*"); }
step() { echo; echo "=== $* ($(date +%T))"; }

# Shared libraries: only those this machine lacks, so its own stay in charge.
export LD_LIBRARY_PATH=$C/lib:$W/deps
for _ in 1 2 3; do
  for n in $(ldd "$C/bin/memsnap" "$C/lib/libmemsnap.so.0" $W/deps/*.so* 2>/dev/null | awk '/not found/{print $1}' | sort -u); do
    [ -e "$C/deps/$n" ] && cp -L "$C/deps/$n" "$W/deps/$n"
  done
done
cupti=$(ldd "$C/lib/libmemsnap_cupti.so" | awk '/libcupti/{print $3}')
if [ "$cupti" = "not" ] || [ -z "$cupti" ]; then
  d=$(dirname "$(find /usr/local/cuda*/ -name 'libcupti.so.13' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
fi
LIB=$C/lib/libmemsnap_cupti.so
MS=$C/bin/memsnap
INJ="env CUDA_INJECTION64_PATH=$LIB NVTX_INJECTION64_PATH=$LIB"

step "machine"
nvidia-smi -L; nvcc --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
echo "carried libs used: $(ls $W/deps | tr '\n' ' ')"
ldd "$LIB" | grep -E "cupti|memsnap|not found"
ldd "$MS" | grep "not found" && fail "memsnap binary misses libraries"
CUPTI_DIR=$(dirname "$(ldd "$LIB" | awk '/libcupti/{print $3}')")

step "build the CUDA test programs"
NVCC="nvcc -O2 -g -std=c++17 -arch=sm_90 -Xcompiler -fno-omit-frame-pointer -Xlinker -export-dynamic"
$NVCC -o $W/alloc_pattern tests/cupti/alloc_pattern.cu -ldl || fail "nvcc alloc_pattern"
$NVCC -o $W/second_subscriber tests/cupti/second_subscriber.cu -L"$CUPTI_DIR" -lcupti -Xlinker -rpath="$CUPTI_DIR" ||
  fail "nvcc second_subscriber"

if want pattern; then
step "1a. alloc_pattern without memsnap"
timeout 120 $W/alloc_pattern --expect --fork >$W/p0.out 2>$W/p0.err
rc0=$?
cat $W/p0.err; grep -v '^expect' $W/p0.out

step "1b. alloc_pattern under the injection (stacks native)"
MEMSNAP_FOLDER=$W/pattern MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=3 MEMSNAP_REPEAT=1 MEMSNAP_STACKS=native \
  timeout 120 $INJ $W/alloc_pattern --expect --fork >$W/p1.out 2>$W/p1.err
rc1=$?
echo "exit codes: without $rc0, with $rc1"; echo "stderr:"; cat $W/p1.err
[ "$rc0" = "$rc1" ] || fail "alloc_pattern exit code differs under memsnap"
diff <(grep -v '^expect' $W/p0.out) <(grep -v '^expect' $W/p1.out) || fail "alloc_pattern output differs under memsnap"
[ "$(grep -c 'fork child exited' $W/p1.out)" = 1 ] || fail "fork child did not exit"
$C/bin/spill_dump $W/pattern >$W/pattern.jsonl || fail "spill_dump pattern"
python3 tests/gpu/check_pattern.py $W/p1.out $W/pattern.jsonl --stacks >$OUT/pattern_check.json || fail "pattern check (native)"
cat $OUT/pattern_check.json
$MS info $W/pattern --json || fail "memsnap info pattern"

step "1c. alloc_pattern through memsnap run (stacks none, cuptiUnsubscribe at exit)"
MEMSNAP_FOLDER=$W/pattern_run MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=3 MEMSNAP_REPEAT=1 MEMSNAP_CUPTI_UNSUBSCRIBE=1 \
  timeout 180 $MS run -- $W/alloc_pattern --expect >$W/p2.out 2>$W/p2.err
echo "memsnap run exit: $?"; cat $W/p2.err
$C/bin/spill_dump $W/pattern_run >$W/pattern_run.jsonl || fail "spill_dump pattern_run"
python3 tests/gpu/check_pattern.py $W/p2.out $W/pattern_run.jsonl >$OUT/pattern_run_check.json || fail "pattern check (memsnap run)"
python3 -c "import json; d=json.load(open('$OUT/pattern_run_check.json')); print(json.dumps(d['windows']))"
ls -R $W/pattern_run | head -30

step "1d. another CUPTI client first: memsnap steps aside with one line"
timeout 60 $INJ MEMSNAP_FOLDER=$W/second $W/second_subscriber >$W/s.out 2>$W/s.err
rc=$?
cat $W/s.out $W/s.err
[ "$rc" = 0 ] || fail "second_subscriber exit $rc under memsnap"
[ "$(grep -c '^memsnap' $W/s.err)" = 1 ] || fail "second subscriber: expected one memsnap line"

fi

if want torch; then
step "2. PyTorch training loop, three allocator setups"
declare -A CONF=([default]="" [expandable]="expandable_segments:True" [async]="backend:cudaMallocAsync")
for c in default expandable async; do
  echo "--- $c (PYTORCH_CUDA_ALLOC_CONF=${CONF[$c]})"
  export PYTORCH_CUDA_ALLOC_CONF=${CONF[$c]}
  if [ $c = default ]; then
    # memsnap run sets the injection itself, then aggregates and reports.
    MEMSNAP_FOLDER=$W/torch_$c MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=6 \
      timeout 300 $MS run -- python3 tests/gpu/train.py --stats $W/torch_$c.stats
    echo "memsnap run exit: $?"
  else
    MEMSNAP_FOLDER=$W/torch_$c MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=6 \
      timeout 300 $INJ python3 tests/gpu/train.py --stats $W/torch_$c.stats
    echo "train exit: $?"
    timeout 120 $MS aggregate $W/torch_$c; echo "aggregate exit: $?"
    timeout 120 $MS report $W/torch_$c/memsnap.h5; echo "report exit: $?"
  fi
  unset PYTORCH_CUDA_ALLOC_CONF
  $MS info $W/torch_$c --json >$W/torch_$c.info.json || fail "memsnap info torch_$c"
  $MS info $W/torch_$c/memsnap.h5 --json >$W/torch_$c.store.json 2>&1 || echo "info on the store failed"
  $C/bin/spill_dump $W/torch_$c >$W/torch_$c.jsonl
  ls $W/torch_$c $W/torch_$c/report 2>/dev/null | head -20
done
python3 - "$W" >$OUT/torch_results.json <<'PY' || fail "torch comparison"
import collections, json, sys
W = sys.argv[1]
out = {}
for c in ["default", "expandable", "async"]:
    r = {}
    try:
        r["torch"] = json.load(open(f"{W}/torch_{c}.stats"))
    except Exception as e:
        r["torch"] = str(e)
    try:
        info = json.load(open(f"{W}/torch_{c}.info.json"))
        r["memsnap_windows"] = [w for rk in info["ranks"] for w in rk["windows"]]
    except Exception as e:
        r["memsnap_windows"] = str(e)
    acts = collections.Counter()
    meta = None
    for line in open(f"{W}/torch_{c}.jsonl"):
        d = json.loads(line)
        if d["kind"] == "event":
            acts[d["action"]] += 1
        elif d["kind"] == "meta":
            meta = d
    r["events_by_action"] = dict(acts)
    r["meta"] = meta
    try:
        r["store_info"] = json.load(open(f"{W}/torch_{c}.store.json"))
    except Exception as e:
        r["store_info"] = "unreadable: " + str(e)
    out[c] = r
    t, w = r["torch"], r["memsnap_windows"]
    if isinstance(t, dict) and isinstance(w, list) and w:
        print(f"{c}: torch peak_reserved {t['peak_reserved']} peak_allocated {t['peak_allocated']} | memsnap "
              f"peak_reserved {w[0].get('peak_reserved')} peak_allocated {w[0].get('peak_allocated')} events {w[0].get('events')}",
              file=sys.stderr)
print(json.dumps(out, indent=1))
PY
cp $W/torch_default/report/summary.json $OUT/summary_default.json 2>/dev/null || echo "no report/summary.json for default"

fi

if want sites; then
step "2b. PyTorch (default allocator) with native stacks: which cudaMalloc calls are not PyTorch's caching allocator"
MEMSNAP_FOLDER=$W/torch_sites MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=6 MEMSNAP_STACKS=native \
  timeout 300 $INJ python3 tests/gpu/train.py --stats $W/torch_sites.stats
$C/bin/spill_dump $W/torch_sites >$W/torch_sites.jsonl || fail "spill_dump torch_sites"
python3 - $W/torch_sites.jsonl $W/torch_sites.stats >$OUT/torch_sites.json <<'PY'
import collections, json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ev = [e for e in ev if e["kind"] == "event" and e["action"] == "alloc"]
torch_stats = json.load(open(sys.argv[2]))
def is_caching(e):
    return any("CUDACachingAllocator" in f or "DeviceCachingAllocator" in f for f in e["frames"])
mine = [e for e in ev if is_caching(e)]
other = [e for e in ev if not is_caching(e)]
sites = collections.Counter()
for e in other:
    key = " <- ".join(f for f in e["frames"][:6])
    sites[(key, e["size"])] += 1
out = {"allocs": len(ev), "caching_allocator_allocs": len(mine), "caching_allocator_bytes": sum(e["size"] for e in mine),
       "torch_segments_allocated": torch_stats["segments_allocated"], "torch_peak_reserved": torch_stats["peak_reserved"],
       "other_allocs": len(other), "other_bytes": sum(e["size"] for e in other),
       "other_sites": [{"frames": k[0], "size": k[1], "count": n} for k, n in sites.most_common(12)],
       "example_caching_stack": mine[0]["frames"][:14] if mine else []}
print(json.dumps(out, indent=1))
print(f"sites: {len(mine)} caching-allocator cudaMallocs ({out['caching_allocator_bytes']} bytes; torch says "
      f"{out['torch_segments_allocated']} segments), {len(other)} others ({out['other_bytes']} bytes)", file=sys.stderr)
PY
head -c 3000 $OUT/torch_sites.json; echo
fi

if want profiler; then
step "2c. torch.profiler (kineto, a CUPTI client) in a process memsnap records"
cat >$W/prof.py <<'PY'
import torch
x = torch.randn(1024, 1024, device="cuda")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as p:
    for _ in range(3):
        torch.cuda.nvtx.range_push("step"); y = x @ x; torch.cuda.synchronize(); torch.cuda.nvtx.range_pop()
k = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
print("profiler: %d CUDA kernel events" % len(k))
PY
timeout 120 python3 $W/prof.py 2>&1 | grep -v Warning | tail -3
MEMSNAP_FOLDER=$W/prof timeout 120 $INJ python3 $W/prof.py 2>&1 | tail -4
fi

if want bench; then
step "3. overhead: step time (tests/bench/bench_gpu_step.py), $BENCH_ROUNDS interleaved rounds"
PIN=${BENCH_PIN:+taskset -c $BENCH_PIN}
B="timeout 240 $PIN python3 tests/bench/bench_gpu_step.py --warmup 15 --steps ${BENCH_STEPS:-60} --out $OUT/bench.jsonl"
REC="MEMSNAP_SKIP_BATCHES=0 MEMSNAP_INTERVAL=10 MEMSNAP_REPEAT=-1 MEMSNAP_OVERWRITE=true"
for r in $(seq $BENCH_ROUNDS); do
  $B --label plain
  $INJ $REC MEMSNAP_FOLDER=$W/bench_none MEMSNAP_STACKS=none $B --label cupti_stacks_none
  $INJ $REC MEMSNAP_FOLDER=$W/bench_native MEMSNAP_STACKS=native $B --label cupti_stacks_native
  $B --mode torch --label torch_record_memory_history
done
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
for r in $(seq $([ "${BENCH_ASYNC:-1}" = 0 ] && echo 0 || echo $BENCH_ROUNDS)); do
  $B --label async_plain
  $INJ $REC MEMSNAP_FOLDER=$W/bench_async MEMSNAP_STACKS=none $B --label async_cupti_stacks_none
  $INJ $REC MEMSNAP_FOLDER=$W/bench_async_native MEMSNAP_STACKS=native $B --label async_cupti_stacks_native
done
unset PYTORCH_CUDA_ALLOC_CONF
python3 - "$OUT/bench.jsonl" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[r["label"]].append(r["median_ms"])
med = {k: statistics.median(v) for k, v in by.items()}
for k, v in by.items():
    ref = med.get("async_plain" if k.startswith("async") else "plain")
    pct = 100.0 * (med[k] / ref - 1) if ref else float("nan")
    print(f"{k:32s} median of {len(v)} runs {med[k]:8.3f} ms/step  {pct:+6.2f} %   runs: {v}")
PY
for d in bench_none bench_native bench_async; do $MS info $W/$d --json | head -c 400; echo; done
fi

step "done"
if [ ${#fails[@]} -eq 0 ]; then echo "ALL CHECKS PASSED"; else printf 'FAILED: %s\n' "${fails[@]}"; exit 1; fi

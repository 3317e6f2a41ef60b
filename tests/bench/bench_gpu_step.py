"""Step time of a PyTorch training loop with and without memsnap's CUPTI capture (GPU benchmark).

One mode per process (tests/gpu/run.sh and tests/gpu/torch_attachment.sh run them in turn):
  --mode plain        no recording in this script; memsnap is on when the caller set it up
                      (CUDA_INJECTION64_PATH, or `memsnap run` with its startup hook)
  --mode attach       memsnap_torch.attach() by hand (memsnap's python folder on PYTHONPATH)
  --mode torch        torch.cuda.memory._record_memory_history() (PyTorch's own recorder, "all")
  --mode torch_state  the same with enabled="state" (live blocks' stacks, no trace)
  --mode empty_tracker  a trace tracker that does nothing: what any tracker costs PyTorch itself
  --mode attach_paired  the attachment with its tracker bypassed in every other step: memsnap's
                      own share in one process, the median over recorded steps of (step - mean of
                      its two bypassed neighbours), in percent of the neighbours
A 12-layer bf16 transformer, NVTX range "step" around each batch, `--warmup` untimed then
`--steps` timed batches; prints one JSON line with the median and p90 ms per step, and the median
time this thread spent before it waited for the GPU (host work a GPU-bound step hides), and the
CPU time of that part (time.thread_time: how much of it the thread ran; on a shared machine the
rest is time spent waiting for a core).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["plain", "attach", "attach_paired", "torch", "torch_state", "empty_tracker"], default="plain")
    ap.add_argument("--label", default="")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = nn.TransformerEncoderLayer(args.width, 16, 4 * args.width, batch_first=True)
    model = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    memsnap = None
    bypass = None
    if args.mode in ("attach", "attach_paired"):
        import memsnap_torch as memsnap

        assert memsnap.attach()
        if args.mode == "attach_paired":
            import ctypes

            bypass = ctypes.CDLL(memsnap.library_path()).memsnap_torch_bench_bypass
    elif "memsnap_torch" in sys.modules:  # attached by memsnap run's startup hook
        memsnap = sys.modules["memsnap_torch"]
    if args.mode == "empty_tracker":
        import ctypes

        import memsnap_torch

        torch.zeros(1, device=dev)  # CUDA initialised: the allocator's per-device state exists
        ctypes.CDLL(memsnap_torch.library_path()).memsnap_torch_attach_empty_tracker()
    if args.mode == "torch":
        torch.cuda.memory._record_memory_history(max_entries=100000)
    elif args.mode == "torch_state":
        torch.cuda.memory._record_memory_history(enabled="state")
    times, host, cpu = [], [], []
    allocs_before = 0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            allocs_before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
            events_before = memsnap._stats()[0] if memsnap else 0
        if bypass is not None:
            bypass(i % 2 == 0)
        torch.cuda.nvtx.range_push("step")
        t0, c0 = time.perf_counter(), time.thread_time()
        x = torch.randn(args.batch, args.seq, args.width, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        host.append((time.perf_counter() - t0) * 1e3)  # this thread's work, before waiting on the GPU
        cpu.append((time.thread_time() - c0) * 1e3)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.nvtx.range_pop()
    if bypass is not None:
        bypass(0)
    timed = times[args.warmup:]
    allocs = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - allocs_before
    events = (memsnap._stats()[0] - events_before) if memsnap else 0
    out = {
        "label": args.label or args.mode,
        "mode": args.mode,
        "backend": torch.cuda.get_allocator_backend(),
        "median_ms": round(statistics.median(timed), 3),
        "p90_ms": round(sorted(timed)[int(0.9 * (len(timed) - 1))], 3),
        "host_median_ms": round(statistics.median(host[args.warmup:]), 3),
        "cpu_median_ms": round(statistics.median(cpu[args.warmup:]), 3),
        "steps": len(timed),
        "allocs_per_step": round(allocs / max(len(timed), 1), 1),
        "events_per_step": round(events / max(len(timed), 1), 1),
        "memsnap_recording": bool(memsnap and memsnap.recording()),
    }
    if bypass is not None:
        # times[i] was recorded for odd i; each recorded step against its two bypassed neighbours.
        def share_of(t):
            return statistics.median(100 * t[i] / ((t[i - 1] + t[i + 1]) / 2) - 100
                                     for i in range(args.warmup + 1, len(t) - 1) if i % 2 == 1)
        out["bypassed_median_ms"] = round(statistics.median(times[args.warmup::2] if args.warmup % 2 == 0 else times[args.warmup + 1::2]), 3)
        out["recorded_median_ms"] = round(statistics.median([times[i] for i in range(args.warmup, len(times)) if i % 2 == 1]), 3)
        out["memsnap_share_pct"] = round(share_of(times), 3)
        out["memsnap_cpu_share_pct"] = round(share_of(cpu), 3)
    line = json.dumps(out)
    print("bench:", line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()

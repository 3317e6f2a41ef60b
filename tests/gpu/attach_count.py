"""Counts what memsnap's PyTorch attachment records against PyTorch's own trace of the same batches.

A 12-layer transformer (as in tests/bench/bench_gpu_step.py). memsnap is attached by hand
(`memsnap_torch.attach()`) or by `memsnap run`'s startup hook, and batches are marked with
`memsnap_torch.step()`, so both recorders cover exactly batches --first..--last: torch's
`_record_memory_history` is switched on right after the step that opens memsnap's window and its
trace is taken right before the step that closes it. An empty_cache() inside the window makes
the allocator free and allocate segments again, which CUPTI sees too. Writes torch's trace entries by action (and
segment addresses) as JSON to --out; tests/gpu/torch_attachment.sh compares them with the spill.
Set MEMSNAP_SKIP_BATCHES=first-1 and MEMSNAP_INTERVAL=last-first+1.
"""
import argparse
import collections
import json
import os

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", type=int, default=4)
    ap.add_argument("--last", type=int, default=8)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--attach", action="store_true", help="attach by hand (else memsnap run's hook did)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import memsnap_torch  # from memsnap's python folder on PYTHONPATH

    if args.attach:
        assert memsnap_torch.attach(), "attach() refused"
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = nn.TransformerEncoderLayer(args.width, 16, 4 * args.width, batch_first=True)
    model = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trace = None
    for batch in range(1, args.last + 2):
        if batch == args.first:
            torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
        x = torch.randn(8, 512, args.width, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if batch == args.first + 1:
            torch.cuda.empty_cache()  # segments freed here, allocated again next batch: both sources see them
        if batch == args.last:
            trace = torch.cuda.memory._snapshot()["device_traces"]
            torch.cuda.memory._record_memory_history(enabled=None)
        memsnap_torch.step()
    entries = [e for t in trace for e in t]
    by_action = collections.Counter(e["action"] for e in entries)
    segments = sorted({e["addr"] for e in entries if e["action"].startswith("segment")})
    out = {"by_action": dict(by_action), "entries": len(entries), "segment_addrs": segments,
           "recording": memsnap_torch.recording(), "memsnap_stats": memsnap_torch._stats(),
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    with open(args.out, "w") as f:
        json.dump(out, f)
    print("attach_count: torch trace %d entries %s; memsnap recording %s" % (len(entries), dict(by_action), out["recording"]))


if __name__ == "__main__":
    main()

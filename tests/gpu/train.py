"""A small PyTorch training loop with NVTX-marked batches, for memsnap's CUPTI capture on a GPU.

It knows nothing of memsnap: run it under `memsnap run -- python3 train.py` or with
CUDA_INJECTION64_PATH / NVTX_INJECTION64_PATH set. Each batch is torch.cuda.nvtx.range_push("step")
... range_pop(). At the end it writes torch's own view of the memory (torch.cuda.memory_stats) as
JSON to --stats, to compare with what memsnap recorded.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--stats", default="")
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = nn.TransformerEncoderLayer(args.width, 8, 4 * args.width, batch_first=True)
    model = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(args.steps):
        torch.cuda.nvtx.range_push("step")
        x = torch.randn(args.batch, args.seq, args.width, device=dev)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()

    s = torch.cuda.memory_stats()
    maps = open("/proc/self/maps").read().splitlines()
    loaded = sorted({line.split()[-1] for line in maps if "libcupti" in line or "libmemsnap" in line})
    out = {
        "backend": torch.cuda.get_allocator_backend(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "steps": args.steps,
        "peak_allocated": s.get("allocated_bytes.all.peak", 0),
        "peak_reserved": s.get("reserved_bytes.all.peak", 0),
        "reserved_now": s.get("reserved_bytes.all.current", 0),
        "segments_allocated": s.get("segment.all.allocated", 0),
        "segments_freed": s.get("segment.all.freed", 0),
        "allocations": s.get("allocation.all.allocated", 0),
        "alloc_retries": s.get("num_alloc_retries", 0),
        "loaded": loaded,
    }
    text = json.dumps(out)
    print("train.py:", text)
    if args.stats:
        with open(args.stats, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())

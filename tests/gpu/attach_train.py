"""A data-parallel-style training loop with planted memory problems, one process per rank, for
memsnap's PyTorch attachment on a GPU (tests/gpu/torch_attachment.sh). It knows nothing of memsnap:
`mpirun -np 4 memsnap run -- python3 attach_train.py` records it through the startup hook, and
batches come from the optimizer's steps (no NVTX ranges, no step marks).

Planted, by rank (RANK or OMPI_COMM_WORLD_RANK): 1 leaks 8 MiB a batch (kept activations), 2 spikes
by 256 MiB in batch --spike-batch, 3 keeps a full unsharded copy of the weights (64 MiB); 0 is clean.
"""
import argparse
import os

import torch
import torch.nn as nn

MiB = 1 << 20


def rank():
    for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if k in os.environ:
            return int(os.environ[k])
    return 0


def kept_activation(t):
    """The leak: a detached copy of an activation kept "for logging", 8 MiB."""
    return t.detach().flatten()[: 2 * MiB].clone()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--spike-batch", type=int, default=5)
    args = ap.parse_args()
    r = rank()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    unsharded = [torch.empty(16 * MiB, device=dev) for _ in range(1)] if r == 3 else []  # 64 MiB fp32
    history = []
    for batch in range(1, args.batches + 1):
        x = torch.randn(2048, 1024, device=dev)
        h = model[1](model[0](x))
        if r == 2 and batch == args.spike_batch:
            scratch = torch.empty(64 * MiB, device=dev)  # 256 MiB for one batch
            scratch.fill_(1.0)
            h = h + scratch[: h.numel()].view_as(h)
            del scratch
        y = model[2](h)
        if r == 1:
            history.append(kept_activation(h))
        loss = y.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    print("attach_train rank %d: %d batches, %d kept, unsharded %d" % (r, args.batches, len(history), len(unsharded)))


if __name__ == "__main__":
    main()

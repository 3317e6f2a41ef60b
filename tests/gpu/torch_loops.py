"""Real PyTorch training loops that write Composer-style memory snapshots, one process per "rank".

Makes the test data in tests/data/torch-loops/ (run on a machine with a GPU and torch 2.11):

    python3 tests/gpu/torch_loops.py --out DIR            all loops, their ranks in parallel
    python3 tests/gpu/torch_loops.py --out DIR --loop mlp_sgd

Each loop is a different real training loop; each has ranks with a planted cause and clean
ranks, written down in DIR/<loop>/manifest.json (the truth the tests check against):
  leak        memory kept across batches (a retained graph, cached activations, saved grads)
  spike       one batch much larger than the others (a longer sequence, a bigger batch)
  unsharded   more persistent memory than its peers, allocated before the window
  clean       nothing wrong

Recording follows Composer's MemorySnapshot callback: history on at the start of batch
`skip_batches`, dumped and off after `interval` batches, the file named
rank{rank}.{batch}.pt.trace.memory_snapshot.pickle with {batch} the window's last batch. None of
the loops uses torch.profiler; loops that use torch.optim get its Optimizer.step annotations,
the others have no annotation at all. fsdp2_ring records like OOMObserver: from program start
into a bounded ring, so its window starts in the middle of a batch and its early blocks carry
frames that the trace no longer has.
"""
import argparse
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20

# loop -> (ranks, {rank: role}, settings)
LOOPS = {
    # Plain MLP, hand-written SGD: no optimizer annotation, no step marks, Python frames.
    "mlp_sgd": (16, {5: "leak", 11: "spike"}, dict(alloc_conf="", stacks="python", context="all")),
    # Small GPT, torch.optim.AdamW (Optimizer.step annotations), expandable segments, C++ frames too.
    "gpt_adamw": (4, {1: "leak", 3: "spike"}, dict(alloc_conf="expandable_segments:True", stacks="all", context="all")),
    # FSDP2 fully_shard (one NCCL process per rank), hand-written SGD, OOMObserver-style ring.
    "fsdp2_ring": (5, {0: "unsharded", 2: "leak", 3: "spike"}, dict(alloc_conf="", stacks="python", context="all")),
    # CNN with gradient accumulation (2 micro-batches a batch), SGD with momentum by hand, frees without frames.
    "cnn_accum": (4, {0: "leak", 2: "spike"}, dict(alloc_conf="expandable_segments:True", stacks="python", context="alloc")),
    # Language model under bf16 autocast, Adam written by hand, a different sequence length every batch.
    "lm_autocast": (4, {3: "leak", 0: "spike"}, dict(alloc_conf="", stacks="python", context="all")),
    # Held out (made after the rules were written, never tuned on): an LSTM with torch.optim.SGD
    # and momentum, C++ and Python frames; a small ViT with Adam and gradient clipping over a
    # longer window (skip 3, interval 5).
    "lstm_sgd": (4, {2: "leak", 1: "spike"}, dict(alloc_conf="", stacks="all", context="all")),
    "vit_adam": (6, {4: "leak", 0: "spike"}, dict(alloc_conf="expandable_segments:True", stacks="python",
                                                  context="all", skip=3, interval=5)),
}
SKIP, INTERVAL = 2, 4
SPIKE_AT = SKIP + 2  # the spike rank's large batch


def snapshot_name(rank, batch):
    return f"rank{rank}.{batch}.pt.trace.memory_snapshot.pickle"


def worker(loop, rank, role, out, ring_entries):
    out_dir = out
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(1234 + rank)
    dev = torch.device("cuda", 0)
    _, _, cfg = LOOPS[loop]
    SKIP, INTERVAL = cfg.get("skip", 2), cfg.get("interval", 4)
    SPIKE_AT = SKIP + 2
    record = lambda max_entries=100000: torch.cuda.memory._record_memory_history(
        enabled="all", context=cfg["context"], stacks=cfg["stacks"], max_entries=max_entries)
    kept = []  # what a leaking rank holds on to
    truth = {"loop": loop, "rank": rank, "role": role}

    def sgd_(params, lr=1e-3):
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
                    p.grad = None

    if loop == "fsdp2_ring":
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(29600 + rank)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
        record(ring_entries)  # from program start, bounded: the window is what the ring keeps
        blocks = [nn.Sequential(nn.Linear(1536, 1536), nn.GELU()).to(dev) for _ in range(6)]
        model = nn.Sequential(*blocks)
        for b in blocks:
            fully_shard(b)
        fully_shard(model)
        if role == "unsharded":  # a full fp32 copy of every weight that the other ranks shard away
            truth["planted_bytes"] = sum(p.numel() * 4 for p in model.parameters())
            kept.extend(p.full_tensor().detach().clone() for p in model.parameters())
        total = SKIP + INTERVAL
        for batch in range(total):
            bs = 2048 if role == "spike" and batch == SPIKE_AT else 256
            x = torch.randn(bs, 1536, device=dev)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            if role == "leak":  # a copy of the first layer's gradient, every batch
                kept.append(blocks[0][0].weight.grad.to_local().detach().clone())
            sgd_(model.parameters())
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(os.path.join(out, snapshot_name(rank, total - 1)))
        torch.cuda.memory._record_memory_history(enabled=None)
        dist.destroy_process_group()
    elif loop == "mlp_sgd":
        model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(2048, 2048), nn.GELU())]).to(dev)
        for batch in range(SKIP + INTERVAL):
            if batch == SKIP:
                record()
            bs = 2048 if role == "spike" and batch == SPIKE_AT else 256
            x = torch.randn(bs, 2048, device=dev)
            y = torch.randn(bs, 2048, device=dev)
            loss = F.mse_loss(model(x), y)
            # The leak: the graph kept alive (retain_graph plus the loss held in a list).
            loss.backward(retain_graph=(role == "leak"))
            if role == "leak":
                kept.append(loss)
            sgd_(model.parameters())
            if batch == SKIP + INTERVAL - 1:
                torch.cuda.memory._dump_snapshot(os.path.join(out, snapshot_name(rank, batch)))
                torch.cuda.memory._record_memory_history(enabled=None)
    elif loop == "gpt_adamw":
        vocab, d = 8192, 512

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(vocab, d)
                layer = nn.TransformerEncoderLayer(d, 8, 2048, batch_first=True)
                self.body = nn.TransformerEncoder(layer, 4)
                self.head = nn.Linear(d, vocab)

            def forward(self, tokens):
                h = self.body(self.emb(tokens))
                return h, self.head(h)

        model = GPT().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for batch in range(SKIP + INTERVAL):
            if batch == SKIP:
                record()
            seq = 1024 if role == "spike" and batch == SPIKE_AT else 256
            tokens = torch.randint(0, vocab, (16, seq), device=dev)
            h, logits = model(tokens)
            loss = F.cross_entropy(logits.view(-1, vocab), tokens.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if role == "leak":  # activations cached "for later analysis"
                kept.append(h.detach())
            if batch == SKIP + INTERVAL - 1:
                torch.cuda.memory._dump_snapshot(os.path.join(out, snapshot_name(rank, batch)))
                torch.cuda.memory._record_memory_history(enabled=None)
    elif loop == "cnn_accum":
        model = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(128, 10)).to(dev)
        momentum = {}
        for batch in range(SKIP + INTERVAL):
            if batch == SKIP:
                record()
            res = 192 if role == "spike" and batch == SPIKE_AT else 64
            for micro in range(2):
                x = torch.randn(32, 3, res, res, device=dev)
                y = torch.randint(0, 10, (32,), device=dev)
                feats = model[:8](x)
                loss = F.cross_entropy(model[8:](feats), y) / 2
                loss.backward()
                if role == "leak":  # every input kept "for a later look", never trimmed
                    kept.append(x)
            with torch.no_grad():
                for p in model.parameters():
                    buf = momentum.get(p)
                    if buf is None:
                        buf = momentum[p] = torch.zeros_like(p)
                    buf.mul_(0.9).add_(p.grad)
                    p.add_(buf, alpha=-1e-3)
                    p.grad = None
            if batch == SKIP + INTERVAL - 1:
                torch.cuda.memory._dump_snapshot(os.path.join(out, snapshot_name(rank, batch)))
                torch.cuda.memory._record_memory_history(enabled=None)
    elif loop == "lm_autocast":
        vocab, d = 4096, 768
        emb = nn.Embedding(vocab, d).to(dev)
        layers = nn.ModuleList([nn.TransformerEncoderLayer(d, 12, 3072, batch_first=True) for _ in range(3)]).to(dev)
        head = nn.Linear(d, vocab).to(dev)
        params = list(emb.parameters()) + list(layers.parameters()) + list(head.parameters())
        state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
        lengths = [192, 256, 160, 224, 240, 176, 208]
        for batch in range(SKIP + INTERVAL):
            if batch == SKIP:
                record()
            seq = 1536 if role == "spike" and batch == SPIKE_AT else lengths[(batch + rank) % len(lengths)]
            tokens = torch.randint(0, vocab, (8, seq), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = emb(tokens)
                for layer in layers:
                    h = layer(h)
                logits = head(h)
            loss = F.cross_entropy(logits.float().view(-1, vocab), tokens.view(-1))
            loss.backward()
            with torch.no_grad():  # Adam, by hand
                for p, (m, v) in zip(params, state):
                    m.mul_(0.9).add_(p.grad, alpha=0.1)
                    v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                    p.addcdiv_(m, v.sqrt().add_(1e-8), value=-1e-4)
                    p.grad = None
            if role == "leak":  # last hidden state kept, as a probe cache would
                kept.append(h.detach().float())
            if batch == SKIP + INTERVAL - 1:
                torch.cuda.memory._dump_snapshot(os.path.join(out, snapshot_name(rank, batch)))
                torch.cuda.memory._record_memory_history(enabled=None)
    elif loop == "lstm_sgd":
        lstm = nn.LSTM(512, 1024, num_layers=2, batch_first=True).to(dev)
        head = nn.Linear(1024, 512).to(dev)
        params = list(lstm.parameters()) + list(head.parameters())
        opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
        for batch in range(SKIP + INTERVAL):
            if batch == SKIP:
                record()
            seq = 512 if role == "spike" and batch == SPIKE_AT else 128
            x = torch.randn(32, seq, 512, device=dev)
            seq_out, _ = lstm(x)
            loss = F.mse_loss(head(seq_out), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if role == "leak":  # predictions kept for an epoch-end metric
                kept.append(seq_out.detach())
            if batch == SKIP + INTERVAL - 1:
                torch.cuda.memory._dump_snapshot(os.path.join(out_dir, snapshot_name(rank, batch)))
                torch.cuda.memory._record_memory_history(enabled=None)
    elif loop == "vit_adam":
        d = 384

        class ViT(nn.Module):
            def __init__(self):
                super().__init__()
                self.patch = nn.Conv2d(3, d, 8, stride=8)
                self.cls = nn.Parameter(torch.zeros(1, 1, d))
                layer = nn.TransformerEncoderLayer(d, 6, 4 * d, batch_first=True, norm_first=True)
                self.body = nn.TransformerEncoder(layer, 6)
                self.head = nn.Linear(d, 1000)

            def forward(self, img):
                t = self.patch(img).flatten(2).transpose(1, 2)
                t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1)
                return t, self.head(self.body(t)[:, 0])

        model = ViT().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
        for batch in range(SKIP + INTERVAL):
            if batch == SKIP:
                record()
            bs = 384 if role == "spike" and batch == SPIKE_AT else 64
            img = torch.randn(bs, 3, 64, 64, device=dev)
            labels = torch.randint(0, 1000, (bs,), device=dev)
            tokens, logits = model(img)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if role == "leak":  # patch embeddings kept for a visualisation
                kept.append(tokens.detach())
            if batch == SKIP + INTERVAL - 1:
                torch.cuda.memory._dump_snapshot(os.path.join(out_dir, snapshot_name(rank, batch)))
                torch.cuda.memory._record_memory_history(enabled=None)
    if kept and role == "leak":
        truth["kept_bytes"] = sum(t.numel() * t.element_size() for t in kept if torch.is_tensor(t))
    with open(os.path.join(out, f"truth.rank{rank}.json"), "w") as f:
        json.dump(truth, f)


def run_loop(loop, out, ring_entries=0):
    ranks, roles, cfg = LOOPS[loop]
    d = os.path.join(out, loop)
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=cfg["alloc_conf"])
    procs = []
    for r in range(ranks):
        role = roles.get(r, "clean")
        cmd = [sys.executable, __file__, "--worker", loop, "--rank", str(r), "--role", role, "--out", d,
               "--ring", str(ring_entries)]
        procs.append((r, subprocess.Popen(cmd, env=env)))
    codes = {r: p.wait() for r, p in procs}
    truths = []
    for r in range(ranks):
        path = os.path.join(d, f"truth.rank{r}.json")
        if os.path.exists(path):
            truths.append(json.load(open(path)))
            os.remove(path)
    skip, interval = cfg.get("skip", SKIP), cfg.get("interval", INTERVAL)
    manifest = {"loop": loop, "world_size": ranks, "skip_batches": skip, "interval": interval,
                "spike_batch": skip + 2, "settings": cfg, "ring_entries": ring_entries,
                "exit_codes": codes, "ranks": truths}
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(loop, "exit codes", codes, flush=True)


def ring_size(out):
    """Entries per batch of the ring loop, measured by one probe rank that records everything."""
    probe = os.path.join(out, "_probe")
    os.makedirs(probe, exist_ok=True)
    subprocess.run([sys.executable, __file__, "--worker", "fsdp2_ring", "--rank", "0", "--role", "clean",
                    "--out", probe, "--ring", "1000000"], check=True)
    import pickle
    snap = pickle.load(open(os.path.join(probe, snapshot_name(0, SKIP + INTERVAL - 1)), "rb"))
    n = len(snap["device_traces"][0])
    subprocess.run(["rm", "-rf", probe])
    # The whole program's trace covers init plus SKIP + INTERVAL batches; keep about 3.5 batches.
    per_batch = n / (SKIP + INTERVAL + 1)
    print("fsdp2_ring probe: trace entries", n, "about", int(per_batch), "per batch", flush=True)
    return int(per_batch * 3.5)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--loop", action="append")
    ap.add_argument("--worker")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--role")
    ap.add_argument("--ring", type=int, default=0)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.rank, a.role, a.out, a.ring)
        sys.exit(0)
    t0 = time.time()
    for loop in a.loop or list(LOOPS):
        try:
            ring = ring_size(a.out) if loop == "fsdp2_ring" else 0
            run_loop(loop, a.out, ring)
        except Exception as e:  # the other loops still run
            print(loop, "failed:", e, flush=True)
    print("all loops in", round(time.time() - t0, 1), "s", flush=True)

"""Pairs of real 4-rank PyTorch runs for `memsnap diff` (issue #29): a base run and a new run of
the same loop with one known change. Makes tests/data/torch-diff/ on a machine with a GPU and
torch 2.11 (tests/gpu/make_diff_data.sh runs them all):

    python3 tests/gpu/diff_loops.py --pair leak_fixed --side base --out DIR   DIR/leak_fixed/base/*.pickle
    python3 tests/gpu/diff_loops.py --all --out DIR                           every pair, both sides
    python3 tests/gpu/diff_loops.py --manifest DIR                            DIR/MANIFEST.json (no torch needed)

Pairs (the change from base to new):
  leak_fixed       transformers GPT-2 (from a config), AdamW; base rank 1 keeps every batch's token
                   probabilities in a list (the leak, one line); new drops that line.
  checkpointing    transformers Llama (from a config), AdamW; new turns on activation checkpointing
                   of its decoder layers (torch.utils.checkpoint, non-reentrant).
  batch_doubled    torchvision resnet18 (weights=None), SGD with momentum; new doubles the batch.
  same_twice       torch.compile'd torchvision squeezenet1_1, AdamW; the same loop run twice.
  unsharded_fixed  FSDP by hand (flat fp32 shards, an all-gather stood in by torch.cat of shards in
                   the forward, Adam over the shards, no NCCL); base rank 2 keeps layer 1 unsharded
                   (a full weight and full Adam state); new shards it like the other ranks.

Every rank is its own process on the one GPU, with RANK, LOCAL_RANK and WORLD_SIZE set. Recording:
stack state from program start (`_record_memory_history(enabled="state")`: the blocks live at the
dump keep the frames that allocated them, parameters and optimizer state included), the full
history from batch SKIP (Composer's MemorySnapshot: stacks="python", context="all"), dumped after
INTERVAL batches as rank{rank}.{batch}.pt.trace.memory_snapshot.pickle. Each side writes
truth.json: per rank the peak allocated and reserved over the window (torch.cuda.max_memory_*),
each batch's peak, memory allocated at each batch's start (persistent), what the forward leaves
allocated, parameter and optimizer-state bytes, and the planted bytes.
"""
import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import time

WORLD = 4
SKIP, INTERVAL = 1, 3  # Composer's defaults: batches 1..3 recorded, files named for batch 3
MAX_ENTRIES = 200000
LEAK_RANK = 1
UNSHARDED_RANK = 2
PAIRS = ["leak_fixed", "checkpointing", "batch_doubled", "same_twice", "unsharded_fixed"]


def snapshot_name(rank, batch):
    return f"rank{rank}.{batch}.pt.trace.memory_snapshot.pickle"


# ---------------------------------------------------------------- the loops (one per pair)

def loop_leak_fixed(side, rank, dev, truth, mark):
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config
    vocab, seq, bs = 4096, 128, 4
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=256, n_layer=2, n_head=4)
    model = AutoModelForCausalLM.from_config(cfg).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    leaks = side == "base" and rank == LEAK_RANK
    kept = []

    def step(batch):
        truth.setdefault("planted_bytes_at_batch_start", []).append(sum(t.nbytes for t in kept))
        ids = torch.randint(0, vocab, (bs, seq), device=dev)
        out = model(input_ids=ids, labels=ids)
        mark("forward")
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if leaks:
            kept.append(out.logits.detach().softmax(-1))  # SITE leak: token probabilities kept for a calibration plot
            truth["planted_bytes_per_batch"] = kept[-1].nbytes
        truth["planted_bytes"] = sum(t.nbytes for t in kept)

    return step, model, opt


def loop_checkpointing(side, rank, dev, truth, mark):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    vocab, seq, bs = 2048, 256, 8
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq)
    model = AutoModelForCausalLM.from_config(cfg).to(dev)
    if side == "new":  # SITE checkpointing: torch.utils.checkpoint on every decoder layer
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    truth["gradient_checkpointing"] = bool(getattr(model, "is_gradient_checkpointing", False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch):
        ids = torch.randint(0, vocab, (bs, seq), device=dev)
        out = model(input_ids=ids, labels=ids, use_cache=False)  # SITE forward_llama
        mark("forward")
        out.loss.backward()  # SITE backward: with checkpointing, each layer's forward runs again here
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model, opt


def loop_batch_doubled(side, rank, dev, truth, mark):
    import torch
    import torch.nn.functional as F
    import torchvision
    bs = 16 if side == "base" else 32
    truth["batch_size"] = bs
    model = torchvision.models.resnet18(weights=None, num_classes=100).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step(batch):
        images = torch.randn(bs, 3, 96, 96, device=dev)  # SITE input
        labels = torch.randint(0, 100, (bs,), device=dev)
        loss = F.cross_entropy(model(images), labels)  # SITE forward_resnet
        mark("forward")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model, opt


def loop_same_twice(side, rank, dev, truth, mark):
    import torch
    import torch.nn.functional as F
    import torchvision
    bs = 32
    model = torchvision.models.squeezenet1_1(weights=None, num_classes=100).to(dev)
    model.train()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch):
        images = torch.randn(bs, 3, 64, 64, device=dev)
        labels = torch.randint(0, 100, (bs,), device=dev)
        loss = F.cross_entropy(compiled(images), labels)  # SITE forward_compiled
        mark("forward")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model, opt


def loop_unsharded_fixed(side, rank, dev, truth, mark):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    d, n_layers, bs = 2048, 4, 512
    keep_full = side == "base" and rank == UNSHARDED_RANK

    def all_gather(shard, shape):
        # What FSDP's all-gather gives: every rank's shard side by side (this rank's shard stands
        # in for the others: no collective runs here).
        return torch.cat([shard] * WORLD).view(shape)  # SITE all_gather

    def build_params():
        params = []
        for i in range(n_layers):
            if keep_full and i == 1:  # the wrap policy missed layer 1 on this rank
                params.append(nn.Parameter(torch.randn(d, d, device=dev) * 0.02))  # SITE unsharded
            else:
                params.append(nn.Parameter(torch.randn(d * d // WORLD, device=dev) * 0.02))  # SITE shard
        return params

    params = build_params()
    truth["unsharded_layers"] = [1] if keep_full else []
    truth["full_weight_bytes"] = d * d * 4
    truth["shard_bytes"] = d * d * 4 // WORLD
    opt = torch.optim.Adam(params, lr=1e-4)

    def forward(x):
        for p in params:
            w = p.view(d, d) if p.numel() == d * d else all_gather(p, (d, d))
            x = F.gelu(F.linear(x, w))  # SITE forward_fsdp
        return x

    def step(batch):
        x = torch.randn(bs, d, device=dev)
        loss = forward(x).pow(2).mean()
        mark("forward")
        loss.backward()
        opt.step()  # SITE opt_step
        opt.zero_grad(set_to_none=True)

    class Holder:
        def parameters(self):
            return params

    return step, Holder(), opt


LOOPS = {"leak_fixed": loop_leak_fixed, "checkpointing": loop_checkpointing, "batch_doubled": loop_batch_doubled,
         "same_twice": loop_same_twice, "unsharded_fixed": loop_unsharded_fixed}


# ---------------------------------------------------------------- one rank

def worker(pair, side, rank, out):
    import torch
    torch.manual_seed(1234 + rank)  # the same on both sides: only the planted change differs
    dev = torch.device("cuda", 0)
    mem = torch.cuda.memory
    mem._record_memory_history(enabled="state", context="state", stacks="python")
    # clear_history: drop whatever the state mode put in the trace before the window opens.
    impl = getattr(mem, "_record_memory_history_impl", mem._record_memory_history)
    clear = {"clear_history": True} if "clear_history" in inspect.signature(impl).parameters else {}
    truth = {"pair": pair, "side": side, "rank": rank, "torch": torch.__version__,
             "device": torch.cuda.get_device_name(0), "clear_history": bool(clear)}
    forward_held = []
    start = [0]

    def mark(what):
        if what == "forward":
            torch.cuda.synchronize()
            forward_held.append(torch.cuda.memory_allocated() - start[0])

    step, model, opt = LOOPS[pair](side, rank, dev, truth, mark)
    truth["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    batch_peaks, batch_reserved, at_start = [], [], []
    for batch in range(SKIP + INTERVAL):
        torch.cuda.synchronize()
        if batch == SKIP:
            mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES, **clear)
            truth["window_start_unix_us"] = int(time.time() * 1e6)
        torch.cuda.reset_peak_memory_stats()
        start[0] = torch.cuda.memory_allocated()
        at_start.append(start[0])
        step(batch)
        torch.cuda.synchronize()
        batch_peaks.append(torch.cuda.max_memory_allocated())
        batch_reserved.append(torch.cuda.max_memory_reserved())
    at_end = torch.cuda.memory_allocated()
    last = SKIP + INTERVAL - 1
    path = os.path.join(out, snapshot_name(rank, last))
    mem._dump_snapshot(path)
    mem._record_memory_history(enabled=None)
    opt_state = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.is_cuda:
                opt_state += v.numel() * v.element_size()
    w = slice(SKIP, None)
    truth.update({
        "window_batches": list(range(SKIP, SKIP + INTERVAL)),
        "peak_allocated": max(batch_peaks[w]), "peak_reserved": max(batch_reserved[w]),
        "batch_peak_allocated": batch_peaks, "batch_peak_reserved": batch_reserved,
        "allocated_at_batch_start": at_start, "allocated_at_end": at_end,
        "forward_held": forward_held, "opt_state_bytes": opt_state,
        "pickle_bytes": os.path.getsize(path),
    })
    truth.setdefault("planted_bytes", 0)
    with open(os.path.join(out, f"truth.rank{rank}.json"), "w") as f:
        json.dump(truth, f)


def run_side(pair, side, out):
    d = os.path.join(out, pair, side)
    os.makedirs(d, exist_ok=True)
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD), TRANSFORMERS_VERBOSITY="error",
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        cmd = [sys.executable, __file__, "--worker", "--pair", pair, "--side", side, "--rank", str(r), "--out", d]
        procs.append(subprocess.Popen(cmd, env=env))
    return d, procs


def finish_side(pair, side, d, procs):
    codes = {r: p.wait() for r, p in enumerate(procs)}
    ranks = []
    for r in range(WORLD):
        p = os.path.join(d, f"truth.rank{r}.json")
        if os.path.exists(p):
            ranks.append(json.load(open(p)))
            os.remove(p)
    with open(os.path.join(d, "truth.json"), "w") as f:
        json.dump({"pair": pair, "side": side, "skip_batches": SKIP, "interval": INTERVAL, "exit_codes": codes,
                   "ranks": ranks}, f, indent=1)
    print(pair, side, "exit codes", codes, "peaks", [t.get("peak_allocated") for t in ranks], flush=True)


def run_pair(pair, out):
    t0 = time.time()
    if pair == "same_twice":  # one after the other, as a user reruns (the second finds the compile cache)
        for side in ("base", "new"):
            finish_side(pair, side, *run_side(pair, side, out))
    else:  # both sides at once: 8 processes on the GPU
        started = [(side, *run_side(pair, side, out)) for side in ("base", "new")]
        for side, d, procs in started:
            finish_side(pair, side, d, procs)
    print(pair, "in", round(time.time() - t0, 1), "s", flush=True)


# ---------------------------------------------------------------- the manifest (here, no torch)

def site_lines():
    """{tag: line} for the lines marked a SITE comment in this file."""
    lines = {}
    for n, text in enumerate(open(__file__).read().splitlines(), 1):
        m = re.search(r"# SITE (\w+)", text)
        if m and not text.lstrip().startswith("#"):
            lines[m.group(1)] = n
    return lines


def user_site(frames):
    """The innermost frame outside torch (this file's, transformers', torchvision's or inductor's
    generated code), as 'function file:line'; '<no frames>' when there is none."""
    for f in frames or []:
        fn = f["filename"]
        if "site-packages/torch/" not in fn and not fn.startswith("<"):
            short = fn.split("site-packages/")[-1].split("tests/gpu/")[-1]
            return f"{f['name']} {short}:{f['line']}"
    return "<no frames>"


def pickle_view(path, top=8):
    """Replays a pickle's trace: its peak allocated; bytes by user_site and by the line of this file at
    that peak and at the dump; bytes the backward allocated re-running checkpointed forwards."""
    import pickle
    snap = pickle.load(open(path, "rb"))
    trace = snap["device_traces"][0]
    loop_line = lambda fr: next((f"{f['name']} diff_loops.py:{f['line']}" for f in fr or []
                                 if f["filename"].endswith("diff_loops.py")), "<no frame of diff_loops.py>")
    key = lambda fr: (user_site(fr), loop_line(fr))
    at_dump = {}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                at_dump[b["address"]] = (b["size"], key(b.get("frames")))
    allocated_in_trace = {e["addr"] for e in trace if e["action"] == "alloc"}
    live, seen = {a: v for a, v in at_dump.items() if a not in allocated_in_trace}, set()  # live before the window
    for e in trace:  # ... or freed by the trace before it allocates that address
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_requested" and e["addr"] not in seen and e["addr"] not in live:
            live[e["addr"]] = (e["size"], key(e.get("frames")))
    total = start = sum(v[0] for v in live.values())
    peak, at_peak, recompute = total, dict(live), 0
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], key(e.get("frames")))
            total += e["size"]
            recompute += e["size"] if any(f["name"] == "recompute_fn" for f in e["frames"]) else 0
            if total > peak:
                peak, at_peak = total, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]

    def by(blocks, i):
        out = {}
        for size, k in blocks.values():
            out[k[i]] = out.get(k[i], 0) + size
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])

    return {"trace_entries": len(trace), "allocated_at_window_start": start, "peak_allocated": peak,
            "at_peak_by_site": by(at_peak, 0), "at_peak_by_loop_line": by(at_peak, 1),
            "at_dump_by_site": by(at_dump, 0), "allocated_by_checkpoint_recompute": recompute}


def manifest(data):
    here = "tests/gpu/diff_loops.py"
    L = site_lines()
    site = lambda fn, tag: {"function": fn, "file": here, "line": L[tag]}
    sides = {p: {s: json.load(open(os.path.join(data, p, s, "truth.json"))) for s in ("base", "new")} for p in PAIRS}

    def per_rank(pair, key):
        return {s: [t[key] for t in sorted(sides[pair][s]["ranks"], key=lambda t: t["rank"])] for s in ("base", "new")}

    out = {"about": "Pairs of real 4-rank torch runs for memsnap diff (issue #29), made by tests/gpu/make_diff_data.sh "
                    "with tests/gpu/diff_loops.py (line numbers below are that file's, as recorded). Each side holds one "
                    "Composer-style pickle per rank (rank{r}.3.pt.trace.memory_snapshot.pickle: history from batch 1 "
                    "for 3 batches, stacks=python, context=all; stack state recorded from program start, so blocks "
                    "live before the window, parameters and optimizer state included, keep their frames) and "
                    "truth.json (per rank, measured on the GPU: peak_allocated/peak_reserved over the window from "
                    "torch.cuda.max_memory_*, batch_peak_allocated for batches 0..3, allocated_at_batch_start "
                    "(persistent), forward_held (allocated after the forward minus at the batch's start), param_bytes, "
                    "opt_state_bytes, planted_bytes). torch's numbers count allocator blocks; from_pickles replays each "
                    "trace (allocation sizes): its peak and the bytes at it by the innermost frame outside torch "
                    "(site) and by this file's line. 'nothing_else' says what must not be named as changed.",
           "world_size": WORLD, "skip_batches": SKIP, "interval": INTERVAL, "source": here,
           "torch": sides["leak_fixed"]["base"]["ranks"][0]["torch"],
           "device": sides["leak_fixed"]["base"]["ranks"][0]["device"], "pairs": {}}
    P = out["pairs"]
    for pair in PAIRS:
        P[pair] = {k: per_rank(pair, k) for k in ("peak_allocated", "peak_reserved", "allocated_at_batch_start",
                                                   "forward_held", "param_bytes", "opt_state_bytes")}
        v = P[pair]["peak_allocated"]
        P[pair]["peak_allocated_delta"] = [n - b for b, n in zip(v["base"], v["new"])]
        P[pair]["exit_codes"] = {s: sides[pair][s]["exit_codes"] for s in ("base", "new")}
        P[pair]["from_pickles"] = {s: [pickle_view(os.path.join(data, pair, s, snapshot_name(r, SKIP + INTERVAL - 1)))
                                       for r in range(WORLD)] for s in ("base", "new")}

    lb = sides["leak_fixed"]["base"]["ranks"][LEAK_RANK]
    P["leak_fixed"].update({
        "model": "transformers GPT2Config(vocab 4096, n_positions 128, n_embd 256, n_layer 2, n_head 4) via "
                 "AutoModelForCausalLM.from_config; AdamW; batch 4x128 tokens",
        "change": "base rank 1 appends out.logits.detach().softmax(-1) to a list after every batch's step (the "
                  "leak); new drops that line",
        "ranks_changed": [LEAK_RANK],
        "sites": [dict(site("step", "leak"), category="other (a user tensor kept)", effect="vanishes on rank 1",
                       bytes_per_batch=lb["planted_bytes_per_batch"], base_bytes_at_dump=lb["planted_bytes"],
                       new_bytes_at_dump=0, base_bytes_at_peak=lb["planted_bytes_at_batch_start"][-1])],
        "planted_bytes": {"rank": LEAK_RANK, "per_batch": lb["planted_bytes_per_batch"], "at_dump": lb["planted_bytes"],
                          "at_batch_start": lb["planted_bytes_at_batch_start"]},
        "expected": "rank 1: the leak site and its bytes gone; its peak falls by what was kept before the last batch "
                    "(3 x 8 MiB = 25165824 in the trace replay; torch's max_memory_allocated falls by 25690112, "
                    "512 KiB more: allocator blocks not split beside the kept tensors); its memory at batch starts no "
                    "longer grows by 8 MiB a batch; ranks 0, 2 and 3 equal to the byte in both runs",
        "findings": {"base": "leak on rank 1 at step diff_loops.py:72, 8 MiB a batch", "new": "none"},
        "nothing_else": "no other site, rank or category (GPT-2's sites in transformers/models/gpt2/modeling_gpt2.py, "
                        "AdamW state at step diff_loops.py:69, parameters at loop_leak_fixed diff_loops.py:57)"})

    P["checkpointing"].update({
        "model": "transformers LlamaConfig(vocab 2048, hidden 256, intermediate 704, 4 layers, 4 heads) via "
                 "AutoModelForCausalLM.from_config; AdamW; batch 8x256 tokens",
        "change": "new: model.gradient_checkpointing_enable(use_reentrant=False): torch.utils.checkpoint around every "
                  "LlamaDecoderLayer (transformers/modeling_layers.py __call__)",
        "ranks_changed": [0, 1, 2, 3],
        "sites": [
            {"function": "forward (LlamaMLP, LlamaAttention, apply_rotary_pos_emb, LlamaRMSNorm, LlamaDecoderLayer)",
             "file": "transformers/models/llama/modeling_llama.py", "category": "activations",
             "effect": "shrink at the peak: only each layer's input stays from the forward",
             "loop_line": dict(site("step", "forward_llama"), base_at_peak="from_pickles[base][r].at_peak_by_loop_line")},
            {"function": "the same modeling_llama.py forwards, called from recompute_fn / unpack_hook",
             "file": "torch/utils/checkpoint.py", "category": "activations recomputed during the backward",
             "effect": "new: allocations in the backward (autograd thread, no frame of diff_loops.py) whose stacks "
                       "run through checkpoint.py; from_pickles[*].allocated_by_checkpoint_recompute is 0 in base"},
        ],
        "expected": "every rank: forward_held and the peak fall (numbers above); the activations at modeling_llama.py "
                    "shrink at the peak; recomputation shows in the backward; parameters (param_bytes), AdamW state "
                    "(opt_state_bytes, step diff_loops.py:97) and memory at batch starts unchanged",
        "findings": {"base": "none", "new": "none"},
        "nothing_else": "parameters, optimizer state, persistent memory, the loss and logits (LlamaForCausalLM.forward, "
                        "transformers/loss/loss_utils.py) unchanged"})

    bb = sides["batch_doubled"]
    fh = per_rank("batch_doubled", "forward_held")
    P["batch_doubled"].update({
        "model": "torchvision resnet18(weights=None, num_classes=100), SGD momentum 0.9 and weight decay, 3x96x96",
        "change": "batch size 16 -> 32", "ranks_changed": [0, 1, 2, 3],
        "batch_size": {"base": bb["base"]["ranks"][0]["batch_size"], "new": bb["new"]["ranks"][0]["batch_size"]},
        "forward_held_ratio": [round(n[-1] / b[-1], 3) for b, n in zip(fh["base"], fh["new"])],
        "sites": [dict(site("step", "forward_resnet"), category="activations",
                       effect="about 2x what the forward holds (forward_held_ratio); the sites under it are in "
                              "torchvision/models/resnet.py"),
                  dict(site("step", "input"), category="activations (the input batch)", effect="exactly 2x"),
                  {"function": "the backward (autograd thread, no Python frames)", "category": "gradients",
                   "effect": "grows: activation gradients scale with the batch; the parameters' gradients do not"}],
        "expected": "every rank: activations about 2x, peak grows (numbers above); parameters (param_bytes, "
                    "loop_batch_doubled diff_loops.py:109) and optimizer state (momentum buffers, opt_state_bytes, "
                    "step diff_loops.py:119) unchanged in bytes requested",
        "noise": "memory at batch starts is 917504 bytes higher in new, all at step diff_loops.py:119 (the momentum "
                 "buffers made in batch 0): allocator blocks rounded differently, the same tensors and sizes",
        "findings": {"base": "none", "new": "none"},
        "nothing_else": "parameter and optimizer-state sites unchanged (within the 917504-byte block rounding)"})

    P["same_twice"].update({
        "model": "torch.compile(torchvision squeezenet1_1(weights=None, num_classes=100)), AdamW, batch 32x3x64x64",
        "change": "none: the same command run twice, one after the other (the second run loads inductor's cache, "
                  "so batch 0, before the window, peaks lower: batch_peak_allocated[0])",
        "ranks_changed": [], "sites": [], "findings": {"base": "none", "new": "none"}, "nothing_else": "everything",
        "expected": "no change in memory on any rank: every number above equal to the byte inside the window"})

    ub = sides["unsharded_fixed"]["base"]["ranks"][UNSHARDED_RANK]
    full, shard = ub["full_weight_bytes"], ub["shard_bytes"]
    P["unsharded_fixed"].update({
        "model": "FSDP by hand: 4 layers of 2048x2048 fp32 weights kept as flat shards of 1/4, gathered in the forward "
                 "by all_gather (torch.cat of the shard 4 times; no NCCL), GELU MLP, Adam over the shards, batch 512",
        "change": "base rank 2 keeps layer 1 as a full 2048x2048 parameter (never sharded, never gathered); new "
                  "shards it like every other rank",
        "ranks_changed": [UNSHARDED_RANK],
        "sites": [
            dict(site("build_params", "unsharded"), category="parameters", base_bytes=full, new_bytes=0, effect="gone"),
            dict(site("build_params", "shard"), category="parameters", base_bytes=3 * shard, new_bytes=4 * shard,
                 effect="grows by one shard on rank 2"),
            dict(site("step", "opt_step"), category="optimizer state (Adam's exp_avg, exp_avg_sq: torch/optim/adam.py)",
                 base_bytes=2 * (full + 3 * shard), new_bytes=2 * 4 * shard, effect="falls on rank 2"),
            dict(site("all_gather", "all_gather"), category="all_gather (gathered weights)", base_bytes_at_peak=
                 2 * full, new_bytes_at_peak=3 * full, effect="grows by one gathered weight on rank 2"),
        ],
        "planted_bytes": {"rank": UNSHARDED_RANK, "param_extra": full - shard, "adam_state_extra": 2 * (full - shard),
                          "persistent_extra": 3 * (full - shard)},
        "expected": "rank 2's memory at batch starts (persistent) falls by 3 x (full - shard) = 37748736 to the other "
                    "ranks'; its peak falls by 20971520 (36 MiB persistent less, 16 MiB more gathered); ranks 0, 1, 3 "
                    "equal to the byte",
        "findings": {"base": "rank 2 holds 36 MiB more than its peers at every batch boundary", "new": "none"},
        "nothing_else": "ranks 0, 1, 3 unchanged; on rank 2 nothing beyond the four sites above"})
    with open(os.path.join(data, "MANIFEST.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", os.path.join(data, "MANIFEST.json"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--pair", choices=PAIRS, action="append")
    ap.add_argument("--side", choices=["base", "new"])
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--manifest", metavar="DATA_DIR")
    a = ap.parse_args()
    if a.manifest:
        manifest(a.manifest)
    elif a.worker:
        worker(a.pair[0], a.side, a.rank, a.out)
    elif a.side:
        for pair in a.pair:
            finish_side(pair, a.side, *run_side(pair, a.side, a.out))
    else:
        t0 = time.time()
        for pair in (PAIRS if a.all else a.pair):
            try:
                run_pair(pair, a.out)
            except Exception as e:  # the other pairs still run
                print(pair, "failed:", e, flush=True)
        print("all pairs in", round(time.time() - t0, 1), "s", flush=True)

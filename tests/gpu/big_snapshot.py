"""Records a real PyTorch memory snapshot of a large model, for issue #30's import benchmark.

A 32-layer Llama-style causal LM from transformers (random weights, no download), trained with
AdamW for --steps steps under torch.cuda.memory._record_memory_history(stacks=...), then dumped
with _dump_snapshot: the size and shape of snapshot that users of big models bring to memsnap.

  python3 tests/gpu/big_snapshot.py --stacks all --out big_all.pickle
  python3 tests/gpu/big_snapshot.py --stacks python --out big_python.pickle
"""
import argparse
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stacks", choices=["all", "python"], default="all")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-entries", type=int, default=2_000_000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        max_position_embeddings=args.seq,
    )
    model = LlamaForCausalLM(config).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")

    torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
    for step in range(args.steps):
        with torch.profiler.record_function(f"ProfilerStep#{step}"):
            out = model(input_ids=tokens, labels=tokens)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._dump_snapshot(args.out)
    torch.cuda.memory._record_memory_history(enabled=None)
    entries = sum(len(t) for t in snap["device_traces"])
    print(f"{args.out}: {os.path.getsize(args.out) / 1e6:.1f} MB, stacks={args.stacks}, "
          f"{args.layers} layers x {args.hidden}, {args.steps} steps, {entries} trace entries")


if __name__ == "__main__":
    main()

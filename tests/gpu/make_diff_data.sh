#!/usr/bin/env bash
# Records the real pairs of issue #29 (memsnap diff) on a GPU machine with torch 2.11, from the
# repo root: OUT/<pair>/{base,new}/rank{r}.3.pt.trace.memory_snapshot.pickle and truth.json, for
# the pairs leak_fixed checkpointing batch_doubled same_twice unsharded_fixed (tests/gpu/diff_loops.py).
# Then, here: copy OUT into tests/data/torch-diff/ and write its manifest with
#   python3 tests/gpu/diff_loops.py --manifest tests/data/torch-diff
set -uo pipefail
OUT="${1:?usage: make_diff_data.sh OUT}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
python3 tests/gpu/diff_loops.py --all --out "$OUT"
du -sh "$OUT" "$OUT"/*/

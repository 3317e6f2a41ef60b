#!/usr/bin/env bash
# Records the real loops of issue #27 on a GPU machine with torch 2.11 (run from the repo root):
#   OUT/torch-loops/{oom_caught,spike16}/         a caught OOM; a 16-rank loop with one small spike
#   OUT/torch-stacks/{python,all}/<loop>/         the same loops with stacks="python" and "all"
# Copy them into tests/data/ (torch-stacks as tests/data/torch-stacks/<loop>/{python,all}).
set -uo pipefail
OUT="${1:?usage: make_trust_data.sh OUT}"
mkdir -p "$OUT"
factor=$(python3 tests/gpu/torch_loops.py --out "$OUT" --calibrate-spike16 | tee "$OUT/calibration.txt" | awk '/^TL_SPIKE_FACTOR/ {print $2}')
echo "spike16 factor: $factor"
TL_SPIKE_FACTOR="$factor" python3 tests/gpu/torch_loops.py --out "$OUT/torch-loops" --loop oom_caught --loop spike16
pids=()
for stacks in python all; do
  TL_STACKS=$stacks TL_RANKS=2 python3 tests/gpu/torch_loops.py --out "$OUT/torch-stacks/$stacks" \
    --loop mlp_sgd --loop gpt_adamw --loop lstm_sgd --loop vit_adam --loop fsdp_unshard >"$OUT/stacks-$stacks.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$OUT"/stacks-*.log | grep -v Warning | tail -20
du -sh "$OUT"/*/*/ 2>/dev/null

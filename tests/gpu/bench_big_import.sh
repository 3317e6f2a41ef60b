#!/usr/bin/env bash
# Issue #30 on the GPU machine: records real snapshots of a large model (tests/gpu/big_snapshot.py,
# stacks="all" and "python") and times memsnap import against Python's pickle.load on them
# (tests/gpu/bench_big_import.py), with an earlier memsnap when .carry/bin/memsnap_old is there.
# Stage first (here): strip build/bin/memsnap into .carry/bin/, libmemsnap.so.0 into .carry/lib/,
# the Debian libraries the machine lacks into .carry/deps/ (as tests/gpu/stage.sh does); run with
# carry [".carry"]. Snapshots and results go to ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
export LD_LIBRARY_PATH="$PWD/.carry/lib:$PWD/.carry/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nproc; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
# stacks="python" first (quick); "all" symbolizes every C++ frame and may take long: each
# recording gets GEN_LIMIT seconds (default 300), and the bench runs on the pickles that came out.
pickles=()
for stacks in python all; do
  p="$out/big_$stacks.pickle"
  if [ ! -s "$p" ]; then
    SECONDS=0
    timeout "${GEN_LIMIT:-300}" python3 tests/gpu/big_snapshot.py --stacks "$stacks" --out "$p" "$@" ||
      { echo "bench_big_import: recording stacks=$stacks failed or ran past ${GEN_LIMIT:-300} s"; rm -f "$p"; continue; }
    echo "recorded in $SECONDS s"
  fi
  pickles+=("$p")
done
[ ${#pickles[@]} -gt 0 ] || exit 1
last="${pickles[-1]}"
.carry/bin/memsnap import "$last" --rank 0 --batch 1 -o "$out/big.h5" --overwrite && .carry/bin/memsnap info "$out/big.h5" | head -20
# The report of the big store: its pages take each window's numbers from the store.
rm -rf "$out/big_report"
time .carry/bin/memsnap report --no-upload -o "$out/big_report" "$out/big.h5" && ls -la "$out/big_report" | head
old=(); [ -x .carry/bin/memsnap_old ] && old=(--memsnap-old .carry/bin/memsnap_old)
python3 tests/gpu/bench_big_import.py --memsnap .carry/bin/memsnap "${old[@]}" --rounds "${ROUNDS:-5}" --cpus "${CPUS:-2-7}" \
  "${pickles[@]}"

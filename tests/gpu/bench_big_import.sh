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
for stacks in all python; do
  [ -s "$out/big_$stacks.pickle" ] || python3 tests/gpu/big_snapshot.py --stacks "$stacks" --out "$out/big_$stacks.pickle" "$@" || exit 1
done
.carry/bin/memsnap import "$out/big_all.pickle" -o "$out/big_all.h5" --overwrite && .carry/bin/memsnap info "$out/big_all.h5" | head -20
old=(); [ -x .carry/bin/memsnap_old ] && old=(--memsnap-old .carry/bin/memsnap_old)
python3 tests/gpu/bench_big_import.py --memsnap .carry/bin/memsnap "${old[@]}" --rounds "${ROUNDS:-5}" --cpus "${CPUS:-2-7}" \
  "$out/big_all.pickle" "$out/big_python.pickle"

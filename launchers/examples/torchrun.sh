#!/usr/bin/env bash
# Record a torchrun job (no MPI between the ranks): each rank records, rank 0 waits for the
# others and gathers the record alone.
#   NPROC=8 TRAIN="python train.py" launchers/examples/torchrun.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
MEMSNAP="${MEMSNAP:-$(command -v memsnap)}"
NPROC="${NPROC:-8}"
CONFIG="${CONFIG:-$here/memsnap.yaml}"
read -r -a train <<< "${TRAIN:-python train.py}"
torchrun --nproc-per-node "$NPROC" --no-python "$MEMSNAP" run --aggregate-when-done --config "$CONFIG" -- "${train[@]}"

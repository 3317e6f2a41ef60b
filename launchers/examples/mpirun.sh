#!/usr/bin/env bash
# Record an 8-rank job started by Open MPI, then gather and report.
#   NP=8 TRAIN="python train.py --config cfg.yaml" launchers/examples/mpirun.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
MEMSNAP="${MEMSNAP:-memsnap}"
NP="${NP:-8}"
CONFIG="${CONFIG:-$here/memsnap.yaml}"
read -r -a train <<< "${TRAIN:-python train.py}"
# memsnap run gathers and reports by itself when the command does not use MPI; when it does, it
# prints the follow-up (mpirun -np N memsnap aggregate ... && memsnap report ...), run here too.
mpirun -np "$NP" "$MEMSNAP" run --config "$CONFIG" -- "${train[@]}"

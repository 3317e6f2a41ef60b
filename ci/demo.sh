#!/usr/bin/env bash
# Sets up (if needed), builds, and runs the built-in 4-rank demo: an FSDP-like CPU workload under
# mpirun with one rank that keeps a module unsharded, one that leaks, and one that spikes.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "$MEMSNAP_ROOT/ci/setup.sh"
memsnap_build >/dev/null

out="${1:-$MEMSNAP_ROOT/out/demo}"
rm -rf "$out"
mkdir -p "$out"
export MEMSNAP_FOLDER="$out"
echo "== 4 ranks of fsdp_sim under mpirun, recorded by memsnap"
mpirun -np 4 "$MEMSNAP_BUILD/bin/fsdp_sim" --config "$MEMSNAP_ROOT/launchers/examples/demo.yaml" \
  --batches 8 --unsharded-rank 1 --leak-rank 2 --spike 3:6
echo
echo "== what each rank recorded"
"$MEMSNAP_BUILD/bin/memsnap" info "$out"
echo
echo "spill files: $out/spill/"

#!/usr/bin/env bash
# Sets up (if needed), builds, and runs the built-in 4-rank demo: an FSDP-like CPU workload under
# mpirun, recorded by memsnap, gathered into one HDF5 store and rendered as HTML.
# Planted: rank 0 keeps a module unsharded, rank 3 leaks a buffer every batch, rank 2 gets a 4x
# longer sequence on batch 3. The report names all three.
#   ci/demo.sh [OUT_DIR]      (default: out/demo)
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "$MEMSNAP_ROOT/ci/setup.sh"
echo "== building memsnap (first time: a few minutes)"
memsnap_build >/dev/null

out="$(realpath -m "${1:-$MEMSNAP_ROOT/out/demo}")"
mkdir -p "$out"
export MEMSNAP_FOLDER="$out"
echo "== mpirun -np 4 memsnap run -- fsdp_sim   (records every rank, then gathers and reports)"
mpirun -np 4 "$MEMSNAP_BUILD/bin/memsnap" run --config "$MEMSNAP_ROOT/launchers/examples/demo.yaml" -- \
  "$MEMSNAP_BUILD/bin/fsdp_sim" --leak-rank 3 --unsharded-rank 0 --spike 2:3
echo
echo "== memsnap info $out/memsnap.h5"
"$MEMSNAP_BUILD/bin/memsnap" info "$out/memsnap.h5"
echo
echo "spills:  $out/spill/"
echo "store:   $out/memsnap.h5"
echo "report:  $out/report/index.html   (open it in a browser; it needs no network)"

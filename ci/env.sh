# Sourced by the ci/ scripts: build folder and the variables Open MPI needs here.
MEMSNAP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MEMSNAP_BUILD="${MEMSNAP_BUILD:-$MEMSNAP_ROOT/build}"
if [ "$(id -u)" -eq 0 ]; then
  # Open MPI refuses to run as root unless told twice; CI and containers run as root.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Small machines: let mpirun start more ranks than cores.
export OMPI_MCA_rmaps_base_oversubscribe=1
jobs="$(nproc 2>/dev/null || echo 2)"

memsnap_build() {
  # -U: the suite is always the whole default list, whatever an earlier configure chose.
  cmake -S "$MEMSNAP_ROOT" -B "$MEMSNAP_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -UMEMSNAP_TEST_DIRS "$@" >/dev/null
  cmake --build "$MEMSNAP_BUILD" -j "$jobs"
}

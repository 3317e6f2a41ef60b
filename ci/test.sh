#!/usr/bin/env bash
# Sets up (if needed), builds, and runs memsnap's whole test suite with ctest.
#   ci/test.sh            the suite
#   ci/test.sh -R spill   only tests whose name matches (ctest's -R)
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "$MEMSNAP_ROOT/ci/setup.sh"
memsnap_build
cd "$MEMSNAP_BUILD"
ctest --output-on-failure -j "$jobs" --timeout 600 "$@"

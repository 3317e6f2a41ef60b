#!/usr/bin/env bash
# Sets up (if needed), builds, and runs memsnap's whole test suite with ctest.
#   ci/test.sh                      the suite
#   ci/test.sh -R spill             only tests whose name matches (any ctest option)
#   ci/test.sh --sanitize=address   the suite built with ASan + UBSan (in build-asan/)
#   ci/test.sh --sanitize=thread    the suite built with TSan (in build-tsan/)
set -euo pipefail
source "$(dirname "$0")/env.sh"
sanitize=""
if [[ "${1:-}" == --sanitize=* ]]; then
  sanitize="${1#--sanitize=}"
  shift
  MEMSNAP_BUILD="$MEMSNAP_ROOT/build-${sanitize/address/asan}"
  MEMSNAP_BUILD="${MEMSNAP_BUILD/thread/tsan}"
  # Open MPI's own allocations are not ours to report; the suppressions keep the signal.
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export TSAN_OPTIONS="halt_on_error=1:suppressions=$MEMSNAP_ROOT/ci/tsan.supp"
fi
bash "$MEMSNAP_ROOT/ci/setup.sh"
memsnap_build -DMEMSNAP_SANITIZE="$sanitize"
cd "$MEMSNAP_BUILD"
# Under TSan the browser tests and the end-to-end runs on real loops are left out
# (CI time): they drive single-threaded page and analysis code through the CLI, and the threaded
# parts they pass through (aggregation, threaded import, the recorder) run under TSan in their own
# tests. Under ASan and in the plain build they all run.
skip=()
[ "$sanitize" = thread ] && skip=(-LE 'report_html|torch_loops')
ctest --output-on-failure -j "$jobs" --timeout 600 "${skip[@]}" "$@"

#!/usr/bin/env bash
# Builds memsnap's libFuzzer targets with clang in build-fuzz/ and fuzzes each one for a bounded
# time on its corpus, one after another; prints executions, coverage and time per target and
# exits non-zero if any target crashed (the input is saved under build-fuzz/fuzz-out/<target>/).
#
#   tests/fuzz/run.sh                      # every target, FUZZ_SECONDS (60) each
#   FUZZ_SECONDS=300 tests/fuzz/run.sh pickle spill
#   FUZZ_JOBS=4 ...                        # build parallelism (default: nproc)
#   FUZZ_ARGS="-max_len=65536" ...         # extra libFuzzer flags for every target
#
# Needs clang and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${FUZZ_BUILD_DIR:-$repo/build-fuzz}"
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-$(nproc)}"
all_targets=(spill config names pickle store store_raw)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")

cxx="${CXX:-clang++}"
cc="${CC:-clang}"
if ! "$cxx" --version 2>/dev/null | grep -q clang; then
  echo "run.sh: $cxx is not clang; set CXX=clang++ (Debian: apt-get install clang)" >&2
  exit 2
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "run.sh: $cxx cannot link -fsanitize=fuzzer (Debian: apt-get install libclang-rt-14-dev)" >&2
  exit 2
fi

# Every library the targets link is instrumented for coverage and sanitized; only the targets
# link libFuzzer itself (tests/fuzz/CMakeLists.txt).
# UBSan stays recoverable so that UBSAN_OPTIONS=suppressions=FILE can skip a known report;
# halt_on_error=1 (below) still stops at the first one.
# The build type's own flags are -O1 without -g, so that -gline-tables-only holds (a later -g
# would replace it with full debug info, and the compile would take about twice as long).
mkdir -p "$build"
sanitize="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -gline-tables-only"
CC="$cc" CXX="$cxx" cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMEMSNAP_FUZZ=ON -DMEMSNAP_TEST_DIRS=fuzz \
  "-DCMAKE_C_FLAGS=$sanitize" "-DCMAKE_CXX_FLAGS=$sanitize" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
  "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" >"$build/fuzz-configure.log" 2>&1 ||
  { cat "$build/fuzz-configure.log" >&2; exit 1; }
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "fuzz_$t"); done
cmake --build "$build" -j "$jobs" "${build_targets[@]}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -50 "$build/fuzz-build.log" >&2; exit 1; }

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_stack_use_after_return=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
results=()
for t in "${targets[@]}"; do
  out="$build/fuzz-out/$t"
  work="$out/corpus"  # new inputs go here; the committed corpus is only read
  mkdir -p "$work" "$out/artifacts"
  log="$out/fuzz.log"
  extra=()
  case "$t" in
    store|store_raw) extra=(-detect_leaks=0) ;;  # HDF5 keeps library-lifetime free lists
  esac
  [ -f "$here/dict/$t.dict" ] && extra+=(-dict="$here/dict/$t.dict")
  echo "run.sh: fuzzing $t for ${seconds}s (log: $log)" >&2
  start=$(date +%s)
  rc=0
  (cd "$out" && "$build/bin/fuzz_$t" "$work" "$here/corpus/$t" -max_total_time="$seconds" \
      -timeout=25 -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/artifacts/" "${extra[@]}" ${FUZZ_ARGS:-}) \
      >"$log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  corpus=$(grep -o 'corp: [0-9]*/[0-9A-Za-z]*' "$log" | tail -1 | cut -d' ' -f2)
  verdict="ok"
  if [ "$rc" -ne 0 ]; then
    verdict="CRASH (rc $rc): $(ls -t "$out/artifacts" | head -1)"
    status=1
  fi
  rate="-"
  [ -n "$execs" ] && [ "$elapsed" -gt 0 ] && rate=$(( execs / elapsed ))
  results+=("$(printf '%-10s %12s %9s %8s %8s %8s %8s  %s' "$t" "${execs:--}" "$rate" "${elapsed}s" "${cov:--}" "${ft:--}" "${corpus:--}" "$verdict")")
done

printf '%-10s %12s %9s %8s %8s %8s %8s  %s\n' target executions exec/s time cov ft corpus result
for r in "${results[@]}"; do echo "$r"; done
if [ "$status" -ne 0 ]; then
  echo "run.sh: crashes found; reproduce with $build/bin/fuzz_<target> <artifact>, and keep the input under tests/fuzz/crashes/<target>/" >&2
fi
exit "$status"

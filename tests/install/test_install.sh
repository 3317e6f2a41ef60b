#!/usr/bin/env bash
# cmake --install into a fresh prefix, then build and run a project that uses find_package(memsnap).
#   test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" src="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for f in bin/memsnap bin/fsdp_sim include/memsnap/memsnap.h include/memsnap/recorder.hpp lib/cmake/memsnap/memsnapConfig.cmake; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
MEMSNAP_FOLDER="$work/run" "$work/consumer/consumer"
"$work/prefix/bin/memsnap" info "$work/run" | grep -q "2-4"
"$work/prefix/bin/memsnap" --version
echo "1 passed, 0 failed"

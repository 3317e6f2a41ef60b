#!/bin/bash
# Stages what tests/gpu/run.sh needs on the GPU machine into .carry/ (ignored by git): the built
# memsnap, libmemsnap, libmemsnap_cupti and spill_dump (stripped copies, to fit the 64 MiB that
# travels), and the Debian shared libraries that machine lacks (HDF5 with Open MPI, yaml-cpp,
# libdw/libelf, szip, libunwind, libdeflate, Google Benchmark for the benches), and the PyTorch attachment where it was built. libmpi is not carried: the GPU machine has the same libmpi.so.40 ABI.
#   tests/gpu/stage.sh [BUILD_DIR]      (default build-cupti), then run with carry: [".carry"]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cupti}
carry=$root/.carry
mkdir -p "$carry/bin" "$carry/lib" "$carry/deps" "$carry/debs"
for f in bin/memsnap bin/spill_dump; do strip -o "$carry/bin/$(basename $f)" "$build/$f"; done
strip --strip-debug -o "$carry/lib/libmemsnap.so.0" "$build/lib/libmemsnap.so.0"
strip --strip-debug -o "$carry/lib/libmemsnap_cupti.so" "$build/lib/libmemsnap_cupti.so"
# The PyTorch attachment and its Python module, where the build found a torch (MEMSNAP_TORCH_PREFIX).
if [ -e "$build/lib/libmemsnap_pytorch.so" ]; then
  strip --strip-debug -o "$carry/lib/libmemsnap_pytorch.so" "$build/lib/libmemsnap_pytorch.so"
  for b in memsnap_bench_torch_tracker memsnap_bench_torch_entry; do strip -o "$carry/bin/$b" "$build/bin/$b"; done
fi
rm -rf "$carry/lib/memsnap" && cp -r "$build/lib/memsnap" "$carry/lib/memsnap"
ln -sf libmemsnap.so.0 "$carry/lib/libmemsnap.so"
cd "$carry/debs"
for pkg in libhdf5-openmpi-103-1 libyaml-cpp0.7 libsz2 libaec0 libdw1 libelf1 libunwind8 libdeflate0 libbenchmark1debian; do
  ls ${pkg}_*.deb >/dev/null 2>&1 || apt-get download $pkg
done
tmp=$(mktemp -d)
for d in *.deb; do dpkg -x "$d" "$tmp"; done
find "$tmp" \( -name '*.so.*' -o -name '*.so' \) \( -type f -o -type l \) -exec cp -a {} "$carry/deps/" \;
rm -rf "$tmp"
du -sh "$carry"

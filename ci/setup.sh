#!/usr/bin/env bash
# Installs what memsnap needs to build, test and run its demo on Debian 12 (as root, idempotent).
# Prints nothing and changes nothing when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libdw-dev libunwind-dev zlib1g-dev libdeflate-dev libcurl4-openssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  chromium
  clang libclang-rt-14-dev
  python3 python3-h5py python3-numpy time
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "ci/setup.sh: these packages are missing: ${missing[*]}; run this script as root (or install them)" >&2
  exit 1
fi
echo "ci/setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

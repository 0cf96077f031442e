#!/usr/bin/env bash
# Installs the Debian packages kcache builds and tests with, if any are
# missing (LLVM 19 for the default build, LLVM 14 for `make test-llvm`,
# which CI runs too; clang-14 makes the ThinLTO test's bitcode; strace lets
# nvrtc_cccl_test see which files NVRTC opens). Runs apt-get
# update at most once. Needs root (or sudo) only when
# something is missing.
set -euo pipefail

pkgs=(build-essential cmake pkg-config g++ clang-format libgtest-dev libbenchmark-dev
      liblmdb-dev lmdb-utils libzstd-dev libxxhash-dev libhiredis-dev libssl-dev
      redis-server python3-dev python3-venv llvm-14-dev llvm-19-dev clang-14 zlib1g-dev libtinfo-dev libedit-dev libxml2-dev libcurl4-openssl-dev
      pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo strace ccache)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kcache: installing missing packages: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "kcache: not root and no sudo; install these packages first: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
retry="$(dirname "$0")/retry.sh"
bash "$retry" 4 $SUDO apt-get update -qq
bash "$retry" 4 $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

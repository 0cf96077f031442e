#!/usr/bin/env bash
# build/venv-torch for the PyTorch tests (`make python-torch`, after `make
# python`): a venv of build/venv's interpreter with torch from PyPI (its CUDA
# libraries come with it: several GB, kept in pip's cache, so a second
# install downloads nothing), numpy and pytest, and the kcache package that
# `make python` built and installed into build/venv (the same interpreter, so
# the same extension; copied with its start-up hook and metadata rather than
# built a second time). Installs torch only when the line asked for changed.
# The same venv holds wave-lang (and IREE's compiler) for the Wave suite:
# it leaves torch as it is.
#   scripts/torch_venv.sh VENV TORCH_VENV "TORCH_DEPS"
set -euo pipefail
venv=$1; tvenv=$2; deps=$3
fail() { echo "python-torch: FAILED: $*" >&2; exit 1; }
[ -x "$venv/bin/python" ] || fail "no $venv (make python)"
if [ ! -x "$tvenv/bin/python" ]; then
  base=$("$venv/bin/python" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$tvenv"
fi
if [ "$(cat "$tvenv/.kcache-deps" 2>/dev/null)" != "$deps" ]; then
  retry="$(dirname "$0")/retry.sh"
  bash "$retry" 4 "$tvenv/bin/pip" install -q --upgrade pip
  # shellcheck disable=SC2086  # a list of requirements
  bash "$retry" 4 "$tvenv/bin/pip" install -q $deps
  echo "$deps" > "$tvenv/.kcache-deps"
fi
src=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dst=$("$tvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -d "$src/kcache" ] || fail "no kcache package in $venv (make python)"
rm -rf "$dst/kcache" "$dst"/kcache_jit-*.dist-info
cp -r "$src/kcache" "$dst/kcache"
for f in _kcache_boot.py kcache-boot.pth "$(cd "$src" && echo kcache_jit-*.dist-info)"; do
  if [ -e "$src/$f" ]; then cp -r "$src/$f" "$dst/$f"; fi
done
"$tvenv/bin/python" -c 'import torch, kcache; print("python-torch:", __import__("sys").prefix, "torch", torch.__version__, "kcache", kcache.__version__)'

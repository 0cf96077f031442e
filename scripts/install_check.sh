#!/usr/bin/env bash
# Installs a built tree into a temporary prefix and uses it the way another
# project does, outside the source tree: checks the installed layout, runs
# the installed `kcache` tool, builds and runs a C++ program through
# find_package(kcache), a C++17 one (the headers a host includes, held to
# -std=c++17) and a C program through `pkg-config kcache` (all with
# -Werror), and, when kcache::llvm is installed, a program linking it
# and one that compiles the installed FileCache source itself, and checks
# that an LLVM of another major version is refused.
#   scripts/install_check.sh [BUILD_DIR]      (default: build; `make install-check`)
# KCACHE_TEST_KEEP_TMP=1 keeps the temporary folder for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=$(cd "${1:-build}" && pwd)
jobs=$(nproc)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-install-check.XXXXXX")
[ -n "${KCACHE_TEST_KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "install check: FAILED: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log" >&2; fail "cmake --install"; }

# The layout README.md describes.
for f in include/kcache/cache.h include/kcache/kcache.h include/kcache/status.h bin/kcache \
         lib/libkcache.so lib/libkcache_cache.a lib/libkcache_util.a \
         lib/cmake/kcache/kcacheConfig.cmake lib/cmake/kcache/kcacheConfigVersion.cmake \
         lib/cmake/kcache/kcache-targets.cmake lib/pkgconfig/kcache.pc; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
# Every header a public header includes is installed too; the internal ones
# (src/, such as cache/assembly.h) are neither installed nor named.
for h in "$prefix"/include/kcache/*.h; do
  for inc in $(sed -n 's|^#include [<"]\(kcache/[a-z0-9_]*\.h\)[>"].*|\1|p' "$h"); do
    [ -e "$prefix/include/$inc" ] || fail "$(basename "$h") includes $inc, which is not installed"
  done
done
[ ! -e "$prefix/include/kcache/assembly.h" ] || fail "the internal assembly.h is installed"
# No build-only flag or path reaches a client.
for bad in -fno-rtti -fsanitize -Werror KCACHE_HAVE_ "$src/" "$build/"; do
  if grep -rqF -- "$bad" "$prefix/lib/cmake/kcache" "$prefix/lib/pkgconfig"; then
    fail "the installed package mentions $bad"
  fi
done
"$prefix/bin/kcache" --version >"$tmp/version.txt" || fail "installed kcache --version"
grep -q "^kcache " "$tmp/version.txt" || fail "kcache --version printed: $(cat "$tmp/version.txt")"
echo "install check: installed into a temporary prefix: $(head -1 "$tmp/version.txt")"

# The clients are copied out of the tree and see only the prefix.
cp -r "$src/tests/consumer" "$tmp/consumer"
unset CMAKE_CXX_COMPILER_LAUNCHER CMAKE_C_COMPILER_LAUNCHER
warn="-Wall -Wextra -Werror"

configure() {  # configure SOURCE BINARY
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_CXX_FLAGS="$warn" >"$2.log" 2>&1 \
    || { cat "$2.log" >&2; fail "configuring $(basename "$1")"; }
  grep -qx "kcache_DIR:PATH=$prefix/lib/cmake/kcache" "$2/CMakeCache.txt" \
    || fail "$(basename "$1") found kcache outside the temporary prefix"
}

# C++: find_package(kcache) and kcache::kcache.
configure "$tmp/consumer/cxx" "$tmp/cxx"
cmake --build "$tmp/cxx" -j "$jobs" >"$tmp/cxx-build.log" 2>&1 || { cat "$tmp/cxx-build.log" >&2; fail "building the C++ client"; }
"$tmp/cxx/consumer"

# C++17: the headers a host includes (kcache/cache.h, and with kcache::llvm
# kcache/llvm.h and kcache/llvm_file_cache.h) in a client held to -std=c++17
# (its main.cc checks __cplusplus, so a package that asked for C++20 fails).
configure "$tmp/consumer/cxx17" "$tmp/cxx17"
cmake --build "$tmp/cxx17" -j "$jobs" >"$tmp/cxx17-build.log" 2>&1 || { cat "$tmp/cxx17-build.log" >&2; fail "building the C++17 client"; }
"$tmp/cxx17/consumer17"

# C: pkg-config and libkcache.so.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cflags=$(pkg-config --cflags kcache)
libs=$(pkg-config --libs kcache)
libdir=$(pkg-config --variable=libdir kcache)
echo "install check: pkg-config --cflags --libs kcache: $cflags $libs"
${CC:-cc} -std=c11 -Wpedantic $warn $cflags "$tmp/consumer/c/main.c" -o "$tmp/consumer_c" $libs -Wl,-rpath,"$libdir" \
  || fail "building the C client"
ldd "$tmp/consumer_c" | grep -q "libkcache.so.* => $(cd "$libdir" && pwd -P)/" \
  || ldd "$tmp/consumer_c" | grep -q "libkcache.so.* => $libdir/" || fail "the C client does not load the installed libkcache.so"
"$tmp/consumer_c"

# LLVM: kcache::llvm, when it was built.
if [ -e "$prefix/lib/cmake/kcache/kcache-llvm-targets.cmake" ]; then
  configure "$tmp/consumer/llvm" "$tmp/llvm"
  cmake --build "$tmp/llvm" -j "$jobs" >"$tmp/llvm-build.log" 2>&1 || { cat "$tmp/llvm-build.log" >&2; fail "building the LLVM client"; }
  "$tmp/llvm/consumer_llvm"
  "$tmp/llvm/consumer_file_cache"
  # An LLVM of another major version is refused, never mixed in: tried with
  # one such LLVM where one is installed.
  built=$(sed -n 's/^set(kcache_LLVM_VERSION "\([0-9]*\)\..*/\1/p' "$prefix/lib/cmake/kcache/kcacheConfig.cmake")
  for v in 14 15 16 17 18 19; do
    other=/usr/lib/llvm-$v/lib/cmake/llvm
    [ "$v" != "$built" ] && [ -f "$other/LLVMConfig.cmake" ] || continue
    if cmake -S "$tmp/consumer/llvm" -B "$tmp/llvm-other" -DCMAKE_PREFIX_PATH="$prefix" -DLLVM_DIR="$other" \
         -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON >"$tmp/llvm-other.log" 2>&1; then
      fail "kcache::llvm (LLVM $built) was found with LLVM $v"
    fi
    grep -q "was built with LLVM $built" "$tmp/llvm-other.log" || { cat "$tmp/llvm-other.log" >&2; fail "no reason given for refusing LLVM $v"; }
    echo "install check: kcache::llvm (LLVM $built) refuses LLVM $v"
    break
  done
fi
echo "install check: ok"

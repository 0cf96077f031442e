#!/usr/bin/env bash
# The LLVM cold-start benchmark on a real C code base: pycryptodome's C
# sources (the pycryptodome sdist on PyPI, src/*.c; or CODEBASE_SRC=folder
# holding them), one bitcode file per translation unit (clang-14 -O2
# -emit-llvm, the flags its setup.py passes on x86-64 Linux). Left out: the
# files other files include (templates), those for other processors
# (ARMv8, NEON), the variants for newer x86 extensions that define the same
# functions as their portable versions (SHA-NI, AVX2, BMI2/ADX, CLMUL,
# AES-NI), and ec_nat_module.c, a unity build of others; 46 files. Then
# kcache_bench_llvm_codebase runs a plain LLJIT, kcache with
# KCACHE_DISABLE=1, cold and warm, ROUNDS times (default 5), in CPU time,
# and checks the JIT-ed SHA-256 and MD5 of "abc". COOP=N runs instead the
# shared cold start: one process against N processes started together on
# an empty store (BitcodeLoader::add_files), and N adding files one by one,
# in wall time.
#
# CODEBASE=c-ares runs the same on a second code base: c-ares, the C DNS
# library pycares ships in its sdist (deps/c-ares), configured by its own
# CMake for this machine and compiled with the flags that CMake passes
# (its compile_commands.json) at -O2: 91 translation units in
# BUILD/codebase-c-ares; checked by calling ares_version, ares_strerror and
# ares_library_init through the JIT.
#
#   scripts/llvm_codebase_bench.sh [BUILD]      (ROUNDS=N, CODEBASE=pycryptodome|c-ares, CODEBASE_SRC=dir, COOP=N)
#
# Everything it fetches and makes goes to BUILD/codebase (BUILD/codebase-c-ares);
# nothing is committed.
set -euo pipefail
B=${1:-build}
BENCH="$B/bench/kcache_bench_llvm_codebase"
[ -x "$BENCH" ] || { echo "llvm_codebase_bench: $BENCH not built (cmake --build $B --target kcache_bench_llvm_codebase)" >&2; exit 1; }
command -v clang-14 >/dev/null || { echo "llvm_codebase_bench: clang-14 not found (apt-get install clang-14)" >&2; exit 1; }
# pip download of an sdist into $1 (unpacked): pip unpacks it and then
# prepares its metadata, which may fail here: the unpacked sources are all
# we need, so keep them (--no-clean) whatever pip says.
fetch_sdist() {
  local dl=$1 spec=$2
  rm -rf "$dl" && mkdir -p "$dl/tmp"
  TMPDIR="$(cd "$dl/tmp" && pwd)" python3 -m pip download --quiet --no-clean --no-deps --no-binary :all: \
    --no-build-isolation "$spec" -d "$dl" >"$dl/pip.log" 2>&1 || true
  for t in "$dl"/*.tar.gz; do [ -f "$t" ] && tar -xzf "$t" -C "$dl"; done
  return 0
}

pycryptodome_bitcode() {
  OUT="$B/codebase"
  CHECK=sha
  local VERSION=${PYCRYPTODOME_VERSION:-4.4.0} SRC
  mkdir -p "$OUT"
  if [ ! -f "$OUT/src/SHA256.c" ]; then
    if [ -n "${CODEBASE_SRC:-}" ]; then
      SRC="$CODEBASE_SRC"
    else
      fetch_sdist "$OUT/dl" "pycryptodome==$VERSION"
      SRC=$(find "$OUT/dl" -path '*/src/SHA256.c' -printf '%h\n' | head -1)
      [ -n "$SRC" ] || { echo "llvm_codebase_bench: no pycryptodome sources (see $OUT/dl/pip.log); set CODEBASE_SRC" >&2; exit 1; }
    fi
    mkdir -p "$OUT/src"
    cp -r "$SRC"/. "$OUT/src/"
  fi
  # setup.py's macros for x86-64 Linux (compiler_opt.py), and the
  # instruction sets its per-file options enable.
  local DEFS="-DHAVE_STDINT_H -DPYCRYPTO_LITTLE_ENDIAN -DSYS_BITS=64 -DHAVE_UINT128 -DHAVE_CPUID_H -DHAVE_POSIX_MEMALIGN
    -DHAVE_X86INTRIN_H -DUSE_SSE2 -DHAVE_WMMINTRIN_H -DHAVE_TMMINTRIN_H"
  mkdir -p "$OUT/bc"
  for c in "$OUT"/src/*.c; do
    n=$(basename "$c" .c)
    case "$n" in
      *armv8* | *neon* | *pmull* | *_shani | *avx2* | *bmi2* | *_perf | AESNI | ghash_clmul | ec_nat_module) continue ;;
      blake2 | block_common | blowfish_init | hash_SHA2_* | cast5 | mod25519 | nat_rows | mldsa | mlkem) continue ;;
    esac
    # shellcheck disable=SC2086
    [ "$OUT/bc/$n.bc" -nt "$c" ] || clang-14 -O2 -w $DEFS ${EXTRA_CFLAGS:-} -emit-llvm -c "$c" -o "$OUT/bc/$n.bc"
  done
  echo "llvm_codebase_bench: $(ls "$OUT"/bc/*.bc | wc -l) translation units of pycryptodome $VERSION in $OUT/bc" >&2
}

cares_bitcode() {
  OUT="$B/codebase-c-ares"
  CHECK=cares
  local VERSION=${PYCARES_VERSION:-5.2.1} SRC
  mkdir -p "$OUT"
  if [ ! -f "$OUT/cmake/compile_commands.json" ]; then
    if [ -n "${CODEBASE_SRC:-}" ]; then
      SRC="$CODEBASE_SRC"
    else
      fetch_sdist "$OUT/dl" "pycares==$VERSION"
      SRC=$(find "$OUT/dl" -path '*/deps/c-ares/CMakeLists.txt' -printf '%h\n' | head -1)
      [ -n "$SRC" ] || { echo "llvm_codebase_bench: no c-ares sources (see $OUT/dl/pip.log); set CODEBASE_SRC" >&2; exit 1; }
    fi
    rm -rf "$OUT/src" && cp -r "$SRC" "$OUT/src"
    cmake -S "$OUT/src" -B "$OUT/cmake" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_BUILD_TYPE=Release -DCARES_SHARED=OFF \
      -DCARES_STATIC=ON -DCARES_BUILD_TOOLS=OFF -DCARES_BUILD_TESTS=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
      >"$OUT/cmake.log" 2>&1 || { echo "llvm_codebase_bench: c-ares did not configure (see $OUT/cmake.log)" >&2; exit 1; }
  fi
  mkdir -p "$OUT/bc"
  # Each unit with the definitions and include folders c-ares's CMake gives
  # it, at -O2 as the other code base, warnings off.
  python3 - "$OUT/cmake/compile_commands.json" "$(cd "$OUT/bc" && pwd)" <<'PY'
import json, os, shlex, subprocess, sys
cmds, out = json.load(open(sys.argv[1])), sys.argv[2]
for c in cmds:
    src = c["file"]
    bc = os.path.join(out, os.path.basename(src)[:-2] + ".bc")
    if os.path.exists(bc) and os.path.getmtime(bc) > os.path.getmtime(src):
        continue
    flags = [a for a in shlex.split(c["command"])[1:] if a.startswith(("-D", "-I", "-std="))]
    subprocess.run(["clang-14", "-O2", "-w", *flags, "-emit-llvm", "-c", src, "-o", bc], check=True, cwd=c["directory"])
PY
  echo "llvm_codebase_bench: $(ls "$OUT"/bc/*.bc | wc -l) translation units of c-ares (pycares $VERSION) in $OUT/bc" >&2
}

case "${CODEBASE:-pycryptodome}" in
  pycryptodome) pycryptodome_bitcode ;;
  c-ares) cares_bitcode ;;
  *) echo "llvm_codebase_bench: CODEBASE is pycryptodome or c-ares" >&2; exit 1 ;;
esac
if [ -n "${COOP:-}" ]; then
  "$BENCH" --bc "$OUT/bc" --coop "$COOP" --rounds "${ROUNDS:-5}" --check "$CHECK"
else
  "$BENCH" --bc "$OUT/bc" --rounds "${ROUNDS:-5}" --check "$CHECK"
fi

#!/usr/bin/env bash
# The real-code-base benchmark: Lua 5.4's C sources (from the lupa sdist on
# PyPI, which ships them under third-party/lua54; or LUA_SRC=folder with
# lapi.c ...), one bitcode file per translation unit (clang-14 -O2
# -emit-llvm; lua.c, onelua.c and ltests.c left out: 32 files), JIT-ed
# through make_cached_lljit by kcache_bench_lua_jit: no cache, cold and
# warm, REPS times (default 3; which of no cache and cold goes first
# alternates), medians printed last as JSON; then, when it is built,
# kcache_bench_llvm_codebase pairs the same files against a plain LLJIT.
# Everything it fetches and makes goes to BUILD/lua; nothing is committed.
set -euo pipefail
B=${1:-build}
BENCH="$B/bench/kcache_bench_lua_jit"
[ -x "$BENCH" ] || { echo "lua_bench: $BENCH not built (cmake --build $B --target kcache_bench_lua_jit)" >&2; exit 1; }
OUT="$B/lua"
mkdir -p "$OUT"
if [ ! -f "$OUT/src/lapi.c" ]; then
  if [ -n "${LUA_SRC:-}" ]; then
    SRC="$LUA_SRC"
  else
    rm -rf "$OUT/dl" && mkdir -p "$OUT/dl/tmp"
    # The sdist only. pip unpacks it, then prepares its metadata, which
    # needs Cython and builds LuaJIT and may fail: the unpacked sources are
    # all we need, so keep them (--no-clean) whatever pip says.
    TMPDIR="$(cd "$OUT/dl/tmp" && pwd)" python3 -m pip download --quiet --no-clean --no-deps --no-binary :all: \
      --no-build-isolation lupa==2.8 -d "$OUT/dl" >"$OUT/dl/pip.log" 2>&1 || true
    if [ -f "$OUT/dl/lupa-2.8.tar.gz" ]; then tar -xzf "$OUT/dl/lupa-2.8.tar.gz" -C "$OUT/dl"; fi
    SRC=$(find "$OUT/dl" -path '*third-party/lua54/lapi.c' -printf '%h\n' | head -1)
    [ -n "$SRC" ] || { echo "lua_bench: no Lua 5.4 sources from the lupa sdist (see $OUT/dl/pip.log); set LUA_SRC" >&2; exit 1; }
  fi
  mkdir -p "$OUT/src"
  cp "$SRC"/*.c "$SRC"/*.h "$OUT/src/"
fi
mkdir -p "$OUT/bc"
for c in "$OUT"/src/*.c; do
  n=$(basename "$c" .c)
  case "$n" in lua|luac|onelua|ltests) continue ;; esac
  [ "$OUT/bc/$n.bc" -nt "$c" ] || clang-14 -O2 -DLUA_USE_LINUX -emit-llvm -c "$c" -o "$OUT/bc/$n.bc"
done
echo "lua_bench: $(ls "$OUT"/bc/*.bc | wc -l) translation units in $OUT/bc" >&2
"$BENCH" --bc "$OUT/bc" --reps "${REPS:-3}" ${KEYS:+--keys "$KEYS"}
# The same bitcode against a plain LLJIT (no kcache code on the path), in
# CPU time, through BitcodeLoader: kcache_bench_llvm_codebase, when built.
if [ -x "$B/bench/kcache_bench_llvm_codebase" ]; then
  "$B/bench/kcache_bench_llvm_codebase" --bc "$OUT/bc" --rounds "${REPS:-3}" --check lua
fi

#!/usr/bin/env bash
# A scripted tour of the kcache command-line tool on a temporary cache:
# put two files, look at them every way the tool offers, explain a miss,
# share an entry through a Redis remote (when redis-server is installed),
# trim, clear. Each command is printed before it runs.
#
# usage: scripts/cli_tour.sh BUILD_DIR   (the tool is BUILD_DIR/tools/kcache)
set -euo pipefail
B=${1:?usage: $0 BUILD_DIR}
K="$B/tools/kcache"
[ -x "$K" ] || { echo "no kcache binary at $K (build target kcache_cli)" >&2; exit 2; }
K=$(cd "$(dirname "$K")" && pwd)/kcache

T=$(mktemp -d)
REDIS_PID=
# One cleanup for every way out (the end, a failed step under set -e, ^C):
# the Redis server stopped if it still runs (one that already exited is
# fine), the temporary folder removed, the exit status kept.
cleanup() {
  local rc=$?
  set +e
  if [ -n "$REDIS_PID" ]; then
    kill "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
  fi
  rm -rf "$T"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
export KCACHE_DIR="$T/cache"
cd "$T"

kcache() { "$K" "$@"; }

# Prints a command as typed, runs it, and shows a non-zero exit status
# (which is part of the tool's contract, not a failure of the tour).
step() {
  echo
  echo "\$ $*"
  local rc=0
  "$@" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || echo "(exit $rc)"
}

echo "kcache CLI tour: cache in \$KCACHE_DIR=$KCACHE_DIR"
step kcache --version

# Two "compiled kernels": a text PTX-like file and binary bytes with NULs.
printf '.version 8.0\n.target sm_90\n.entry saxpy() { ret; }\n' > saxpy.ptx
head -c 4096 /dev/urandom > saxpy.cubin
printf '.version 8.0\n.target sm_90\n.entry relu() { ret; }\n' > relu.ptx

# Manifests (what the keys were made of) in the text format of --manifest.
cat > saxpy.manifest <<'EOF'
namespace tour/1
compiler  string 0c2f8e6a4b1d3e5f7a9b0c1d2e3f4a5b
opt       string 11111111111111111111111111111111
source    bytes  5d1a2b3c4d5e6f708192a3b4c5d6e7f8
target    string 9e0f1a2b3c4d5e6f708192a3b4c5d6e7
EOF
sed 's/^source .*/source    bytes  77777777777777777777777777777777/' saxpy.manifest > relu.manifest

step kcache put --manifest saxpy.manifest ptx=saxpy.ptx cubin=saxpy.cubin | tee put.out
SAXPY=$(grep -o '[0-9a-f]\{32\}' put.out)
step kcache put --manifest relu.manifest ptx=relu.ptx

step kcache ls
step kcache ls --json
step kcache show --key "$SAXPY"
step kcache get --key "$SAXPY" --artifact ptx
step kcache get --key "$SAXPY" --artifact cubin -o out.cubin
step cmp out.cubin saxpy.cubin
step kcache stats
step kcache stats --json
step kcache stats --format openmetrics
step kcache config
step kcache doctor
step kcache verify

# A lookup that built its key with -O3 instead of the stored -O2 misses;
# explain names the component that differs.
sed 's/^opt .*/opt       string 33333333333333333333333333333333/' saxpy.manifest > lookup.manifest
step kcache explain --manifest lookup.manifest
step kcache explain --key "$SAXPY"

step kcache get --key 00000000000000000000000000000000 --artifact ptx

# A shared remote: with KCACHE_REMOTE set, put stores in Redis as well, and
# another cache folder (another machine, say) gets the entry from there.
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  # A free port: a server that could not bind one exits, and another port
  # is tried.
  UP=
  for _ in 1 2 3 4 5; do
    PORT=$((20000 + RANDOM % 20000))
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 100); do
      if redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG; then UP=1; break; fi
      kill -0 "$REDIS_PID" 2>/dev/null || break
      sleep 0.05
    done
    [ -n "$UP" ] && break
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
    REDIS_PID=
  done
  [ -n "$UP" ] || { echo "redis-server did not start: $(tail -3 "$T/redis.log")" >&2; exit 1; }
  echo
  echo "\$ export KCACHE_REMOTE=redis://127.0.0.1:$PORT"
  export KCACHE_REMOTE="redis://127.0.0.1:$PORT"
  step kcache put --manifest saxpy.manifest ptx=saxpy.ptx cubin=saxpy.cubin
  step kcache --dir "$T/other-machine" get --key "$SAXPY" --artifact ptx
  step kcache --dir "$T/other-machine" show --key "$SAXPY"
  step kcache stats --json
  step kcache doctor
  unset KCACHE_REMOTE
  kill "$REDIS_PID" 2>/dev/null || true
  wait "$REDIS_PID" 2>/dev/null || true
  REDIS_PID=
else
  echo
  echo "(no redis-server: the KCACHE_REMOTE part of the tour is left out)"
fi
# Keep 4.4 KiB: the least recently used entry (relu) goes, saxpy stays.
step kcache trim --max-size 4.4K
step kcache ls
step kcache clear
step kcache stats --json
echo
echo "tour done"

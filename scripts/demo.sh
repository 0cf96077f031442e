#!/usr/bin/env bash
# `make demo`: the JIT demo. kcache-demo compiles a few hundred generated
# kernels through LLVM ORC at -O2 three times, each in a process of its own:
# with the cache disabled (KCACHE_DISABLE=1), into an empty temporary cache
# (cold), and from that cache (warm: every kernel found by a stage key on its
# source, none lowered to IR). It checks every result against the
# interpreter and prints the time (wall and CPU) until all kernels are ready
# in the three runs, the speedup and the cache's statistics.
set -euo pipefail
B=${1:-build}
DEMO="$B/examples/jit/kcache-demo"
if [ ! -x "$DEMO" ]; then
  echo "demo: $DEMO not built (it needs LLVM 14 to 19: apt-get install llvm-19-dev, then reconfigure)" >&2
  exit 1
fi
D=$(mktemp -d "${TMPDIR:-/tmp}/kcache-demo.XXXXXX")
trap 'rm -rf "$D"' EXIT
"$DEMO" --dir "$D/cache" --both --kernels "${KERNELS:-240}"

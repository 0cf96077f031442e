#!/usr/bin/env bash
# `make demo`: the JIT demo. kcache-demo compiles a few hundred generated
# kernels through LLVM ORC at -O2 into an empty temporary cache (cold run,
# one process), then loads them all from it (warm run, a second process),
# checks every result against the interpreter, and prints the time until all
# kernels are ready in both runs, the speedup and the cache's statistics.
set -euo pipefail
B=${1:-build}
DEMO="$B/examples/jit/kcache-demo"
if [ ! -x "$DEMO" ]; then
  echo "demo: $DEMO not built (it needs LLVM 14: apt-get install llvm-14-dev, then reconfigure)" >&2
  exit 1
fi
D=$(mktemp -d "${TMPDIR:-/tmp}/kcache-demo.XXXXXX")
trap 'rm -rf "$D"' EXIT
"$DEMO" --dir "$D/cache" --both --kernels "${KERNELS:-240}"

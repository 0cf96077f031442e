#!/usr/bin/env bash
# The JIT demo and the ThinLTO benchmark on several LLVM releases in one run:
# each build folder's kcache-demo (no cache, cold, warm), ROUNDS rounds
# (default 5) taking the folders in turn, the first folder first in odd
# rounds and last in even ones; then each folder's kcache_bench_thinlto
# (--reps ROUNDS). Prints one table row per folder (medians) and the ThinLTO
# tables.
#   scripts/llvm_versions_bench.sh build-llvm14 build-llvm19
# Each folder needs kcache-demo and kcache_bench_thinlto built, e.g.
#   cmake -S . -B build-llvm14 -DKCACHE_LLVM_VERSION=14 && \
#   cmake --build build-llvm14 --target kcache-demo kcache_bench_thinlto
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR..." >&2; exit 1; }
ROUNDS=${ROUNDS:-5}
for b in "$@"; do
  [ -x "$b/examples/jit/kcache-demo" ] || { echo "llvm_versions_bench: $b/examples/jit/kcache-demo not built" >&2; exit 1; }
done
out=$(mktemp -d "${TMPDIR:-/tmp}/kcache-llvm-versions.XXXXXX")
trap 'rm -rf "$out"' EXIT
order=("$@")
for r in $(seq "$ROUNDS"); do
  for b in "${order[@]}"; do
    "$b/examples/jit/kcache-demo" --rounds 1 --json >>"$out/$(basename "$b").jsonl" 2>/dev/null
  done
  # The other way round next time.
  rev=()
  for ((i = ${#order[@]} - 1; i >= 0; i--)); do rev+=("${order[i]}"); done
  order=("${rev[@]}")
done
python3 - "$out" "$@" <<'EOF'
import json, os, statistics, sys, subprocess
out, builds = sys.argv[1], sys.argv[2:]
print("| build | LLVM | no cache | cold | cold / no cache (paired) | warm | warm speedup |")
print("|---|---|---:|---:|---:|---:|---:|")
for b in builds:
    rows = [json.loads(l) for l in open(os.path.join(out, os.path.basename(b) + ".jsonl"))]
    med = lambda k: statistics.median(r[k] for r in rows)
    ver = subprocess.run(["grep", "-m1", "^LLVM_DIR:PATH=", os.path.join(b, "CMakeCache.txt")],
                         capture_output=True, text=True).stdout.strip().split("=")[-1]
    ver = ver.split("/llvm-")[1].split("/")[0] if "/llvm-" in ver else ver
    print(f"| {b} | {ver} | {med('nocache_s'):.3f} s | {med('cold_s'):.3f} s | "
          f"{med('cold_over_nocache'):.3f} | {med('warm_s')*1000:.2f} ms | {med('nocache_s')/med('warm_s'):.0f}× |")
EOF
for b in "$@"; do
  if [ -x "$b/bench/kcache_bench_thinlto" ]; then
    echo
    "$b/bench/kcache_bench_thinlto" --reps "$ROUNDS"
  fi
done

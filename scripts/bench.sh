#!/usr/bin/env bash
# Runs every benchmark binary in BUILD/bench (whatever is built there), with
# repetitions so that medians are reported, then prints the tables and
# ratios of docs/benchmarks.md (scripts/bench_report.py).
#
#   scripts/bench.sh [BUILD]            default BUILD: build
#
# Environment:
#   KCACHE_BENCH_MIN_TIME  seconds per repetition (default 0.05)
#   KCACHE_BENCH_REPS      repetitions; medians are taken over them (default 5)
#   KCACHE_BENCH_FILTER    regex passed as --benchmark_filter
#   KCACHE_BENCH_OUT       folder for the JSON results and report.md
#                          (default BUILD/bench/results)
#   KCACHE_BENCH_DIR       where the benchmarks create their stores (default
#                          $TMPDIR or /tmp); point it at the disk to measure
set -euo pipefail
B=${1:-build}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MIN_TIME=${KCACHE_BENCH_MIN_TIME:-0.05}
REPS=${KCACHE_BENCH_REPS:-5}
OUT=${KCACHE_BENCH_OUT:-$B/bench/results}

if [[ ! -d $B/bench ]]; then
  echo "bench.sh: no $B/bench folder; build with -DKCACHE_BUILD_BENCH=ON first" >&2
  exit 1
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json

args=(--benchmark_min_time="$MIN_TIME" --benchmark_repetitions="$REPS"
      --benchmark_report_aggregates_only=true)
[[ -n ${KCACHE_BENCH_FILTER:-} ]] && args+=(--benchmark_filter="$KCACHE_BENCH_FILTER")

shopt -s nullglob
ran=0
failed=0
for bin in "$B"/bench/*; do
  [[ -f $bin && -x $bin ]] || continue
  name=$(basename "$bin")
  echo "== $name"
  if ! "$bin" "${args[@]}" --benchmark_out="$OUT/$name.json" --benchmark_out_format=json; then
    echo "bench.sh: $name failed" >&2
    failed=$((failed + 1))
  fi
  ran=$((ran + 1))
done
if (( ran == 0 )); then
  echo "bench.sh: no benchmark binaries in $B/bench" >&2
  exit 1
fi

results=("$OUT"/*.json)
if (( ${#results[@]} )); then
  echo
  python3 "$HERE/bench_report.py" "${results[@]}" | tee "$OUT/report.md"
  echo
  echo "bench.sh: results in $OUT (report.md, one JSON per binary)"
fi
exit $(( failed > 0 ))

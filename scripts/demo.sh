#!/usr/bin/env bash
# The main job until the JIT demo exists: a scripted tour of the CLI on a
# temporary cache.
set -euo pipefail
B=${1:-build}
K="$B/tools/kcache"
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
export KCACHE_DIR="$D/cache"
echo "kcache demo: cache in $KCACHE_DIR"
"$K" --version

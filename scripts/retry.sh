#!/usr/bin/env bash
# Runs a command that reaches a package registry (pip, apt-get) up to TRIES
# times, waiting 15 s, then 30 s, 60 s... between tries, so a connection
# that drops for a while (a download cut off part way, a mirror that
# answers late) costs a wait rather than the whole build. A command that
# fails every time fails with its own last exit status.
#   scripts/retry.sh TRIES COMMAND [ARGS...]
set -uo pipefail
# Interrupted (Ctrl-C) or stopped: no further try.
trap 'exit 130' INT
trap 'exit 143' TERM
tries=$1; shift
wait_s=15
for ((i = 1; ; i++)); do
  "$@" && exit 0
  rc=$?
  if ((i >= tries)); then
    echo "retry: '$1' failed $i times (last exit status $rc)" >&2
    exit "$rc"
  fi
  echo "retry: '$1' failed (exit status $rc), try $((i + 1)) of $tries in $wait_s s" >&2
  sleep "$wait_s"
  wait_s=$((wait_s * 2))
done

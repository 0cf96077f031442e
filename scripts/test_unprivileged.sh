#!/usr/bin/env bash
# The C and C++ tests of a build (ctest, without the Python suite) as an
# unprivileged user: what needs root skips, and file permissions hold for
# the tests as they do for any user. Run as root it drops to USER (default
# nobody) with setpriv; run as any other user it runs as that user. The
# build folder must be readable by USER; ctest's log folder (Testing/) is
# given to USER, and HOME is a fresh folder of USER's. readme_test runs in
# the Python interpreter CMake found; where USER cannot run that one (a
# pyenv under /root), it is left out, saying so.
#   scripts/test_unprivileged.sh [BUILD] [USER] [JOBS] [more ctest arguments, e.g. -R lease]
# KCACHE_TEST_EXCLUDE: a regular expression of more tests to leave out.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
user=${2:-nobody}
jobs=${3:-2}
shift $(($# < 3 ? $# : 3))
exclude=${KCACHE_TEST_EXCLUDE:-}

if [ "$(id -u)" -eq 0 ]; then
  uid=$(id -u "$user")
  gid=$(id -g "$user")
  as_user=(setpriv --reuid="$uid" --regid="$gid" --clear-groups)
else
  as_user=()
fi
src=$(cd "$(dirname "$0")/.." && pwd)
# A checkout or build under a private folder (a fresh clone in a 0700
# mktemp folder, /root): the folders above them are made searchable (o+x,
# nothing readable) for the run, and put back as they were when it ends.
restore=()
if [ "$(id -u)" -eq 0 ]; then
  for top in "$build" "$src"; do
    d=$top
    while [ "$d" != "/" ]; do
      d=$(dirname "$d")
      if [ -d "$d" ] && ! "${as_user[@]}" test -x "$d"; then
        restore+=("$(stat -c '%a' "$d"):$d")
        chmod o+x "$d"
      fi
    done
  done
fi
put_back() {
  local r
  for r in ${restore[@]+"${restore[@]}"}; do chmod "${r%%:*}" "${r#*:}"; done
}
trap put_back EXIT
if ! "${as_user[@]}" test -r "$build/CTestTestfile.cmake" -a -x "$build"; then
  echo "test-unprivileged: $user cannot read $build (each folder above it must be searchable by all)" >&2
  exit 1
fi
python=$(sed -n 's/^_Python3_EXECUTABLE:INTERNAL=//p' "$build/CMakeCache.txt")
if [ -n "$python" ] && ! "${as_user[@]}" test -x "$python"; then
  echo "test-unprivileged: readme_test left out ($user cannot run $python)"
  exclude="${exclude:+$exclude|}^readme_test\$"
fi
ctest_args=(-LE python -j "$jobs" --output-on-failure --timeout 600 ${exclude:+-E "$exclude"} "$@")

if [ "$(id -u)" -ne 0 ]; then
  cd "$build" && exec ctest "${ctest_args[@]}"
fi
home=$(mktemp -d)
trap 'rm -rf "$home"; put_back' EXIT
chown "$uid:$gid" "$home"
mkdir -p "$build/Testing"
chown -R "$uid:$gid" "$build/Testing"
cd "$build"
"${as_user[@]}" env HOME="$home" XDG_CACHE_HOME="$home/.cache" XDG_CONFIG_HOME="$home/.config" ctest "${ctest_args[@]}"

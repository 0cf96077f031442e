#!/usr/bin/env bash
# Checks a wheel the way a user gets it (`make wheel-check`, after
# `make wheel`): every library the extension needs is either inside the
# wheel or one every Linux system has (the C and C++ runtimes), none of the
# libraries it links statically is exported, and in a fresh virtual
# environment (the wheel alone, nothing from an index) the package imports,
# lists its features, and stores and loads entries through each library:
# LMDB (the lmdb engine), zstd (compression), OpenSSL (a signed bundle, an
# HMAC-signed remote), hiredis (a redis-server started here, when one is
# installed; else a closed port); then it runs the Python blocks of the
# README's Python section as written, and the package's `kcache` command.
#   scripts/wheel_check.sh [WHEEL_DIR] [PYTHON]   (default: build/wheel, python3)
# AUDITWHEEL names the auditwheel that prints the wheel's platform tag.
# KCACHE_TEST_KEEP_TMP=1 keeps the temporary folder for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/wheel}
py=${2:-python3}
fail() { echo "wheel check: FAILED: $*" >&2; exit 1; }

shopt -s nullglob
wheels=("$dir"/kcache_jit-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one kcache_jit wheel in $dir, found ${#wheels[@]} (make wheel)"
wheel=$(cd "$(dirname "${wheels[0]}")" && pwd)/$(basename "${wheels[0]}")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-wheel-check.XXXXXX")
redis_pid=""
cleanup() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  [ -n "${KCACHE_TEST_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

# 1. What the wheel's shared objects need.
system_libs=" libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 "
"$py" -m zipfile -e "$wheel" "$tmp/unpacked"
mods=$(find "$tmp/unpacked" -name '*.so*' -type f)
[ -n "$mods" ] || fail "no shared objects in $wheel"
# The bundled kcache tool, which the package's `kcache` command starts.
# (zipfile does not keep the mode bits; pip sets them from the wheel's.)
[ -f "$tmp/unpacked/kcache/_bin/kcache" ] || fail "the wheel lacks the kcache tool (kcache/_bin/kcache)"
mods="$mods $tmp/unpacked/kcache/_bin/kcache"
# auditwheel names the folder of the libraries it copies in after the
# distribution: kcache_jit.libs.
libs=kcache_jit.libs
for so in $mods; do
  for lib in $(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case "$system_libs" in *" $lib "*) continue ;; esac
    [ -e "$tmp/unpacked/$libs/$lib" ] ||
      fail "$(basename "$so") needs $lib, which is neither in the wheel nor a system library"
  done
done
# The licence terms of the code it carries.
for pkg in liblmdb-dev libzstd-dev libxxhash-dev libhiredis-dev libssl-dev; do
  ls "$tmp"/unpacked/kcache_jit-*.dist-info/licenses/$pkg.copyright >/dev/null 2>&1 ||
    fail "the wheel lacks the licence terms of $pkg (.dist-info/licenses/$pkg.copyright)"
done
ext=$(find "$tmp/unpacked/kcache" -name '_kcache*.so')
# hiredis and OpenSSL are linked in (KCACHE_STATIC_DEPS) and kept inside.
if nm -D --defined-only "$ext" | awk '{print $3}' | grep -E '^(EVP_|OPENSSL_|CRYPTO_|redis|mdb_|ZSTD_|XXH)' >"$tmp/exported"; then
  fail "the extension exports library symbols: $(head -3 "$tmp/exported" | tr '\n' ' ')"
fi
echo "wheel check: $(basename "$wheel"): needs only system libraries besides $(ls "$tmp/unpacked/$libs" 2>/dev/null | tr '\n' ' ')"

# 2. A fresh virtual environment with the wheel alone.
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-deps "$wheel" || fail "pip install of the wheel"
installed=$(find "$tmp/venv" -name '_kcache*.so')
ldd "$installed" >"$tmp/ldd" || fail "ldd $installed"
tool=$(find "$tmp/venv" -path '*/kcache/_bin/kcache')
ldd "$tool" >>"$tmp/ldd" || fail "ldd $tool"
if grep -q "not found" "$tmp/ldd"; then fail "unresolved libraries: $(grep 'not found' "$tmp/ldd" | tr '\n' ' ')"; fi
if grep -E 'lib(lmdb|zstd|xxhash|hiredis|crypto|ssl)' "$tmp/ldd" | grep -v "/$libs/" >"$tmp/outside"; then
  fail "libraries resolved outside the wheel: $(tr '\n' ' ' <"$tmp/outside")"
fi

# 3. A redis-server for the remote, when one is installed.
remote="redis://127.0.0.1:1"  # a closed port: the remote is said unreachable, lookups still work
if command -v redis-server >/dev/null 2>&1; then
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
  redis_pid=$!
  remote="redis://127.0.0.1:$port"
fi

# 4. The package, run outside the source tree, with no KCACHE_* setting and
# a HOME of its own.
mkdir -p "$tmp/home"
(cd "$tmp" && env -i PATH=/usr/bin:/bin HOME="$tmp/home" "$tmp/venv/bin/python" - "$tmp" "$remote" "${redis_pid:+live}") <<'PY' ||
import os, sys, time
import kcache

tmp, remote, live = sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "live"
features = kcache.features()
assert isinstance(features, tuple) and {"lmdb", "files", "zstd", "redis"} <= set(features), features
print("wheel check: kcache", kcache.__version__, "features:", " ".join(features))

k = kcache.key("wheel-check/1", ir=b"\x00ir", arch="sm_90")
with kcache.Cache(os.path.join(tmp, "store"), engine="lmdb", compression="zstd") as c:
    assert c.tiers() == ["memory", "lmdb"], c.tiers()
    c.put(k, {"obj": b"x" * 100000})
with kcache.Cache(os.path.join(tmp, "store"), engine="lmdb", memory=False) as c:
    e = c.get(k)
    assert e is not None and e.source == "disk" and bytes(e["obj"]) == b"x" * 100000, e
    key_file = os.path.join(tmp, "sign.key")
    kcache.bundle_keygen(key_file)
    data = c.save_bundle(key_file=key_file)
with kcache.Cache(disk=False, bundle_trust=[key_file + ".pub"]) as c:
    c.load_bundle(data)
    assert c.get(k).source == "bundle"
with kcache.Cache() as c:  # the default folder, under HOME
    assert c.dir == os.path.join(os.environ["HOME"], ".cache", "kcache"), c.dir

secret = os.path.join(tmp, "secret")
with open(secret, "w") as f:
    f.write("wheel-check-secret\n")
if live:
    import socket
    port = int(remote.rsplit(":", 1)[1])
    for _ in range(200):  # the server is starting
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    with kcache.Cache(disk=False, memory=False, remote=remote, remote_secret_file=secret) as c:
        assert c.put(k, {"obj": b"remote"}) is not None
        c.flush()
    with kcache.Cache(disk=False, memory=False, remote=remote, remote_secret_file=secret) as c:
        e = c.get(k)
        assert e is not None and e.source == "remote" and bytes(e["obj"]) == b"remote", e
    print("wheel check: lmdb, zstd, signed bundle and redis round trips: ok")
else:
    with kcache.Cache(disk=False, remote=remote, remote_secret_file=secret) as c:
        assert c.get(k) is None
    print("wheel check: lmdb, zstd and signed bundle round trips: ok (no redis-server: remote not exercised)")
PY
  fail "the package in a fresh virtual environment"

# 5. The README's Python section as written, in a folder of its own: its
# blocks in order in one interpreter, after defining the names they leave to
# the reader (the IR, the compiler, what uses an entry) and making the
# signing key its bundle block names.
mkdir -p "$tmp/readme"
"$py" - README.md >"$tmp/readme/readme_python.py" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```python\n(.*?)```", section, re.S)
assert len(blocks) >= 3, "the README's Python section has fewer blocks than expected"
print("import kcache")
print("ir = ir_bytes = b'define void @saxpy() { ret void }'")
print("def compile(ir):\n    return b'cubin of ' + bytes(ir)")
print("def use(entry):\n    assert len(entry['cubin']) > 0, entry")
print("kcache.bundle_keygen('sign.key')")
for b in blocks:
    print(b)
print("print('wheel check: the README Python section ran; store', cache.dir)")
PY
(cd "$tmp/readme" && env -i PATH=/usr/bin:/bin HOME="$tmp/home" "$tmp/venv/bin/python" readme_python.py) ||
  fail "the README's Python section (as extracted into $tmp/readme/readme_python.py)"

# 6. The `kcache` command the package installs: the bundled tool, the same
# version and features as the package, on the store the README used.
kc="$tmp/venv/bin/kcache"
[ -x "$kc" ] || fail "the package installed no kcache command ($kc)"
version=$(env -i PATH=/usr/bin:/bin HOME="$tmp/home" "$kc" --version | tr "\n" " ") || fail "kcache --version"
want=$("$tmp/venv/bin/python" -c 'import kcache; print(kcache.__version__, " ".join(kcache.features()))')
read -r v_num v_rest <<<"$(echo "$want")"
case "$version" in *"$v_num"*) ;; *) fail "kcache --version says '$version', the package is $v_num" ;; esac
for f in $v_rest; do case "$version" in *"$f"*) ;; *) fail "kcache --version ('$version') lacks the feature $f" ;; esac; done
(cd "$tmp/readme" && env -i PATH=/usr/bin:/bin HOME="$tmp/home" "$kc" stats >"$tmp/stats.txt") || fail "kcache stats"
echo "wheel check: $version; kcache stats: $(head -1 "$tmp/stats.txt")"

# 7. The platform tag the wheel claims, where auditwheel is at hand.
aw=${AUDITWHEEL:-$(command -v auditwheel || true)}
if [ -n "$aw" ] && [ -x "$aw" ]; then "$aw" show "$wheel" | sed -n '/consistent with/,/platform tag/p' | tr -s ' \n' ' ' | sed 's/^/wheel check: /'; echo; fi
echo "wheel check: ok"

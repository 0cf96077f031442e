"""The kcache package's surface: Cache.dir, docstrings and reprs, typed
features() (the list `kcache --version` prints), stats()["tiers"] as a
list, the bundle calls (mark, save_bundle, load_bundle, bundle_keygen) and
the one log line of a remote that cannot be reached."""

import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import kcache


# ---- Cache.dir -----------------------------------------------------------------

def test_dir_is_the_store_folder_in_effect(tmp_path, monkeypatch):
    with kcache.Cache(str(tmp_path / "a")) as c:
        assert c.dir == str(tmp_path / "a")
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "from-env"))
    with kcache.Cache() as c:
        assert c.dir == str(tmp_path / "from-env")
    monkeypatch.delenv("KCACHE_DIR")
    # The default folder, the one the `kcache` tool uses.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with kcache.Cache() as c:
        assert c.dir == str(tmp_path / "xdg" / "kcache")
        assert os.path.isdir(c.dir)
    # No disk tier: None.
    with kcache.Cache(str(tmp_path / "b"), disk=False) as c:
        assert c.dir is None
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with kcache.Cache(str(blocker / "sub")) as c:
        assert c.dir is None and c.tiers() == ["memory"]


# ---- docstrings and reprs --------------------------------------------------------

def test_every_public_class_and_method_has_a_docstring():
    missing = []
    for name in kcache.__all__:
        obj = getattr(kcache, name)
        if name.startswith("__") or not (inspect.isclass(obj) or callable(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                doc = getattr(member, "__doc__", None) or ""
                # nanobind puts the signature first; the words follow it.
                words = doc.split("\n\n", 1)[-1] if "\n\n" in doc else doc
                if not words.strip() or words.strip().startswith(attr + "("):
                    missing.append(f"{name}.{attr}")
    assert missing == []


def test_reprs_say_what_each_object_is(cache_dir):
    with kcache.Cache(cache_dir) as c:
        assert repr(c) == f"kcache.Cache(dir={cache_dir!r}, tiers=['memory', 'lmdb'])"
        k = kcache.key("t/1", x="repr")
        assert repr(k) == f"kcache.Key('t/1', {k.hex})"
        e = c.put(k, {"a": b"12", "b": b"3"})
        assert repr(e) == f"kcache.Entry({k.hex}, source=compiled, artifacts=[a, b], 3 bytes)"
        f = c.begin(k)
        assert repr(f) == f"kcache.Flight('t/1', {k.hex}, hit from memory)"
        k2 = kcache.key("t/1", x="other")
        f = c.begin(k2)
        assert repr(f) == f"kcache.Flight('t/1', {k2.hex}, owner)"
        f.commit({"a": b"x"})
        assert repr(f) == f"kcache.Flight('t/1', {k2.hex}, committed)"
        k3 = kcache.key("t/1", x="third")
        with c.begin(k3) as f:
            pass
        assert repr(f) == f"kcache.Flight('t/1', {k3.hex}, abandoned)"
    assert repr(c) == "kcache.Cache(closed)"
    with kcache.Cache(disk=False) as c:
        assert repr(c) == "kcache.Cache(dir=None, tiers=['memory'])"


# ---- features ------------------------------------------------------------------

def test_features_is_a_tuple_of_names():
    f = kcache.features()
    assert isinstance(f, tuple) and all(isinstance(x, str) for x in f)
    assert "files" in f and len(set(f)) == len(f)
    assert set(f) <= {"lmdb", "files", "zstd", "redis", "llvm", "nvrtc", "opencl"}


def test_features_match_the_tool(tmp_path):
    tool = os.environ.get("TEST_KCACHE_TOOL") or shutil.which("kcache")
    if not tool or not os.access(tool, os.X_OK):
        pytest.skip("no kcache tool (TEST_KCACHE_TOOL, set by ctest, or kcache on PATH)")
    out = subprocess.run([tool, "--version", "--json"], capture_output=True, text=True, check=True).stdout
    tool_features = json.loads(out)["features"]
    # The extension is built without the C++-only integrations.
    assert tuple(x for x in tool_features if x not in ("llvm", "nvrtc", "opencl")) == kcache.features()


def test_the_package_is_kcache_jit_with_the_kcache_command(tmp_path):
    """Installed as the distribution kcache-jit (the name kcache on PyPI is
    another project's), with a `kcache` command: the bundled tool, the same
    version and features as the package."""
    from importlib import metadata

    import kcache._cli

    dist = metadata.distribution("kcache-jit")
    assert dist.version == kcache.__version__
    scripts = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert [(e.name, e.value) for e in scripts] == [("kcache", "kcache._cli:main")]
    assert os.access(kcache._cli.tool_path(), os.X_OK), kcache._cli.tool_path()
    # The command itself, where pip put it (beside this interpreter).
    command = os.path.join(os.path.dirname(sys.executable), "kcache")
    assert os.access(command, os.X_OK), command
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env["KCACHE_DIR"] = str(tmp_path / "store")
    out = subprocess.run([command, "--version", "--json"], capture_output=True, text=True, env=env, check=True)
    info = json.loads(out.stdout)
    assert info["version"] == kcache.__version__, info
    assert tuple(info["features"]) == kcache.features(), info
    # Arguments, output and exit status are the tool's own.
    with kcache.Cache(env["KCACHE_DIR"]) as c:
        c.put(kcache.key("t/1", x="cli"), {"obj": b"abc"})
    p = subprocess.run([command, "ls", "--json"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["count"] == 1, p.stdout + p.stderr
    p = subprocess.run([command, "get", "--key", "f" * 32, "--artifact", "obj"], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 1 and p.stderr.startswith("kcache: get: "), p.stderr


# ---- evict ---------------------------------------------------------------------

def test_evict_by_age_and_namespace(tmp_path):
    import time
    d = str(tmp_path / "store")
    with kcache.Cache(d, memory=False) as c:
        old_a = kcache.key("evict-a/1", n=1)
        old_b = kcache.key("evict-b/1", n=1)
        c.put(old_a, {"obj": b"a" * 1000})
        c.put(old_b, {"obj": b"b" * 1000})
        c.flush()
        time.sleep(1.2)
        new_a = kcache.key("evict-a/1", n=2)
        c.put(new_a, {"obj": b"c" * 1000})
        c.flush()
        # Old and of evict-a/1: only old_a.
        assert c.evict(older_than=1.0, namespace="evict-a/1") == 1
        assert c.get(old_a) is None and c.get(old_b) is not None and c.get(new_a) is not None
        # Of evict-a/1, whatever its age.
        assert c.evict(namespace="evict-a/1") == 1
        assert c.get(new_a) is None and c.get(old_b) is not None
        assert c.evict(namespace="nosuch/1") == 0
        with pytest.raises(ValueError):
            c.evict()
        with pytest.raises(ValueError):
            c.evict(older_than=0)
        with pytest.raises(TypeError):
            c.evict(namespace=3)
    with kcache.Cache(disk=False) as c:
        with pytest.raises(kcache.Error) as e:
            c.evict(namespace="evict-a/1")
        assert e.value.code == "unavailable"


# ---- stats ---------------------------------------------------------------------

def test_stats_tiers_is_a_list_with_name_and_kind(cache_dir, tmp_path):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="stats")
        c.put(k, {"a": b"1"})
        c.flush()
        data = c.save_bundle()
    with kcache.Cache(cache_dir) as c:
        # Two bundles with one name: both are listed.
        c.load_bundle(data)
        c.load_bundle(data)
        assert c.get(k).source == "bundle"
        tiers = c.stats()["tiers"]
        assert isinstance(tiers, list)
        assert [(t["name"], t["kind"]) for t in tiers] == [
            ("memory", "memory"), ("bundle", "bundle"), ("bundle", "bundle"), ("lmdb", "disk")]
        assert tiers[1]["stats"]["hits"] == 1 and tiers[2]["stats"]["hits"] == 0
        assert set(tiers[3]["stats"]) >= {"hits", "misses", "puts", "entries", "bytes", "errors"}
        assert c.tier_stats("lmdb")["entries"] == 1 and c.tier_stats("disk")["entries"] == 1
        assert c.tier_stats("redis") is None


# ---- bundles -------------------------------------------------------------------

def test_mark_and_save_bundle_since(tmp_path):
    old = kcache.key("t/1", x="old")
    new = kcache.key("t/1", x="new")
    with kcache.Cache(str(tmp_path / "src")) as c:
        c.put(old, {"a": b"old"})
        c.flush()
        m = c.mark()
        assert isinstance(m, int) and m > 0
        c.put(new, {"a": b"new"})
        c.flush()
        whole = c.save_bundle()
        since = c.save_bundle(since=m)
        hits_before = c.tier_stats("lmdb")["hits"]
        assert isinstance(since, bytes) and len(since) < len(whole)
        # Making a bundle counts nothing.
        assert c.tier_stats("lmdb")["hits"] == hits_before
    with kcache.Cache(disk=False) as c:
        c.load_bundle(since)
        assert bytes(c.get(new)["a"]) == b"new" and c.get(old) is None
    with kcache.Cache(disk=False) as c:
        c.load_bundle(memoryview(whole))
        assert c.get(new).source == "bundle" and c.get(old).source == "bundle"


def test_signed_bundles_and_trust(tmp_path):
    key_file = str(tmp_path / "sign.key")
    kcache.bundle_keygen(key_file)
    assert os.path.exists(key_file + ".pub") and os.stat(key_file).st_mode & 0o077 == 0
    with pytest.raises(ValueError, match="exists"):  # never overwrites a key
        kcache.bundle_keygen(key_file)
    k = kcache.key("t/1", x="signed")
    with kcache.Cache(str(tmp_path / "src")) as c:
        c.put(k, {"a": b"v"})
        signed = c.save_bundle(key_file=key_file)
        unsigned = c.save_bundle()
    with kcache.Cache(disk=False, bundle_trust=[key_file + ".pub"]) as c:
        with pytest.raises(kcache.Error) as err:
            c.load_bundle(unsigned)
        assert err.value.code == "corrupt"
        assert c.tiers() == ["memory"]
        c.load_bundle(signed)
        assert c.get(k).source == "bundle"
    damaged = bytearray(signed)
    damaged[len(damaged) // 2] ^= 0xFF
    with kcache.Cache(disk=False) as c:
        with pytest.raises(kcache.Error) as err:
            c.load_bundle(bytes(damaged[:20]))
        assert err.value.code == "corrupt"


def test_bundle_calls_raise_as_the_c_abi_fails(tmp_path):
    with kcache.Cache(disk=False) as c:
        with pytest.raises(kcache.Error) as err:
            c.mark()
        assert err.value.code == "unavailable" and "no disk store" in str(err.value)
        with pytest.raises(kcache.Error) as err:
            c.save_bundle()
        assert err.value.code == "unavailable"
        with pytest.raises(TypeError):
            c.load_bundle("not bytes")
    with kcache.Cache(str(tmp_path / "c")) as c:
        with pytest.raises(kcache.Error) as err:
            c.save_bundle(key_file=str(tmp_path / "missing.key"))
        assert err.value.code == "not_found" and "missing.key" in str(err.value)
        with pytest.raises(ValueError):
            c.save_bundle(since=-1)
        with pytest.raises(TypeError):
            c.save_bundle(since="1")
    assert issubclass(kcache.Error, RuntimeError)


def test_loaded_bundle_survives_fork(tmp_path):
    k = kcache.key("t/1", x="forked")
    with kcache.Cache(str(tmp_path / "src")) as c:
        c.put(k, {"a": b"f"})
        data = c.save_bundle()
    c = kcache.Cache(disk=False)
    c.load_bundle(data)
    pid = os.fork()
    if pid == 0:
        try:
            e = c.get(k)
            os._exit(0 if e is not None and e.source == "bundle" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    c.close()


# ---- a remote that cannot be reached ---------------------------------------------

_OPEN_AND_HIT = textwrap.dedent("""
    import sys, kcache
    k = kcache.key("t/1", x="remote")
    with kcache.Cache(sys.argv[1]) as c:
        c.put(k, {"a": b"1"})
    with kcache.Cache(sys.argv[1], remote=sys.argv[2], memory=False) as c:
        for _ in range(5):
            assert c.get(k).source == "disk"  # a disk hit never asks the remote
    print("ok")
""")


def _run(cache_dir, url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    r = subprocess.run([sys.executable, "-c", _OPEN_AND_HIT, cache_dir, url], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    return [line for line in r.stderr.splitlines() if line.startswith("kcache:")]


def test_unreachable_remote_is_said_once(redis, tmp_path):
    # Reachable: nothing to say.
    assert _run(str(tmp_path / "a"), redis.url) == []
    port = redis.port
    redis.close()
    # The same server, killed: one line, naming it, although every lookup
    # is answered by the disk.
    lines = _run(str(tmp_path / "b"), redis.url)
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "warn" in lines[0], lines

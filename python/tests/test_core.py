"""The kcache package's core API: keys, entries, get/put/get_or_compile,
flights, threads and the GIL, exceptions, bad usage, cache faults."""

import gc
import os
import subprocess
import sys
import threading
import time

import pytest

import kcache


def _until(pred, bound=60.0):
    """Polls pred until it holds (True) or bound seconds pass (False)."""
    end = time.time() + bound
    while not pred():
        if time.time() > end:
            return False
        time.sleep(0.005)
    return True


# ---- keys --------------------------------------------------------------------

def test_key_does_not_depend_on_component_order():
    a = kcache.key("t/1", ir=b"\x00ir", arch="sm_90", options={"O": 3, "fast": True}, n=-5, flag=False,
                   defs=["A", 1])
    b = kcache.key("t/1", defs=["A", 1], flag=False, n=-5, options={"fast": True, "O": 3}, arch="sm_90",
                   ir=b"\x00ir")
    assert a == b and hash(a) == hash(b) and a.hex == b.hex
    assert len(a.hex) == 32 and int(a.hex, 16) >= 0
    assert [m[0] for m in a.manifest] == sorted(["ir", "arch", "options", "n", "flag", "defs"])
    assert dict((m[0], m[1]) for m in a.manifest)["options"] == "map"
    assert a.namespace == "t/1" and len(bytes(a)) == 16


def test_key_changes_with_every_component():
    base = dict(ir=b"ir", arch="sm_90", options={"O": 3})
    k = kcache.key("t/1", **base)
    assert kcache.key("t/2", **base) != k
    assert kcache.key("t/1", **{**base, "ir": b"ir2"}) != k
    assert kcache.key("t/1", **{**base, "options": {"O": 2}}) != k
    assert kcache.key("t/1", **{**base, "options": {"O": "3"}}) != k  # 3 and "3" differ
    assert kcache.key("t/1", **base, extra=0) != k
    # bytes and str of the same text are different component types
    assert kcache.key("t/1", x=b"a") != kcache.key("t/1", x="a")
    # list order matters, dict order does not
    assert kcache.key("t/1", l=[1, 2]) != kcache.key("t/1", l=[2, 1])
    # a key can be a component (a previous stage's digest)
    assert kcache.key("t/1", prev=k) != kcache.key("t/1", prev=kcache.key("t/1", ir=b"x"))
    assert kcache.key("t/1", buf=bytearray(b"abc")) == kcache.key("t/1", buf=memoryview(b"abc"))


@pytest.mark.parametrize("bad", [None, 1.5, object(), {1: "a"}, [object()], 2 ** 64])
def test_key_bad_component_raises(bad):
    with pytest.raises((TypeError, ValueError)):
        kcache.key("t/1", x=bad)


def test_key_bad_namespace_raises():
    with pytest.raises(ValueError):
        kcache.key("", x=1)
    with pytest.raises(TypeError):
        kcache.key(b"t/1", x=1)


# ---- get / put / get_or_compile ------------------------------------------------

def test_round_trip_and_sources(cache_dir):
    k = kcache.key("t/1", ir=b"abc")
    payload = os.urandom(16384)
    with kcache.Cache(cache_dir, max_size="64M") as c:
        assert c.get(k) is None
        e = c.get_or_compile(k, lambda: {"cubin": payload, "log": "ok"})
        assert e.source == "compiled"
        assert bytes(e["cubin"]) == payload and bytes(e["log"]) == b"ok"
        assert isinstance(e["cubin"], memoryview) and e["cubin"].readonly
        assert sorted(e) == ["cubin", "log"] and len(e) == 2 and "cubin" in e and "x" not in e
        assert e.get("x") is None and e.key_hex == k.hex and e.size == len(payload) + 2
        with pytest.raises(KeyError):
            e["missing"]
        assert c.get(k).source == "memory"
        c.flush()  # the disk tier is written by a committer thread
        s = c.stats()
        assert s["compiles"] == 1 and s["hits"] >= 1 and c.tier_stats("lmdb")["entries"] == 1
    # a new Cache (and a new process would do the same) reads it from disk
    with kcache.Cache(cache_dir) as c:
        e = c.get(k)
        assert e.source == "disk" and bytes(e["cubin"]) == payload
        assert c.get_or_compile(k, lambda: pytest.fail("compiled again")).source == "memory"


def test_views_outlive_entry_and_cache(cache_dir):
    c = kcache.Cache(cache_dir)
    k = kcache.key("t/1", x=1)
    c.put(k, {"a": b"x" * 100000})
    view = c.get(k)["a"]
    c.close()
    gc.collect()
    assert bytes(view) == b"x" * 100000
    with pytest.raises(ValueError):
        c.get(k)


def test_put_returns_entry_and_overwrites(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x=2)
        e = c.put(k, {"a": b"1"})
        assert e is not None and bytes(e["a"]) == b"1"
        c.put(k, {"a": b"2"})
        assert bytes(c.get(k)["a"]) == b"2"


def test_compile_exception_reaches_caller_and_nothing_is_stored(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="boom")

        class Boom(Exception):
            pass

        def compile():
            raise Boom("compiler said no")

        with pytest.raises(Boom, match="compiler said no"):
            c.get_or_compile(k, compile)
        assert c.get(k) is None
        # a result that is not a mapping of bytes is a TypeError, not stored
        with pytest.raises(TypeError):
            c.get_or_compile(k, lambda: [b"x"])
        with pytest.raises(TypeError):
            c.get_or_compile(k, lambda: {"a": 1})
        assert c.get(k) is None
        assert c.get_or_compile(k, lambda: {"a": b"ok"}).source == "compiled"
        assert c.stats()["compile_failures"] == 3


def test_threads_compile_once_and_gil_is_released(cache_dir):
    """Eight threads miss one key: one compile; the others wait in C++ without
    the GIL (else the compile, which needs the GIL, could never finish)."""
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="threads")
        started, release = threading.Event(), threading.Event()
        calls = []

        def compile():
            calls.append(1)
            started.set()
            release.wait(30)
            return {"a": b"result"}

        results = [None] * 8

        def worker(i):
            results[i] = c.get_or_compile(k, compile)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        assert started.wait(10)
        # This thread runs Python while seven threads wait inside kcache.
        spins = 0
        t0 = time.time()
        while time.time() - t0 < 0.3:
            spins += 1
        release.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a thread hung: the GIL was held while waiting"
        assert len(calls) == 1 and spins > 1000
        assert all(bytes(r["a"]) == b"result" for r in results)
        assert sorted(r.source for r in results).count("compiled") == 1
        assert c.stats()["compiles"] == 1


def test_waiters_get_compile_error_of_other_thread(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="fail-shared")
        started, release = threading.Event(), threading.Event()

        def compile():
            started.set()
            release.wait(30)
            raise RuntimeError("leader failed")

        errors = []

        def leader():
            try:
                c.get_or_compile(k, compile)
            except RuntimeError as e:
                errors.append(("leader", type(e).__name__, str(e)))

        def waiter():
            try:
                c.get_or_compile(k, lambda: {"a": b"waiter compiled"})
                errors.append(("waiter", "ok", ""))
            except kcache.CompileError as e:
                errors.append(("waiter", "CompileError", str(e)))

        t1 = threading.Thread(target=leader)
        t1.start()
        assert started.wait(10)
        t2 = threading.Thread(target=waiter)
        t2.start()
        time.sleep(0.2)
        release.set()
        t1.join(30)
        t2.join(30)
        assert ("leader", "RuntimeError", "leader failed") in errors
        w = [e for e in errors if e[0] == "waiter"][0]
        # The waiter either joined the failed flight (and got its error) or
        # came after it and compiled itself.
        assert w[1] in ("CompileError", "ok")
        if w[1] == "CompileError":
            assert "leader failed" in w[2]


# ---- flights -------------------------------------------------------------------

def test_flight_owner_commit_then_hit(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="flight")
        f = c.begin(k)
        assert f.owner and not f.hit and f.entry is None and f.source == "pending"
        e = f.commit({"cubin": b"\x7fELF", "json": '{"a": 1}'})
        assert e.source == "compiled" and bytes(e["cubin"]) == b"\x7fELF"
        assert f.done and not f.owner
        with pytest.raises(ValueError):
            f.commit({"a": b"again"})
        g = c.begin(k)
        assert g.hit and bytes(g.entry["json"]) == b'{"a": 1}' and g.source == "memory"
        with pytest.raises(ValueError):
            g.commit({"a": b"x"})
        g.abandon()  # no-op on a hit
        s = c.stats()
        assert (s["misses"], s["compiles"]) == (1, 1)


def test_flight_abandon_and_gc_and_context_manager(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="abandon")
        f = c.begin(k)
        assert f.owner
        f.abandon()
        assert c.get(k) is None
        f = c.begin(k)
        assert f.owner  # the lease was given back
        del f
        gc.collect()
        with c.begin(k) as f:  # a dropped flight abandoned too
            assert f.owner
        with pytest.raises(ZeroDivisionError):
            with c.begin(k) as f:
                assert f.owner
                1 / 0
        with c.begin(k) as f:
            f.commit({"a": b"done"})
        assert bytes(c.get(k)["a"]) == b"done"


def test_flight_begin_twice_in_one_thread_raises(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="twice")
        f = c.begin(k)
        with pytest.raises(ValueError, match="already owns"):
            c.begin(k)  # would wait for itself
        f.abandon()
        g = c.begin(k)
        assert g.owner
        g.commit({"a": b"1"})
        assert c.begin(k).hit


def test_flight_bad_artifacts_raise_and_keep_ownership(cache_dir):
    with kcache.Cache(cache_dir) as c:
        f = c.begin(kcache.key("t/1", x="bad-commit"))
        with pytest.raises(TypeError):
            f.commit(b"not a mapping")
        assert f.owner
        f.abandon()


def test_flight_waits_for_thread(cache_dir):
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="flight-thread")
        f = c.begin(k)
        assert f.owner
        got = []
        t = threading.Thread(target=lambda: got.append(c.begin(k)))
        t.start()
        assert _until(lambda: c.stats()["waits"] >= 1)
        assert t.is_alive() and not got  # waiting for this flight, without the GIL
        f.commit({"a": b"from owner"})
        t.join(10)
        assert got[0].hit and bytes(got[0].entry["a"]) == b"from owner"
        assert got[0].source == "waited"


_CHILD = r"""
import sys, time, kcache
c = kcache.Cache(sys.argv[1])
f = c.begin(kcache.key("t/1", x="cross-process"))
assert f.owner
print("owner", flush=True)
sys.stdin.readline()  # the parent's go, or EOF
if sys.argv[2] == "commit":
    f.commit({"a": b"from child"})
    c.close()
else:
    import os; os._exit(0) if sys.argv[2] == "exit" else time.sleep(60)
"""


def _child(cache_dir, then):
    return subprocess.Popen([sys.executable, "-c", _CHILD, cache_dir, then], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_flight_waits_for_other_process(cache_dir):
    p = _child(cache_dir, "commit")
    assert p.stdout.readline().strip() == "owner"
    with kcache.Cache(cache_dir) as c:
        def go():  # the child commits 0.2 s after this process began waiting on its lease
            if _until(lambda: c.stats()["lease_waits"] >= 1):
                time.sleep(0.2)
            p.stdin.write("go\n")
            p.stdin.flush()

        t = threading.Thread(target=go)
        t.start()
        t0 = time.time()
        f = c.begin(kcache.key("t/1", x="cross-process"))
        t.join(120)
        assert f.hit and bytes(f.entry["a"]) == b"from child"
        assert f.source == "waited" and time.time() - t0 >= 0.2
        assert c.stats()["lease_waits"] >= 1
    assert p.wait(10) == 0


def test_flight_of_killed_process_is_taken_over(cache_dir):
    p = _child(cache_dir, "hang")
    assert p.stdout.readline().strip() == "owner"
    with kcache.Cache(cache_dir) as c:
        k = kcache.key("t/1", x="cross-process")
        res = []
        t = threading.Thread(target=lambda: res.append(c.begin(k)))
        t.start()
        assert _until(lambda: c.stats()["lease_waits"] >= 1)
        assert t.is_alive()  # waiting for the child
        p.kill()
        p.wait()
        t.join(30)
        assert res and res[0].owner  # taken over: this process compiles
        res[0].commit({"a": b"taken over"})
        assert c.stats()["lease_takeovers"] >= 1
        assert bytes(c.get(k)["a"]) == b"taken over"


# ---- faults are misses; bad usage raises -------------------------------------------

def test_corrupt_entry_is_a_miss(cache_dir):
    k = kcache.key("t/1", x="corrupt")
    with kcache.Cache(cache_dir, engine="files", memory=False) as c:
        c.put(k, {"a": b"A" * 4096})
    files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(cache_dir, "files")) for f in fs
             if k.hex in f]
    assert len(files) == 1
    with open(files[0], "r+b") as f:
        f.seek(-100, os.SEEK_END)
        f.write(b"B")
    with kcache.Cache(cache_dir, engine="files", memory=False) as c:
        assert c.get(k) is None
        assert c.tier_stats("files")["corrupt"] == 1
        e = c.get_or_compile(k, lambda: {"a": b"recompiled"})
        assert e.source == "compiled" and bytes(e["a"]) == b"recompiled"


def test_read_only_and_unusable_folder_and_dead_remote(tmp_path):
    k = kcache.key("t/1", x="faults")
    with kcache.Cache(str(tmp_path / "ro")) as c:
        c.put(kcache.key("t/1", x="there"), {"a": b"0"})
    with kcache.Cache(str(tmp_path / "ro"), read_only=True) as c:
        assert bytes(c.get(kcache.key("t/1", x="there"))["a"]) == b"0"
        c.put(k, {"a": b"1"})
        assert c.get_or_compile(kcache.key("t/1", x="ro2"), lambda: {"a": b"1"}).source == "compiled"
        assert c.tiers() == ["memory", "lmdb(ro)"]
    with kcache.Cache(str(tmp_path / "ro")) as c:  # nothing reached the disk
        assert c.get(k) is None and c.get(kcache.key("t/1", x="ro2")) is None
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with kcache.Cache(str(blocker / "sub")) as c:  # cannot be created: no disk tier, no error
        assert c.tiers() == ["memory"]
        assert c.get_or_compile(k, lambda: {"a": b"1"}).source == "compiled"
    with kcache.Cache(str(tmp_path / "r"), remote="redis://127.0.0.1:1") as c:
        assert c.get(k) is None
        assert c.get_or_compile(k, lambda: {"a": b"2"}).source == "compiled"


def test_bad_usage_raises(cache_dir):
    with pytest.raises(ValueError):
        kcache.Cache(cache_dir, max_size="lots")
    with pytest.raises(ValueError):
        kcache.Cache(cache_dir, engine="sqlite")
    with pytest.raises(ValueError):
        kcache.Cache(cache_dir, compression="lz4")
    with pytest.raises(TypeError):
        kcache.Cache(cache_dir, max_size=1.5)
    with kcache.Cache(cache_dir) as c:
        with pytest.raises(TypeError):
            c.get("not a key")
        with pytest.raises(TypeError):
            c.put(kcache.key("t/1", x=1), [b"not", b"a mapping"])
        with pytest.raises(ValueError):
            c.put(kcache.key("t/1", x=1), {"": b"empty name"})
        with pytest.raises(TypeError):
            c.get_or_compile(kcache.key("t/1", x=1), "not callable")


def test_environment_configures_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("KCACHE_ENGINE", "files")
    with kcache.Cache() as c:
        assert c.tiers() == ["memory", "files"]
        c.put(kcache.key("t/1", x=1), {"a": b"1"})
    assert os.path.isdir(tmp_path / "env" / "files")
    monkeypatch.setenv("KCACHE_DISABLE", "1")
    with kcache.Cache() as c:
        assert c.tiers() == []
    with kcache.Cache(env=False, dir=str(tmp_path / "noenv")) as c:
        assert "lmdb" in c.tiers()


def test_dict_and_list_values_are_canonical_json():
    # Scalars are encoded in C++; subclasses take the Python encoder. Both
    # must write the same text, or keys would depend on the value's class.
    class S(str):
        pass

    class I(int):
        pass

    text = 'q"b\\s\n\r\t\b\f\x01\x1f é ✓'
    for v in (text, "", "plain"):
        assert kcache.key("t/1", d={"v": v}, l=[v]) == kcache.key("t/1", d={"v": S(v)}, l=[S(v)])
    for v in (0, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 70):
        assert kcache.key("t/1", d={"v": v}, l=[v]) == kcache.key("t/1", d={"v": I(v)}, l=[I(v)])
    assert kcache.key("t/1", d={"v": True}) != kcache.key("t/1", d={"v": 1})
    assert kcache.key("t/1", d={"v": {"b": 1, "a": [1, "x"]}}) == kcache.key("t/1", d={"v": {"a": [1, "x"], "b": 1}})


def test_options_follow_one_precedence(tmp_path, monkeypatch):
    # Defaults, then the arguments, then KCACHE_* (as in C++, C and the
    # kcache tool): KCACHE_READONLY=1 wins over read_only=False.
    monkeypatch.setenv("KCACHE_READONLY", "1")
    k = kcache.key("t/1", x="ro")
    with kcache.Cache(str(tmp_path / "a"), read_only=False, memory=False) as c:
        assert c.put(k, {"a": b"1"}) is None
        assert c.get(k) is None
    with kcache.Cache(str(tmp_path / "a"), read_only=False, memory=False, env=False) as c:
        assert c.put(k, {"a": b"1"}) is not None
    monkeypatch.delenv("KCACHE_READONLY")
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "env"))
    with kcache.Cache(str(tmp_path / "arg"), engine="files") as c:
        c.put(k, {"a": b"1"})
    assert os.path.isdir(tmp_path / "env" / "files")
    assert not os.path.exists(tmp_path / "arg")


def test_every_option_is_reachable_by_name(tmp_path):
    names = {name for name, _, _ in kcache.options()}
    for n in ("shared_group", "bundles", "bundle_trust", "explain", "recompile", "remote", "miss_journal"):
        assert n in names
    k = kcache.key("t/1", x="recompile")
    with kcache.Cache(str(tmp_path), memory=False) as c:
        c.get_or_compile(k, lambda: {"a": b"old"})
    with kcache.Cache(str(tmp_path), memory=False, recompile=True, miss_journal=0, explain=False) as c:
        assert c.get(k) is None
        e = c.get_or_compile(k, lambda: {"a": b"new"})
        assert e.source == "compiled"
    with kcache.Cache(str(tmp_path), memory=False) as c:
        assert bytes(c.get(k)["a"]) == b"new"
    with kcache.Cache(str(tmp_path), bundles=[str(tmp_path / "none.kcb")]) as c:
        assert "bundle" not in c.tiers()  # a bundle that cannot be opened is left out
    with pytest.raises(TypeError, match="unknown option 'read_onyl'"):
        kcache.Cache(str(tmp_path), read_onyl=True)
    with pytest.raises(ValueError, match="lease_ttl_ms"):
        kcache.Cache(str(tmp_path), lease_ttl_ms=0)
    with pytest.raises(TypeError):
        kcache.Cache(str(tmp_path), explain=1.0)


def test_key_label_and_private(tmp_path):
    token = "tok-5ecret-9921"
    k = kcache.key("lbl/1", label="saxpy_label_kernel", private=["user_token"], ir=b"ir", user_token=token)
    assert k.label == "saxpy_label_kernel"
    assert "saxpy_label_kernel" in repr(k)
    # The label is not part of the key; private changes only what is stored.
    assert k == kcache.key("lbl/1", ir=b"ir", user_token=token)
    with pytest.raises(ValueError, match="user_tokn"):
        kcache.key("lbl/1", private=["user_tokn"], ir=b"ir", user_token=token)
    with pytest.raises(TypeError):
        kcache.key("lbl/1", private="user_token", ir=b"ir", user_token=token)
    with pytest.raises(TypeError):
        kcache.key("lbl/1", label=3, ir=b"ir")
    store = tmp_path / "store"
    with kcache.Cache(str(store), engine="files", compression="none", memory=False, sync_commit=True) as c:
        c.get_or_compile(k, lambda: {"obj": b"compiled"})
        # A changed component under the same label: a miss the journal records.
        k2 = kcache.key("lbl/1", label="saxpy_label_kernel", private=["user_token"], ir=b"ir2", user_token=token)
        c.get_or_compile(k2, lambda: {"obj": b"compiled2"})
    data = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert b"saxpy_label_kernel" in data
    assert token.encode() not in data


def test_signed_remote_only_leaves_an_unsigned_remote_out(tmp_path, redis):
    kinds = lambda c: [t["kind"] for t in c.stats()["tiers"]]  # noqa: E731
    with kcache.Cache(str(tmp_path / "a"), remote=redis.url, env=False) as c:
        assert "remote" in kinds(c)
    with kcache.Cache(str(tmp_path / "b"), remote=redis.url, env=False, signed_remote_only=True) as c:
        assert "remote" not in kinds(c)
    # One log line, in a process of its own (the log is the process's).
    code = ("import kcache, sys; c = kcache.Cache(sys.argv[1], remote=sys.argv[2], env=False, "
            "signed_remote_only=True); c.close()")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "b"), redis.url], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("remote tier left out") == 1, r.stderr
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    with kcache.Cache(str(tmp_path / "c"), remote=redis.url, remote_secret_file=str(secret), env=False,
                      signed_remote_only=True) as c:
        assert "remote" in kinds(c)

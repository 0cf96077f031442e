"""kcache.triton where real users break it: written-out files removed or
damaged, a read-only TRITON_CACHE_DIR, compiles that raise (an exception
kept alive, its frames' locals intact, a thread waiting for the same
kernel), a holder killed mid-compile, the written-out files' limit,
triton_key() remembered, readable keys in `kcache misses`, Triton absent."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "triton_scenarios.py")


def _hit_dirs(env):
    files = os.path.join(env.base["TRITON_CACHE_DIR"], "kcache-files")
    return [os.path.join(files, d) for d in os.listdir(files) if not d.startswith(("pid-", "tmp-", "del-", "."))]


def _scenario(env, *args, stdin=None, **extra):
    return subprocess.Popen([sys.executable, SCENARIOS, *map(str, args)], env=env.env(**extra),
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_removed_or_damaged_written_out_file_is_written_again(triton_env):
    cold = triton_env.run(1)
    [d] = _hit_dirs(triton_env)
    [cubin] = glob.glob(os.path.join(d, "*.cubin"))
    good = open(cubin, "rb").read()
    os.unlink(cubin)  # a cleaner, a quota, a user
    warm = triton_env.run(1)
    assert warm["cubins"] == cold["cubins"] and triton_env.ptxas_runs() == 1
    assert open(cubin, "rb").read() == good
    # One byte flipped in the written-out copy: not served, written again.
    with open(cubin, "r+b") as f:
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0xFF]))
    again = triton_env.run(1)
    assert again["cubins"] == cold["cubins"] and triton_env.ptxas_runs() == 1
    assert open(cubin, "rb").read() == good


def _immutable(path, on):
    return subprocess.run(["chattr", "-R", "+i" if on else "-i", path], capture_output=True).returncode == 0


@pytest.mark.parametrize("readonly", ["1", "0"])
def test_read_only_cache_dir_still_serves_hits(triton_env, tmp_path, readonly):
    # A folder no write can change (immutable: not even root's): filled
    # first, then used read-only. The files engine: an LMDB store needs its
    # lock file writable.
    cdir = str(tmp_path / "ro-cache")
    fill = triton_env.run(2, TRITON_CACHE_DIR=cdir, KCACHE_ENGINE="files")
    before = sorted(os.listdir(cdir))
    if shutil.which("chattr") is None or not _immutable(cdir, True):
        pytest.skip("chattr +i is not available here (a read-only folder for root)")
    try:
        res = triton_env.run(2, TRITON_CACHE_DIR=cdir, KCACHE_READONLY=readonly, KCACHE_ENGINE="files")
        assert res["cubins"] == fill["cubins"]
        if readonly == "1":
            assert triton_env.ptxas_runs() == 2  # hits from the read-only store
        assert sorted(os.listdir(cdir)) == before
    finally:
        _immutable(cdir, False)


def _assert_frames_intact(frames):
    # Every frame of the traceback the program got still has its locals
    # (pdb.pm() and %debug see them): each argument it was called with, and
    # Triton's compile frame its own.
    assert frames
    assert all(not f["missing_args"] for f in frames), frames
    compile_frames = [f for f in frames if f["function"] == "compile" and f["module"] == "triton.compiler.compiler"]
    assert compile_frames and {"src", "target", "options", "key", "fn_cache_manager"} <= set(compile_frames[0]["locals"])


def _failing_pair(triton_env, first_cmd, **extra):
    # Process 1 compiles a kernel that fails and keeps the exception alive
    # (as a notebook keeps the last one); process 2 must not wait for it.
    bound = dict(KCACHE_WAIT_BOUND_MS=600000, KCACHE_LEASE_TTL_MS=600000, **extra)
    first = _scenario(triton_env, first_cmd, stdin=subprocess.PIPE, **bound)
    line = first.stdout.readline()
    while line and not line.startswith("RESULT "):  # Triton's own prints
        line = first.stdout.readline()
    assert line, first.stderr.read()
    assert json.loads(line[7:])["ready"]
    _assert_frames_intact(json.loads(line[7:])["frames"])
    try:
        t = time.time()
        second = _scenario(triton_env, first_cmd.replace("-and-keep", "").replace("-keep", ""), **bound)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        assert json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][-1][7:])["ready"]
        assert time.time() - t < 100 and first.poll() is None
    finally:
        first.stdin.close()
        err1 = first.stderr.read()
        first.wait(60)
    return err1


def test_failed_compile_with_live_exception_does_not_stall_others(triton_env):
    err = _failing_pair(triton_env, "fail-and-keep")
    assert "leaked" not in err  # the process ended holding a Triton exception


def test_failed_backend_compile_with_live_exception_does_not_stall_others(triton_env, tmp_path):
    import triton
    real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    failing = tmp_path / "ptxas-failing"
    failing.write_text(f'#!/bin/sh\ncase "$1" in --version) exec {real} "$@" ;; esac\nexit 1\n')
    failing.chmod(0o755)
    err = _failing_pair(triton_env, "fail-ptxas-keep", TRITON_PTXAS_PATH=str(failing),
                        TRITON_PTXAS_BLACKWELL_PATH=str(failing))
    assert "leaked" not in err


def test_failed_first_backend_compile_without_install_does_not_stall_others(triton_env, tmp_path):
    # TRITON_CACHE_MANAGER alone: Triton imports kcache.triton inside the
    # process's first compile, which then fails in ptxas.
    import triton
    real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    failing = tmp_path / "ptxas-failing"
    failing.write_text(f'#!/bin/sh\ncase "$1" in --version) exec {real} "$@" ;; esac\nexit 1\n')
    failing.chmod(0o755)
    err = _failing_pair(triton_env, "fail-ptxas-env-keep", TRITON_PTXAS_PATH=str(failing),
                        TRITON_PTXAS_BLACKWELL_PATH=str(failing))
    assert "leaked" not in err


def test_failed_compile_keeps_its_frames_and_a_waiting_thread_compiles(triton_env, tmp_path):
    # Thread A's compile fails in ptxas while thread B of the same process
    # waits in get_group() for A's flight: B compiles the kernel itself,
    # and A's exception reaches A with every local of its frames.
    import triton
    real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    fifo = str(tmp_path / "release")
    os.mkfifo(fifo)
    script = tmp_path / "ptxas-first-fails"
    script.write_text(f'#!/bin/sh\ncase "$1" in --version) exec {real} "$@" ;; esac\n'
                      'echo "$$" >> "$PTXAS_COUNT_FILE"\n'
                      f'if mkdir "{fifo}.started" 2>/dev/null; then cat "{fifo}" >/dev/null; exit 1; fi\n'
                      f'exec {real} "$@"\n')
    script.chmod(0o755)
    p = _scenario(triton_env, "fail-waited", fifo, TRITON_PTXAS_PATH=str(script),
                  TRITON_PTXAS_BLACKWELL_PATH=str(script), KCACHE_WAIT_BOUND_MS=600000, KCACHE_LEASE_TTL_MS=600000)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    r = json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][-1][7:])
    assert r["a"] not in ("NoneType", "str"), r  # A's compile raised
    _assert_frames_intact(r["frames"])
    assert len(r["b"]) == 64, r["b"]  # B compiled the kernel (the cubin's SHA-256)
    assert triton_env.ptxas_runs() == 2
    assert r["stats"]["compiles"] == 1 and r["stats"]["waits"] >= 1  # B waited for A's flight, then took it
    # Stored by B: a new process loads it.
    again = triton_env.run(1)
    assert list(again["cubins"].values()) == [r["b"]] and triton_env.ptxas_runs() == 2


def test_holder_killed_is_taken_over_before_its_lease_expires(triton_env):
    # The lease would last ten minutes: the waiter compiles once it sees
    # the holder (same host) is dead, not when the lease runs out.
    long = dict(KCACHE_LEASE_TTL_MS=600000, KCACHE_WAIT_BOUND_MS=600000)
    holder = triton_env.start(1, PTXAS_SLEEP=120, **long)
    deadline = time.time() + 120
    while triton_env.ptxas_runs() < 1:
        assert holder.poll() is None and time.time() < deadline
        time.sleep(0.1)
    waiter = triton_env.start(1, **long)
    time.sleep(2)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    res = triton_env.result(waiter, timeout=90)
    assert triton_env.ptxas_runs() == 2
    assert res["stats"]["compiles"] == 1 and res["stats"]["lease_takeovers"] >= 1


def test_holder_killed_is_taken_over_with_a_remote_tier(triton_env, redis, tmp_path):
    # KCACHE_REMOTE: the lease is held on the Redis server too; a holder of
    # this host that died gives it up there at once as well.
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    long = dict(KCACHE_LEASE_TTL_MS=600000, KCACHE_WAIT_BOUND_MS=600000, KCACHE_REMOTE=redis.url,
                KCACHE_REMOTE_SECRET_FILE=str(secret))
    holder = triton_env.start(1, PTXAS_SLEEP=120, **long)
    deadline = time.time() + 120
    while triton_env.ptxas_runs() < 1:
        assert holder.poll() is None and time.time() < deadline
        time.sleep(0.1)
    waiter = triton_env.start(1, **long)
    time.sleep(2)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    res = triton_env.result(waiter, timeout=90)
    assert triton_env.ptxas_runs() == 2
    assert res["stats"]["compiles"] == 1 and res["stats"]["lease_takeovers"] >= 1


def _tree_size(dirs):
    return sum(os.path.getsize(os.path.join(d, f)) for d in dirs for f in os.listdir(d))


def test_written_out_files_are_bounded(triton_env):
    triton_env.run(3)
    dirs = _hit_dirs(triton_env)
    assert len(dirs) == 3
    sizes = sorted(_tree_size([d]) for d in dirs)
    limit = sizes[-1] + sizes[0] // 2  # room for one folder, not three
    old = time.time() - 3600
    for d in dirs + [os.path.join(os.path.dirname(dirs[0]), ".swept")]:
        os.utime(d, (old, old))  # an hour unused, and last swept an hour ago
    res = triton_env.run(1, KCACHE_MAX_SIZE=str(limit))
    assert len(res["cubins"]) == 1
    assert _tree_size(_hit_dirs(triton_env)) <= limit


def _triton_tree(tmp_path, edit, added=b"\n# edited\n"):
    # A Triton whose files are the installed ones (symbolic links), except
    # `edit`, a copy with `added` appended (a comment by default).
    import triton
    real = os.path.dirname(triton.__file__)
    site = tmp_path / "site"
    top = site / "triton"
    parts = edit.split("/")
    src, dst = real, str(top)
    for i, part in enumerate(parts):
        os.makedirs(dst)
        for n in os.listdir(src):
            if n != part and n != "__pycache__":
                os.symlink(os.path.join(src, n), os.path.join(dst, n))
        src, dst = os.path.join(src, part), os.path.join(dst, part)
    shutil.copyfile(src, dst)
    with open(dst, "ab") as f:
        f.write(added)
    return str(site)


def _on_path(site):
    # `site` first, then the rest of the path (which may hold the kcache under test).
    return os.pathsep.join([site] + [p for p in [os.environ.get("PYTHONPATH")] if p])


def test_triton_key_is_remembered_and_invalidated(triton_env, tmp_path):
    def key(**extra):
        p = _scenario(triton_env, "key", **extra)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        r = json.loads(out.splitlines()[-1])
        assert r["key"] == r["own"]  # the same value as Triton's own
        return r

    first = key()
    assert first["source"] == "computed"
    second = key()
    assert second["source"] == "remembered" and second["key"] == first["key"]
    # An edited module under triton/ changes the key: computed afresh.
    site = _triton_tree(tmp_path, "language/random.py")
    path = _on_path(site)
    edited = key(PYTHONPATH=path)
    assert edited["source"] == "computed" and edited["key"] != first["key"]
    # The real tree is still remembered, and so is the edited one, until a
    # file of it is touched (a new mtime, the same bytes): computed again,
    # to the same value.
    assert key()["source"] == "remembered"
    assert key(PYTHONPATH=path)["source"] == "remembered"
    copied = os.path.join(site, "triton", "language", "random.py")
    st = os.stat(copied)
    os.utime(copied, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = key(PYTHONPATH=path)
    assert touched["source"] == "computed" and touched["key"] == edited["key"]
    assert key(PYTHONPATH=path)["source"] == "remembered"


def test_triton_key_memo_is_keyed_on_a_stat_walk_of_the_tree(tmp_path):
    # The walk over a Triton-shaped tree of its own (the installed Triton is
    # never changed): the same tree gives the same digest, any change to a
    # file's identity (mtime, size, inode, a file added or removed, also in
    # a backend linked in from elsewhere) another; __pycache__ is left out.
    pytest.importorskip("triton")
    from kcache.triton import _key

    root = tmp_path / "triton"
    elsewhere = tmp_path / "plugin" / "extra"
    for rel, data in (("__init__.py", b"__version__ = '3.9.0'\n"), ("_C/libtriton.so", b"\x7fELF" + bytes(4096)),
                      ("language/core.py", b"def f(): pass\n"), ("backends/nvidia/compiler.py", b"x = 1\n"),
                      ("backends/nvidia/lib/libcupti.so", b"\x7fELF" + bytes(64))):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    elsewhere.mkdir(parents=True)
    (elsewhere / "compiler.py").write_bytes(b"y = 2\n")
    os.symlink(elsewhere, root / "backends" / "extra")  # a backend installed elsewhere
    os.symlink(root, root / "backends" / "loop")  # a link back up is walked once
    walk = lambda: _key.stat_walk(str(root))  # noqa: E731
    d0 = walk()
    assert walk() == d0

    (root / "language" / "__pycache__").mkdir()
    (root / "language" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"pyc")
    assert walk() == d0

    lib = root / "_C" / "libtriton.so"
    st = os.stat(lib)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched
    assert walk() != d0
    time.sleep(0.01)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))  # and back: its ctime moved on
    d0 = walk()
    assert walk() == d0
    # Rewritten in place, same size, same inode, mtime put back (touch -r):
    # only the ctime tells.
    time.sleep(0.01)
    with open(lib, "r+b") as f:
        f.write(b"\x7fELF\x02")
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(lib).st_ino == st.st_ino and os.stat(lib).st_size == st.st_size
    assert walk() != d0
    d0 = walk()

    copy = root / "_C" / "libtriton.so.new"  # the same bytes and times in a new inode
    shutil.copy2(lib, copy)
    os.replace(copy, lib)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    d1 = walk()
    assert d1 != d0

    plugin = elsewhere / "compiler.py"
    pst = os.stat(plugin)
    os.utime(plugin, ns=(pst.st_atime_ns, pst.st_mtime_ns + 10**9))
    d2 = walk()
    assert d2 != d1

    (root / "language" / "random.py").write_bytes(b"")  # a module added
    d3 = walk()
    assert d3 != d2
    os.unlink(root / "language" / "random.py")
    assert walk() == d2

    with open(root / "backends" / "nvidia" / "compiler.py", "ab") as f:  # grown, whatever its mtime
        f.write(b"\n")
    os.utime(root / "backends" / "nvidia" / "compiler.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert walk() != d2

    # The store key follows the walk.
    assert _key.record_key(str(root), d0).hex == _key.record_key(str(root), d0).hex
    assert _key.record_key(str(root), d0).hex != _key.record_key(str(root), d1).hex


def test_triton_key_is_remembered_from_the_variable_alone(triton_env):
    """TRITON_CACHE_MANAGER alone (no install()): the wheel's start-up hook
    imports kcache.triton right after `import triton`, so triton_key() is
    remembered before Triton first computes it."""
    def key(**extra):
        p = _scenario(triton_env, "key-env", **extra)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        return json.loads(out.splitlines()[-1])

    first = key()
    assert first["booted"] and first["source"] == "computed" and first["key"] == first["own"]
    second = key()
    assert second["booted"] and second["source"] == "remembered" and second["key"] == first["key"]
    # Without the variable nothing of kcache is imported at start.
    env = triton_env.env(manager="triton")
    code = "import sys, triton; print(int('kcache' in sys.modules or '_kcache_boot' in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "0", p.stderr


def _kcache_tool():
    tool = os.environ.get("TEST_KCACHE_TOOL")
    if tool and os.access(tool, os.X_OK):
        return tool
    for cand in (os.path.join(HERE, "..", "..", "build", "tools", "kcache"),):
        if os.access(cand, os.X_OK):
            return cand
    pytest.skip("the kcache tool of this build is not found (TEST_KCACHE_TOOL)")


def test_misses_name_the_changed_triton_option(triton_env):
    tool = _kcache_tool()
    for w in (4, 8):
        p = _scenario(triton_env, "options", w)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    store = os.path.join(triton_env.base["TRITON_CACHE_DIR"], "kcache")
    r = subprocess.run([tool, "misses", "--dir", store], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")})
    assert r.returncode == 0, r.stderr
    assert '"add_kernel"' in r.stdout
    assert "num_warps: 4 → 8" in r.stdout, r.stdout


_GLOBAL_KERNEL = r"""
import hashlib, json, os
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SCALE = tl.constexpr(float(os.environ["SCALE"]))


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)


try:  # Triton 3.1 on: arguments by name
    src = ASTSource(scale_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                    {"BLOCK": 128})
except TypeError:  # Triton 3.0: by position
    src = ASTSource(scale_kernel, {0: "*fp32", 1: "*fp32", 2: "i32"}, {3: 128})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
print(json.dumps({"cubin": hashlib.sha256(k.asm["cubin"]).hexdigest(), "ptx": k.asm["ptx"]}))
"""


def test_a_changed_global_constexpr_misses(triton_env, tmp_path):
    """A kernel that reads a module-level `SCALE: tl.constexpr`: a process
    where SCALE is 3.0 compiles again rather than loading the kernel
    compiled with 2.0 (Triton 3.0 leaves such values out of its own hash:
    with Triton's own cache the 3.0 process gets the 2.0 kernel), and
    `kcache misses` names the value that changed."""
    script = tmp_path / "scale_kernel.py"
    script.write_text(_GLOBAL_KERNEL)

    def run(scale):
        r = subprocess.run([sys.executable, str(script)], env=triton_env.env(SCALE=scale), capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    two = run("2.0")
    three = run("3.0")
    assert triton_env.ptxas_runs() == 2
    assert three["cubin"] != two["cubin"]
    assert "0f40400000" in three["ptx"]  # 3.0f, multiplied in
    assert run("2.0")["cubin"] == two["cubin"] and triton_env.ptxas_runs() == 2  # a hit again
    store = os.path.join(triton_env.base["TRITON_CACHE_DIR"], "kcache")
    r = subprocess.run([_kcache_tool(), "misses", "--dir", store], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")})
    assert r.returncode == 0, r.stderr
    assert "globals:" in r.stdout and "constexpr[3.0]" in r.stdout, r.stdout


def _libdevice(env, **extra):
    # The libdevice path Triton's options hold in a process of this environment.
    code = ("from triton.backends.nvidia.compiler import CUDAOptions\n"
            "print(dict(CUDAOptions().extern_libs)['libdevice'])")
    r = subprocess.run([sys.executable, "-c", code], env=env.env(**extra), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


LIBDEVICE = "backends/nvidia/lib/libdevice.10.bc"


def test_a_store_filled_by_triton_at_another_path_hits(triton_env, tmp_path):
    """A store filled by one Triton install serves the same Triton installed
    at another path (another venv, an image's): Triton's options name
    libdevice by its absolute path (extern_libs), which is keyed by the
    file's content and name, not its folder. The second install is a tree
    at another folder on sys.path whose files are the installed Triton's
    (symbolic links), libdevice a copy: Triton's default libdevice path
    follows its package folder, as a relocated install's does."""
    site = _triton_tree(tmp_path, LIBDEVICE, added=b"")
    moved = dict(PYTHONPATH=_on_path(site))
    here, there = _libdevice(triton_env), _libdevice(triton_env, **moved)
    assert there == os.path.join(site, "triton", LIBDEVICE) and here != there
    first = triton_env.run(3)  # elementwise add (two block sizes) and GELU
    assert triton_env.ptxas_runs() == 3
    res = triton_env.run(3, **moved)
    assert triton_env.ptxas_runs() == 3, "the Triton at another path compiled again"
    assert res["cubins"] == first["cubins"] and res["stats"]["compiles"] == 0 and res["stats"]["hits"] >= 3


def test_libdevice_with_other_bytes_at_the_same_path_is_a_miss(triton_env, tmp_path):
    """libdevice rewritten in place (the same path, other bytes) is a miss,
    and `kcache misses` names extern_libs as the option that changed. The
    Triton is a tree of the installed one's files (symbolic links) with
    libdevice a copy, so the installed one is never changed; the kernel
    (elementwise add) does not link libdevice, so any bytes compile."""
    tool = _kcache_tool()
    site = _triton_tree(tmp_path, LIBDEVICE, added=b"")
    env = dict(PYTHONPATH=_on_path(site))
    first = triton_env.run(1, **env)
    assert triton_env.ptxas_runs() == 1
    assert triton_env.run(1, **env)["cubins"] == first["cubins"] and triton_env.ptxas_runs() == 1
    lib = os.path.join(site, "triton", LIBDEVICE)
    size = os.path.getsize(lib)
    with open(lib, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    res = triton_env.run(1, **env)
    assert triton_env.ptxas_runs() == 2, "a changed libdevice was a hit"
    assert res["cubins"] == first["cubins"] and res["stats"]["compiles"] == 1
    store = os.path.join(triton_env.base["TRITON_CACHE_DIR"], "kcache")
    r = subprocess.run([tool, "misses", "--dir", store], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")})
    assert r.returncode == 0, r.stderr
    assert "extern_libs: " in r.stdout and "libdevice.10.bc" in r.stdout, r.stdout
    assert site not in r.stdout, r.stdout  # named by content and base name, not by folder


def test_a_manager_reached_through_more_calls_keys_the_same(triton_env, tmp_path):
    """The key's readable parts (kernel, options, target) are read from
    Triton's compile frame however many calls lie between it and
    get_group: a program whose own manager wraps kcache's (each lookup
    passes through a few layers of its code) hits what the plain manager
    stored, and the plain manager hits what it stored."""
    first = triton_env.run(1)
    assert triton_env.ptxas_runs() == 1

    def wrapped(**extra):
        p = _scenario(triton_env, "wrapped-manager", **extra)
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        r = json.loads(out.strip().splitlines()[-1])
        assert r["lookups"] >= 1  # its own manager was Triton's
        return r

    res = wrapped()
    assert triton_env.ptxas_runs() == 1, "the wrapped manager missed what the plain one stored"
    assert res["cubins"] == first["cubins"] and res["stats"]["compiles"] == 0
    other = dict(TRITON_CACHE_DIR=str(tmp_path / "other-cache"))
    assert wrapped(**other)["cubins"] == first["cubins"] and triton_env.ptxas_runs() == 2
    assert triton_env.run(1, **other)["cubins"] == first["cubins"]
    assert triton_env.ptxas_runs() == 2, "the plain manager missed what the wrapped one stored"


def test_import_without_triton_says_what_to_install():
    code = "import sys; sys.modules['triton'] = None\nimport kcache.triton"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "pip install 'kcache-jit[triton]'" in r.stderr, r.stderr

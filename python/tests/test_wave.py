"""kcache.wave with real Wave (wave-lang from PyPI) on the CPU: wave_worker.py
compiles kernels for gfx942 (compile only: no GPU, run and bench off) in
real processes, Wave's compiles counted in each. Each hazard of Wave's own
cache is shown first with Wave's cache (HOST_CACHE=wave, its folder
$WAVE_CACHE_DIR), then with kcache. Runs in build/venv-torch (make
python-torch)."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("wave_lang", reason="Wave is not installed in this Python (make python-torch installs it)")

from hosts_support import HostEnv  # noqa: E402

# Processes started together on an empty store: eight, as the ranks of a node.
N = 8


def _kc(tmp_path, **extra):
    return HostEnv(tmp_path, "wave_worker.py", KCACHE_ENGINE="files", WAVE_CACHE_DIR=tmp_path / "wave", **extra)


def _wave(tmp_path, **extra):
    return HostEnv(tmp_path, "wave_worker.py", HOST_CACHE="wave", WAVE_CACHE_DIR=tmp_path / "wave", **extra)


def test_round_trip_in_a_new_process(tmp_path):
    env = _kc(tmp_path)
    cold = env.run()
    assert cold["enabled"] and cold["compiles"] == 2 and cold["stats"]["misses"] == 2
    warm = env.run()
    assert warm["compiles"] == 0 and warm["stats"]["hits"] == 2 and warm["stats"]["misses"] == 0
    # The same binaries, and the grid rebuilt from data gives what Wave's
    # lambdified grid gave (the GEMM's M is dynamic: 256 and 1000 rows).
    assert warm["kernels"] == cold["kernels"]
    assert cold["kernels"]["gemm"]["grid"] == [[4, 4, 1], [16, 4, 1]]
    assert cold["kernels"]["add"]["vmfb_size"] > 1000


def test_processes_started_together_compile_each_kernel_once(tmp_path):
    # Wave's own cache: every process compiles every kernel.
    (tmp_path / "own").mkdir()
    own = _wave(tmp_path / "own")
    results = [own.result(p, timeout=400) for p in [own.start() for _ in range(N)]]
    assert sum(r["compiles"] for r in results) == 2 * N
    env = _kc(tmp_path)
    results = [env.result(p, timeout=400) for p in [env.start() for _ in range(N)]]
    assert sum(r["compiles"] for r in results) == 2, [r["compiles"] for r in results]
    assert env.compiles() == 2
    assert all(r["kernels"] == results[0]["kernels"] for r in results)


def test_changed_option_is_a_miss(tmp_path):
    opt = dict(KERNELS="add", OPTION="linearize_shared_access=True")
    own = _wave(tmp_path)
    assert own.run(KERNELS="add")["compiles"] == 1
    # Wave: the option is not in its key, the other kernel is returned.
    assert own.run(**opt)["compiles"] == 0
    env = _kc(tmp_path)
    assert env.run(KERNELS="add")["compiles"] == 1
    res = env.run(**opt)
    assert res["compiles"] == 1 and res["stats"]["misses"] == 1
    assert env.run(**opt)["compiles"] == 0
    # `kcache misses` names the option.
    r = subprocess.run([_kcache_tool(), "misses", "--dir", env.kcache_dir], capture_output=True, text=True,
                       timeout=60, env=dict({k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")},
                                        KCACHE_ENGINE="files"))
    assert r.returncode == 0, r.stderr
    assert 'option[linearize_shared_access]: ["bool", false] → ["bool", true]' in r.stdout, r.stdout


def _kcache_tool():
    tool = os.environ.get("TEST_KCACHE_TOOL")
    if tool and os.access(tool, os.X_OK):
        return tool
    import kcache

    cand = os.path.join(os.path.dirname(kcache.__file__), "_bin", "kcache")
    if os.access(cand, os.X_OK):
        return cand
    pytest.skip("the kcache tool is not found (TEST_KCACHE_TOOL)")


def test_changed_helper_is_a_miss(tmp_path):
    own = _wave(tmp_path)
    assert own.run(KERNELS="add")["kernels"]["add"]["addf"]
    stale = own.run(KERNELS="add", HELPER="mul")
    # Wave: the helper is not in its key: the adding kernel is returned.
    assert stale["compiles"] == 0 and stale["kernels"]["add"]["addf"] and not stale["kernels"]["add"]["mulf"]
    env = _kc(tmp_path)
    assert env.run(KERNELS="add")["compiles"] == 1
    res = env.run(KERNELS="add", HELPER="mul")
    assert res["compiles"] == 1 and res["kernels"]["add"]["mulf"] and not res["kernels"]["add"]["addf"]


def test_lambda_constraint_hits_in_a_second_process(tmp_path):
    own = _wave(tmp_path)
    assert own.run(KERNELS="lambda")["compiles"] == 1
    # Wave: the lambda's address is in its key: never a hit.
    assert own.run(KERNELS="lambda")["compiles"] == 1
    env = _kc(tmp_path)
    assert env.run(KERNELS="lambda")["compiles"] == 1
    res = env.run(KERNELS="lambda")
    assert res["compiles"] == 0 and res["stats"]["hits"] == 1


def test_truncated_entry_is_compiled_again(tmp_path):
    own = _wave(tmp_path)
    cold = own.run(KERNELS="add")
    vmfbs = glob.glob(str(tmp_path / "wave" / "*" / "*.vmfb"))
    assert len(vmfbs) == 1
    with open(vmfbs[0], "r+b") as f:
        f.truncate(100)
    served = own.run(KERNELS="add")
    # Wave: the cut vmfb is served.
    assert served["compiles"] == 0 and served["kernels"]["add"]["vmfb_size"] == 100
    env = _kc(tmp_path)
    cold = env.run(KERNELS="add")
    entries = [p for p in glob.glob(os.path.join(env.kcache_dir, "files", "**", "*"), recursive=True)
               if os.path.isfile(p) and os.path.getsize(p) > 1000]
    assert entries
    for p in entries:
        with open(p, "r+b") as f:
            f.truncate(100)
    res = env.run(KERNELS="add")
    assert res["compiles"] == 1 and res["kernels"] == cold["kernels"]


def test_planted_grid_is_never_executed(tmp_path):
    marker = tmp_path / "planted-ran"
    own = _wave(tmp_path)
    own.run(KERNELS="add", PLANT_GRID=marker)
    assert not marker.exists()
    # Wave: a fresh process eval()s the stored grid text.
    own.run(KERNELS="add")
    assert marker.exists()
    marker.unlink()
    env = _kc(tmp_path)
    planted = env.run(KERNELS="add", PLANT_GRID=marker)
    assert planted["compiles"] == 1
    res = env.run(KERNELS="add")
    # The grid text is data to kcache: one that is not an arithmetic
    # expression is not stored, and the kernel is compiled again.
    assert not marker.exists()
    assert res["compiles"] == 1 and res["kernels"]["add"]["grid"] == [[256, 2, 1], [256, 2, 1]]
    assert env.run(KERNELS="add")["compiles"] == 0
    assert not marker.exists()


def test_upgraded_compiler_is_a_miss(tmp_path):
    upgrade = dict(KERNELS="add", FAKE_VERSION="iree-base-compiler=3.9.99")
    own = _wave(tmp_path)
    assert own.run(KERNELS="add")["compiles"] == 1
    # Wave: no version in its key: the old compiler's kernel is returned.
    assert own.run(**upgrade)["compiles"] == 0
    env = _kc(tmp_path)
    assert env.run(KERNELS="add")["compiles"] == 1
    res = env.run(**upgrade)
    assert res["compiles"] == 1 and res["stats"]["misses"] == 1
    assert env.run(**upgrade)["compiles"] == 0
    r = subprocess.run([_kcache_tool(), "misses", "--dir", env.kcache_dir], capture_output=True, text=True,
                       timeout=60, env=dict({k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")},
                                        KCACHE_ENGINE="files"))
    assert r.returncode == 0, r.stderr
    assert "iree_compiler:" in r.stdout and "→ 3.9.99" in r.stdout, r.stdout


def _long_running(env, tmp_path):
    """A process that compiled `add`, then `gemm` after another process
    stored it: the kernels the long-running process compiled for gemm."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    long = env.start(KERNELS="add", THEN_KERNELS="gemm", READY=ready, GO=go)
    deadline = time.time() + 300
    while not ready.exists():
        assert long.poll() is None and time.time() < deadline
        time.sleep(0.1)
    assert env.run(KERNELS="gemm")["compiles"] == 1
    go.touch()
    res = env.result(long, timeout=300)
    ready.unlink()
    go.unlink()
    return res["compiles_then"]


def test_long_running_process_sees_kernels_stored_since_it_started(tmp_path):
    # Wave lists its folder once per process: gemm is compiled again.
    (tmp_path / "own").mkdir()
    assert _long_running(_wave(tmp_path / "own"), tmp_path) == 1
    assert _long_running(_kc(tmp_path), tmp_path) == 0


def test_entry_missing_a_part_is_compiled_again(tmp_path):
    own = _wave(tmp_path)
    cold = own.run(KERNELS="add")
    infos = glob.glob(str(tmp_path / "wave" / "*" / "*.kernel_info.json"))
    assert len(infos) == 1
    os.unlink(infos[0])
    # Wave: every later compile of the kernel raises.
    p = own.start(KERNELS="add")
    out, err = p.communicate(timeout=400)
    assert p.returncode != 0 and "kernel_info.json" in err, err[-2000:]
    env = _kc(tmp_path)
    assert env.run(KERNELS="add", DROP_ARTIFACT="info")["compiles"] == 1
    res = env.run(KERNELS="add")
    assert res["compiles"] == 1 and res["kernels"] == cold["kernels"]
    assert env.run(KERNELS="add")["compiles"] == 0


def test_wave_runtime_hsaco_is_written_out_on_a_hit(tmp_path):
    """With Wave's runtime the kernel is an HSACO file loaded by path: a hit
    in a new process with an empty binaries folder writes the same bytes
    where Wave's runtime looks (loading it needs HIP, absent here)."""
    env = _kc(tmp_path, KERNELS="add", OPTION="wave_runtime=True")
    cold = env.run()
    assert cold["compiles"] == 1 and cold["kernels"]["add"]["hip"] == "missing"
    (name, digest), = cold["kernels"]["add"]["hsaco"].items()
    shutil.rmtree(tmp_path / "wave" / "kcache-binaries")
    warm = env.run()
    assert warm["compiles"] == 0 and warm["stats"]["hits"] == 1
    assert warm["kernels"]["add"]["hsaco"] == {name: digest}
    # Not the kernel of the vmfb path: wave_runtime is in the key.
    assert env.run(OPTION="wave_runtime=False")["compiles"] == 1


def test_wave_runtime_stores_only_its_own_hsaco(tmp_path):
    """Wave's temporary binaries folder is one per process: a thread
    compiling another kernel at the same time writes its HSACO there too
    (and Wave, before each compile, empties it). The HSACO stored is the one
    this compile's vmfb embeds, never another file of the folder; with none
    there the kernel is not stored, and an entry without its HSACO is a
    miss."""
    (tmp_path / "clean").mkdir()
    clean = _kc(tmp_path / "clean", KERNELS="add", OPTION="wave_runtime=True").run()
    (name, digest), = clean["kernels"]["add"]["hsaco"].items()
    (tmp_path / "noisy").mkdir()
    env = _kc(tmp_path / "noisy", KERNELS="add", OPTION="wave_runtime=True")
    cold = env.run(HSACO_NOISE="20")
    assert cold["compiles"] == 1 and cold["kernels"]["add"]["hsaco"] == {name: digest}
    shutil.rmtree(tmp_path / "noisy" / "wave" / "kcache-binaries")
    warm = env.run(HSACO_NOISE="20")
    assert warm["compiles"] == 0 and warm["kernels"]["add"]["hsaco"] == {name: digest}

    (tmp_path / "dropped").mkdir()
    env = _kc(tmp_path / "dropped", KERNELS="add", OPTION="wave_runtime=True")
    p = env.start(HSACO_NOISE="drop")
    out, err = p.communicate(timeout=400)
    assert p.returncode == 0, err[-2000:]
    assert "not stored (_NoHsaco: no HSACO of this kernel in" in err, err[-2000:]
    assert env.run()["compiles"] == 1  # nothing was stored
    assert env.run()["compiles"] == 0

    # An entry stored without its HSACO (by an older kcache, or damaged).
    (tmp_path / "partial").mkdir()
    env = _kc(tmp_path / "partial", KERNELS="add", OPTION="wave_runtime=True")
    assert env.run(DROP_ARTIFACT="hsaco")["compiles"] == 1
    res = env.run()
    assert res["compiles"] == 1 and res["kernels"]["add"]["hsaco"] == {name: digest}
    assert env.run()["compiles"] == 0


def test_compile_that_raises_gives_its_flight_up(tmp_path):
    env = _kc(tmp_path)
    failed = tmp_path / "failed"
    holder = env.start(KERNELS="add", FAIL_FIRST=failed, HOLD=120)
    try:
        deadline = time.time() + 120
        while not failed.exists():
            assert holder.poll() is None and time.time() < deadline
            time.sleep(0.1)
        # The holder's compile raised and it lives on: the flight is given
        # up, so another process compiles at once rather than waiting.
        res = env.run(KERNELS="add")
        assert holder.poll() is None
        assert res["compiles"] == 1 and res["stats"]["lease_waits"] == 0
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_key_follows_helpers_through_modules_and_ignores_addresses():
    """The kernel key's function part, without compiling: a helper reached
    through a module of the program is keyed by its code; a lambda by its
    code and captured values, not its address."""
    import types

    import kcache.wave as kw

    def key_of(helper_src, scale):
        mod = types.ModuleType("helpers_mod")
        exec(helper_src, mod.__dict__)
        g = {"helpers_mod": mod, "scale": scale}
        exec("def kernel(x):\n    return helpers_mod.combine(x, scale) + (lambda y: y * scale)(x)\n", g)
        return kw._Keyer().function(g["kernel"])

    add = "def combine(x, y):\n    return x + y\n"
    mul = "def combine(x, y):\n    return x * y\n"
    assert key_of(add, 2) == key_of(add, 2)
    assert key_of(add, 2) != key_of(mul, 2)
    assert key_of(add, 2) != key_of(add, 3)
    with pytest.raises(kw._Unkeyable):
        kw._Keyer().value(object())


def test_import_says_what_to_install():
    code = "import sys; sys.modules['wave_lang'] = None\nimport kcache.wave"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "pip install 'kcache-jit[wave]'" in r.stderr, r.stderr
    code = ("import importlib.metadata as m; v = m.version\n"
            "m.version = lambda n: '3.8.0' if n == 'wave-lang' else v(n)\nimport kcache.wave")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "kcache.wave supports wave-lang 3.9; this is wave-lang 3.8.0" in r.stderr, r.stderr

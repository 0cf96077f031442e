"""kcache.torch with real PyTorch from PyPI on the CPU (Inductor's C++
backend): torch_worker.py's torch.compile'd programs in real processes, FX
graph compiles counted in each (fx_compiles: Inductor's fx_codegen_and_compile
runs) beside Inductor's own counters (fxgraph_cache_miss,
fxgraph_cache_hit: a graph loaded). Every process
has a TORCHINDUCTOR_CACHE_DIR of its own, so whatever it does not compile
comes from kcache. Runs in build/venv-torch (make python-torch)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed in this Python (make python-torch installs it)")

import kcache  # noqa: E402
from hosts_support import HostEnv, tier  # noqa: E402

# Processes started together on an empty store: eight, as many ranks of a
# node (each spends ~10 s of CPU importing torch and tracing before it looks
# anything up, so on 2 cores this test takes about 3 minutes).
N = 8


class TorchEnv(HostEnv):
    """HostEnv with a fresh TORCHINDUCTOR_CACHE_DIR for every process."""

    def env(self, **extra):
        e = super().env(**extra)
        if "TORCHINDUCTOR_CACHE_DIR" not in extra:
            n = len([d for d in os.listdir(self.tmp) if d.startswith("inductor")])
            e["TORCHINDUCTOR_CACHE_DIR"] = str(self.tmp / f"inductor{n}")
            os.makedirs(e["TORCHINDUCTOR_CACHE_DIR"])
        return e


def _env(tmp_path, store):
    env = TorchEnv(tmp_path, "torch_worker.py", KCACHE_DIR=store, KCACHE_ENGINE="files")
    env.kcache_dir = str(store)
    return env


@pytest.fixture(scope="module")
def warm_store(tmp_path_factory):
    """A store that one process filled: both programs compiled cold."""
    tmp = tmp_path_factory.mktemp("warm")
    env = _env(tmp, tmp / "kcache")
    cold = env.run()
    return tmp / "kcache", cold


def _copy(store, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(store, dst)
    return dst


def test_round_trip_in_a_new_process(warm_store, tmp_path):
    store, cold = warm_store
    assert cold["equal"] == [True, True] and cold["fx_compiles"] == 2 and cold["fx_miss"] == 2
    assert cold["fx_hit"] == 0
    assert cold["stats"]["compiles"] >= 4  # two graphs, their C++ kernel libraries (and the ISA probes)
    env = _env(tmp_path, _copy(store, tmp_path))
    warm = env.run()
    assert warm["equal"] == [True, True]
    assert warm["fx_compiles"] == 0 and warm["fx_miss"] == 0 and warm["fx_hit"] == 2
    # Every lookup that missed in the cold process hits: the two graphs and
    # the two AOTAutograd entries (whose hits load the graphs) once each,
    # every C++ build twice (its inputs, which name the files the compiler
    # read, then the built file under their content).
    assert warm["stats"]["misses"] == 0 and warm["stats"]["compiles"] == 0
    assert warm["stats"]["hits"] == 2 * cold["stats"]["misses"] - 4
    assert warm["aot_hit"] == 2
    # Nothing of the graphs is compiled again: no C++ build of a kernel
    # library (the one compiler run left preprocesses a header in a
    # temporary folder, which is not cached).
    assert warm["cxx_runs"] <= 1
    # The variable alone (the start-up hook) does the same.
    by_env = env.run(KCACHE_TORCH=1, PROGRAMS=1)
    assert by_env["enabled"] and by_env["fx_compiles"] == 0 and by_env["fx_hit"] == 1 and by_env["equal"] == [True]


_PROBE = """
import ctypes, json, os, sys
import kcache.torch
kcache.torch.enable()
from torch._inductor import cpp_builder
from torch._inductor.runtime.cache_dir_utils import cache_dir
src = os.path.join(cache_dir(), "probe", "probe.cpp")
os.makedirs(os.path.dirname(src), exist_ok=True)
with open(src, "w") as f:
    f.write('#include "value.h"\\nextern "C" int value() { return VALUE; }\\n')
b = cpp_builder.CppBuilder("probe", [src], cpp_builder.CppOptions(extra_flags=["-I" + sys.argv[1]]),
                           output_dir=os.path.dirname(src))
b.build()
print(json.dumps({"value": ctypes.CDLL(b.get_target_file_path()).value(), "stats": kcache.torch.cache().stats()}))
"""


def test_a_header_changed_in_place_is_a_miss(tmp_path):
    """A C++ build's key holds the content of every file the compiler read
    (its -MD list), not only the sources and the command line: a header
    edited in place, its size and mtime put back, is built again."""
    inc = tmp_path / "inc"
    inc.mkdir()
    header = inc / "value.h"
    header.write_text("#define VALUE 1\n")
    env = _env(tmp_path, tmp_path / "kcache")

    def run():
        r = subprocess.run([sys.executable, "-c", _PROBE, str(inc)], env=env.env(), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["value"] == 1 and cold["stats"]["compiles"] == 1
    warm = run()
    assert warm["value"] == 1 and warm["stats"]["compiles"] == 0 and warm["stats"]["misses"] == 0
    st = header.stat()
    header.write_text("#define VALUE 2\n")
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = run()
    assert changed["value"] == 2 and changed["stats"]["misses"] == 1
    assert run()["value"] == 2
    # Both contents stay stored: the first one back is a hit.
    header.write_text("#define VALUE 1\n")
    back = run()
    assert back["value"] == 1 and back["stats"]["misses"] == 0


def test_processes_started_together_compile_each_graph_once(tmp_path):
    env = _env(tmp_path, tmp_path / "kcache")
    procs = [env.start() for _ in range(N)]
    results = [env.result(p, timeout=400) for p in procs]
    assert all(r["equal"] == [True, True] for r in results)
    assert sum(r["fx_compiles"] for r in results) == 2, [r["fx_compiles"] for r in results]
    assert sum(r["fx_miss"] for r in results) == 2 and sum(r["fx_hit"] for r in results) == 2 * (N - 1)


def test_damaged_entry_is_a_miss(warm_store, tmp_path):
    store, _ = warm_store
    env = _env(tmp_path, _copy(store, tmp_path))
    # The FX graphs' entries (the C++ libraries stay: the graph is compiled
    # again, its kernels loaded).
    assert _damage_graphs(env.kcache_dir) == 2
    res = env.run(PROGRAMS=1)
    # AOTAutograd's entry hits and names the graph, whose entry is a miss:
    # the graph is compiled again.
    assert res["equal"] == [True] and res["fx_compiles"] == 1 and res["fx_hit"] == 0
    assert tier(res["stats"], "files")["corrupt"] >= 1


def _damage_graphs(kcache_dir):
    """Flips one byte in the middle of each FX graph entry of a
    files-engine store (those whose manifest names kcache.torch's graph
    namespace); returns how many."""
    n = 0
    for root, _, files in os.walk(os.path.join(kcache_dir, "files")):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "r+b") as f:
                data = f.read()
                if b"torch-fx/1" not in data:
                    continue
                f.seek(len(data) // 2)
                f.write(bytes([data[len(data) // 2] ^ 0xFF]))
                n += 1
    return n


def _kcache_tool():
    tool = os.environ.get("TEST_KCACHE_TOOL")
    if tool and os.access(tool, os.X_OK):
        return tool
    cand = os.path.join(os.path.dirname(kcache.__file__), "_bin", "kcache")
    if os.access(cand, os.X_OK):
        return cand
    pytest.skip("the kcache tool is not found (TEST_KCACHE_TOOL)")


def test_changed_inductor_option_is_a_miss_kcache_misses_names(warm_store, tmp_path):
    store, _ = warm_store
    env = _env(tmp_path, _copy(store, tmp_path))
    res = env.run(PROGRAMS=1, INDUCTOR_OPTION="epilogue_fusion=False")
    assert res["equal"] == [True] and res["fx_compiles"] == 1 and res["fx_miss"] == 1 and res["fx_hit"] == 0
    r = subprocess.run([_kcache_tool(), "misses", "--dir", env.kcache_dir], capture_output=True, text=True,
                       timeout=60, env=dict({k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")},
                                                   KCACHE_ENGINE="files"))
    assert r.returncode == 0, r.stderr
    assert "elementwise (forward)" in r.stdout, r.stdout
    assert "inductor_config[epilogue_fusion]: True → False" in r.stdout, r.stdout


def _started(env):
    try:
        with open(env.count_file + ".started") as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def test_process_killed_mid_compile_is_taken_over(warm_store, tmp_path):
    store, _ = warm_store
    # A graph not in the store (another option value), its C++ probes there.
    env = _env(tmp_path, _copy(store, tmp_path))
    opt = dict(PROGRAMS=1, INDUCTOR_OPTION="epilogue_fusion=False")
    holder = env.start(COMPILE_SLEEP=300, **opt)
    try:
        deadline = time.time() + 200
        while not _started(env):
            assert holder.poll() is None and time.time() < deadline
            time.sleep(0.1)
        waiter = env.start(**opt)
        time.sleep(5)
        assert waiter.poll() is None  # waiting for the holder's compile
        assert len(_started(env)) == 1
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    res = env.result(waiter, timeout=300)
    assert res["equal"] == [True] and res["fx_compiles"] == 1 and res["stats"]["lease_takeovers"] >= 1
    assert len(_started(env)) == 2


def test_import_says_what_to_install():
    code = "import sys; sys.modules['torch'] = None\nimport kcache.torch"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "pip install 'kcache-jit[torch]'" in r.stderr, r.stderr
    code = "import torch; torch.__version__ = '2.13.1'\nimport kcache.torch"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "kcache.torch supports PyTorch 2.14 and 2.15; this is PyTorch 2.13.1" in r.stderr, r.stderr


def test_hook_does_nothing_without_the_variable():
    code = ("import sys, torch, torch._inductor.compile_fx\n"
            "print(int('kcache' in sys.modules or '_kcache_boot' in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k not in ("KCACHE_TORCH", "TRITON_CACHE_MANAGER")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "0", r.stderr


def test_a_signed_bundle_ships_a_warm_start(warm_store, tmp_path):
    """What Mega-Cache's save/load_cache_artifacts is for, as kcache does it:
    the filled store written to a signed bundle (`kcache bundle create
    --sign`), and a process with an empty store and an empty Inductor folder
    that mounts it (KCACHE_BUNDLES, KCACHE_BUNDLE_TRUST) compiles nothing.
    A bundle signed by another key is refused: every graph compiled again."""
    store, _ = warm_store
    tool = _kcache_tool()

    def kc(*args):
        r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")})
        assert r.returncode == 0, r.stderr
        return r.stdout
    key, other = str(tmp_path / "ship.key"), str(tmp_path / "other.key")
    kc("bundle", "keygen", key)
    kc("bundle", "keygen", other)
    bundle = str(tmp_path / "warm.kcb")
    kc("--dir", str(store), "--engine", "files", "bundle", "create", "-o", bundle, "--sign", key)
    env = _env(tmp_path, tmp_path / "empty-store")
    res = env.run(KCACHE_BUNDLES=bundle, KCACHE_BUNDLE_TRUST=key + ".pub")
    assert res["equal"] == [True, True]
    assert res["fx_compiles"] == 0 and res["fx_hit"] == 2 and res["cxx_runs"] <= 1, res
    env = _env(tmp_path, tmp_path / "empty-store-2")
    res = env.run(KCACHE_BUNDLES=bundle, KCACHE_BUNDLE_TRUST=other + ".pub", PROGRAMS=1)
    assert res["equal"] == [True] and res["fx_compiles"] == 1, res

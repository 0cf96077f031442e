"""kcache.warp with real Warp from PyPI on the CPU: the kernel modules of
warp_worker.py built in real processes, Warp's CPU builds counted in each."""

import glob
import os
import shutil
import signal
import time

import pytest

pytest.importorskip("warp", reason="Warp is not installed in this Python (make python installs it)")

from hosts_support import HostEnv, damage_files_engine_entries, poison_redis_values, tier  # noqa: E402

N = 3
RESULTS = [20.0, 34.0, 30.0]


@pytest.fixture
def warp_env(tmp_path):
    return HostEnv(tmp_path, "warp_worker.py", WARP_KERNEL_CACHE=tmp_path / "warp")


def test_round_trip_in_new_process_and_files_written_again(warp_env):
    cold = warp_env.run(N)
    assert cold["results"] == RESULTS and cold["compiles"] == N and cold["stats"]["misses"] == N
    warm = warp_env.run(N)
    assert warm["results"] == RESULTS and warm["compiles"] == 0 and warm["stats"]["hits"] == N
    # Warp's folder gone, or a module file in it changed: written out again
    # from the verified entries, nothing built.
    objs = glob.glob(os.path.join(warp_env.base["WARP_KERNEL_CACHE"], "*", "wp_*", "*.o"))
    assert len(objs) == N
    with open(objs[0], "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    again = warp_env.run(N)
    assert again["results"] == RESULTS and again["compiles"] == 0
    shutil.rmtree(warp_env.base["WARP_KERNEL_CACHE"])
    last = warp_env.run(N)
    assert last["results"] == RESULTS and last["compiles"] == 0 and warp_env.compiles() == N


def test_eight_processes_build_each_module_once(warp_env):
    procs = [warp_env.start(N) for _ in range(8)]
    results = [warp_env.result(p) for p in procs]
    assert all(r["results"] == RESULTS for r in results)
    assert warp_env.compiles() == N, "a module was built more than once"


def test_process_killed_mid_build_is_taken_over(warp_env):
    holder = warp_env.start(1, COMPILE_SLEEP=120)
    deadline = time.time() + 60
    while warp_env.compiles() < 1:
        assert holder.poll() is None and time.time() < deadline
        time.sleep(0.05)
    waiter = warp_env.start(1)
    time.sleep(2)
    assert waiter.poll() is None  # waiting for the holder's build
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    res = warp_env.result(waiter, timeout=120)
    assert res["results"] == RESULTS[:1] and res["compiles"] == 1
    assert res["stats"]["lease_takeovers"] >= 1
    assert warp_env.run(1)["compiles"] == 0


def test_damaged_entry_is_a_miss(warp_env):
    warp_env.run(1, KCACHE_ENGINE="files")
    assert damage_files_engine_entries(warp_env.kcache_dir) == 1
    res = warp_env.run(1, KCACHE_ENGINE="files")
    assert res["results"] == RESULTS[:1] and res["compiles"] == 1
    assert tier(res["stats"], "files")["corrupt"] == 1


def test_remote_value_with_wrong_mac_is_a_miss(warp_env, redis, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-tests\n")
    remote = dict(KCACHE_REMOTE=redis.url, KCACHE_REMOTE_SECRET_FILE=str(secret))

    def run(tag):
        return warp_env.run(1, KCACHE_DIR=tmp_path / tag, WARP_KERNEL_CACHE=tmp_path / f"warp-{tag}", **remote)

    assert run("a")["compiles"] == 1
    second = run("b")  # another machine: all from Redis
    assert second["compiles"] == 0 and second["results"] == RESULTS[:1]
    assert poison_redis_values(redis)
    third = run("c")
    assert third["compiles"] == 1 and third["results"] == RESULTS[:1]
    assert tier(third["stats"], "remote")["rejected"] >= 1


def test_processes_with_their_own_kernel_cache_folders_share_one_store(warp_env, tmp_path):
    # Node-local Warp kernel caches over one kcache store: the folder is no
    # part of the key, so each module is built once.
    procs = [warp_env.start(N, WARP_KERNEL_CACHE=tmp_path / f"node{i}" / "warp") for i in range(8)]
    results = [warp_env.result(p) for p in procs]
    assert all(r["results"] == RESULTS for r in results)
    assert warp_env.compiles() == N, "a module was built more than once"
    # And a process with yet another folder loads every module.
    last = warp_env.run(N, WARP_KERNEL_CACHE=tmp_path / "elsewhere")
    assert last["results"] == RESULTS and last["compiles"] == 0

"""kcache.warp with real Warp from PyPI on the CPU: the kernel modules of
warp_worker.py built in real processes, Warp's CPU builds counted in each."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
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


def _building(warp_env):
    """A worker that has begun its build and sleeps in it (120 s)."""
    p = warp_env.start(1, COMPILE_SLEEP=120)
    deadline = time.time() + 60
    while warp_env.compiles() < 1:
        assert p.poll() is None and time.time() < deadline
        time.sleep(0.05)
    return p


def test_process_killed_mid_build_is_taken_over(warp_env):
    holder = _building(warp_env)
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


def _build_folders(warp_env):
    """kcache's build folders (and Warp's inside them) in the kernel cache
    folder."""
    pattern = os.path.join(warp_env.base["WARP_KERNEL_CACHE"], "*", "*_kcache_*")
    return sorted(os.path.basename(p) for p in glob.glob(pattern))


def _puts(stats):
    return sum(t["stats"]["puts"] for t in stats["tiers"])


def test_failed_build_is_not_stored_and_raises_warps_error(warp_env, tmp_path):
    # Warp's headers missing: the C++ compile of every CPU build fails.
    plain = warp_env.run(1, HOST_CACHE="warp", WARP_BROKEN_HEADERS=1, WARP_KERNEL_CACHE=tmp_path / "plain")
    assert plain["error"].startswith("builtins.Exception: CPU kernel build failed")
    broken = warp_env.run(1, WARP_BROKEN_HEADERS=1)
    assert broken["error"] == plain["error"] and broken["results"] == [] and broken["compiles"] == 1
    assert _puts(broken["stats"]) == 0
    assert _build_folders(warp_env) == [], "a failed build left its folder"
    # Fixed: the next process builds and stores, the one after loads it (even
    # one with the broken install: nothing to compile).
    fixed = warp_env.run(1)
    assert "error" not in fixed and fixed["results"] == RESULTS[:1] and fixed["compiles"] == 1
    assert _puts(fixed["stats"]) >= 1
    for extra in ({}, {"WARP_BROKEN_HEADERS": 1}):
        again = warp_env.run(1, **extra)
        assert "error" not in again and again["results"] == RESULTS[:1] and again["compiles"] == 0
        assert again["stats"]["hits"] == 1
    assert _build_folders(warp_env) == []


def test_failed_build_hands_the_flight_to_a_waiting_process(warp_env):
    # The owner's build fails while another process waits for it; the owner
    # then lives on, so only the abandoned flight can let the waiter build.
    owner = warp_env.start(1, WARP_BROKEN_HEADERS=1, COMPILE_SLEEP=20, HOLD_AFTER_ERROR=120)
    deadline = time.time() + 60
    while warp_env.compiles() < 1:
        assert owner.poll() is None and time.time() < deadline
        time.sleep(0.05)
    waiter = warp_env.start(1)
    try:
        res = warp_env.result(waiter, timeout=100)
        assert owner.poll() is None, "the waiter built only once the owner had exited"
    finally:
        for p in (owner, waiter):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        out, _ = owner.communicate()
    assert res["results"] == RESULTS[:1] and res["compiles"] == 1 and "error" not in res
    assert res["stats"]["lease_waits"] + res["stats"]["waits"] >= 1, "the waiter never waited"
    failed = json.loads(out.strip().splitlines()[-1])
    assert failed["error"].startswith("builtins.Exception: CPU kernel build failed") and _puts(failed["stats"]) == 0
    last = warp_env.run(1)
    assert last["compiles"] == 0 and last["results"] == RESULTS[:1]
    assert _build_folders(warp_env) == []


def test_build_folders_of_ended_processes_are_removed(warp_env):
    # A process SIGKILLed mid-build leaves its build folder.
    killed = _building(warp_env)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    left = _build_folders(warp_env)
    assert len(left) == 1 and f"_p{killed.pid}_" in left[0], left
    folder = glob.glob(os.path.join(warp_env.base["WARP_KERNEL_CACHE"], "*"))[0]
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    hour, day = 3600, 86400
    # A pid of this machine's namespace with its builder gone (the killed
    # folder) goes at once; one without the namespace, or of another, only
    # after an hour with no such pid here, or a day whatever its pid.
    planted = {
        f"wp_a_1234567_kcache_p{ended.pid}_0000000a": (2 * hour, False),
        f"wp_b_1234567_kcache_p{ended.pid}_0000000b_p{ended.pid}_t1": (2 * hour, False),
        f"wp_c_1234567_kcache_p{ended.pid}_0000000c": (300, True),
        f"wp_d_1234567_kcache_p{os.getpid()}_0000000d": (2 * hour, True),
        f"wp_e_1234567_kcache_p{os.getpid()}_0000000e": (2 * day, False),
        f"wp_f_1234567_kcache_0123456789ab_p{ended.pid}_0000000f": (300, True),
        f"wp_g_1234567_p{ended.pid}_t1": (2 * day, True),  # Warp's own, not kcache's
        "wp_h_1234567": (2 * day, True),
    }
    now = time.time()
    for name, (age, _) in planted.items():
        os.makedirs(os.path.join(folder, name, "sub"))
        os.utime(os.path.join(folder, name), (now - age, now - age))
    res = warp_env.run(1)  # builds (no entry: the killed process stored none)
    assert res["results"] == RESULTS[:1] and res["compiles"] == 1
    remaining = set(os.listdir(folder))
    assert left[0] not in remaining, "the killed process's build folder is still there"
    for name, (_, kept) in planted.items():
        assert (name in remaining) == kept, name
    assert _build_folders(warp_env) == sorted(n for n, (_, kept) in planted.items() if kept and "_kcache_" in n)

"""kcache.numba with real numba from PyPI: @njit(cache=True) functions of
numba_worker.py in real processes, numba's own compiles counted in each."""

import os
import signal
import time

import pytest

pytest.importorskip("numba", reason="numba is not installed in this Python (make python installs it)")

from hosts_support import HostEnv, damage_files_engine_entries, poison_redis_values, tier  # noqa: E402

N = 3
RESULTS = [7.0, 140.0, 111]


@pytest.fixture
def numba_env(tmp_path):
    return HostEnv(tmp_path, "numba_worker.py")


def test_round_trip_in_new_process(numba_env):
    cold = numba_env.run(N)
    assert cold["results"] == RESULTS and cold["compiles"] == N
    assert cold["stats"]["misses"] == N
    warm = numba_env.run(N)
    assert warm["results"] == RESULTS and warm["compiles"] == 0
    assert warm["stats"]["hits"] == N and numba_env.compiles() == N


def test_eight_processes_compile_each_function_once(numba_env):
    procs = [numba_env.start(N) for _ in range(8)]
    results = [numba_env.result(p) for p in procs]
    assert all(r["results"] == RESULTS for r in results)
    assert numba_env.compiles() == N, "a function was compiled more than once"
    assert sum(r["compiles"] for r in results) == N


def test_process_killed_mid_compile_is_taken_over(numba_env):
    holder = numba_env.start(1, COMPILE_SLEEP=120)
    deadline = time.time() + 60
    while numba_env.compiles() < 1:  # the holder compiles, owning the flight
        assert holder.poll() is None and time.time() < deadline
        time.sleep(0.05)
    waiter = numba_env.start(1)
    time.sleep(2)
    assert waiter.poll() is None  # waiting for the holder's compile
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    res = numba_env.result(waiter, timeout=120)
    assert res["results"] == RESULTS[:1] and res["compiles"] == 1
    assert res["stats"]["lease_takeovers"] >= 1
    assert numba_env.run(1)["compiles"] == 0


def test_failed_compile_ends_its_flight(numba_env, tmp_path):
    # A process whose compile fails stays alive: its flight ended with the
    # failure, so another process compiles at once instead of waiting.
    held = tmp_path / "held"
    holder = numba_env.start(0, FAILING=1, HOLD=held)
    try:
        deadline = time.time() + 60
        while not held.exists():
            assert holder.poll() is None and time.time() < deadline
            time.sleep(0.05)
        other = numba_env.run(0, FAILING=1, KCACHE_WAIT_BOUND_MS=20000)
        assert other["results"] == ["TypingError"] and other["compiles"] == 1
        assert other["stats"]["lease_waits"] == 0 and other["stats"]["lease_timeouts"] == 0
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_damaged_entry_is_a_miss(numba_env):
    numba_env.run(N, KCACHE_ENGINE="files")
    assert damage_files_engine_entries(numba_env.kcache_dir) == N
    res = numba_env.run(N, KCACHE_ENGINE="files")
    assert res["results"] == RESULTS and res["compiles"] == N  # compiled again, nothing unpickled
    assert tier(res["stats"], "files")["corrupt"] == N


def test_remote_value_with_wrong_mac_is_a_miss(numba_env, redis, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-tests\n")
    remote = dict(KCACHE_REMOTE=redis.url, KCACHE_REMOTE_SECRET_FILE=str(secret))
    first = numba_env.run(N, KCACHE_DIR=tmp_path / "a", **remote)
    assert first["compiles"] == N
    second = numba_env.run(N, KCACHE_DIR=tmp_path / "b", **remote)  # another machine: all from Redis
    assert second["compiles"] == 0 and second["results"] == RESULTS
    assert poison_redis_values(redis)
    third = numba_env.run(N, KCACHE_DIR=tmp_path / "c", **remote)
    assert third["compiles"] == N and third["results"] == RESULTS
    assert tier(third["stats"], "remote")["rejected"] >= 1

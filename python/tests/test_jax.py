"""kcache.jax with real JAX from PyPI on the CPU: the jitted programs of
jax_worker.py in real processes, XLA compiles counted in each."""

import os
import signal
import time

import pytest

pytest.importorskip("jax", reason="JAX is not installed in this Python (make python installs it)")

from hosts_support import HostEnv, damage_files_engine_entries, poison_redis_values, tier  # noqa: E402

N = 3
RESULTS = [24.0, 3.9973, 1.0]


@pytest.fixture
def jax_env(tmp_path):
    return HostEnv(tmp_path, "jax_worker.py", JAX_PLATFORMS="cpu")


def _compiles(env):
    """Every XLA compile of every process: pid, module, and when JAX asked
    for it, when XLA began and when it ended (jax_worker.py)."""
    rows = []
    with open(env.count_file) as f:
        for line in f.read().split():
            pid, name, asked, started, ended = line.split(":")
            rows.append(dict(pid=int(pid), name=name, asked=float(asked), started=float(started), ended=float(ended)))
    return rows


def _started(env):
    """The modules whose compile began, in every process (one that was
    killed mid-compile too)."""
    try:
        with open(env.count_file + ".started") as f:
            return [line.split(":", 1)[1] for line in f.read().split()]
    except FileNotFoundError:
        return []


def _compiled_names(env):
    return [r["name"] for r in _compiles(env)] if os.path.exists(env.count_file) else []


def test_round_trip_then_eight_processes_compile_each_program_once(jax_env, tmp_path):
    cold = jax_env.run(N)
    programs = cold["compiles"]  # the three programs and JAX's helper programs
    assert cold["results"] == RESULTS and programs >= N and cold["stats"]["misses"] == programs
    warm = jax_env.run(N)
    assert warm["results"] == RESULTS and warm["compiles"] == 0 and warm["stats"]["hits"] == programs
    # Eight processes at once on another empty cache: each program once.
    os.unlink(jax_env.count_file)
    procs = [jax_env.start(N, KCACHE_DIR=tmp_path / "eight") for _ in range(8)]
    results = [jax_env.result(p) for p in procs]
    assert all(r["results"] == RESULTS for r in results)
    assert sum(r["compiles"] for r in results) == programs, sorted(_compiled_names(jax_env))


def test_process_killed_mid_compile_is_taken_over(jax_env):
    holder = jax_env.start(1, COMPILE_SLEEP=120)
    deadline = time.time() + 60
    while "jit_slow_poly" not in _started(jax_env):
        assert holder.poll() is None and time.time() < deadline
        time.sleep(0.05)
    waiter = jax_env.start(1)
    time.sleep(3)
    assert waiter.poll() is None  # waiting for the holder's compile
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    res = jax_env.result(waiter, timeout=120)
    assert res["results"] == RESULTS[:1] and res["stats"]["lease_takeovers"] >= 1
    assert _started(jax_env).count("jit_slow_poly") == 2
    assert jax_env.run(1)["compiles"] == 0


def test_program_not_stored_ends_its_flight(jax_env, tmp_path):
    # A process compiles a program JAX does not store (a host callback) and
    # stays alive: its flight ends with the compile, so another process
    # compiles the program at once instead of waiting for the first.
    held = tmp_path / "held"
    holder = jax_env.start(0, CALLBACK=1, HOLD=held)
    try:
        deadline = time.time() + 60
        while not held.exists():
            assert holder.poll() is None and time.time() < deadline
            time.sleep(0.05)
        other = jax_env.run(0, CALLBACK=1, KCACHE_WAIT_BOUND_MS=20000)
        assert other["results"] == [8.0]
        assert other["stats"]["lease_waits"] == 0 and other["stats"]["lease_timeouts"] == 0
        assert _compiled_names(jax_env).count("jit_slow_printed") == 2
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_damaged_entry_is_a_miss(jax_env):
    cold = jax_env.run(N, KCACHE_ENGINE="files")
    programs = cold["compiles"]
    assert damage_files_engine_entries(jax_env.kcache_dir) == programs
    res = jax_env.run(N, KCACHE_ENGINE="files")
    assert res["results"] == RESULTS and res["compiles"] == programs
    assert tier(res["stats"], "files")["corrupt"] == programs


def test_remote_value_with_wrong_mac_is_a_miss(jax_env, redis, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-tests\n")
    remote = dict(KCACHE_REMOTE=redis.url, KCACHE_REMOTE_SECRET_FILE=str(secret))
    first = jax_env.run(N, KCACHE_DIR=tmp_path / "a", **remote)
    programs = first["compiles"]
    second = jax_env.run(N, KCACHE_DIR=tmp_path / "b", **remote)  # another machine: all from Redis
    assert second["compiles"] == 0 and second["results"] == RESULTS
    assert poison_redis_values(redis)
    third = jax_env.run(N, KCACHE_DIR=tmp_path / "c", **remote)
    assert third["compiles"] == programs and third["results"] == RESULTS
    assert tier(third["stats"], "remote")["rejected"] >= 1


def _waited(row):
    """Seconds between JAX asking for a program and XLA compiling it."""
    return row["started"] - row["asked"]


def test_eight_processes_compile_a_program_with_a_host_callback_at_once(jax_env):
    # JAX never stores a program with a host callback: every process compiles
    # it, as under JAX's own cache, and none waits for another's compile.
    procs = [jax_env.start(0, CALLBACK=1, COMPILE_SLEEP=3) for _ in range(8)]
    results = [jax_env.result(p) for p in procs]
    assert all(r["results"] == [8.0] for r in results)
    printed = [r for r in _compiles(jax_env) if r["name"] == "jit_slow_printed"]
    assert len({r["pid"] for r in printed}) == len(printed) == 8
    assert max(_waited(r) for r in printed) < 1.0, printed  # a wait would be 3 s or more


def test_programs_jax_will_not_store_are_compiled_at_once_by_the_waiting_processes(jax_env):
    # Under enable(min_compile_time_secs=60) JAX stores none of these
    # programs. The first process to miss one owns its flight and the others
    # wait (nobody can tell before it is compiled); compiled and not stored,
    # the key is marked "compile locally", and every waiting process then
    # compiles it at once, in parallel, instead of one after another.
    procs = [jax_env.start(1, COMPILE_SLEEP=3, MIN_COMPILE_TIME=60) for _ in range(8)]
    assert all(jax_env.result(p)["results"] == RESULTS[:1] for p in procs)
    slow = sorted((r for r in _compiles(jax_env) if r["name"] == "jit_slow_poly"), key=lambda r: r["started"])
    assert len({r["pid"] for r in slow}) == len(slow) == 8
    first_end = slow[0]["ended"]
    # Each began when the first compile ended (or when it asked, if later),
    # not 3 s after another waiter's compile.
    late = [r for r in slow[1:] if r["started"] - max(first_end, r["asked"]) > 1.5]
    assert not late, (first_end, slow)
    # A process that misses it later compiles at once, without a flight.
    later = jax_env.run(1, COMPILE_SLEEP=3, MIN_COMPILE_TIME=60)
    mine = [r for r in _compiles(jax_env) if r["pid"] == later["pid"] and r["name"] == "jit_slow_poly"]
    assert len(mine) == 1 and _waited(mine[0]) < 1.0 and later["stats"]["lease_waits"] == 0
    # The mark never stops a program from being stored: a process under
    # JAX's default thresholds stores it, and the next one loads it.
    assert jax_env.run(1, COMPILE_SLEEP=0.1)["compiles"] >= 1
    assert jax_env.run(1)["compiles"] == 0


def test_processes_with_their_own_jax_folders_share_one_store(jax_env, tmp_path):
    # Node-local JAX folders (JAX_COMPILATION_CACHE_DIR) over one kcache
    # store: the folders, which JAX writes into the compile options as the
    # paths of XLA's own caches, are not part of the key.
    one = jax_env.run(N, JAX_COMPILATION_CACHE_DIR=tmp_path / "jax-one", KCACHE_DIR=tmp_path / "one")
    programs = one["compiles"]
    os.unlink(jax_env.count_file)
    procs = [jax_env.start(N, JAX_COMPILATION_CACHE_DIR=tmp_path / f"node{i}" / "jax") for i in range(8)]
    results = [jax_env.result(p) for p in procs]
    assert all(r["results"] == RESULTS for r in results)
    assert jax_env.compiles() == programs, sorted(_compiled_names(jax_env))
    # And a process with yet another folder loads every program.
    assert jax_env.run(N, JAX_COMPILATION_CACHE_DIR=tmp_path / "elsewhere")["compiles"] == 0

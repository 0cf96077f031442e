"""Entries compiled in worker processes reach the disk when the workers end
by a normal path: multiprocessing.Process, Pool (close and join) and
ProcessPoolExecutor workers under fork, forkserver and spawn (forked and
forkserver workers leave through os._exit after multiprocessing's
finalizers), a module-level Cache the workers inherited from their parent,
os._exit after flush() or under sync_commit, and Triton compiles in forked
workers; and when they are killed: a `with Pool() as pool:` block (its
terminate() sends SIGTERM to the workers) and workers a scheduler stops with
SIGTERM or SIGKILL right after their compiles returned. After the workers
are gone, a fresh Cache finds every entry.

KCACHE_TEST_TRIALS sets the trials per case (default 3; Triton: a tenth of it,
at least 1)."""

import concurrent.futures
import multiprocessing as mp
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kcache  # noqa: E402
import worker_tasks  # noqa: E402

TRIALS = int(os.environ.get("KCACHE_TEST_TRIALS", "3"))
METHODS = [m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()]
WORKERS = 4
PER_WORKER = 6


def ranges(trial):
    base = trial * WORKERS * PER_WORKER
    return [range(base + w * PER_WORKER, base + (w + 1) * PER_WORKER) for w in range(WORKERS)]


def all_keys(trials):
    return range(trials * WORKERS * PER_WORKER)


def run_processes(ctx, d, trial):
    ps = [ctx.Process(target=worker_tasks.compile_keys, args=(d, r)) for r in ranges(trial)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    assert [p.exitcode for p in ps] == [0] * WORKERS


def run_pool(ctx, d, trial):
    pool = ctx.Pool(WORKERS)
    try:
        assert pool.starmap(worker_tasks.compile_keys, [(d, r) for r in ranges(trial)]) == [PER_WORKER] * WORKERS
        pool.close()
        pool.join()  # the workers end by their normal path
    finally:
        pool.terminate()


def run_executor(ctx, d, trial):
    with concurrent.futures.ProcessPoolExecutor(WORKERS, mp_context=ctx) as ex:
        rs = ranges(trial)
        assert list(ex.map(worker_tasks.compile_keys, [d] * len(rs), rs)) == [PER_WORKER] * WORKERS


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("run", [run_processes, run_pool, run_executor], ids=["process", "pool", "executor"])
def test_worker_entries_reach_the_disk(tmp_path, method, run):
    d = str(tmp_path / "kcache")
    ctx = mp.get_context(method)
    for t in range(TRIALS):
        run(ctx, d, t)
    assert worker_tasks.missing(d, all_keys(TRIALS)) == []


def test_pool_left_through_its_context_manager_keeps_every_compile(tmp_path):
    # The idiom of Python's documentation, as it is written: leaving the
    # block calls terminate(), which sends SIGTERM to every worker (no
    # finalizer, no flush runs). What each compile produced was on disk
    # when get_or_compile or commit returned, before map() had its result.
    d = str(tmp_path / "kcache")
    for t in range(TRIALS):
        with mp.Pool(WORKERS) as pool:
            assert pool.starmap(worker_tasks.compile_keys, [(d, r) for r in ranges(t)]) == [PER_WORKER] * WORKERS
    assert worker_tasks.missing(d, all_keys(TRIALS)) == []


@pytest.mark.parametrize("method", METHODS)
def test_pool_context_manager_under_each_start_method(tmp_path, method):
    d = str(tmp_path / "kcache")
    ctx = mp.get_context(method)
    for t in range(TRIALS):
        with ctx.Pool(WORKERS) as pool:
            assert pool.starmap(worker_tasks.compile_keys, [(d, r) for r in ranges(t)]) == [PER_WORKER] * WORKERS
    assert worker_tasks.missing(d, all_keys(TRIALS)) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_workers_killed_right_after_compiling_lose_nothing(tmp_path, sig):
    # Forked workers compile, say so and wait; each is killed the moment the
    # parent hears. Before they are killed, the parent's own Cache sees
    # their entries (other processes see a compile once it returned).
    d = str(tmp_path / "kcache")
    ctx = mp.get_context("fork")
    for t in range(TRIALS):
        ps = []
        for r in ranges(t):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=worker_tasks.compile_then_wait, args=(d, r, child_end))
            p.start()
            ps.append((p, parent_end, r))
        for p, conn, r in ps:
            assert conn.recv() == PER_WORKER
            assert worker_tasks.missing(d, r) == []
            os.kill(p.pid, sig)
        for p, _, _ in ps:
            p.join()
            assert p.exitcode == -sig
    assert worker_tasks.missing(d, all_keys(TRIALS)) == []


def test_forked_workers_reopen_a_cache_their_parent_opened(tmp_path):
    # A Cache opened at import time in the parent, used by forked workers:
    # each worker reopens it on its first call (the parent's disk handles
    # must not be used across fork), so their entries persist as spawned
    # workers' do.
    d = str(tmp_path / "kcache")
    worker_tasks.inherited = kcache.Cache(d, env=False)
    try:
        ctx = mp.get_context("fork")
        for t in range(TRIALS):
            with concurrent.futures.ProcessPoolExecutor(WORKERS, mp_context=ctx) as ex:
                assert list(ex.map(worker_tasks.compile_keys_inherited, ranges(t))) == [PER_WORKER] * WORKERS
        assert worker_tasks.missing(d, all_keys(TRIALS)) == []
        # The parent's own Cache still works, in the parent.
        assert worker_tasks.inherited.get(kcache.key(worker_tasks.NS, i=0)) is not None
    finally:
        worker_tasks.inherited.close()
        worker_tasks.inherited = None


def _fork_and_exit(d, keys, flush, puts=False, **options):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            c = kcache.Cache(d, env=False, **options)
            (worker_tasks.put_into if puts else worker_tasks.compile_into)(c, keys)
            if flush:
                c.flush()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("puts", [False, True], ids=["compiles", "puts"])
@pytest.mark.parametrize("way", ["flush", "sync_commit"])
def test_os_exit_after_flush_or_with_sync_commit(tmp_path, way, puts):
    d = str(tmp_path / "kcache")
    for t in range(TRIALS):
        keys = range(t * 20, (t + 1) * 20)
        if way == "flush":
            _fork_and_exit(d, keys, True, puts=puts)
        else:
            _fork_and_exit(d, keys, False, puts=puts, sync_commit=True)
    assert worker_tasks.missing(d, range(TRIALS * 20)) == []


def test_os_exit_right_after_compiling_loses_nothing(tmp_path):
    # No flush, no sync_commit: compiles are on disk when they return.
    d = str(tmp_path / "kcache")
    for t in range(TRIALS):
        _fork_and_exit(d, range(t * 20, (t + 1) * 20), False)
    assert worker_tasks.missing(d, range(TRIALS * 20)) == []


def test_sync_commit_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_SYNC_COMMIT", "1")
    d = str(tmp_path / "kcache")
    pid = os.fork()
    if pid == 0:
        try:
            worker_tasks.put_into(kcache.Cache(d), range(10))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert worker_tasks.missing(d, range(10)) == []


# ---- Triton -----------------------------------------------------------------

N_TRITON = 4


def test_triton_compiles_in_forked_workers_persist(triton_env):
    # Each trial: a fresh Triton cache folder, four forked workers each
    # compiling one kernel through kcache.triton, then a new process that
    # must find all four (no ptxas run).
    for t in range(max(1, TRIALS // 10)):
        cache_dir = str(triton_env.tmp / f"triton-cache-{t}")
        runs = triton_env.ptxas_runs()
        p = subprocess.run([sys.executable, os.path.join(HERE, "triton_fork_worker.py"), str(N_TRITON)],
                           env=triton_env.env(TRITON_CACHE_DIR=cache_dir), capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-4000:]
        assert triton_env.ptxas_runs() == runs + N_TRITON
        warm = triton_env.run(N_TRITON, TRITON_CACHE_DIR=cache_dir)
        assert triton_env.ptxas_runs() == runs + N_TRITON, "a kernel compiled in a forked worker was lost"
        assert warm["stats"]["compiles"] == 0

"""kcache.numba with real numba from PyPI: @njit(cache=True) functions of
numba_worker.py and numba_keys_worker.py in real processes, numba's own
compiles counted in each; the key (what a function runs) against numba's
own cache on notebook cells, edited callees and constants in other modules,
recompile(), recursion and python -c; code_key in this process."""

import json
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


# ---- keys: what runs (numba_keys_worker.py) -------------------------------------

@pytest.fixture
def keys_env(tmp_path):
    return HostEnv(tmp_path, "numba_keys_worker.py", PYTHONDONTWRITEBYTECODE=1)


def _write(folder, name, text):
    (folder / name).write_text(text)


def _modules(folder, step=1, scale=2, offset=0):
    folder.mkdir(exist_ok=True)
    _write(folder, "calleemod.py", "from numba import njit\n\n\n@njit(cache=True)\n"
                                   f"def g(x):\n    return x + {step}\n")
    _write(folder, "consts.py", f"SCALE = {scale}\nOFFSET = {offset}\n")
    _write(folder, "callermod.py", "from numba import njit\n\nimport consts\nfrom calleemod import g\n"
                                   "from consts import OFFSET\n\n\n@njit(cache=True)\n"
                                   "def f(x):\n    return g(x) * consts.SCALE + OFFSET\n")


def test_notebook_cells_keyed_on_globals(keys_env):
    # Code without a source file: a cell run again with C = 2 gives 12, an
    # edited cell reading B gives its result, an array's new values count.
    expected = [11, 12, 11, 110, 6.0, 8.0, 16]
    cold = keys_env.run("notebook")
    assert cold["results"] == expected and cold["compiles"] == 8
    warm = keys_env.run("notebook")  # the same session again: all from the cache
    assert warm["results"] == expected and warm["compiles"] == 0
    assert warm["stats"]["hits"] == 8


def test_python_c_and_stdin(keys_env):
    # __main__ without a file, as `python -c` and `python - < file` run it;
    # the name it is compiled under (<string>, <stdin>) is not in the key.
    import subprocess
    import sys

    prog = ("import json, kcache.numba\nkcache.numba.enable()\nfrom numba import njit\nC = {c}\n"
            "@njit(cache=True)\ndef f(x):\n    return x + C\n"
            "print(json.dumps([int(f(10)), kcache.numba.cache().stats()['hits']]))\n")

    def run(c, stdin=False):
        args = [sys.executable, "-"] if stdin else [sys.executable, "-c", prog.format(c=c)]
        p = subprocess.run(args, input=prog.format(c=c) if stdin else None, env=keys_env.env(),
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr[-4000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    assert run(1) == [11, 0]
    assert run(2) == [12, 0]
    assert run(1, stdin=True) == [11, 1]
    assert run(2) == [12, 1]


def test_callee_and_constant_in_other_modules(keys_env, tmp_path):
    # The caller's file never changes; its callee and a constant module do.
    # numba's own cache hands back the first build each time (stale), kcache
    # compiles each new version and hits each old one.
    mods = tmp_path / "mods"
    own = dict(HOST_CACHE="numba", NUMBA_CACHE_DIR=tmp_path / "numba-cache")
    steps = [(dict(step=1, scale=2), 4), (dict(step=10, scale=2), 22), (dict(step=10, scale=3), 33),
             (dict(step=10, scale=3, offset=5), 38)]
    for i, (edit, right) in enumerate(steps):
        _modules(mods, **edit)
        got = keys_env.run("modules", mods)
        assert got["results"] == [right], edit
        assert got["compiles"] == (2 if i < 2 else 1), edit  # caller (+ callee when it changed)
        stale = keys_env.run("modules", mods, **own)
        assert stale["results"] == [4], f"numba's own cache is no longer stale for {edit}: {stale}"
    _modules(mods, step=1, scale=2)  # back to the first version: a hit, no compile
    again = keys_env.run("modules", mods)
    assert again["results"] == [4] and again["compiles"] == 0


def test_recompile_replaces_the_entry(keys_env, tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    _write(mods, "recmod.py", "from numba import njit\n\nZ = 1\n\n\n@njit(cache=True)\n"
                              "def f(x, y):\n    return x + y + Z\n")
    cold = keys_env.run("recompile", mods)
    assert cold["results"] == [6, 6, 15] and cold["compiles"] == 2
    # A hit for Z = 1; recompile() then compiles afresh although Z = 10 is
    # stored, and stores its result again.
    warm = keys_env.run("recompile", mods)
    assert warm["results"] == [6, 6, 15] and warm["compiles"] == 1
    assert warm["stats"]["hits"] == 1
    z10 = keys_env.run("recompile", mods, SET_Z=10)  # Z = 10 from the start: the recompiled entry
    assert z10["results"] == [15, 15, 15] and z10["compiles"] == 1 and z10["stats"]["hits"] == 1


def test_recursion(keys_env):
    # Self recursion is keyed and stored. Mutual recursion is compiled and
    # not stored: numba's own cache stores it, and the next process that
    # loads it crashes (SIGSEGV, numba 0.68.1).
    cold = keys_env.run("recursion")
    assert cold["results"] == [3628800, True, True] and cold["compiles"] >= 3
    warm = keys_env.run("recursion")
    assert warm["results"] == cold["results"] and warm["stats"]["hits"] == 1
    assert warm["compiles"] == cold["compiles"] - 1  # fact from the cache, even and odd compiled


def test_eight_processes_with_own_numba_folders_share_one_store(numba_env, tmp_path):
    # Where numba would keep its files does not enter the key.
    procs = [numba_env.start(N, NUMBA_CACHE_DIR=tmp_path / f"numba-{i}") for i in range(8)]
    results = [numba_env.result(p) for p in procs]
    assert all(r["results"] == RESULTS for r in results)
    assert numba_env.compiles() == N, "a function was compiled more than once"


# ---- code_key in this process -----------------------------------------------------

def _fresh(src, **ns):
    g = {"__name__": "cellmod", **ns}
    exec(compile(src, "<cell>", "exec"), g)
    return g


def test_code_key_follows_every_value_read():
    import enum

    import numpy as np

    import kcache.numba as kn
    from numba import njit

    class Mode(enum.Enum):
        A = 1
        B = 2

    g = _fresh("def callee(x):\n    return x + K\n"
               "def f(x, y=2):\n    return callee(x) + C + ARR[0] + M.value + len(T) + y\n",
               K=1, C=1, ARR=np.zeros(3), M=Mode.A, T=(1, 2))
    f = g["f"]
    base = kn.code_key(f)
    assert kn.code_key(f) == base  # deterministic
    changes = [("K", 2), ("C", 2), ("M", Mode.B), ("T", (1, 2, 3))]
    for name, value in changes:
        old = g[name]
        g[name] = value
        assert kn.code_key(f) != base, name
        g[name] = old
        assert kn.code_key(f) == base, name
    g["ARR"][0] = 5  # an array changed in place
    assert kn.code_key(f) != base
    g["ARR"][0] = 0
    f.__defaults__ = (3,)
    assert kn.code_key(f) != base
    f.__defaults__ = (2,)
    assert kn.code_key(f) == base
    g["callee"] = njit(g["callee"])  # the same code behind a dispatcher: keyed with its options
    assert kn.code_key(f) != base


def test_function_cache_reuses_its_walk_only_while_unchanged():
    import numpy as np

    import kcache.numba as kn
    from numba.core.registry import cpu_target

    g = _fresh("def f(x):\n    return x + C + ARR[0]\n", C=1, ARR=np.zeros(2))
    fc = kn.FunctionCache(g["f"], {})
    codegen = cpu_target.target_context.codegen()
    sig = "(int64,)"
    k1 = fc._key(sig, codegen)
    assert fc._key(sig, codegen).hex == k1.hex
    g["C"] = 2
    k2 = fc._key(sig, codegen)
    assert k2.hex != k1.hex
    g["ARR"][0] = 1
    assert fc._key(sig, codegen).hex not in (k1.hex, k2.hex)
    g["C"], g["ARR"][0] = 1, 0
    assert fc._key(sig, codegen).hex == k1.hex


def test_code_key_is_the_same_in_another_process(tmp_path):
    # Hash randomisation differs per process; the key must not.
    import subprocess
    import sys

    prog = ("import enum, kcache.numba as kn\n"
            "class E(enum.Enum):\n    X = 1\n"
            "g = {'__name__': 'm', 'S': frozenset({'a', 'b', 'c'}), 'E': E}\n"
            "exec('def f(x):\\n    return x in {\"p\", \"q\"} or len(S) + E.X.value\\n', g)\n"
            "print(kn.code_key(g['f']).hex())\n")
    keys = {subprocess.run([sys.executable, "-c", prog], env={**os.environ, "PYTHONHASHSEED": str(seed)},
                           capture_output=True, text=True, check=True).stdout for seed in (1, 2, 3)}
    assert len(keys) == 1

"""kcache.triton with real Triton from PyPI, compiling for sm_90 without a GPU
(ptxas from Triton's wheel, counted through a wrapper script)."""

import glob
import os
import signal
import time

N = 3  # kernels per process: elementwise add (two block sizes) and GELU


def test_round_trip_cold_then_warm_in_new_process(triton_env):
    cold = triton_env.run(N)
    assert triton_env.ptxas_runs() == N
    assert len(cold["cubins"]) == N and cold["stats"]["compiles"] == N
    warm = triton_env.run(N)
    assert triton_env.ptxas_runs() == N  # nothing compiled again
    assert warm["cubins"] == cold["cubins"]
    assert warm["stats"]["compiles"] == 0 and warm["stats"]["hits"] >= N
    # Hits were written out for Triton under kcache-files/, one folder each.
    files = os.path.join(triton_env.base["TRITON_CACHE_DIR"], "kcache-files")
    hit_dirs = [d for d in os.listdir(files) if not d.startswith(("pid-", "tmp-", "del-", "."))]
    assert len(hit_dirs) == N
    assert all(any(f.endswith(".cubin") for f in os.listdir(os.path.join(files, d))) for d in hit_dirs)
    # The processes' own staging folders went with them.
    assert not [d for d in os.listdir(files) if d.startswith("pid-")]


def test_eight_processes_compile_each_kernel_once(triton_env):
    procs = [triton_env.start(N) for _ in range(8)]
    results = [triton_env.result(p) for p in procs]
    assert triton_env.ptxas_runs() == N, "a kernel was compiled more than once"
    assert sum(r["stats"]["compiles"] for r in results) == N
    first = results[0]["cubins"]
    assert len(first) == N and all(r["cubins"] == first for r in results)


def test_process_killed_mid_compile_is_taken_over(triton_env):
    holder = triton_env.start(1, PTXAS_SLEEP=120)
    deadline = time.time() + 120
    while triton_env.ptxas_runs() < 1:  # the holder is inside ptxas, holding the lease
        assert holder.poll() is None and time.time() < deadline
        time.sleep(0.1)
    waiter = triton_env.start(1)
    time.sleep(3)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    res = triton_env.result(waiter, timeout=120)
    assert triton_env.ptxas_runs() == 2
    assert res["stats"]["compiles"] == 1 and res["stats"]["lease_takeovers"] >= 1
    again = triton_env.run(1)
    assert again["cubins"] == res["cubins"] and triton_env.ptxas_runs() == 2


def test_corrupt_entry_is_a_miss(triton_env):
    cold = triton_env.run(1, KCACHE_ENGINE="files")
    assert triton_env.ptxas_runs() == 1
    store = os.path.join(triton_env.base["TRITON_CACHE_DIR"], "kcache", "files")
    entries = [p for p in glob.glob(os.path.join(store, "**", "*"), recursive=True)
               if os.path.isfile(p) and os.path.basename(p)[:32].isalnum() and len(os.path.basename(p)) >= 32]
    # The kernel's group and the remembered triton_key() record (a small
    # JSON entry: the start-up hook remembers it from the variable alone).
    assert len(entries) == 2
    group = max(entries, key=os.path.getsize)
    with open(group, "r+b") as f:
        f.seek(os.path.getsize(group) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    res = triton_env.run(1, KCACHE_ENGINE="files")
    assert triton_env.ptxas_runs() == 2  # compiled again, not a crash or a wrong kernel
    assert res["cubins"] == cold["cubins"]
    assert [t for t in res["stats"]["tiers"] if t["name"] == "files"][0]["stats"]["corrupt"] == 1


def test_remote_backend_redis_hmac_and_poisoned_values(triton_env, redis, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-tests\n")
    remote = dict(KCACHE_REMOTE=redis.url, KCACHE_REMOTE_SECRET_FILE=str(secret))

    def run(tag):
        return triton_env.run(2, manager="remote", TRITON_CACHE_DIR=str(tmp_path / f"local-{tag}"), **remote)

    first = run("a")
    assert triton_env.ptxas_runs() == 2
    # Values only: kcache:{32 hex digits} (not leases, nor the statistics hash).
    keys = redis.command("KEYS", "kcache:{" + "?" * 32 + "}")
    assert len(keys) >= 4  # the group files and each kernel's files
    second = run("b")  # a new machine: empty local folder, everything from Redis
    assert triton_env.ptxas_runs() == 2 and second["cubins"] == first["cubins"]
    assert second["stats"]["compiles"] == 0 and second["stats"]["hits"] >= 4
    # Poison every value: flip one byte behind the header. The MAC fails, so
    # each is a miss and the kernels are compiled again, correctly.
    for k in keys:
        v = bytearray(redis.command("GET", k))
        v[-1] ^= 0x01
        assert redis.command("SET", k, bytes(v)) == "OK"
    third = run("c")
    assert triton_env.ptxas_runs() == 4 and third["cubins"] == first["cubins"]
    tier = [t["stats"] for t in third["stats"]["tiers"] if t["kind"] == "remote"][0]
    assert tier["rejected"] >= 1
    # A value signed with another secret is refused too.
    other = tmp_path / "other-secret"
    other.write_text("another secret")
    fourth = triton_env.run(2, manager="remote", TRITON_CACHE_DIR=str(tmp_path / "local-d"),
                            KCACHE_REMOTE=redis.url, KCACHE_REMOTE_SECRET_FILE=str(other))
    assert triton_env.ptxas_runs() == 6 and fourth["cubins"] == first["cubins"]


def test_an_unsigned_remote_is_left_out(tmp_path, redis):
    """Triton's entries hold cubins and launcher libraries, which are loaded
    as code: a remote without a secret is not used, by either of the
    integration's caches (its cache manager's, and RemoteBackend's)."""
    import subprocess
    import sys
    code = ("import json, sys\n"
            "from kcache.triton import _common\n"
            "kinds = lambda c: [t['kind'] for t in c.stats()['tiers']]\n"
            "print(json.dumps([kinds(_common.cache()), kinds(_common.remote_cache())]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env.update(KCACHE_DIR=str(tmp_path / "store"), KCACHE_REMOTE=redis.url)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    main, backend = json.loads(r.stdout.strip().splitlines()[-1])
    assert "remote" not in main and "remote" not in backend, r.stdout
    assert "remote tier left out" in r.stderr, r.stderr
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    env["KCACHE_REMOTE_SECRET_FILE"] = str(secret)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    main, backend = json.loads(r.stdout.strip().splitlines()[-1])
    assert "remote" in main and "remote" in backend, r.stdout

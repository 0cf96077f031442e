"""numba, JAX and Warp, each with its own cache and with kcache, in one run.

    build/venv/bin/python bench/python/hosts_bench.py [--procs 8] [--reps 2] [--hosts numba,jax,warp] [--small]

The programs are those of the test workers (python/tests/numba_worker.py,
jax_worker.py, warp_worker.py) with their benchmark set (BENCH=1): seven
numba functions (arithmetic, loops, np.linalg.solve, a parallel prange
loop, np.unique, np.histogram), eight jitted JAX programs (an MLP gradient,
a scan, an FFT, a linear solve, a convolution, ...; plus the helper
programs JAX compiles for array creation and reductions), six Warp kernel
modules (vector, quaternion and matrix math, loops), all on the CPU;
--small: the tests' three of each. Each host runs with

  own       its own persistent cache: numba cache=True (NUMBA_CACHE_DIR),
            JAX jax_compilation_cache_dir with both thresholds off (every
            program stored), Warp's kernel cache folder
  kcache    kcache.numba / kcache.jax / kcache.warp .enable()

and for each:

  cold      one process, empty cache folder
  warm      a new process, the folder the cold run filled
  N cold    N processes started at once on an empty folder

Each row: the host's own compiles (numba pipeline runs, XLA compiles, Warp
CPU builds, counted inside the workers), CPU seconds of the processes (user +
system, from wait4), and wall time; the median of --reps repetitions. The
import floor is what N processes cannot go below: one cold process plus N-1
interpreters that only import the host (and numpy). The last column of the N
row is the CPU over that floor, and over one cold process plus N-1 warm ones
(what the host spends per process even on a hit: numba's typing context,
JAX's tracing, Warp's hashing).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "python", "tests")

HOSTS = {
    "numba": ("numba_worker.py", "import numpy, numba"),
    "jax": ("jax_worker.py", "import jax, jax.numpy"),
    "warp": ("warp_worker.py", "import warp"),
}


def _env(host, mode, root, count_file, bench=True):
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    if bench:
        e["BENCH"] = "1"
    e.update(PYTHONWARNINGS="ignore", JAX_PLATFORMS="cpu", COUNT_FILE=count_file,
             KCACHE_DIR=os.path.join(root, "kcache"), WARP_KERNEL_CACHE=os.path.join(root, "warp"))
    if mode == "own":
        e["HOST_CACHE"] = host
        e["NUMBA_CACHE_DIR"] = os.path.join(root, "numba")
        e["JAX_CACHE_DIR"] = os.path.join(root, "jax")
    return e


def _count(path):
    try:
        with open(path) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


def _run(argv_list, envs, results=False):
    """Starts the processes at once; (wall, CPU seconds) of all of them, and
    with results=True each one's last line of output, read as JSON."""
    t = time.perf_counter()
    outs = [tempfile.TemporaryFile() if results else subprocess.DEVNULL for _ in envs]
    procs = [subprocess.Popen(a, env=e, stdout=o, stderr=subprocess.PIPE) for a, e, o in zip(argv_list, envs, outs)]
    cpu = 0.0
    for p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        if p.returncode != 0:
            sys.exit(f"worker failed ({p.returncode}):\n{err[-3000:]}")
        cpu += ru.ru_utime + ru.ru_stime
    wall = time.perf_counter() - t
    if not results:
        return wall, cpu
    found = []
    for o in outs:
        o.seek(0)
        found.append(json.loads(o.read().decode().strip().splitlines()[-1]))
        o.close()
    return wall, cpu, found


def measure(host, mode, procs, tmp, bench):
    worker = os.path.join(TESTS, HOSTS[host][0])
    rows = {}
    root = tempfile.mkdtemp(dir=tmp)
    cf = os.path.join(root, "count")
    e = _env(host, mode, root, cf, bench)
    rows["cold"] = _run([[sys.executable, worker]], [e]) + (_count(cf),)
    os.unlink(cf)
    rows["warm"] = _run([[sys.executable, worker]], [e]) + (_count(cf),)
    shutil.rmtree(root, ignore_errors=True)
    root = tempfile.mkdtemp(dir=tmp)
    cf = os.path.join(root, "count")
    e = _env(host, mode, root, cf, bench)
    rows["N"] = _run([[sys.executable, worker]] * procs, [e] * procs) + (_count(cf),)
    shutil.rmtree(root, ignore_errors=True)
    return rows


def import_cpu(host, reps=3):
    e = _env(host, "own", tempfile.gettempdir(), os.devnull)
    return statistics.median(_run([[sys.executable, "-c", HOSTS[host][1]]], [e])[1] for _ in range(reps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hosts", default="numba,jax,warp")
    ap.add_argument("--small", action="store_true", help="the tests' three programs per host")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kcache-hosts-bench-")
    n = args.procs
    try:
        for host in args.hosts.split(","):
            try:
                __import__({"numba": "numba", "jax": "jax", "warp": "warp"}[host])
            except ImportError:
                print(f"{host}: not installed, skipped")
                continue
            imp = import_cpu(host)
            print(f"\n{host}: {args.reps} reps, median; an interpreter importing {host}: {imp:.2f} s CPU")
            print(f"  {'cache':<7} {'run':<8} {'compiles':>8} {'CPU s':>7} {'wall s':>7}   notes")
            for mode in ("own", "kcache"):
                reps = [measure(host, mode, n, tmp, not args.small) for _ in range(args.reps)]
                med = {r: tuple(statistics.median(x[r][i] for x in reps) for i in range(3)) for r in reps[0]}
                floor = med["cold"][1] + (n - 1) * imp
                for r, label in (("cold", "cold"), ("warm", "warm"), ("N", f"{n} cold")):
                    wall, cpu, comp = med[r]
                    note = ""
                    if r == "warm":
                        note = f"warm speedup {med['cold'][0] / wall:.1f}x wall, {med['cold'][1] / cpu:.1f}x CPU"
                    if r == "N":
                        hits = med["cold"][1] + (n - 1) * med["warm"][1]
                        note = (f"CPU {cpu / med['cold'][1]:.1f}x one cold process; import floor {floor:.2f} s "
                                f"({100 * (cpu / floor - 1):+.0f}%); cold + {n - 1} warm {hits:.2f} s "
                                f"({100 * (cpu / hits - 1):+.0f}%)")
                    print(f"  {mode:<7} {label:<8} {comp:>8g} {cpu:>7.2f} {wall:>7.2f}   {note}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

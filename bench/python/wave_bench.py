"""Wave (wave-lang, compiling for gfx942 on the CPU) with Wave's own cache and with kcache.wave, in one run.

    make python-torch
    build/venv-torch/bin/python bench/python/wave_bench.py [--procs 8] [--reps 1]

The kernels are the tests' (python/tests/wave_worker.py): an elementwise
add and Wave's GEMM template (M dynamic), compiled to vmfb (run and bench
off). Each mode runs

  own       Wave's own cache (session LRU and its folder, WAVE_CACHE_DIR)
  kcache    kcache.wave.enable()

and for each:

  cold      one process, empty folders
  warm      a new process on the folders the cold run filled
  N cold    N processes started at once on one empty folder

Each row: kernels compiled (summed over the processes), CPU seconds of the
processes (user + system, from wait4, imports included) and wall time;
medians of --reps. The N row's note gives its CPU over one cold process
plus N-1 warm ones (what compiling each kernel once costs at best).
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from hosts_bench import _run as run_workers  # processes started at once: wall, CPU, their JSON

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "python", "tests", "wave_worker.py")


def _env(mode, root):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "WAVE_"))}
    e.update(PYTHONWARNINGS="ignore", KCACHE_DIR=os.path.join(root, "kcache"),
             WAVE_CACHE_DIR=os.path.join(root, "wave"))
    if mode == "own":
        e["HOST_CACHE"] = "wave"
    return e


def _run(envs):
    """Starts the processes at once: (wall, CPU seconds, kernels compiled)."""
    wall, cpu, results = run_workers([[sys.executable, WORKER]] * len(envs), envs, results=True)
    return wall, cpu, sum(r["compiles"] for r in results)


def measure(mode, procs, tmp):
    rows = {}
    root = tempfile.mkdtemp(dir=tmp)
    rows["cold"] = _run([_env(mode, root)])
    rows["warm"] = _run([_env(mode, root)])
    root = tempfile.mkdtemp(dir=tmp)
    rows["N"] = _run([_env(mode, root)] * procs)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    import importlib.metadata as md

    n = args.procs
    tmp = tempfile.mkdtemp(prefix="kcache-wave-bench-")
    try:
        print(f"wave-lang {md.version('wave-lang')}, iree-base-compiler {md.version('iree-base-compiler')}, "
              f"{args.reps} rep(s), median; {n} processes at once")
        print(f"  {'cache':<7} {'run':<8} {'kernels':>7} {'CPU s':>7} {'wall s':>7}   notes")
        meds = {}
        for mode in ("own", "kcache"):
            reps = [measure(mode, n, tmp) for _ in range(args.reps)]
            med = {r: tuple(statistics.median(x[r][i] for x in reps) for i in range(3)) for r in reps[0]}
            meds[mode] = med
            for r, label in (("cold", "cold"), ("warm", "warm"), ("N", f"{n} cold")):
                wall, cpu, compiles = med[r]
                note = ""
                if r == "warm":
                    note = f"{med['cold'][1] / cpu:.1f}x less CPU than cold"
                if r == "N":
                    best = med["cold"][1] + (n - 1) * med["warm"][1]
                    note = (f"CPU {cpu / med['cold'][1]:.1f}x one cold; over cold + {n - 1} warm "
                            f"{100 * (cpu / best - 1):+.0f}%")
                print(f"  {mode:<7} {label:<8} {compiles:>7g} {cpu:>7.2f} {wall:>7.2f}   {note}")
        own, kc = meds["own"], meds["kcache"]
        ratios = ", ".join(f"{r} {kc[r][1] / own[r][1]:.2f}" for r in ("cold", "warm", "N"))
        print(f"  kcache / own, CPU: {ratios}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

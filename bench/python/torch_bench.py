"""torch.compile (Inductor, CPU) with Inductor's own caches and with kcache.torch, in one run.

    make python-torch
    build/venv-torch/bin/python bench/python/torch_bench.py [--procs 8] [--reps 1]

The program is the tests' (python/tests/torch_worker.py): an MLP in
inference and an elementwise function, two FX graphs and their C++ kernels.
Each mode runs

  own       Inductor's own caches: its FX graph cache and C++ code cache in
            TORCHINDUCTOR_CACHE_DIR (and AOTAutograd's, as by default)
  kcache    kcache.torch.enable() (AOTAutograd's cache stays Inductor's)

and for each:

  cold        one process, empty folders
  warm        a new process on the folders the cold run filled
  warm, new   a new process with an empty TORCHINDUCTOR_CACHE_DIR (another
              machine, container or rank folder) over the same store
  N cold      N processes started at once on one empty folder

Each row: FX graphs compiled (Inductor's fxgraph_cache_miss, summed over the
processes), C++ compiler runs, CPU seconds of the processes (user + system,
from wait4) and wall time; medians of --reps. The N row's note gives its CPU
over one cold process plus N-1 warm ones (what compiling each graph once
costs at best).
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from hosts_bench import _run as run_workers  # processes started at once: wall, CPU, their JSON

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "python", "tests", "torch_worker.py")


def _env(mode, store, inductor):
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_") and k != "TORCHINDUCTOR_CACHE_DIR"}
    e.update(PYTHONWARNINGS="ignore", KCACHE_DIR=store, TORCHINDUCTOR_CACHE_DIR=inductor)
    if mode == "own":
        e["HOST_CACHE"] = "inductor"
    return e


def _run(envs):
    """Starts the processes at once: (wall, CPU seconds, FX graphs compiled,
    C++ compiler runs) of all of them."""
    wall, cpu, results = run_workers([[sys.executable, WORKER]] * len(envs), envs, results=True)
    for res in results:
        if res["equal"] != [True, True]:
            sys.exit(f"a compiled result differs from eager's: {res}")
    return wall, cpu, sum(r["fx_miss"] for r in results), sum(r["cxx_runs"] for r in results)


def measure(mode, procs, tmp):
    rows = {}
    root = tempfile.mkdtemp(dir=tmp)
    store, ind = os.path.join(root, "kcache"), os.path.join(root, "inductor")
    rows["cold"] = _run([_env(mode, store, ind)])
    rows["warm"] = _run([_env(mode, store, ind)])
    rows["new"] = _run([_env(mode, store, os.path.join(root, "inductor-new"))])
    root = tempfile.mkdtemp(dir=tmp)
    store, ind = os.path.join(root, "kcache"), os.path.join(root, "inductor")
    rows["N"] = _run([_env(mode, store, ind)] * procs)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    import torch

    n = args.procs
    tmp = tempfile.mkdtemp(prefix="kcache-torch-bench-")
    try:
        print(f"PyTorch {torch.__version__}, {args.reps} rep(s), median; {n} processes at once")
        print(f"  {'cache':<7} {'run':<10} {'FX':>3} {'C++':>4} {'CPU s':>7} {'wall s':>7}   notes")
        meds = {}
        for mode in ("own", "kcache"):
            reps = [measure(mode, n, tmp) for _ in range(args.reps)]
            med = {r: tuple(statistics.median(x[r][i] for x in reps) for i in range(4)) for r in reps[0]}
            meds[mode] = med
            for r, label in (("cold", "cold"), ("warm", "warm"), ("new", "warm, new"), ("N", f"{n} cold")):
                wall, cpu, fx, cxx = med[r]
                note = ""
                if r in ("warm", "new"):
                    note = f"{med['cold'][1] / cpu:.1f}x less CPU than cold"
                if r == "N":
                    best = med["cold"][1] + (n - 1) * med["warm"][1]
                    note = (f"CPU {cpu / med['cold'][1]:.1f}x one cold; over cold + {n - 1} warm "
                            f"{100 * (cpu / best - 1):+.0f}%")
                print(f"  {mode:<7} {label:<10} {fx:>3g} {cxx:>4g} {cpu:>7.2f} {wall:>7.2f}   {note}")
        own, kc = meds["own"], meds["kcache"]
        ratios = ", ".join(f"{r} {kc[r][1] / own[r][1]:.2f}" for r in ("cold", "warm", "new", "N"))
        print(f"  kcache / own, CPU: {ratios}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

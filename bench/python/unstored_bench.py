"""Programs JAX does not store, N processes at once: JAX's own cache against
kcache.jax, in one run.

    build/venv/bin/python bench/python/unstored_bench.py [--procs 8] [--reps 5] [--sleep 3] [--threshold 1]
        [--cases callback,threshold,marked]

The worker is python/tests/jax_worker.py on the CPU. Three cases:

  callback   a jitted program with a host callback (jax.debug.print): JAX
             never stores it; its compile takes --sleep seconds
  threshold  a plain jitted program under a minimum compile time of
             --threshold seconds (default 1 s, JAX's default;
             jax_persistent_cache_min_compile_time_secs, under kcache
             enable(min_compile_time_secs=...)), whose compile takes
             --sleep / 6 seconds: not stored either, on an empty store
  marked     the same after one process compiled it (under kcache, the key
             is then marked "compile locally")

A compile is made slow by a sleep inside it (COMPILE_SLEEP), so that the
2-core machine measures waiting and not CPU contention. Each repetition
runs both caches on fresh folders, in alternating order. Each row, medians:
the wall time from starting the N processes to the last one's exit, the CPU
seconds (user + system, from wait4) of all of them, the XLA compiles of the
program, the longest time a process spent between JAX asking for it and
XLA starting to compile it (a wait for another process's compile), and the
longest between asking for it and having it (its wait and its compile: the
part of the wall time a cache decides, without the imports and start-up
that the machine's load stretches).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from hosts_bench import _run  # processes started at once: (wall, CPU seconds)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "python", "tests", "jax_worker.py")

# name: (worker arguments, environment, the program, its compile in units
# of --sleep, one process run to its end first)
CASES = {
    "callback": (["0"], {"CALLBACK": "1"}, "jit_slow_printed", 1.0, False),
    "threshold": (["1"], {}, "jit_slow_poly", 1 / 6, False),
    "marked": (["1"], {}, "jit_slow_poly", 1 / 6, True),
}


def run(case, mode, procs, sleep, threshold, tmp):
    args, extra, program, scale, first = CASES[case]
    if case != "callback":
        extra = dict(extra, MIN_COMPILE_TIME=str(threshold))
    root = tempfile.mkdtemp(dir=tmp)
    count = os.path.join(root, "count")
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    e.update(extra, PYTHONWARNINGS="ignore", JAX_PLATFORMS="cpu", COUNT_FILE=count,
             COMPILE_SLEEP=str(sleep * scale), KCACHE_DIR=os.path.join(root, "kcache"))
    if mode == "own":
        e.update(HOST_CACHE="jax", JAX_CACHE_DIR=os.path.join(root, "jax"))
    if first:
        subprocess.run([sys.executable, WORKER, *args], env=e, stdout=subprocess.DEVNULL, check=True)
        os.unlink(count)
    wall, cpu = _run([[sys.executable, WORKER, *args]] * procs, [e] * procs)
    waits, gets = [], []
    with open(count) as f:
        for line in f.read().split():
            _, name, asked, started, ended = line.split(":")
            if name == program:
                waits.append(float(started) - float(asked))
                gets.append(float(ended) - float(asked))
    shutil.rmtree(root, ignore_errors=True)
    return wall, cpu, len(waits), max(waits), max(gets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=3.0)
    ap.add_argument("--threshold", type=float, default=1.0, help="the minimum compile time, s")
    ap.add_argument("--cases", default="callback,threshold,marked")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kcache-unstored-bench-")
    try:
        print(f"{args.procs} processes at once, --sleep {args.sleep:g}; median of {args.reps} reps")
        print(f"  {'case':<10} {'cache':<7} {'wall s':>7} {'CPU s':>7} {'compiles':>8} {'longest wait s':>14} {'longest get s':>13}")
        for case in args.cases.split(","):
            res = {"own": [], "kcache": []}
            for i in range(args.reps):
                for mode in (("own", "kcache") if i % 2 == 0 else ("kcache", "own")):
                    res[mode].append(run(case, mode, args.procs, args.sleep, args.threshold, tmp))
            med = {m: [statistics.median(r[j] for r in rs) for j in range(5)] for m, rs in res.items()}
            for m in ("own", "kcache"):
                wall, cpu, comp, wait, get = med[m]
                print(f"  {case:<10} {m:<7} {wall:>7.2f} {cpu:>7.2f} {comp:>8g} {wait:>14.2f} {get:>13.2f}")
            for j, what in ((0, "wall"), (4, "longest get")):
                ratios = sorted(k[j] / o[j] for k, o in zip(res["kcache"], res["own"]))
                print(f"  {case:<10} kcache / own {what}: {med['kcache'][j] / med['own'][j]:.3f} "
                      f"(per rep: {', '.join(f'{r:.3f}' for r in ratios)})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A process that defines N small numba functions with cache=True under
kcache.numba (or numba's own cache with HOST_CACHE=numba), calls them and
prints one JSON line: results, numba's own compiles in this process and the
kcache statistics. Every compile numba runs is appended to $COUNT_FILE
first; with $COMPILE_SLEEP it then sleeps that long (a slow compile)."""

import json
import os
import sys
import time

import numpy as np
from numba.core import dispatcher

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
compiles = 0
_real_compile_core = dispatcher._FunctionCompiler._compile_core


def _counted_compile_core(self, args, return_type):
    global compiles
    compiles += 1
    if os.environ.get("COUNT_FILE"):
        with open(os.environ["COUNT_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
    if os.environ.get("COMPILE_SLEEP"):
        time.sleep(float(os.environ["COMPILE_SLEEP"]))
    return _real_compile_core(self, args, return_type)


dispatcher._FunctionCompiler._compile_core = _counted_compile_core

if os.environ.get("HOST_CACHE") != "numba":
    import kcache.numba
    kcache.numba.enable()

from numba import njit  # noqa: E402


@njit(cache=True)
def axpy(a, x, y):
    return a * x + y


@njit(cache=True)
def dot(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


@njit(cache=True)
def collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


x = np.arange(8, dtype=np.float64)
calls = [lambda: float(axpy(2.0, 3.0, 1.0)), lambda: float(dot(x, x)), lambda: int(collatz(27))]
results = [c() for c in calls[:N]]
if os.environ.get("BENCH"):
    # Heavier programs for bench/python/hosts_bench.py.
    from numba import prange

    @njit(cache=True)
    def solve(a, b):
        return np.linalg.solve(a, b)

    @njit(cache=True, parallel=True)
    def prange_sum(v):
        s = 0.0
        for i in prange(v.shape[0]):
            s += np.sqrt(v[i]) * np.sin(v[i])
        return s

    @njit(cache=True)
    def uniq(v):
        return np.unique(np.sort(v))

    @njit(cache=True)
    def hist(v):
        return np.histogram(v, bins=4)[0]

    m = np.eye(4) * 2.0
    results += [float(solve(m, np.ones(4)).sum()), round(float(prange_sum(x)), 4), int(uniq(x).shape[0]),
                int(hist(x).sum())]

if os.environ.get("FAILING"):
    # A function whose compile fails (no such attribute): nothing is stored.
    @njit(cache=True)
    def broken(x):
        return x.no_such_attribute

    try:
        broken(1.0)
        results.append("compiled")
    except Exception as e:
        results.append(type(e).__name__)
    if os.environ.get("HOLD"):  # stay alive after the compile
        open(os.environ["HOLD"], "w").close()
        time.sleep(120)

out = {"results": results, "compiles": compiles, "pid": os.getpid()}
if os.environ.get("HOST_CACHE") != "numba":
    out["stats"] = kcache.numba.cache().stats()
print(json.dumps(out))

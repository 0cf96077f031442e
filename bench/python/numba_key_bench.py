"""kcache.numba's key against numba's own index lookup, per function, in one
warm process.

    build/venv/bin/python bench/python/numba_key_bench.py [--functions 24] [--reps 200]

Writes a module of --functions @njit(cache=True) functions (module
constants, a small global array, an enum, a tuple, a jitted callee in a
second module that reads a constant of a third) into a temporary folder,
imports it, compiles each function once, stores each overload in numba's own
cache (NUMBA_CACHE_DIR in the same folder) and in kcache (KCACHE_DIR there),
then times, per function, in this warm process (code objects seen before,
as when a process compiles a second signature or a new dispatcher of a
function it has keyed before):

  kcache key        FunctionCache._key of the function's cache: the values
                    its last walk read re-checked (same objects, arrays' same
                    bytes), signature, target
  kcache walk       the same on a new FunctionCache (a new dispatcher of a
                    function whose code objects the process has seen): the
                    whole walk of what it runs (globals' values, callees)
  numba index       numba's own lookup before the data file: its index key
                    (signature, target, bytecode and closure hashes) and the
                    index file read, stamp check and unpickle
  kcache first      the walk as the first key of these code objects in a
                    process: each disassembled (dis) and its file hashed
  kcache load       kcache.numba's load_overload: key, kcache lookup, unpickle
                    and rebuild of the compile result
  numba load        numba's own load_overload: index, data file, rebuild

Medians over --reps calls per function, then the median over functions;
ratios are kcache / numba from this run.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

CALLEE = """from numba import njit
import limits

@njit(cache=True)
def clamp(x):
    return min(max(x, -limits.BOUND), limits.BOUND)
"""

HEAD = """import enum
import numpy as np
from numba import njit
from callee import clamp

SCALE = 3
OFFSET = 0.5
NAME = "kernel"
WEIGHTS = np.linspace(0.0, 1.0, 16)
SHAPE = (4, 4)

class Mode(enum.IntEnum):
    FAST = 1
    SAFE = 2
"""

BODY = """
@njit(cache=True)
def f{i}(x, n):
    s = 0.0
    for k in range(n):
        s += clamp(x * SCALE + k) * WEIGHTS[k % WEIGHTS.shape[0]] + OFFSET
    if Mode.SAFE == {mode}:
        s += SHAPE[0] * {i}
    return s
"""


def timeit(fn, reps):
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--functions", type=int, default=24)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="numba-key-bench-")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(root, "numba")
    os.environ["KCACHE_DIR"] = os.path.join(root, "kcache")
    with open(os.path.join(root, "limits.py"), "w") as f:
        f.write("BOUND = 100.0\n")
    with open(os.path.join(root, "callee.py"), "w") as f:
        f.write(CALLEE)
    with open(os.path.join(root, "kernels.py"), "w") as f:
        f.write(HEAD + "".join(BODY.format(i=i, mode=1 + i % 2) for i in range(a.functions)))
    sys.path.insert(0, root)

    import numba
    from numba.core.caching import FunctionCache as NumbaCache

    import kcache.numba as kn
    import kernels

    rows = []
    for i in range(a.functions):
        d = getattr(kernels, f"f{i}")
        d(1.5, 8)  # compiled (no cache: the dispatcher was made before any enable())
        sig = d.signatures[0]
        cres = d.overloads[sig]
        ctx = d.targetctx
        codegen = ctx.codegen()
        own = NumbaCache(d.py_func)
        kc = kn.FunctionCache(d.py_func, d.targetoptions)
        own.save_overload(sig, cres)
        kc.save_overload(sig, cres)
        assert own.load_overload(sig, ctx) is not None and kc.load_overload(sig, ctx) is not None
        index_key = own._index_key
        cache_file = own._cache_file

        def numba_index():
            return cache_file._load_index().get(index_key(sig, codegen))

        def kcache_walk():  # a new FunctionCache: no walk to reuse, code objects known
            return kn.FunctionCache(d.py_func, d.targetoptions)._key(sig, codegen)

        def kcache_first():  # as the first key of these code objects in a process
            kn._code_infos.clear()
            kn._file_digests.clear()
            return kcache_walk()

        rows.append((timeit(lambda: kc._key(sig, codegen), a.reps), timeit(numba_index, a.reps),
                     timeit(lambda: kc.load_overload(sig, ctx), a.reps),
                     timeit(lambda: own.load_overload(sig, ctx), a.reps), timeit(kcache_walk, a.reps),
                     timeit(kcache_first, a.reps)))
    kn.cache().flush()
    med = [statistics.median(r[j] for r in rows) * 1e6 for j in range(6)]
    print(f"numba {numba.__version__}, {a.functions} functions, median of {a.reps} calls each (microseconds)")
    print(f"  kcache key   {med[0]:8.1f}   numba index  {med[1]:8.1f}   ratio {med[0] / med[1]:.2f}")
    print(f"  kcache walk  {med[4]:8.1f}   numba index  {med[1]:8.1f}   ratio {med[4] / med[1]:.2f}")
    print(f"  kcache first {med[5]:8.1f}   numba index  {med[1]:8.1f}   ratio {med[5] / med[1]:.2f}")
    print(f"  kcache load  {med[2]:8.1f}   numba load   {med[3]:8.1f}   ratio {med[2] / med[3]:.2f}")


if __name__ == "__main__":
    main()

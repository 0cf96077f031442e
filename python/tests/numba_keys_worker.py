"""A process for the numba key tests (test_numba.py): a scenario named by
argv[1], run under kcache.numba (or numba's own cache with
HOST_CACHE=numba), printing one JSON line: results, numba's own compiles in
this process and (under kcache) the kcache statistics.

  notebook        cells compiled from strings with compile()/exec, globals
                  changed between them (no source file)
  modules DIR     imports callermod from DIR (a callee and constants in
                  other modules) and calls it
  recompile DIR   imports recmod from DIR: f(2, 3), mod.Z = 10, f(2, 3),
                  f.recompile(), f(2, 3) ($SET_Z sets mod.Z before)
  recursion       self and mutual recursion, compiled from a string
"""

import json
import os
import sys

from numba.core import dispatcher

compiles = 0
_real_compile_core = dispatcher._FunctionCompiler._compile_core


def _counted_compile_core(self, args, return_type):
    global compiles
    compiles += 1
    return _real_compile_core(self, args, return_type)


dispatcher._FunctionCompiler._compile_core = _counted_compile_core

if os.environ.get("HOST_CACHE") != "numba":
    import kcache.numba

    kcache.numba.enable()

scenario = sys.argv[1]
results = []


def cell(src, ns, n):
    exec(compile(src, f"<cell-{n}>", "exec"), ns)


if scenario == "notebook":
    ns = {"__name__": "__main__"}
    cell("from numba import njit\nimport numpy as np\n", ns, 1)
    cell("C = 1\n@njit(cache=True)\ndef f(x):\n    return x + C\nr = f(10)\n", ns, 2)
    results.append(int(ns["r"]))
    cell("C = 2\n@njit(cache=True)\ndef f(x):\n    return x + C\nr = f(10)\n", ns, 3)  # the cell run again
    results.append(int(ns["r"]))
    cell("A = 1\nB = 100\n@njit(cache=True)\ndef g(x):\n    return x + A\nr = g(10)\n", ns, 4)
    results.append(int(ns["r"]))
    cell("@njit(cache=True)\ndef g(x):\n    return x + B\nr = g(10)\n", ns, 5)  # the cell edited
    results.append(int(ns["r"]))
    cell("T = np.arange(4.0)\n@njit(cache=True)\ndef h(i):\n    return T[i] * 2\nr = h(3)\n", ns, 6)
    results.append(float(ns["r"]))
    cell("T = np.arange(4.0) + 1\n@njit(cache=True)\ndef h(i):\n    return T[i] * 2\nr = h(3)\n", ns, 7)
    results.append(float(ns["r"]))
    cell("def k(s):\n    @njit(cache=True)\n    def inner(x):\n        return x * s\n    return inner\n"
         "r = k(3)(2) + k(5)(2)\n", ns, 8)  # closures: one per cell value
    results.append(int(ns["r"]))
elif scenario == "modules":
    sys.path.insert(0, sys.argv[2])
    import callermod

    results.append(int(callermod.f(1)))
elif scenario == "recompile":
    sys.path.insert(0, sys.argv[2])
    import recmod

    if os.environ.get("SET_Z"):
        recmod.Z = int(os.environ["SET_Z"])
    results.append(int(recmod.f(2, 3)))
    recmod.Z = 10
    results.append(int(recmod.f(2, 3)))  # compiled already in this process: numba keeps it
    recmod.f.recompile()
    results.append(int(recmod.f(2, 3)))
elif scenario == "recursion":
    ns = {"__name__": "__main__"}
    cell("from numba import njit\n"
         "@njit(cache=True)\ndef fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n"
         "@njit(cache=True)\ndef even(n):\n    return True if n == 0 else odd(n - 1)\n"
         "@njit(cache=True)\ndef odd(n):\n    return False if n == 0 else even(n - 1)\n", ns, 1)
    results += [int(ns["fact"](10)), bool(ns["even"](10)), bool(ns["odd"](7))]
else:
    raise SystemExit(f"unknown scenario {scenario}")

out = {"results": results, "compiles": compiles}
if os.environ.get("HOST_CACHE") != "numba":
    out["stats"] = kcache.numba.cache().stats()
print(json.dumps(out))

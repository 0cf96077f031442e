"""Triton's FileCacheManager and kcache.triton side by side, and the Python
core API and llvmlite object cache, in one run.

    build/venv/bin/python bench/python/triton_bench.py [--procs 8] [--skip-triton] [--skip-llvmlite]

For each manager, on the same kernels (python/tests/triton_kernels.py:
elementwise, GELU, softmax, layernorm, matmul at several block sizes),
compiled for sm_90 without a GPU with the ptxas of Triton's wheel:

  cold      one process, empty cache folder
  warm      a new process, the folder the cold run filled
  N cold    N processes started at once on an empty folder
  import    a process that only imports Triton (the floor of every process)

"kcache+key" is kcache.triton.install() at the top of the worker: the same
cache, and triton_key() remembered across processes.

Each row gives wall time, CPU seconds of the processes and their children
(ptxas), ptxas runs (counted by a wrapper script), and for warm runs the load
time per kernel (triton.compile on a hit, measured inside the process, wall
and CPU; "again": each kernel loaded a second time in the same process, with
the cache already open). N processes cannot use less CPU than one cold process plus N-1
warm ones (interpreter, import triton, Triton's per-kernel work on a hit);
the last line of each manager says how far above that floor it went.

Then: cache.get of a 16 KiB entry from Python (memory-tier hit and disk-only
hit), and llvmlite MCJIT cold (no cache, and miss+store) against warm (hit).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "python", "tests")

_WORKER = r"""
import json, os, resource, sys, time
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
sys.path.insert(0, sys.argv[1])
if os.environ.get("BENCH_INSTALL"):
    import kcache.triton
    kcache.triton.install()
import triton_kernels
import triton
t_import = cpu()
if os.environ.get("BENCH_IMPORT_ONLY"):
    print(json.dumps({"import_cpu_s": t_import, "per_kernel_s": {}}))
    sys.exit(0)
per, per_cpu = {}, {}
for name, src in triton_kernels.kernels():
    c, t = cpu(), time.perf_counter()
    triton.compile(src, target=triton_kernels.TARGET)
    per[name] = time.perf_counter() - t
    per_cpu[name] = cpu() - c
# Each kernel once more: loads of a process that has its cache open already.
again = {}
for name, src in triton_kernels.kernels():
    c = cpu()
    triton.compile(src, target=triton_kernels.TARGET)
    again[name] = cpu() - c
out = {"import_cpu_s": t_import, "per_kernel_s": per, "per_kernel_cpu_s": per_cpu, "again_cpu_s": again}
# The cache manager alone: Triton's get_cache_manager(hash).get_group(name) on
# a hit, as compile() calls it, without the rest of compile().
if os.environ.get("BENCH_GET_GROUP"):
    import hashlib
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager
    backend = make_backend(triton_kernels.TARGET)
    env_vars = get_cache_invalidating_env_vars()
    calls = []
    for name, src in triton_kernels.kernels():
        options = backend.parse_options(dict(src.parse_options()))
        h = hashlib.sha256(get_cache_key(src, backend, options, env_vars=env_vars).encode()).hexdigest()
        calls.append((h, src.name[:150] + ".json"))
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        for h, f in calls:
            assert get_cache_manager(h).get_group(f)
    out["get_group_us"] = (time.perf_counter() - t) / (n * len(calls)) * 1e6
if os.environ.get("TRITON_CACHE_MANAGER", "").startswith("kcache"):
    import kcache.triton
    out["stats"] = kcache.triton.cache().stats()
print(json.dumps(out))
"""


def _ptxas_wrapper(tmp):
    import triton
    real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    path = os.path.join(tmp, "ptxas-wrapper")
    with open(path, "w") as f:
        f.write("#!/bin/sh\ncase \"$1\" in --version) ;; *) echo $$ >> \"$PTXAS_COUNT_FILE\" ;; esac\n"
                f"exec {real} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def _count(path):
    try:
        with open(path) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(env, nprocs):
    """Starts nprocs workers at once; (wall s, CPU s, results)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, TESTS], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(nprocs)]
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"worker failed:\n{err[-3000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return time.perf_counter() - t0, _children_cpu() - cpu0, outs


def bench_triton(procs):
    tmp = tempfile.mkdtemp(prefix="kcache-triton-bench-")
    wrapper = _ptxas_wrapper(tmp)
    rows = []
    try:
        for manager in ("file", "kcache", "kcache+key"):
            phases = (("import", 1), ("cold", 1), ("warm", 1), ("get_group", 1), (f"{procs} cold", procs))
            if manager == "kcache+key":
                phases = (("cold", 1), ("warm", 1), ("get_group", 1))
            for phase, n in phases:
                folder = os.path.join(tmp, manager + ("-multi" if n > 1 else ""))
                count = os.path.join(tmp, f"count-{manager}-{phase.replace(' ', '')}")
                env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "KCACHE_"))}
                env.update(TRITON_CACHE_DIR=folder, TRITON_HOME=os.path.join(tmp, "home"),
                           TRITON_PTXAS_PATH=wrapper, TRITON_PTXAS_BLACKWELL_PATH=wrapper, PTXAS_COUNT_FILE=count,
                           TRITON_DEFAULT_FP_FUSION="1", PYTHONWARNINGS="ignore")
                if manager.startswith("kcache"):
                    env["TRITON_CACHE_MANAGER"] = "kcache.triton:CacheManager"
                if manager == "kcache+key":
                    env["BENCH_INSTALL"] = "1"
                if phase == "import":
                    env["BENCH_IMPORT_ONLY"] = "1"
                if phase == "get_group":  # a warm process of its own: its loop is not in warm's CPU
                    env["BENCH_GET_GROUP"] = "1"
                wall, cpu, outs = _run(env, n)
                kernels = len(outs[0]["per_kernel_s"])
                row = {"manager": manager, "phase": phase, "processes": n, "kernels": kernels,
                       "wall_s": wall, "cpu_s": cpu, "ptxas_runs": _count(count),
                       "import_cpu_s": statistics.median(o["import_cpu_s"] for o in outs)}
                if phase == "warm":
                    row["load_ms_per_kernel"] = 1000 * statistics.mean(outs[0]["per_kernel_s"].values())
                    row["load_cpu_ms_per_kernel"] = 1000 * statistics.mean(outs[0]["per_kernel_cpu_s"].values())
                    row["again_cpu_ms_per_kernel"] = 1000 * statistics.mean(outs[0]["again_cpu_s"].values())
                if phase == "get_group":
                    row["get_group_us"] = outs[0]["get_group_us"]
                if manager.startswith("kcache") and phase != "import":
                    row["compiles"] = sum(o["stats"]["compiles"] for o in outs)
                rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def bench_get():
    import kcache
    tmp = tempfile.mkdtemp(prefix="kcache-get-bench-")
    res = {}
    try:
        payload = os.urandom(16384)
        for label, kw in (("memory hit", {}), ("disk hit (no memory tier)", {"memory": False})):
            with kcache.Cache(os.path.join(tmp, label.split()[0]), env=False, **kw) as c:
                k = kcache.key("bench/1", x=label)
                c.put(k, {"obj": payload})
                get = c.get
                for _ in range(10000):
                    get(k)
                best = []
                for _ in range(5):
                    n = 200000
                    t = time.perf_counter()
                    for _ in range(n):
                        get(k)
                    best.append((time.perf_counter() - t) / n * 1e6)
                res[f"cache.get 16 KiB, {label} (us)"] = min(best)
                view = []
                n = 100000
                t = time.perf_counter()
                for _ in range(n):
                    get(k)["obj"]
                view.append((time.perf_counter() - t) / n * 1e6)
                res[f"cache.get 16 KiB + entry['obj'], {label} (us)"] = min(view)
        k = kcache.key("bench/1", ir=payload, arch="sm_90", options={"O": 3, "fast": True})
        n = 100000
        t = time.perf_counter()
        for _ in range(n):
            kcache.key("bench/1", ir=payload, arch="sm_90", options={"O": 3, "fast": True})
        res["kcache.key of 16 KiB IR + 2 components (us)"] = (time.perf_counter() - t) / n * 1e6
        assert k is not None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _llvm_ir(i, funcs=40):
    # A module of `funcs` small loops, distinct per i.
    out = []
    for f in range(funcs):
        out.append(f"""
define i64 @f{f}(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %acc = phi i64 [{i}, %entry], [%acc1, %loop]
  %m = mul i64 %i, {f + 3}
  %x = xor i64 %acc, %m
  %acc1 = add i64 %x, {i * 7 + f}
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %done
done:
  ret i64 %acc1
}}""")
    return "\n".join(out)


def bench_llvmlite(modules=20):
    import llvmlite.binding as llvm

    import kcache
    from kcache.llvmlite import ObjectCache
    try:
        llvm.initialize()
    except RuntimeError:
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    irs = [_llvm_ir(i) for i in range(modules)]
    tmp = tempfile.mkdtemp(prefix="kcache-llvmlite-bench-")
    res = {}
    try:
        def run(objects):
            t = time.perf_counter()
            engines = []
            for ir in irs:
                mod = llvm.parse_assembly(ir)
                tm = objects.create_target_machine() if objects else llvm.Target.from_default_triple()\
                    .create_target_machine(opt=2, jit=True)
                e = llvm.create_mcjit_compiler(mod, tm)
                if objects:
                    objects.attach(e)
                e.finalize_object()
                assert e.get_function_address("f0")
                engines.append(e)
            return (time.perf_counter() - t) / len(irs) * 1000

        res["llvmlite MCJIT, no cache (ms/module)"] = run(None)
        with kcache.Cache(tmp, env=False) as c:
            res["llvmlite MCJIT, kcache cold: miss + store (ms/module)"] = run(ObjectCache(opt=2, cache=c))
        with kcache.Cache(tmp, env=False) as c:  # a new cache: hits come from disk
            res["llvmlite MCJIT, kcache warm: disk hit (ms/module)"] = run(ObjectCache(opt=2, cache=c))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--skip-llvmlite", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    results = {"get": bench_get()}
    if not a.skip_llvmlite:
        results["llvmlite"] = bench_llvmlite()
    if not a.skip_triton:
        results["triton"] = bench_triton(a.procs)
    if a.json:
        print(json.dumps(results, indent=1))
        return
    for k, v in {**results["get"], **results.get("llvmlite", {})}.items():
        print(f"{k:62s} {v:8.3f}")
    if "triton" in results:
        print()
        hdr = f"{'manager':8s} {'phase':8s} {'wall s':>7s} {'CPU s':>7s} {'ptxas':>6s} {'compiles':>8s} " \
              f"{'import CPU s':>12s} {'load ms/kernel':>14s} {'load CPU ms/kernel':>18s} {'again CPU ms':>12s}"
        print(hdr)
        nan = float("nan")
        for r in results["triton"]:
            if r["phase"] in ("import", "get_group"):
                continue
            print(f"{r['manager']:8s} {r['phase']:8s} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {r['ptxas_runs']:6d} "
                  f"{str(r.get('compiles', '-')):>8s} {r['import_cpu_s']:12.2f} "
                  f"{r.get('load_ms_per_kernel', nan):14.2f} {r.get('load_cpu_ms_per_kernel', nan):18.2f} "
                  f"{r.get('again_cpu_ms_per_kernel', nan):12.2f}")
        by = {(r["manager"], r["phase"]): r for r in results["triton"]}
        multi = f"{a.procs} cold"
        for m in ("file", "kcache"):
            cold, warm, many = by[(m, "cold")]["cpu_s"], by[(m, "warm")]["cpu_s"], by[(m, multi)]["cpu_s"]
            # What N processes cannot avoid even when all but one only load:
            # N-1 warm processes (interpreter, import triton, Triton's own
            # per-kernel work on a hit).
            floor = by[(m, "import")]["cpu_s"]
            print(f"{m}: {multi} CPU / one cold process = {many / cold:.2f}x; "
                  f"above {a.procs - 1} warm processes' CPU: {(many - (a.procs - 1) * warm) / cold:.2f}x; "
                  f"above the import floor ({a.procs - 1} more interpreters importing Triton, "
                  f"{floor:.2f} s each): {(many - (a.procs - 1) * floor) / cold:.2f}x")
        for m in ("kcache", "kcache+key"):
            print(f"warm process that compiles nothing, CPU {m} / file: "
                  f"{by[(m, 'warm')]['cpu_s'] / by[('file', 'warm')]['cpu_s']:.2f}x "
                  f"({by[(m, 'warm')]['cpu_s']:.2f} s / {by[('file', 'warm')]['cpu_s']:.2f} s)")
        for m in ("file", "kcache", "kcache+key"):
            print(f"{m}: get_cache_manager(hash).get_group(name) on a hit: {by[(m, 'get_group')]['get_group_us']:.1f} us")
        print(f"warm load per kernel, kcache / file: wall "
              f"{by[('kcache', 'warm')]['load_ms_per_kernel'] / by[('file', 'warm')]['load_ms_per_kernel']:.2f}x, "
              f"CPU {by[('kcache', 'warm')]['load_cpu_ms_per_kernel'] / by[('file', 'warm')]['load_cpu_ms_per_kernel']:.2f}x, "
              f"CPU of a second load in the same process "
              f"{by[('kcache', 'warm')]['again_cpu_ms_per_kernel'] / by[('file', 'warm')]['again_cpu_ms_per_kernel']:.2f}x")

if __name__ == "__main__":
    main()

"""kcache.llvmlite: llvmlite's MCJIT object cache, cold and warm, with real
LLVM from llvmlite's wheel."""

import ctypes
import subprocess
import sys
import time

import pytest

llvm = pytest.importorskip("llvmlite.binding", reason="llvmlite is not installed (make python installs it)")

import kcache  # noqa: E402
from kcache.llvmlite import ObjectCache  # noqa: E402

IR = r"""
define i64 @fib(i64 %n) {
entry:
  %small = icmp slt i64 %n, 2
  br i1 %small, label %done, label %rec
rec:
  %a = sub i64 %n, 1
  %b = sub i64 %n, 2
  %fa = call i64 @fib(i64 %a)
  %fb = call i64 @fib(i64 %b)
  %s = add i64 %fa, %fb
  ret i64 %s
done:
  ret i64 %n
}
"""


def _init():
    try:
        llvm.initialize()
    except RuntimeError:
        pass  # newer llvmlite initialises itself
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def _jit(objects, ir=IR):
    _init()
    mod = llvm.parse_assembly(ir)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, objects.create_target_machine())
    objects.attach(engine)
    engine.finalize_object()
    fib = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(engine.get_function_address("fib"))
    return engine, fib


def test_cold_then_warm(cache_dir):
    with kcache.Cache(cache_dir) as c:
        objects = ObjectCache(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2,
                              cache=c)
        engine, fib = _jit(objects)
        assert fib(20) == 6765
        assert (objects.hits, objects.misses) == (0, 1)
        c.flush()  # the disk tier is written by a committer thread
        assert c.tier_stats("lmdb")["entries"] == 1
        engine2, fib2 = _jit(objects)
        assert fib2(21) == 10946
        assert (objects.hits, objects.misses) == (1, 1)
        # Another optimisation level is another key.
        other = ObjectCache(cpu=objects.cpu, features=objects.features, opt=0, cache=c)
        _, fib3 = _jit(other)
        assert fib3(10) == 55 and other.misses == 1
        c.flush()
        assert c.tier_stats("lmdb")["entries"] == 2


_WARM = r"""
import ctypes, sys, kcache, llvmlite.binding as llvm
from kcache.llvmlite import ObjectCache
sys.path.insert(0, sys.argv[2])
import test_llvmlite as t
objects = ObjectCache(opt=2, cache=kcache.Cache(sys.argv[1]))
engine, fib = t._jit(objects)
print(fib(15), objects.hits, objects.misses)
"""


def test_warm_in_new_process(cache_dir):
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    outs = [subprocess.run([sys.executable, "-c", _WARM, cache_dir, here], capture_output=True, text=True, check=True)
            .stdout.split() for _ in range(2)]
    assert outs[0] == ["610", "0", "1"]
    assert outs[1] == ["610", "1", "0"]


def test_bad_opt_raises():
    with pytest.raises(ValueError):
        ObjectCache(opt=7, cache=kcache.Cache(disk=False))


def _big_ir(n=1500):
    """A module that takes MCJIT about a second at opt=2 here: n functions
    with a loop each, and `fib` to call."""
    fns = [f"""
define i64 @f{i}(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %acc = phi i64 [ {i}, %entry ], [ %acc2, %loop ]
  %m = mul i64 %acc, {i + 3}
  %acc2 = xor i64 %m, %i
  %next = add i64 %i, 1
  %done = icmp sge i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret i64 %acc2
}}""" for i in range(n)]
    return IR + "\n".join(fns)


_RACE = r"""
import os, sys, time, kcache
sys.path.insert(0, sys.argv[2])
import test_llvmlite as t
from kcache.llvmlite import ObjectCache
ir = t._big_ir()
c = kcache.Cache(sys.argv[1])
objects = ObjectCache(opt=2, cache=c)
open(sys.argv[4], "w").close()  # ready
while not os.path.exists(sys.argv[3]):
    time.sleep(0.005)
engine, fib = t._jit(objects, ir)
print(fib(15), objects.hits, objects.misses, c.stats()["lease_waits"])
"""


def test_processes_started_together_compile_a_module_once(cache_dir, tmp_path):
    """Four processes that miss the same module at once: one compiles it,
    the others wait for its object and load it (each would compile it
    without the key's flight: MCJIT takes about a second on this module)."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, cache_dir, here, str(go), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in ready]
    deadline = time.time() + 120
    while not all(r.exists() for r in ready):  # all four imported and waiting
        assert time.time() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append([int(x) for x in out.split()])
    assert all(o[0] == 610 for o in outs), outs
    assert sum(o[2] for o in outs) == 1, outs  # one compile
    assert sum(o[1] for o in outs) == 3, outs  # three loads
    assert sum(o[3] for o in outs) >= 1, outs  # of which some waited for it

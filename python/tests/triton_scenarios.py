"""Small programs the Triton tests run in their own processes (one command
each), printing one JSON line.

    python triton_scenarios.py fail-and-keep     compiles a kernel that fails
        (front end: a static assertion), keeps the exception in a global,
        prints {"ready": ..., "frames": the frames of its traceback}, then
        sleeps until stdin closes
    python triton_scenarios.py fail              the same kernel, once
    python triton_scenarios.py fail-ptxas-keep   install(), then a kernel whose
        ptxas fails (PTXAS_FAIL=1 in the environment); kept as above
    python triton_scenarios.py fail-ptxas-env-keep   the same without install():
        the manager is imported by Triton inside this first compile
    python triton_scenarios.py fail-waited FIFO  install(); thread A compiles
        the add kernel; its first ptxas run (the test's wrapper) blocks on
        FIFO, then fails; once A is in ptxas (holding the lease) thread B
        compiles the same kernel, and once B waits in get_group() the FIFO is
        released: prints A's exception and the frames of its traceback, and
        whether B compiled (RESULT line)
    python triton_scenarios.py options W         the add kernel with num_warps=W
    python triton_scenarios.py wrapped-manager   the add kernel under a cache
        manager of the program's own that wraps kcache's: its get_group and
        put_group reach kcache's through a few layers of calls; prints the
        cubin's digest, the kcache statistics and how many lookups it made
    python triton_scenarios.py key               install(); triton_key() and
        where it came from, and Triton's own value computed afresh
    python triton_scenarios.py key-env           the same without install():
        only what TRITON_CACHE_MANAGER and the wheel's start-up hook do
"""

import hashlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402

# Whether the wheel's start-up hook imported kcache.triton right after Triton.
BOOTED = "kcache.triton" in sys.modules
import triton.language as tl  # noqa: E402

import triton_kernels  # noqa: E402

kept = None


@triton.jit
def failing_kernel(x_ptr, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK < 0, "this kernel never compiles")
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, offs, mask=offs < n)


def _failing():
    return triton_kernels.ast_source(failing_kernel, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                     {"BLOCK": 64})


def _frames(e):
    """Each frame of e's traceback: its function, module, the names of
    its locals, and the arguments it was called with that are missing from
    its locals (none, when nothing cleared them)."""
    out = []
    tb = e.__traceback__
    while tb is not None:
        f = tb.tb_frame
        code = f.f_code
        nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        names = list(f.f_locals)
        out.append({"function": code.co_name, "module": f.f_globals.get("__name__", ""), "locals": names,
                    "missing_args": [a for a in code.co_varnames[:nargs] if a not in names]})
        tb = tb.tb_next
    return out


def _until(cond, what, timeout=120):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def _waited(fifo):
    import kcache.triton
    kcache.triton.install(remember_triton_key=False)
    src = triton_kernels.kernels()[0][1]
    got = {}

    def compile_as(name):
        try:
            k = triton.compile(src, target=triton_kernels.TARGET)
            got[name] = hashlib.sha256(k.asm["cubin"]).hexdigest()
        except Exception as e:  # noqa: BLE001 - A's ptxas fails
            got[name] = e

    a = threading.Thread(target=compile_as, args=("a",))
    a.start()
    # A is in its first ptxas run (the wrapper made this folder), holding the lease.
    _until(lambda: os.path.isdir(fifo + ".started"), "the first ptxas run")
    b = threading.Thread(target=compile_as, args=("b",))
    b.start()
    # B is in get_group(), on the line that calls begin(): waiting for A's flight.
    code = kcache.triton.CacheManager.get_group.__code__
    lines = open(code.co_filename).read().splitlines()
    begin_line = next(i for i in range(code.co_firstlineno, len(lines) + 1) if ".begin(" in lines[i - 1])

    def b_waits():
        f = sys._current_frames().get(b.ident)
        return f is not None and f.f_code is code and f.f_lineno == begin_line
    _until(b_waits, "the second thread to wait in get_group")
    with open(fifo, "w"):
        pass  # A's ptxas reads the end of the FIFO and fails
    a.join(240)
    b.join(240)
    err = got.get("a")
    return {"a": type(err).__name__, "frames": _frames(err) if isinstance(err, BaseException) else [],
            "b": got.get("b") if isinstance(got.get("b"), str) else repr(got.get("b")), "stats": _stats()}


def _wrapped_manager():
    """kcache's cache manager wrapped by the program: each group lookup and
    store is counted, then handed on through a few layers of calls."""
    import kcache.triton

    def through(n, fn, *args):
        return fn(*args) if n == 0 else through(n - 1, fn, *args)

    class WrappedManager(kcache.triton.CacheManager):
        lookups = 0

        def get_group(self, filename):
            WrappedManager.lookups += 1
            return through(4, super().get_group, filename)

        def put_group(self, filename, group):
            return through(4, super().put_group, filename, group)

    return WrappedManager


def _stats():
    import kcache.triton
    return kcache.triton.cache().stats()


def main(argv):
    global kept
    cmd = argv[1]
    if cmd in ("fail", "fail-and-keep", "fail-ptxas", "fail-ptxas-keep", "fail-ptxas-env", "fail-ptxas-env-keep"):
        if cmd.startswith("fail-ptxas"):
            if not cmd.startswith("fail-ptxas-env"):
                import kcache.triton
                kcache.triton.install(remember_triton_key=False)
            src = triton_kernels.kernels()[0][1]
        else:
            src = _failing()
        t = time.time()
        try:
            triton.compile(src, target=triton_kernels.TARGET)
            print("RESULT " + json.dumps({"error": None}), flush=True)
            return 1
        except Exception as e:  # noqa: BLE001 - any compile error will do
            kept = e
        print("RESULT " + json.dumps({"ready": type(kept).__name__, "seconds": time.time() - t,
                                      "frames": _frames(kept)}), flush=True)
        if cmd.endswith("keep"):
            sys.stdin.read()  # held until the test closes stdin
        return 0
    if cmd == "fail-waited":
        print("RESULT " + json.dumps(_waited(argv[2])), flush=True)
        return 0
    if cmd == "options":
        name, src = triton_kernels.kernels()[0]
        k = triton.compile(src, target=triton_kernels.TARGET, options={"num_warps": int(argv[2])})
        print(json.dumps({"cubin": hashlib.sha256(k.asm["cubin"]).hexdigest()}))
        return 0
    if cmd == "wrapped-manager":
        manager = globals()["WrappedManager"] = _wrapped_manager()
        os.environ["TRITON_CACHE_MANAGER"] = "__main__:WrappedManager"
        name, src = triton_kernels.kernels()[0]
        k = triton.compile(src, target=triton_kernels.TARGET)
        print(json.dumps({"cubins": {name: hashlib.sha256(k.asm["cubin"]).hexdigest()}, "stats": _stats(),
                          "lookups": manager.lookups}))
        return 0
    if cmd in ("key", "key-env"):
        if cmd == "key":
            import kcache.triton
            kcache.triton.install()
        import triton.runtime.cache as rc
        fn = getattr(rc, "triton_key", None)
        if fn is None:
            import triton.compiler.compiler as cc
            fn = cc.triton_key
        value = fn()
        orig = getattr(fn, "_kcache_original", fn)
        own = getattr(orig, "__wrapped__", orig)()
        import kcache.triton
        print(json.dumps({"key": value, "own": own, "source": kcache.triton.triton_key_source(), "booted": BOOTED}))
        return 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))

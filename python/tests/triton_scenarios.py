"""Small programs the Triton tests run in their own processes (one command
each), printing one JSON line.

    python triton_scenarios.py fail-and-keep     compiles a kernel that fails
        (front end: a static assertion), keeps the exception in a global,
        prints {"ready": ...}, then sleeps until stdin closes
    python triton_scenarios.py fail              the same kernel, once
    python triton_scenarios.py fail-ptxas-keep   install(), then a kernel whose
        ptxas fails (PTXAS_FAIL=1 in the environment); kept as above
    python triton_scenarios.py fail-ptxas-env-keep   the same without install():
        the manager is imported by Triton inside this first compile
    python triton_scenarios.py options W         the add kernel with num_warps=W
    python triton_scenarios.py key               install(); triton_key() and
        where it came from, and Triton's own value computed afresh
    python triton_scenarios.py key-env           the same without install():
        only what TRITON_CACHE_MANAGER and the wheel's start-up hook do
"""

import hashlib
import json
import os
import sys
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
        print("RESULT " + json.dumps({"ready": type(kept).__name__, "seconds": time.time() - t}), flush=True)
        if cmd.endswith("keep"):
            sys.stdin.read()  # held until the test closes stdin
        return 0
    if cmd == "options":
        name, src = triton_kernels.kernels()[0]
        k = triton.compile(src, target=triton_kernels.TARGET, options={"num_warps": int(argv[2])})
        print(json.dumps({"cubin": hashlib.sha256(k.asm["cubin"]).hexdigest()}))
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

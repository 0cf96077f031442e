"""A process that builds and launches N small Warp modules on the CPU under
kcache.warp (or Warp's own kernel cache with HOST_CACHE=warp) and prints one
JSON line: results, Warp's CPU builds in this process and the kcache
statistics. Every build is appended to $COUNT_FILE first; with
$COMPILE_SLEEP it then sleeps that long. The kernel cache folder is
$WARP_KERNEL_CACHE.

With $WARP_BROKEN_HEADERS, Warp's compiler looks for Warp's headers in a
folder that does not exist, as in a broken install: every CPU build fails
at the C++ compile. A launch that raises ends the runs; the line then has
"error" (the exception's type and message), and with $HOLD_AFTER_ERROR the
process lives that many seconds more."""

import json
import os
import sys
import time

import warp as wp
import warp._src.build as wbuild

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
compiles = 0
_real = wbuild.build_cpu


def _counted(obj_path, *args, **kwargs):
    global compiles
    compiles += 1
    if os.environ.get("COUNT_FILE"):
        with open(os.environ["COUNT_FILE"], "a") as f:
            f.write(f"{os.getpid()}:{os.path.basename(obj_path)}\n")
    if os.environ.get("COMPILE_SLEEP"):
        time.sleep(float(os.environ["COMPILE_SLEEP"]))
    return _real(obj_path, *args, **kwargs)


wbuild.build_cpu = _counted
wp.config.kernel_cache_dir = os.environ["WARP_KERNEL_CACHE"]
wp.config.quiet = True
if os.environ.get("HOST_CACHE") != "warp":
    import kcache.warp
    kcache.warp.enable()
wp.init()
if os.environ.get("WARP_BROKEN_HEADERS"):
    wbuild.warp_home = os.path.join(os.environ["WARP_KERNEL_CACHE"], "no-warp-install")


# One module each (module="unique"), as a program with several Python
# modules of kernels has.
@wp.kernel(module="unique")
def scale(a: wp.array(dtype=float), s: float):
    i = wp.tid()
    a[i] = a[i] * s


@wp.kernel(module="unique")
def saxpy(x: wp.array(dtype=float), y: wp.array(dtype=float), s: float):
    i = wp.tid()
    y[i] = s * x[i] + y[i]


@wp.kernel(module="unique")
def square(a: wp.array(dtype=float)):
    i = wp.tid()
    a[i] = a[i] * a[i]


def run(k):
    a = wp.array([1.0, 2.0, 3.0, 4.0], dtype=float, device="cpu")
    b = wp.array([1.0, 1.0, 1.0, 1.0], dtype=float, device="cpu")
    if k == 0:
        wp.launch(scale, dim=4, inputs=[a, 2.0], device="cpu")
        return float(a.numpy().sum())
    if k == 1:
        wp.launch(saxpy, dim=4, inputs=[a, b, 3.0], device="cpu")
        return float(b.numpy().sum())
    wp.launch(square, dim=4, inputs=[a], device="cpu")
    return float(a.numpy().sum())


results = []
error = None
try:
    for k in range(N):
        results.append(run(k))
except Exception as e:
    error = f"{type(e).__module__}.{type(e).__qualname__}: {e}"

if os.environ.get("BENCH") and error is None:
    # Heavier modules for bench/python/hosts_bench.py.
    @wp.kernel(module="unique")
    def rotate(p: wp.array(dtype=wp.vec3), q: wp.quat, out: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        out[i] = wp.quat_rotate(q, p[i]) + wp.cross(p[i], wp.vec3(1.0, 0.0, 0.0))

    @wp.kernel(module="unique")
    def inertia(p: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.mat33)):
        i = wp.tid()
        v = p[i]
        m = wp.outer(v, v)
        out[i] = wp.inverse(m + wp.identity(n=3, dtype=float)) * wp.determinant(m + wp.identity(n=3, dtype=float))

    @wp.kernel(module="unique")
    def series(a: wp.array(dtype=float)):
        i = wp.tid()
        s = float(0.0)
        for k in range(16):
            s += wp.sin(float(k) * a[i]) / float(k + 1)
        a[i] = s

    pts = wp.array([wp.vec3(1.0, 2.0, 3.0)] * 4, dtype=wp.vec3, device="cpu")
    o3 = wp.zeros(4, dtype=wp.vec3, device="cpu")
    wp.launch(rotate, dim=4, inputs=[pts, wp.quat_identity(), o3], device="cpu")
    om = wp.zeros(4, dtype=wp.mat33, device="cpu")
    wp.launch(inertia, dim=4, inputs=[pts, om], device="cpu")
    fa = wp.array([0.5, 1.0, 1.5, 2.0], dtype=float, device="cpu")
    wp.launch(series, dim=4, inputs=[fa], device="cpu")
    results += [round(float(o3.numpy().sum()), 4), round(float(om.numpy().sum()), 3), round(float(fa.numpy().sum()), 4)]
out = {"results": results, "compiles": compiles, "pid": os.getpid()}
if error is not None:
    out["error"] = error
if os.environ.get("HOST_CACHE") != "warp":
    out["stats"] = kcache.warp.cache().stats()
print(json.dumps(out), flush=True)
if error is not None and os.environ.get("HOLD_AFTER_ERROR"):
    time.sleep(float(os.environ["HOLD_AFTER_ERROR"]))

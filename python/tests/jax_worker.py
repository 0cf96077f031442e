"""A process that jit-compiles N small JAX programs on the CPU under
kcache.jax (or JAX's own file cache with HOST_CACHE=jax and
JAX_CACHE_DIR), runs them and prints one JSON line: results, XLA compiles
in this process and the kcache statistics. Every XLA compile is appended to
$COUNT_FILE as `pid:module:asked:started:ended` when it ends (wall clock
times: when JAX asked for the program, when XLA began compiling it, when it
finished), and to $COUNT_FILE.started as `pid:module` when it begins; with
$COMPILE_SLEEP the compile of a program named jit_slow_* sleeps that long.
With $CALLBACK it also compiles and runs a program with a host callback
(jit_slow_printed); with $HOLD it then creates that file and stays alive.
$MIN_COMPILE_TIME: JAX's jax_persistent_cache_min_compile_time_secs (under
kcache, through enable()'s min_compile_time_secs); $LOCAL_TTL: how long
a "compile locally" mark holds (kcache._hostutil.LOCAL_TTL_S);
$JAX_COMPILATION_CACHE_DIR (read by JAX) names JAX's folder under kcache."""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src import compiler  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
compiles = 0
_real = compiler.backend_compile_and_load
_real_lookup = compiler.compile_or_get_cached
_asked = {}  # module name -> when JAX asked for it (compile_or_get_cached)


def _counted(backend, module, *args, **kwargs):
    global compiles
    compiles += 1
    name = str(module.operation.attributes["sym_name"]).strip('"')
    started = time.time()
    if os.environ.get("COUNT_FILE"):
        with open(os.environ["COUNT_FILE"] + ".started", "a") as f:
            f.write(f"{os.getpid()}:{name}\n")
    if os.environ.get("COMPILE_SLEEP") and "slow" in name:
        time.sleep(float(os.environ["COMPILE_SLEEP"]))
    try:
        return _real(backend, module, *args, **kwargs)
    finally:
        if os.environ.get("COUNT_FILE"):
            with open(os.environ["COUNT_FILE"], "a") as f:
                f.write(f"{os.getpid()}:{name}:{_asked.get(name, started):.3f}:{started:.3f}:{time.time():.3f}\n")


def _lookup(backend, module, *args, **kwargs):
    _asked[str(module.operation.attributes["sym_name"]).strip('"')] = time.time()
    return _real_lookup(backend, module, *args, **kwargs)


compiler.backend_compile_and_load = _counted
compiler.compile_or_get_cached = _lookup

if os.environ.get("HOST_CACHE") == "jax":
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ.get("MIN_COMPILE_TIME", "0")))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
else:
    import kcache._hostutil
    import kcache.jax
    if os.environ.get("LOCAL_TTL"):
        kcache._hostutil.LOCAL_TTL_S = float(os.environ["LOCAL_TTL"])
    kcache.jax.enable(min_compile_time_secs=float(os.environ.get("MIN_COMPILE_TIME", "0")))


@jax.jit
def slow_poly(x):
    return x * x * 3.0 + 2.0 * x + 1.0


@jax.jit
def matvec(a, x):
    return jnp.tanh(a @ x)


@jax.jit
def softmax_sum(x):
    e = jnp.exp(x - jnp.max(x))
    return jnp.sum(e / jnp.sum(e))


x = jnp.ones((4,), dtype=jnp.float32)  # a device buffer: no helper programs
a = jnp.ones((4, 4), dtype=jnp.float32)
calls = [lambda: float(jnp.sum(slow_poly(x))), lambda: float(jnp.sum(matvec(a, x))),
         lambda: float(softmax_sum(x))]
results = [round(c(), 4) for c in calls[:N]]

if os.environ.get("BENCH"):
    # Heavier programs for bench/python/hosts_bench.py.
    def mlp(params, v):
        for w, b in params:
            v = jnp.tanh(v @ w + b)
        return jnp.sum(v)

    params = [(jnp.ones((4, 4), dtype=jnp.float32) * 0.1, jnp.zeros((4,), dtype=jnp.float32))] * 3
    grad_mlp = jax.jit(jax.grad(mlp))
    scan = jax.jit(lambda v: jax.lax.scan(lambda c, e: (c * 0.9 + e, c), 0.0, v)[0])
    fft = jax.jit(lambda v: jnp.sum(jnp.abs(jnp.fft.fft(v))))
    solve = jax.jit(lambda m, v: jnp.linalg.solve(m, v))
    conv = jax.jit(lambda v: jnp.convolve(v, v))
    results += [round(float(jnp.sum(grad_mlp(params, x)[0][0])), 4), round(float(scan(x)), 4),
                round(float(fft(x)), 4), round(float(jnp.sum(solve(a + 3 * jnp.eye(4), x))), 4),
                round(float(jnp.sum(conv(x))), 4)]

if os.environ.get("CALLBACK"):
    # A program with a host callback: JAX never stores it.
    @jax.jit
    def slow_printed(x):
        jax.debug.print("x={}", x)
        return x + 1.0

    results.append(float(jnp.sum(slow_printed(x))))
    if os.environ.get("HOLD"):  # stay alive after the compile
        open(os.environ["HOLD"], "w").close()
        time.sleep(120)
out = {"results": results, "compiles": compiles, "pid": os.getpid()}
if os.environ.get("HOST_CACHE") != "jax":
    out["stats"] = kcache.jax.cache().stats()
print(json.dumps(out))

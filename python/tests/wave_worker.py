"""A process that compiles small Wave kernels for gfx942 on the CPU (no GPU:
compile only, run and bench off) under kcache.wave, or Wave's own cache with
HOST_CACHE=wave (its folder: $WAVE_CACHE_DIR), and prints one JSON line:
the kernels Wave compiled in this process (compiles: its
_trace_and_get_kernel_signature runs, each also appended as a pid to
$COUNT_FILE), and for each kernel the digest and size of its vmfb, whether
its MLIR adds or multiplies, and its launch grid for two sizes.

$KERNELS: a comma-separated list of `add` (an elementwise kernel calling
the module-level helper `combine`), `gemm` (Wave's GEMM template) and
`lambda` (the elementwise kernel with a WorkgroupConstraint whose apply_fn
is a lambda, as Wave's decode-attention templates have); default add,gemm.
$HELPER=mul: `combine` multiplies instead of adding (an edited helper).
$OPTION=name=value: a WaveCompileOptions field (True/False or an int).
$PLANT_GRID=path: Wave's grid text becomes code that creates `path` when
evaluated (what a tampered cache entry would hold). $FAIL_FIRST=path: the
first compile raises; the process then creates `path`, sleeps $HOLD seconds
(default 60) and compiles again. $FAKE_VERSION=dist=version: the
installed distribution `dist` reports `version` (an upgrade). $READY=path,
$GO=path, $THEN_KERNELS: after $KERNELS the process creates READY, waits
for GO to exist and then compiles THEN_KERNELS (a long-running process).
$DROP_ARTIFACT=name: after compiling, each kcache entry is stored again
without that artifact (a damaged entry). $HSACO_NOISE: what another thread
compiling in the same process does to Wave's temporary binaries folder,
which every compile in a process shares, between this compile's writing its
HSACO there and its storing: `N` (a number) writes N HSACO files of other
kernels there, `drop` empties it. With OPTION=wave_runtime=True a
kernel whose compile ends in loading HIP (absent here) reports the HSACO
files under $WAVE_CACHE_DIR/kcache-binaries."""

import glob
import hashlib
import importlib
import json
import math
import os
import sys
import time

t0 = time.time()
if os.environ.get("FAKE_VERSION"):
    import importlib.metadata as _md

    _fake_dist, _fake_version = os.environ["FAKE_VERSION"].split("=", 1)
    _real_version = _md.version
    _md.version = lambda name: _fake_version if name == _fake_dist else _real_version(name)

import wave_lang.kernel.lang as tkl  # noqa: E402
import wave_lang.kernel.wave as tkw  # noqa: E402
from wave_lang.kernel.lang.global_symbols import GLOBAL_ADDRESS_SPACE  # noqa: E402


_wave_mod = importlib.import_module("wave_lang.kernel.wave.wave")
from wave_lang.kernel.wave.compile import WaveCompileOptions, wave_compile  # noqa: E402
from wave_lang.kernel.wave.constraints import MMAType  # noqa: E402
from wave_lang.kernel.wave.templates.gemm import get_gemm_kernel  # noqa: E402
from wave_lang.kernel.wave.utils.general_utils import get_default_scheduling_params  # noqa: E402

if os.environ.get("HOST_CACHE") != "wave":
    import kcache.wave

    kcache.wave.enable()

compiles = 0
_real_trace = _wave_mod.LaunchableWave._trace_and_get_kernel_signature


def _counted_trace(*args, **kwargs):
    global compiles
    compiles += 1
    if os.environ.get("FAIL_FIRST") and compiles == 1:
        raise RuntimeError("a compile that raises")
    if os.environ.get("COUNT_FILE"):
        with open(os.environ["COUNT_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
    return _real_trace(*args, **kwargs)


_wave_mod.LaunchableWave._trace_and_get_kernel_signature = _counted_trace

if os.environ.get("PLANT_GRID"):
    _marker = os.environ["PLANT_GRID"]

    def _planted(args, expr):
        return f"(__import__('pathlib').Path({_marker!r}).touch(), lambda _0: [1, 1, 1])[1]"

    _wave_mod.lambdastr = _planted

if os.environ.get("HSACO_NOISE"):
    from wave_lang.kernel.wave import cache as _wcache
    from wave_lang.kernel.wave import compile as _wcompile

    _real_to_vmfb = _wcompile.compile_to_vmfb

    def _noisy_to_vmfb(*args, **kwargs):
        vmfb = _real_to_vmfb(*args, **kwargs)
        folder = _wcache.get_temp_binary_dir()
        if os.environ["HSACO_NOISE"] == "drop":
            for p in glob.glob(str(folder / "*.hsaco")):
                os.unlink(p)
        else:
            for i in range(int(os.environ["HSACO_NOISE"])):
                with open(folder / f"module_other{i}_rocm_hsaco_fb.hsaco", "wb") as f:
                    f.write(b"\x7fELF another kernel %d" % i)
        return vmfb

    _wcompile.compile_to_vmfb = _noisy_to_vmfb

M = tkl.sym.M
N = tkl.sym.N
BLOCK_M = tkl.sym.BLOCK_M
BLOCK_N = tkl.sym.BLOCK_N
ADDRESS_SPACE = tkl.sym.ADDRESS_SPACE

if os.environ.get("HELPER") == "mul":
    def combine(x, y):
        return x * y
else:
    def combine(x, y):
        return x + y


def _elementwise(first):
    constraints = [first, tkw.WorkgroupConstraint(N, BLOCK_N, 1), tkw.WaveConstraint(M, BLOCK_M),
                   tkw.WaveConstraint(N, BLOCK_N),
                   tkw.HardwareConstraint(threads_per_wave=64, vector_shapes={M: 1, N: BLOCK_N})]

    @tkw.wave(constraints)
    def add(a: tkl.Memory[M, N, ADDRESS_SPACE, tkl.f16], b: tkl.Memory[M, N, ADDRESS_SPACE, tkl.f16],
            c: tkl.Memory[M, N, GLOBAL_ADDRESS_SPACE, tkl.f16]):
        x = tkw.read(a)
        y = tkw.read(b)
        tkw.write(combine(x, y), c)

    subs = {M: 256, N: 128, BLOCK_M: 1, BLOCK_N: 64, ADDRESS_SPACE: GLOBAL_ADDRESS_SPACE}
    return add, subs, []


def kernel(name):
    if name == "add":
        return _elementwise(tkw.WorkgroupConstraint(M, BLOCK_M, 0))
    if name == "lambda":
        return _elementwise(tkw.WorkgroupConstraint(M, BLOCK_M, 0, apply_fn=lambda wg: wg * BLOCK_M))
    if name == "gemm":
        k, subs, dyn = get_gemm_kernel((256, 256, 128), (True, False, False), MMAType.F32_16x16x16_F16)
        subs.update(get_default_scheduling_params())
        return k, subs, dyn
    raise ValueError(name)


def _option(opts):
    if os.environ.get("OPTION"):
        name, value = os.environ["OPTION"].split("=", 1)
        setattr(opts, name, value == "True" if value in ("True", "False") else int(value))


def compile_kernel(name):
    k, subs, dyn = kernel(name)
    opts = WaveCompileOptions(subs=subs, canonicalize=True, run_bench=False, target="gfx942",
                              dynamic_symbols=dyn)
    _option(opts)
    try:
        compiled = wave_compile(opts, k)
    except RuntimeError:
        if not os.environ.get("FAIL_FIRST") or compiles != 1:
            raise
        with open(os.environ["FAIL_FIRST"], "w"):
            pass
        time.sleep(float(os.environ.get("HOLD", "60")))
        compiled = wave_compile(opts, k)
    vmfb = bytes(compiled.executable)
    grid = compiled.options.kernel_launch_info.grid
    # As Wave's runtime calls it (wave_lang.kernel.wave.utils.run_utils).
    grid.__globals__.setdefault("math", math)
    return {"vmfb": hashlib.sha256(vmfb).hexdigest()[:16], "vmfb_size": len(vmfb),
            "mulf": "arith.mulf" in compiled.asm, "addf": "arith.addf" in compiled.asm,
            "grid": [[int(x) for x in grid([d] * len(dyn) if dyn else [])] for d in (256, 1000)]}


def compile_or_report(name):
    try:
        return compile_kernel(name)
    except RuntimeError as e:
        # With wave_runtime the compile ends in loading HIP, which a machine
        # without an AMD GPU does not have: the kernel was compiled (and
        # stored) by then; report its HSACO files instead.
        if "libamdhip64" not in str(e):
            raise
        hsaco = {}
        for p in glob.glob(os.path.join(os.environ["WAVE_CACHE_DIR"], "kcache-binaries", "*", "*.hsaco")):
            with open(p, "rb") as f:
                hsaco[os.path.basename(p)] = hashlib.sha256(f.read()).hexdigest()[:16]
        return {"hip": "missing", "hsaco": hsaco}


res = {"kernels": {}}
for name in os.environ.get("KERNELS", "add,gemm").split(","):
    res["kernels"][name] = compile_or_report(name)
if os.environ.get("THEN_KERNELS"):
    with open(os.environ["READY"], "w"):
        pass
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.05)
    before = compiles
    for name in os.environ["THEN_KERNELS"].split(","):
        res["kernels"][name] = compile_kernel(name)
    res["compiles_then"] = compiles - before
if os.environ.get("DROP_ARTIFACT"):
    import kcache.wave

    for key, _label in list(kcache.wave._get_cache_manager()._keys.values()):
        entry = kcache.wave.cache().get(key)
        kept = {n: bytes(entry[n]) for n in entry.keys() if n != os.environ["DROP_ARTIFACT"]}
        kcache.wave.cache().put(key, kept)
res["compiles"] = compiles
res["seconds"] = round(time.time() - t0, 3)
if "kcache.wave" in sys.modules:
    import kcache.wave

    res["enabled"] = kcache.wave.enabled()
    res["stats"] = kcache.wave.cache().stats()
print(json.dumps(res))

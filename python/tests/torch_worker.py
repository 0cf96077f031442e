"""A process that torch.compile's two small programs on the CPU (an MLP in
inference and an elementwise function: two FX graphs) under kcache.torch,
or Inductor's own caches with HOST_CACHE=inductor, runs them and prints one
JSON line: whether each result equals eager's, the FX graphs Inductor
compiled (fx_compiles: its fx_codegen_and_compile runs), Inductor's FX graph
cache counters in this process (fxgraph_cache_miss, fxgraph_cache_hit: graphs
loaded), AOTAutograd's cache hits, the C++ compiler runs, and the kcache
statistics. $PROGRAMS: how many of the two to compile (default 2).
$INDUCTOR_OPTION=name=value sets a torch._inductor.config option (a bool or
an int). With $COMPILE_SLEEP each FX graph compile sleeps that long after
appending `pid` to $COUNT_FILE.started. $KCACHE_TORCH_ENV=1: enable through
the environment (KCACHE_TORCH=1 and the start-up hook) instead of
enable()."""

import json
import os
import sys
import time

t0 = time.time()
import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor import compile_fx, config, cpp_builder  # noqa: E402

if os.environ.get("HOST_CACHE") != "inductor" and not os.environ.get("KCACHE_TORCH"):
    import kcache.torch

    kcache.torch.enable()

if os.environ.get("INDUCTOR_OPTION"):
    name, value = os.environ["INDUCTOR_OPTION"].split("=", 1)
    setattr(config, name, value == "True" if value in ("True", "False") else int(value))

_real_compile = compile_fx.fx_codegen_and_compile


fx_compiles = 0


def _slow_compile(*args, **kwargs):
    global fx_compiles
    fx_compiles += 1
    if os.environ.get("COUNT_FILE"):
        with open(os.environ["COUNT_FILE"] + ".started", "a") as f:
            f.write(f"{os.getpid()}\n")
    if os.environ.get("COMPILE_SLEEP"):
        time.sleep(float(os.environ["COMPILE_SLEEP"]))
    return _real_compile(*args, **kwargs)


compile_fx.fx_codegen_and_compile = _slow_compile

cxx_runs = 0
_real_run = cpp_builder.run_compile_cmd


def _counted_run(*args, **kwargs):
    global cxx_runs
    cxx_runs += 1
    return _real_run(*args, **kwargs)


cpp_builder.run_compile_cmd = _counted_run

torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def elementwise(x, y):
    return torch.sin(x) * y + torch.cos(y) * 2.0


x = torch.randn(8, 16)
a, b = torch.randn(256), torch.randn(256)
programs = int(os.environ.get("PROGRAMS", "2"))
equal = []
with torch.no_grad():
    out = torch.compile(elementwise)(a, b)
    equal.append(bool(torch.allclose(out, elementwise(a, b), atol=1e-6)))
    if programs > 1:
        out = torch.compile(mlp)(x)
        equal.append(bool(torch.allclose(out, mlp(x), atol=1e-5)))

res = {"equal": equal, "fx_compiles": fx_compiles, "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
       "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
       "fx_bypass": counters["inductor"]["fxgraph_cache_bypass"], "cxx_runs": cxx_runs,
       "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
       "seconds": round(time.time() - t0, 3)}
if "kcache.torch" in sys.modules:
    import kcache.torch

    res["enabled"] = kcache.torch.enabled()
    res["stats"] = kcache.torch.cache().stats()
print(json.dumps(res))

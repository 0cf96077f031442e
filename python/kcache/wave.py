"""kcache.wave: Wave's kernel cache (wave-lang) in kcache.

    import kcache.wave
    kcache.wave.enable()           # before the first wave_compile

Every kernel `wave_compile` compiles becomes one kcache entry holding what
Wave's own cache keeps: the vmfb (IREE's module), the MLIR text, the kernel's
buffer usages and launch information (as JSON data), and the HSACO binary
when the Wave runtime is used.

The key is computed by kcache, not by Wave's `get_hash`:

* every field of the WaveCompileOptions object (read with
  dataclasses.fields, so an option added to Wave is keyed without a change
  here), each a component of its own (`option[linearize_shared_access]`),
  except the fields wave_compile writes as results (`kernel_hash`,
  `kernel_usages`, `kernel_launch_info`);
* the constraints (every attribute of each, by value; a lambda such as
  WorkgroupConstraint's `apply_fn` by its code and captured values, never
  by its address; the induction variables and wave ids Wave fills in
  anonymised as Wave does);
* the kernel function and every function it calls, transitively, wherever
  it is defined: its bytecode, constants, defaults, annotations (the
  buffer types: shapes, dtypes, address spaces), the values it captures
  and the module-level values it names (by value; through a module of the
  program, the attributes the code names; a function of
  wave_lang, torch, sympy or IREE by its name, the package version covering
  it);
* the wave-lang, IREE compiler (iree-base-compiler) and torch versions, the
  Python version and the target.

A value that cannot be keyed by value (an object whose only text is its
address) makes the kernel uncached: it is compiled as without a cache,
with one log line.

A kernel that N processes miss at once is compiled once: the first process
owns the key's flight and compiles; the others wait and load its entry. A
compile that raises abandons the flight (a waiting process takes it over);
one that ends without storing (a debug-op kernel) leaves a "compile
locally" mark (kcache._hostutil). The entry is written in one step and
verified (checksummed) before use. Nothing in it is executed as code:
Wave's own cache rebuilds the launch grid with eval() of a stored string;
here the grid is stored as a JSON expression tree (numbers, arguments,
arithmetic, floor, ceiling, min, max, mod), checked when stored and
evaluated by a small interpreter. The HSACO a Wave-runtime kernel loads by
path is written to <base_dir>/<key>/<key>.hsaco (under a temporary name,
then renamed). It is taken from Wave's temporary binaries folder, which
every compile in the process shares, only when its bytes are the ones the
compile's vmfb embeds (a file another thread's compile wrote there is never
stored under this kernel's key); a Wave-runtime kernel without its HSACO
is not stored, and an entry without one is a miss. The size limit, verification, statistics, KCACHE_REMOTE
(values signed with KCACHE_REMOTE_SECRET_FILE) and every other KCACHE_*
variable are kcache's. The folder is $KCACHE_DIR, else
<Wave's cache folder ($WAVE_CACHE_DIR, else ~/.wave)>/kcache.

Plugged in by replacing Wave's cache manager (what
wave_lang.kernel.wave.cache.get_cache_manager returns, which wave_compile
asks for get_hash, load_kernel, store_kernel and base_dir), and the
IndexingContext wave_compile enters, whose exit ends the flights a compile
did not store. WAVE_CACHE_ON=0 and WAVE_ALWAYS_COMPILE=1 keep their
meaning. A cache fault is a miss and one log line; it never fails a compile.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import glob
import hashlib
import importlib.metadata
import json
import math
import os
import sys
import threading
import types
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import kcache

try:
    import sympy
    import torch
    from wave_lang.kernel._support import indexing as _indexing
    from wave_lang.kernel.compiler.kernel_codegen import KernelBufferUsage
    from wave_lang.kernel.wave import cache as _wcache
    from wave_lang.kernel.wave import compile as _wcompile
    from wave_lang.kernel.wave.utils.classes import KernelLaunchInfo
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("kcache.wave needs Wave (wave-lang 3.9), which is not installed here "
                      f"({_e}): pip install 'kcache-jit[wave]'") from _e


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


WAVE_VERSION = _dist_version("wave-lang")
if not WAVE_VERSION.startswith("3.9."):
    raise ImportError(f"kcache.wave supports wave-lang 3.9; this is wave-lang {WAVE_VERSION or 'unknown'}")

from ._hostutil import Flights, ProcessCache, dist_build, log, write_file  # noqa: E402

__all__ = ["KcacheWaveCacheManager", "cache", "disable", "enable", "enabled"]

_NAMESPACE = "wave/1"
# Fields of WaveCompileOptions that wave_compile writes as its results.
_RESULT_FIELDS = frozenset(("kernel_hash", "kernel_usages", "kernel_launch_info"))
# Packages whose functions are keyed by name (their version is in the key).
_LIBRARIES = ("wave_lang", "torch", "sympy", "iree", "numpy", "math", "builtins", "typing", "functools",
              "operator", "itertools", "collections", "dataclasses", "enum")


def _default_dir() -> Optional[str]:
    return os.path.join(str(_wcache.get_cache_base_dir()), "kcache")


cache = ProcessCache("wave", _default_dir)
cache.__doc__ = "The process's kcache for Wave (opened on first use, and again after fork)."
_flights = Flights()
_enabled = False
_originals: Dict[str, Any] = {}
_manager: Optional["KcacheWaveCacheManager"] = None
_manager_lock = threading.Lock()


class _Unkeyable(Exception):
    pass


# ---------------------------------------------------------------------------
# Keys: values by value, functions by code, transitively.


def _is_library(module: Optional[str]) -> bool:
    return bool(module) and module.split(".")[0] in _LIBRARIES


class _Keyer:
    """Canonical text of the values a kernel's code depends on."""

    def __init__(self) -> None:
        self._fns: Dict[int, str] = {}
        self._active: set = set()

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return [type(v).__name__, v]
        if isinstance(v, float):
            return ["float", v.hex()]
        if isinstance(v, (bytes, bytearray)):
            return ["bytes", bytes(v).hex()]
        if isinstance(v, enum.Enum):
            return ["enum", f"{type(v).__module__}.{type(v).__qualname__}", v.name]
        if isinstance(v, sympy.Basic):
            return ["sympy", sympy.srepr(v)]
        if isinstance(v, torch.dtype):
            return ["dtype", str(v)]
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return ["tensor", str(t.dtype), list(t.shape), hashlib.sha256(data).hexdigest()]
        if type(v).__module__ == "numpy" and hasattr(v, "tobytes") and hasattr(v, "dtype"):
            return ["ndarray", str(v.dtype), list(getattr(v, "shape", ())), hashlib.sha256(v.tobytes()).hexdigest()]
        if isinstance(v, types.FunctionType):
            return ["fn", self.function(v)]
        if isinstance(v, (types.BuiltinFunctionType, types.MethodType)) and _is_library(getattr(v, "__module__",
                                                                                                 None) or "builtins"):
            return ["builtin", f"{getattr(v, '__module__', None)}.{getattr(v, '__qualname__', repr(v))}"]
        if isinstance(v, types.ModuleType):
            return ["module", v.__name__]
        if isinstance(v, type):
            return self.cls(v)
        if isinstance(v, types.CodeType):
            return ["code", self.code(v)]
        oid = id(v)
        if oid in self._active:
            return ["cycle", type(v).__qualname__]
        self._active.add(oid)
        try:
            if isinstance(v, (list, tuple)):
                return [type(v).__name__, [self.value(x) for x in v]]
            if isinstance(v, dict):
                items = [(json.dumps(self.value(k), sort_keys=True), self.value(x)) for k, x in v.items()]
                return ["dict", sorted(items, key=lambda kv: kv[0])]
            if isinstance(v, (set, frozenset)):
                return ["set", sorted(json.dumps(self.value(x), sort_keys=True) for x in v)]
            if isinstance(v, functools_partial):
                return ["partial", self.value(v.func), self.value(v.args), self.value(v.keywords)]
            state = _state_of(v)
            if state is not None:
                return ["obj", self.cls(type(v)), self.value(state)]
            r = repr(v)
            if " at 0x" in r or " object at " in r:
                raise _Unkeyable(f"a {type(v).__qualname__} keyed only by its address")
            if "..." in r:
                raise _Unkeyable(f"a {type(v).__qualname__} whose text is a summary")
            return ["repr", f"{type(v).__module__}.{type(v).__qualname__}", r]
        finally:
            self._active.discard(oid)

    def cls(self, c: type) -> Any:
        name = f"{c.__module__}.{c.__qualname__}"
        mod = sys.modules.get(c.__module__)
        found = mod
        for part in c.__qualname__.split("."):
            found = getattr(found, part, None)
        if found is c and _is_library(c.__module__):
            return ["type", name]
        # A class made at run time (tkl.Memory[M, N, ...]) or of the
        # program: its own attributes by value.
        attrs = {k: x for k, x in vars(c).items()
                 if not (k.startswith("__") and k.endswith("__")) and not isinstance(x, (property, staticmethod,
                                                                                        classmethod))}
        return ["type", name, self.value(attrs), [self.cls(b) for b in c.__bases__ if b is not object]]

    def module_attrs(self, values: List[Any], names: set, depth: int = 0) -> List[Any]:
        out: List[Any] = []
        for m in values:
            if not isinstance(m, types.ModuleType) or _is_library(m.__name__) or depth > 4:
                continue
            attrs = [n for n in sorted(names) if n in vars(m)]
            out += [[f"{m.__name__}.{n}", self.value(vars(m)[n])] for n in attrs]
            out += self.module_attrs([vars(m)[n] for n in attrs], names, depth + 1)
        return out

    def code(self, co: types.CodeType) -> Any:
        consts = [self.code(c) if isinstance(c, types.CodeType) else self.value(c) for c in co.co_consts]
        return [co.co_code.hex(), consts, list(co.co_names), list(co.co_varnames), list(co.co_freevars),
                co.co_argcount, co.co_kwonlyargcount, co.co_flags]

    def function(self, f: types.FunctionType) -> str:
        """A digest of `f`: its code, defaults, annotations, captured
        values and the module-level values it names, transitively."""
        if _is_library(f.__module__):
            return f"{f.__module__}.{f.__qualname__}"
        fid = id(f)
        if fid in self._fns:
            return self._fns[fid]
        self._fns[fid] = f"recursive:{f.__module__}.{f.__qualname__}"
        inner = getattr(f, "__wrapped__", None)
        closure = []
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            try:
                closure.append([name, self.value(cell.cell_contents)])
            except ValueError:  # an empty cell
                closure.append([name, "empty"])
        names = sorted(_global_names(f.__code__))
        g = f.__globals__
        globs = [[n, self.value(g[n])] for n in names if n in g]
        # A function called through a module of the program
        # (`helpers.combine(x, y)`): the module's attributes the code names.
        globs += self.module_attrs([g[n] for n in names if n in g], set(names))
        text = json.dumps([f.__qualname__, self.code(f.__code__), self.value(f.__defaults__),
                           self.value(f.__kwdefaults__), self.value(dict(getattr(f, "__annotations__", {}) or {})),
                           closure, globs, self.value(inner) if inner is not None else None], sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()
        self._fns[fid] = digest
        return digest


try:
    from functools import partial as functools_partial
except ImportError:  # pragma: no cover
    functools_partial = ()


def _state_of(v: Any) -> Optional[Dict[str, Any]]:
    d = getattr(v, "__dict__", None)
    state: Dict[str, Any] = dict(d) if isinstance(d, dict) else {}
    for klass in type(v).__mro__:
        for s in getattr(klass, "__slots__", ()) or ():
            if isinstance(s, str) and s not in ("__dict__", "__weakref__") and hasattr(v, s):
                state[s] = getattr(v, s)
    if not state and not isinstance(d, dict) and not dataclasses.is_dataclass(v):
        return None
    return state


def _global_names(co: types.CodeType) -> set:
    names = set(co.co_names)
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _iree_compiler_version() -> str:
    v = _dist_version("iree-base-compiler")
    if v:
        return v
    try:
        from iree.compiler import version as _v

        return str(getattr(_v, "VERSION", ""))
    except Exception:
        return ""


_VERSIONS = {"wave": WAVE_VERSION, "iree_compiler": _iree_compiler_version(), "torch": str(torch.__version__),
             "python": "%d.%d" % sys.version_info[:2]}


def _versions() -> Dict[str, str]:
    """The versions, and what identifies each build beyond its version
    (_hostutil.dist_build: found at the first key, then remembered)."""
    import wave_lang

    try:
        import iree.compiler as iree_compiler
    except ImportError:  # pragma: no cover - wave-lang requires it
        iree_compiler = None
    return dict(_VERSIONS, wave_build=dist_build("wave-lang", wave_lang),
                iree_compiler_build=dist_build("iree-base-compiler", iree_compiler),
                torch_build=dist_build("torch", torch))


def _component(v: Any) -> str:
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 64 else "#" + hashlib.sha256(text.encode()).hexdigest()[:32]


def kernel_key(constraints: List[Any], kernel_fn: Callable, options: Any) -> kcache.Key:
    """The kcache key of compiling `kernel_fn` under `constraints` with
    `options` (raises _Unkeyable when a value has no text but its address)."""
    k = _Keyer()
    comps: Dict[str, Any] = {}
    for f in dataclasses.fields(options):
        if f.name not in _RESULT_FIELDS:
            comps[f"option[{f.name}]"] = _component(k.value(getattr(options, f.name)))
    anon = _wcache.anonymize_constraints(constraints)
    comps["constraints"] = [_component(k.value(c)) for c in anon]
    comps["kernel"] = k.function(kernel_fn)
    comps["target"] = str(getattr(options, "target", ""))
    comps.update(_versions())
    label = f"{getattr(kernel_fn, '__qualname__', 'kernel')} ({comps['target']})"
    return kcache.key(_NAMESPACE, label=label, **comps)


# ---------------------------------------------------------------------------
# The launch grid as data: lambdastr's text parsed into a JSON tree once,
# evaluated by an interpreter (never eval()).

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}
_CALLS = {"ceiling": "ceil", "math.ceil": "ceil", "floor": "floor", "math.floor": "floor", "Max": "max",
          "max": "max", "Min": "min", "min": "min", "Mod": "mod", "int": "int", "Abs": "abs", "abs": "abs"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise ValueError(f"unsupported callee {ast.dump(node)}")


def grid_tree(grid_str: str) -> Any:
    """Wave's grid text (sympy's lambdastr of the grid) as a JSON tree;
    ValueError for anything but numbers, arguments, arithmetic and the
    functions in _CALLS."""

    def conv(n: ast.AST) -> Any:
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return ["num", n.value]
        if isinstance(n, ast.Name):
            return ["arg", n.id]
        if isinstance(n, (ast.Tuple, ast.List)):
            return ["tuple", [conv(e) for e in n.elts]]
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return ["bin", _BINOPS[type(n.op)], conv(n.left), conv(n.right)]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            return ["neg" if isinstance(n.op, ast.USub) else "pos", conv(n.operand)]
        if isinstance(n, ast.Subscript):
            return ["index", conv(n.value), conv(n.slice)]
        if isinstance(n, ast.Lambda):
            a = n.args
            if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs:
                raise ValueError("unsupported lambda arguments")
            return ["lambda", [x.arg for x in a.args], conv(n.body)]
        if isinstance(n, ast.Call) and not n.keywords:
            if isinstance(n.func, ast.Lambda):
                return ["apply", conv(n.func), [conv(x) for x in n.args]]
            name = _dotted(n.func)
            if name not in _CALLS:
                raise ValueError(f"unsupported function {name}")
            return ["call", _CALLS[name], [conv(x) for x in n.args]]
        raise ValueError(f"unsupported expression {type(n).__name__}")

    tree = conv(ast.parse(grid_str, mode="eval").body)
    if tree[0] != "lambda" or len(tree[1]) != 1:
        raise ValueError("the grid is not a function of one argument")
    return tree


def _num(x: Any) -> Any:
    if isinstance(x, Fraction) and x.denominator == 1:
        return int(x)
    return x


_FUNCS: Dict[str, Callable[..., Any]] = {
    "ceil": lambda x: math.ceil(x), "floor": lambda x: math.floor(x), "max": max, "min": min,
    "mod": lambda a, b: a % b, "int": lambda x: int(x), "abs": abs}


def _eval(t: Any, env: Dict[str, Any]) -> Any:
    op = t[0]
    if op == "num":
        v = t[1]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("not a number")
        return Fraction(v) if isinstance(v, int) else v
    if op == "arg":
        if t[1] not in env:
            raise ValueError(f"unknown name {t[1]}")
        return env[t[1]]
    if op == "tuple":
        return tuple(_eval(e, env) for e in t[1])
    if op == "bin":
        a, b = _eval(t[2], env), _eval(t[3], env)
        o = t[1]
        if o == "+":
            return a + b
        if o == "-":
            return a - b
        if o == "*":
            return a * b
        if o == "/":
            return Fraction(a) / Fraction(b) if not isinstance(a, float) and not isinstance(b, float) else a / b
        if o == "//":
            return a // b
        if o == "%":
            return a % b
        if o == "**":
            return a ** b
        raise ValueError(f"unknown operator {o}")
    if op == "neg":
        return -_eval(t[1], env)
    if op == "pos":
        return _eval(t[1], env)
    if op == "index":
        seq, i = _eval(t[1], env), _eval(t[2], env)
        return seq[int(i)]
    if op == "lambda":
        params, body = t[1], t[2]
        return lambda *args: _eval(body, dict(env, **dict(zip(params, args))))
    if op == "apply":
        fn = _eval(t[1], env)
        return fn(*[_eval(a, env) for a in t[2]])
    if op == "call":
        f = _FUNCS.get(t[1])
        if f is None:
            raise ValueError(f"unknown function {t[1]}")
        return f(*[_eval(a, env) for a in t[2]])
    raise ValueError(f"unknown node {op}")


def grid_function(tree: Any) -> Callable[[Any], Tuple[Any, ...]]:
    """The grid function Wave's runtime calls (with the list of its dynamic
    dimensions), from grid_tree()'s tree."""
    if not (isinstance(tree, list) and tree and tree[0] == "lambda" and len(tree[1]) == 1):
        raise ValueError("the grid is not a function of one argument")
    param, body = tree[1][0], tree[2]

    def grid(dims):
        dims = [Fraction(d) if isinstance(d, int) else d for d in dims]
        out = _eval(body, {param: dims})
        if isinstance(out, tuple):
            return [_num(x) for x in out]
        return _num(out)

    return grid


# ---------------------------------------------------------------------------
# The cache manager wave_compile asks.


def _launch_info_json(info: Any) -> Dict[str, Any]:
    return {"blocks": [int(x) for x in (info.blocks or [])],
            "cluster_dims": [int(x) for x in (info.cluster_dims or [])],
            "shared_memory_bytes": int(info.shared_memory_bytes or 0), "func_name": str(info.func_name or ""),
            "grid_str": str(info.grid_str or ""), "grid": grid_tree(info.grid_str)}


class _NoHsaco(OSError):
    pass


def _hsaco_of(vmfb: Optional[bytes], options) -> Optional[bytes]:
    """The HSACO this compile wrote into Wave's temporary binaries folder.
    The folder is one per process, shared by every thread's compile (Wave
    empties it before each and takes the first file it lists), so a file is
    taken only when the compile's own vmfb embeds its bytes (IREE keeps the
    executable verbatim). The asm backend makes no vmfb; its HSACO is the
    file Wave names after the kernel's function."""
    d = _wcache.get_temp_binary_dir()
    if vmfb is None:
        paths = [str(d / f"{options.func_name}.hsaco")]
        body = None
    else:
        paths = sorted(glob.glob(str(d / "*.hsaco")))
        body = bytes(vmfb)
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if data and (body is None or data in body):
            return data
    return None


class KcacheWaveCacheManager:
    """What wave_compile asks for its cache (get_hash, load_kernel,
    store_kernel, base_dir), backed by kcache."""

    def __init__(self) -> None:
        self.base_dir = Path(_wcache.get_cache_base_dir()) / "kcache-binaries"
        self._lock = threading.Lock()
        self._keys: Dict[str, Tuple[Optional[kcache.Key], str]] = {}
        # The keys of Wave-runtime kernels: loaded by path, their entries
        # are only usable with the HSACO.
        self._needs_hsaco: set = set()
        self.cache_hits = 0
        self.cache_misses = 0

    def get_hash(self, constraints, kernel_fn, options) -> Optional[str]:
        label = getattr(kernel_fn, "__qualname__", "kernel")
        try:
            key = kernel_key(constraints, kernel_fn, options)
        except (_Unkeyable, RecursionError) as e:
            log("wave", f"kernel {label}: not cached ({e})")
            return None
        except Exception as e:  # the cache never fails a compile
            log("wave", f"kernel {label}: no key ({type(e).__name__}: {e}); not cached")
            return None
        # Compiles that stop before a binary (MLIR or assembly only) or
        # replace the IR are not stored: looked up without a flight.
        storable = not (options.compile_to_mlir or options.compile_to_asm or options.override_mlir)
        with self._lock:
            self._keys[key.hex] = (key if storable else None, label)
            if options.wave_runtime:
                self._needs_hsaco.add(key.hex)
        return key.hex

    def _key(self, kernel_hash: Optional[str]) -> Tuple[Optional[kcache.Key], str]:
        with self._lock:
            return self._keys.get(kernel_hash or "", (None, "kernel"))

    def load_kernel(self, kernel_hash: Optional[str]):
        if _wcache.WAVE_ALWAYS_COMPILE or not kernel_hash or not _wcache.WAVE_CACHE_ON:
            return None
        key, label = self._key(kernel_hash)
        if key is None:
            return None
        try:
            c = cache()
        except Exception as e:
            log("wave", f"kernel {label}: lookup failed: {e}")
            return None
        entry = _flights.begin(c, key, "wave", f"kernel {label}")
        if entry is None:
            self.cache_misses += 1
            return None
        try:
            cached = self._rebuild(entry, kernel_hash)
        except Exception as e:
            log("wave", f"kernel {label}: entry {entry.key_hex} unusable ({type(e).__name__}: {e}); compiling")
            self.cache_misses += 1
            return None
        self.cache_hits += 1
        return cached

    def _rebuild(self, entry: kcache.Entry, kernel_hash: str):
        info = json.loads(bytes(entry["info"]).decode("utf-8"))
        usages = [KernelBufferUsage[u] for u in info["kernel_usages"]]
        li = info["launch"]
        launch = KernelLaunchInfo(grid=grid_function(li["grid"]), blocks=list(li["blocks"]),
                                  cluster_dims=list(li["cluster_dims"]),
                                  shared_memory_bytes=int(li["shared_memory_bytes"]), func_name=str(li["func_name"]),
                                  grid_str=str(li["grid_str"]))
        vmfb = bytes(entry["vmfb"]) if "vmfb" in entry.keys() else None
        asm = bytes(entry["mlir"]).decode("utf-8")
        with self._lock:
            needs_hsaco = kernel_hash in self._needs_hsaco
        if needs_hsaco and "hsaco" not in entry.keys():
            raise KeyError("a Wave-runtime kernel without its HSACO")
        if "hsaco" in entry.keys():
            d = self.base_dir / kernel_hash
            os.makedirs(d, exist_ok=True)
            if not write_file(str(d / (kernel_hash + ".hsaco")), bytes(entry["hsaco"])):
                raise OSError(f"cannot write the HSACO into {d}")
        return _wcache.WaveCache(usages, vmfb, asm, launch)

    def store_kernel(self, vmfb: Optional[bytes], module_str: str, options) -> None:
        if not _wcache.WAVE_CACHE_ON or not options.kernel_hash:
            return
        kernel_hash = options.kernel_hash
        key, label = self._key(kernel_hash)
        if key is None:
            return
        flight = _flights.pop(key.hex)
        try:
            info = {"kernel_usages": [u.name for u in options.kernel_usages],
                    "launch": _launch_info_json(options.kernel_launch_info)}
            artifacts: Dict[str, bytes] = {"mlir": module_str.encode("utf-8"),
                                           "info": json.dumps(info, sort_keys=True).encode("utf-8")}
            if vmfb is not None:
                artifacts["vmfb"] = bytes(vmfb)
            if options.wave_runtime:
                hsaco = _hsaco_of(vmfb, options)
                if hsaco is None:
                    raise _NoHsaco(f"no HSACO of this kernel in {_wcache.get_temp_binary_dir()}")
                artifacts["hsaco"] = hsaco
                d = self.base_dir / kernel_hash
                os.makedirs(d, exist_ok=True)
                if not write_file(str(d / (kernel_hash + ".hsaco")), hsaco):
                    raise OSError(f"cannot write the HSACO into {d}")
        except Exception as e:
            log("wave", f"kernel {label}: not stored ({type(e).__name__}: {e})")
            if flight is not None:
                # A missing HSACO is this compile's bad luck (another thread
                # emptied the folder): a waiting process compiles it again.
                # Anything else would fail the same way there: compile locally.
                flight.fail() if isinstance(e, _NoHsaco) else flight.abandon()
            return
        try:
            if flight is not None:
                flight.commit(artifacts)
            else:
                cache().put(key, artifacts)
        except Exception as e:
            log("wave", f"kernel {label}: not stored: {e}")
            if flight is not None and not flight.done:
                flight.abandon()


class _IndexingContext(_indexing.IndexingContext):
    """wave_compile's IndexingContext: its exit ends the flights the compile
    began and did not store (raised: given up, a waiting process takes
    over; returned without storing: "compile locally")."""

    def __enter__(self):
        self._kcache_before = _flights.names()
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        try:
            return super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            _flights.abandon_new(getattr(self, "_kcache_before", []), local=exc_type is None)


def _get_cache_manager() -> KcacheWaveCacheManager:
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = KcacheWaveCacheManager()
        return _manager


def enable() -> None:
    """Makes wave_compile keep every kernel it compiles in kcache. Idempotent."""
    global _enabled
    if _enabled:
        return
    if not _originals:
        _originals["cache.get_cache_manager"] = _wcache.get_cache_manager
        _originals["compile.get_cache_manager"] = _wcompile.get_cache_manager
        _originals["compile.IndexingContext"] = _wcompile.IndexingContext
    _wcache.get_cache_manager = _get_cache_manager
    _wcompile.get_cache_manager = _get_cache_manager
    _wcompile.IndexingContext = _IndexingContext
    _enabled = True


def disable() -> None:
    """Wave's own cache again."""
    global _enabled
    if _enabled:
        _wcache.get_cache_manager = _originals["cache.get_cache_manager"]
        _wcompile.get_cache_manager = _originals["compile.get_cache_manager"]
        _wcompile.IndexingContext = _originals["compile.IndexingContext"]
        _enabled = False


def enabled() -> bool:
    """Whether enable() is in effect."""
    return _enabled

"""kcache.torch: torch.compile's caches (PyTorch Inductor) in kcache.

    import kcache.torch
    kcache.torch.enable()          # before the first torch.compile'd call

or, without touching the program, KCACHE_TORCH=1 in its environment (the
package's start-up hook, kcache-boot.pth, calls enable() once
torch._inductor.compile_fx has loaded, at the program's first compile;
python/_kcache_boot.py).

What torch.compile compiles becomes kcache entries:

* every FX graph Inductor compiles (a forward, a backward or an inference
  graph of a torch.compile'd region): Inductor's pickled CompiledFxGraph,
  what its FX graph cache stores. Key: Inductor's own FX graph cache key
  (the graph, its inputs' metadata, every Inductor option, the torch
  build, the system), beside it each part of Inductor's hash details as a
  component of its own (`inductor_config[max_autotune]`, `gm`,
  `example_inputs[0]`, ...: shown by value when short and stable, else by
  Inductor's digest of it, so `kcache misses` names the option or graph
  that changed), the torch and Triton versions and the C++ compiler's
  version. The label is the compiled function's name and the graph's kind
  (`f (forward)`).
* every file the CPU backend builds with the C++ compiler into Inductor's
  cache folder (the graph's kernel libraries, their object files and
  precompiled headers, and the small programs with which Inductor probes
  the vector instruction sets of the CPU once per folder): the built file.
  Key, in two steps: the inputs (the content of each source file, the
  compiler's command line with Inductor's cache folder written as
  `<cache>`, the compiler's version, the torch version) name the files
  the compiler read the last time (its -MD list), and the built file is
  stored under the inputs and the content of those files, so a header
  changed in place is a miss. The label is the file's name. A hit is
  written into Inductor's cache folder under the name Inductor loads it by
  (under a temporary name, then renamed). A build outside that folder (a
  header preprocessed in a temporary folder) is not cached.

* every AOTAutograd cache entry (what AOTAutograd's own cache stores: the
  compiled region's wrappers, naming its forward and backward FX graphs by
  their keys): under AOTAutograd's key and the torch, Triton and C++
  compiler versions, labelled `AOTAutograd <key prefix>`. Looked up after
  AOTAutograd's own folder, without a flight (the lookup comes before the
  compile, whose graphs have flights of their own); a hit loads its graphs
  from kcache, and a graph missing there is a miss of the entry
  (AOTAutograd then compiles as usual).

No key holds a cache folder, so processes with their own
TORCHINDUCTOR_CACHE_DIR share one store.

A graph or a C++ build that N processes miss at once is compiled once:
the first process owns the key's flight and compiles; the others wait and
load its entry. A compile that raises abandons the flight, and a waiting
process takes it over; a graph Inductor compiles and does not store (one it
cannot pickle) leaves a "compile locally" mark (kcache._hostutil). A graph
Inductor will not cache (its BypassFxGraphCache cases: custom passes it
cannot key, freezing, ...) is not looked up. The size limit,
verification, statistics, KCACHE_REMOTE (values signed with
KCACHE_REMOTE_SECRET_FILE: entries are code, and a remote without a secret
is left out) and every other KCACHE_* variable are kcache's. The folder is
$KCACHE_DIR, else <Inductor's cache folder>/kcache
($TORCHINDUCTOR_CACHE_DIR, else <temporary folder>/torchinductor_<user>).
AOTAutograd's own folder (in Inductor's cache folder) is still written and
looked up first.

Plugged in through the remote cache interfaces of Inductor and
AOTAutograd: enable() turns torch._inductor.config.fx_graph_remote_cache
and torch._functorch.config.enable_remote_autograd_cache on and Inductor's
own FX graph folder (fx_graph_cache) off; FxGraphCache.get_remote_cache
returns a KcacheFxGraphCache and AOTAutogradCache.get_remote_cache a
KcacheAOTAutogradCache (torch._inductor.remote_cache.RemoteCache, each).
FxGraphCache.load_with_key is wrapped to hand its hash details to the
lookup; compile_fx._compile_fx_inner to end the flights a compile did not
commit; cpp_builder.CppBuilder.build (and codecache._worker_compile_cpp,
which Inductor may hand to a compile worker process) for the C++ builds.
A cache fault is a miss and one log line; it never fails a torch.compile.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import subprocess
import threading
from typing import Any, Dict, List, Optional, Sequence

import kcache

try:
    import torch
    from torch._functorch import config as _fconfig
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache as _AOTAutogradCache
    from torch._inductor import codecache as _codecache
    from torch._inductor import compile_fx as _compile_fx
    from torch._inductor import config as _iconfig
    from torch._inductor import cpp_builder as _cpp_builder
    from torch._inductor.remote_cache import RemoteCache, RemoteCacheBackend, RemoteCachePassthroughSerde
    from torch._inductor.runtime.cache_dir_utils import cache_dir as _inductor_cache_dir
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kcache.torch needs PyTorch 2.14 or 2.15, which is not installed here "
        f"({_e}): pip install 'kcache-jit[torch]'") from _e


from ._hostutil import release  # noqa: E402

TORCH_VERSION = release(torch.__version__)
if not (2, 14) <= TORCH_VERSION < (2, 16):
    raise ImportError(f"kcache.torch supports PyTorch 2.14 and 2.15; this is PyTorch {torch.__version__}")

from ._hostutil import Flights, ProcessCache, dist_build, file_digest, log, write_file  # noqa: E402

__all__ = ["KcacheAOTAutogradCache", "KcacheFxGraphCache", "cache", "disable", "enable", "enabled"]

_FX_NAMESPACE = "torch-fx/1"
_CPP_NAMESPACE = "torch-cpp/2"  # inputs: names the files the build read
_CPP_BUILT_NAMESPACE = "torch-cpp-built/1"  # inputs + those files' content: the built file
_AOT_NAMESPACE = "torch-aot/1"
_FX_ARTIFACT = "graph"
_AOT_ARTIFACT = "entry"
_CPP_ARTIFACT = "library"
_CPP_DEPS = "files-read"
_CXX_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH")


def _default_dir() -> Optional[str]:
    return os.path.join(_inductor_cache_dir(), "kcache")


cache = ProcessCache("torch", _default_dir)
cache.__doc__ = "The process's kcache for PyTorch Inductor (opened on first use, and again after fork)."
_flights = Flights()
_enabled = False
_originals: Dict[str, Any] = {}
_state = threading.local()  # details of the graph being looked up; depth of _compile_fx_inner
_lock = threading.Lock()
_cxx_versions: Dict[str, str] = {}


def _triton_version() -> str:
    try:
        import triton

        return str(triton.__version__)
    except Exception:  # no Triton: CPU only
        return ""


def _builds() -> Dict[str, str]:
    """What identifies the torch and Triton builds beyond their versions
    (_hostutil.dist_build)."""
    try:
        import triton
    except Exception:  # no Triton: CPU only
        triton = None
    return {"torch_build": dist_build("torch", torch), "triton_build": dist_build("triton", triton)}


def _cxx_version() -> str:
    """The first line of `<compiler> --version` of the C++ compiler Inductor
    uses (asked once per compiler and process)."""
    try:
        cxx = _cpp_builder.get_cpp_compiler()
    except Exception as e:
        return f"unknown ({type(e).__name__})"
    with _lock:
        v = _cxx_versions.get(cxx)
    if v is None:
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
            v = out.strip().splitlines()[0] if out.strip() else cxx
        except Exception as e:
            v = f"{os.path.basename(cxx)} (no version: {type(e).__name__})"
        with _lock:
            _cxx_versions[cxx] = v
    return v


# A component shown by its value: short, one line, printable, and free of
# what differs between processes for one key (addresses, set order).
_READABLE = re.compile(r"[ -~]{0,64}")


def _component_value(text: str, digest: str) -> str:
    if _READABLE.fullmatch(text) and "0x" not in text and not text.lstrip().startswith(("{", "OrderedSet", "set(",
                                                                                          "frozenset")):
        return text
    return "#" + digest


_LINE = re.compile(r"\[([a-z0-9]+)\] ([^:]+): (.*)", re.S)


def _fx_components(debug_lines: Sequence[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in debug_lines:
        m = _LINE.match(line)
        if m is None:
            continue
        digest, name, text = m.group(1), m.group(2).strip(), m.group(3)
        if name in ("fx_key", "torch", "triton", "cxx") or not name:
            continue
        out[name] = _component_value(text, digest)
    return out


_FRAME = re.compile(r'File "[^"]*", line \d+, in (\S+)')


def _graph_label(gm: Any, is_backward: bool) -> str:
    kind = "backward" if is_backward else "forward"
    try:
        for node in gm.graph.nodes:
            names = _FRAME.findall(node.meta.get("stack_trace") or "")
            if names:
                return f"{names[-1]} ({kind})"
    except Exception:
        pass
    return f"graph ({kind})"


def _fx_key(fx_key: str) -> kcache.Key:
    details = getattr(_state, "details", {}).get(fx_key)
    components: Dict[str, Any] = {}
    label = None
    if details is not None:
        debug_lines, label = details
        components = _fx_components(debug_lines)
    components.update(fx_key=fx_key, torch=torch.__version__, triton=_triton_version(), cxx=_cxx_version(),
                      **_builds())
    return kcache.key(_FX_NAMESPACE, label=label or fx_key[:12], **components)


class _Backend(RemoteCacheBackend):
    """The bytes under Inductor's FX graph keys: a lookup begins the
    graph's flight (inside a compile), a store commits it."""

    def _get(self, key: str) -> Optional[bytes]:
        try:
            k = _fx_key(key)
            c = cache()
        except Exception as e:  # the cache never fails a compile
            log("torch", f"graph {key[:16]}: lookup failed: {e}")
            return None
        if getattr(_state, "depth", 0) > 0:
            entry = _flights.begin(c, k, "torch", f"graph {k.label}")
        else:  # a lookup outside a compile (AOTAutograd's hit path): no flight
            try:
                entry = c.get(k)
            except Exception as e:
                log("torch", f"graph {k.label}: lookup failed: {e}")
                return None
        if entry is None or _FX_ARTIFACT not in entry:
            return None
        return bytes(entry[_FX_ARTIFACT])

    def _put(self, key: str, data: bytes) -> None:
        try:
            k = _fx_key(key)
            flight = _flights.pop(k.hex)
            if flight is not None:
                flight.commit({_FX_ARTIFACT: data})
            else:
                cache().put(k, {_FX_ARTIFACT: data})
        except Exception as e:
            log("torch", f"graph {key[:16]}: not stored: {e}")


class _Serde(RemoteCachePassthroughSerde):
    """Inductor's value ({"data": base64 of the pickle, "time_taken_ms"})
    as the pickle's bytes and back."""

    def encode(self, data: Any) -> bytes:
        return base64.b64decode(data["data"])

    def decode(self, data: bytes) -> Any:
        return {"data": base64.b64encode(data).decode("ascii"), "time_taken_ms": 0}


class _KcacheRemoteCache(RemoteCache):
    """An Inductor RemoteCache over kcache whose faults are misses."""

    def get(self, key: str) -> Optional[Any]:
        try:
            return super().get(key)
        except Exception as e:  # the cache never fails a compile
            log("torch", f"{key[:16]}: lookup failed: {e}")
            return None

    def put(self, key: str, value: Any) -> None:
        try:
            super().put(key, value)
        except Exception as e:
            log("torch", f"{key[:16]}: not stored: {e}")


class KcacheFxGraphCache(_KcacheRemoteCache):
    """Inductor's remote FX graph cache over kcache (what
    FxGraphCache.get_remote_cache returns once enable() ran)."""

    def __init__(self) -> None:
        super().__init__(_Backend(), _Serde())


def _aot_key(aot_key: str) -> kcache.Key:
    return kcache.key(_AOT_NAMESPACE, label=f"AOTAutograd {aot_key[:12]}", aot_key=aot_key, torch=torch.__version__,
                      triton=_triton_version(), cxx=_cxx_version(), **_builds())


class _AotBackend(RemoteCacheBackend):
    """AOTAutograd's entries under its keys (no flight: its lookup comes
    before the compile, whose FX graphs have flights of their own)."""

    def _get(self, key: str) -> Optional[bytes]:
        entry = cache().get(_aot_key(key))
        if entry is None or _AOT_ARTIFACT not in entry:
            return None
        return bytes(entry[_AOT_ARTIFACT])

    def _put(self, key: str, data: bytes) -> None:
        cache().put(_aot_key(key), {_AOT_ARTIFACT: data})


class KcacheAOTAutogradCache(_KcacheRemoteCache):
    """AOTAutograd's remote cache over kcache (what
    AOTAutogradCache.get_remote_cache returns once enable() ran)."""

    def __init__(self) -> None:
        super().__init__(_AotBackend(), _Serde())


_aot_remote: Optional[KcacheAOTAutogradCache] = None


def _get_aot_remote_cache() -> KcacheAOTAutogradCache:
    global _aot_remote
    if _aot_remote is None:
        _aot_remote = KcacheAOTAutogradCache()
    return _aot_remote


def _get_remote_cache() -> KcacheFxGraphCache:
    return KcacheFxGraphCache()


def _load_with_key(key, debug_lines, example_inputs, *args, **kwargs):
    # The hash details of the graph looked up, for its kcache key.
    try:
        details = getattr(_state, "details", None)
        if details is None:
            details = _state.details = {}
        is_backward = kwargs.get("is_backward", args[2] if len(args) > 2 else False)
        details[key] = (list(debug_lines or ()), getattr(_state, "label", None) or _graph_label(None, is_backward))
    except Exception as e:
        log("torch", f"graph {key[:16]}: no details for its key: {e}")
    return _originals["load_with_key"](key, debug_lines, example_inputs, *args, **kwargs)


def _compile_fx_inner(gm, example_inputs, *args, **kwargs):
    # Flights begun for this graph and not committed end with its compile: a
    # compile that raised fails them (a waiting process takes over), one
    # Inductor compiled and did not store marks them "compile locally".
    outer_label = getattr(_state, "label", None)
    try:
        _state.label = _graph_label(gm, bool(kwargs.get("is_backward", False)))
    except Exception:
        _state.label = None
    _state.depth = getattr(_state, "depth", 0) + 1
    before = _flights.names()
    ok = False
    try:
        out = _originals["_compile_fx_inner"](gm, example_inputs, *args, **kwargs)
        ok = True
        return out
    finally:
        _state.depth -= 1
        _state.label = outer_label
        if _state.depth == 0:
            _state.details = {}
        _flights.abandon_new(before, local=ok)


# What the CPU backend builds with the C++ compiler.


def _cpp_key(builder: Any, root: str) -> kcache.Key:
    sources = hashlib.sha256()
    for tok in str(getattr(builder, "_sources_args", "")).split():
        if os.path.isfile(tok):
            with open(tok, "rb") as f:
                sources.update(tok.replace(root, "<cache>").encode() + b"\0" + f.read() + b"\0")
    # Search paths the compiler takes from the environment, not the command
    # line: they choose which header a name finds.
    env = "\0".join(f"{v}={os.environ.get(v, '')}" for v in _CXX_ENV)
    return kcache.key(_CPP_NAMESPACE, label=os.path.basename(builder.get_target_file_path()),
                      sources=sources.digest(), command=builder.get_command_line().replace(root, "<cache>"),
                      cxx=_cxx_version(), torch=torch.__version__, torch_build=dist_build("torch", torch),
                      compiler_env=env)


def _read_deps(depfile: str, cwd: str, root: str) -> Optional[List[str]]:
    """The files a make-style dependency list (the compiler's -MD) names,
    absolute, Inductor's cache folder written `<cache>`; [] when the
    compiler wrote none (a link of object files reads no header); None
    when it cannot be read."""
    try:
        with open(depfile, "r", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    except OSError:
        return None
    out: List[str] = []
    seen = set()
    for rule in re.split(r"(?<!\\)\n", text.replace("\\\n", " ")):
        _, colon, rest = rule.partition(": ")
        if not colon:
            continue
        for tok in re.split(r"(?<!\\)\s+", rest.strip()):
            if not tok:
                continue
            path = os.path.normpath(os.path.join(cwd, tok.replace("\\ ", " ")))
            if path.startswith(root + os.sep):
                path = "<cache>" + path[len(root):]
            if path not in seen:
                seen.add(path)
                out.append(path)
    return sorted(out)


def _headers_key(k1: kcache.Key, deps: Sequence[str], root: str) -> Optional[kcache.Key]:
    """The build's key: its inputs key and the content of every file the
    compiler read for it; None when one of them cannot be read now."""
    h = hashlib.sha256()
    for d in deps:
        digest = file_digest(root + d[len("<cache>"):] if d.startswith("<cache>") else d)
        if digest is None:
            return None
        h.update(d.encode("utf-8", "surrogateescape") + b"\0" + digest)
    return kcache.key(_CPP_BUILT_NAMESPACE, label=k1.label, inputs=bytes(k1), files_read=h.digest(),
                      files=str(len(deps)))


class _WithDeps:
    """A CppBuilder whose command line also writes the compiler's list of
    the files it read (-MD -MF)."""

    def __init__(self, builder: Any, depfile: str) -> None:
        self._builder = builder
        self._depfile = depfile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)

    def get_command_line(self) -> str:
        return self._builder.get_command_line() + " -MD -MF " + shlex.quote(self._depfile)


def _write_hit(entry: Optional[kcache.Entry], target: str, name: str) -> bool:
    if entry is None or _CPP_ARTIFACT not in entry:
        return False
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    except OSError:
        pass
    if write_file(target, bytes(entry[_CPP_ARTIFACT])):
        return True
    log("torch", f"C++ build {name}: cannot write {target}; compiling")
    return False


def _cached_build(builder: Any) -> None:
    """CppBuilder.build through kcache: the built file (a kernel library,
    an object file, a precompiled header, a vector ISA probe) is one entry,
    keyed in two steps: the inputs (sources, command line, versions) name
    the files the compiler read the last time (its -MD list), and the
    entry's key holds their content too, so a header changed in place is a
    miss. A build whose output is not in Inductor's cache folder is not
    cached."""
    build = _originals.get("build") or _cpp_builder.CppBuilder.build
    try:
        root = _inductor_cache_dir()
        target = builder.get_target_file_path()
        if getattr(builder, "_use_relative_path", False) or not target.startswith(root + os.sep):
            return build(builder)
        k1 = _cpp_key(builder, root)
        c = cache()
    except Exception as e:  # the cache never fails a compile
        log("torch", f"C++ build: lookup failed: {e}")
        return build(builder)
    name = k1.label
    # The inputs' entry: the files the last build read. Its flight is the
    # build's when no process built these inputs yet.
    entry1 = _flights.begin(c, k1, "torch", f"C++ build {name}")
    k2 = None
    if entry1 is not None:
        try:
            k2 = _headers_key(k1, json.loads(bytes(entry1[_CPP_DEPS])), root)
        except Exception as e:
            log("torch", f"C++ build {name}: entry {entry1.key_hex} unusable ({type(e).__name__}: {e}); compiling")
        del entry1
        if k2 is not None and _write_hit(_flights.begin(c, k2, "torch", f"C++ build {name}"), target, name):
            return None
    depfile = f"{target}.kcache-{os.getpid()}-{threading.get_ident()}.d"
    try:
        build(_WithDeps(builder, depfile))
        with open(target, "rb") as f:
            data = f.read()
        cwd = os.path.join(builder._output_dir, f"{builder._name}_{_cpp_builder._BUILD_TEMP_DIR}")
        deps = _read_deps(depfile, cwd, root)
    except BaseException:
        _flights.abandon(k1.hex)
        if k2 is not None:
            _flights.abandon(k2.hex)
        raise
    finally:
        try:
            os.unlink(depfile)
        except OSError:
            pass
    flight1 = _flights.pop(k1.hex)
    flight2 = _flights.pop(k2.hex) if k2 is not None else None
    try:
        built = _headers_key(k1, deps, root) if deps is not None else None
        if built is None:
            raise OSError("the files the compiler read cannot be listed or read")
        # The built file first, on disk before the inputs' entry names its
        # files: a process that waited for the inputs finds it.
        if flight2 is not None and flight2.key == built:
            flight2.commit({_CPP_ARTIFACT: data})
            flight2 = None
        else:
            c.put(built, {_CPP_ARTIFACT: data})
            c.flush()
        listed = {_CPP_DEPS: json.dumps(deps).encode("utf-8", "surrogateescape")}
        if flight1 is not None:
            flight1.commit(listed)
        elif built != k2:
            c.put(k1, listed)
    except Exception as e:
        log("torch", f"C++ build {name}: not stored: {e}")
    finally:
        for f in (flight1, flight2):
            if f is not None and not f.done:
                f.fail()
    return None


def _build(self: Any) -> None:
    return _cached_build(self)


class _Routed:
    """A CppBuilder whose build() goes through kcache (handed to Inductor's
    _worker_compile_cpp, which may run in a compile worker process where
    kcache.torch is imported without enable())."""

    def __init__(self, builder: Any) -> None:
        self._builder = builder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)

    def build(self) -> None:
        return _cached_build(self._builder)


def _worker_compile_cpp(lock_path: str, cpp_builders: Sequence[Any]) -> None:
    orig = _originals.get("_worker_compile_cpp", _codecache._worker_compile_cpp)
    return orig(lock_path, [_Routed(b) for b in cpp_builders])


def enable() -> None:
    """Makes Inductor keep every FX graph and C++ build it compiles, and
    AOTAutograd its entries, in kcache (call it before the first compile). Idempotent."""
    global _enabled
    with _lock:
        if _enabled:
            return
        fx = _codecache.FxGraphCache
        _originals.setdefault("get_remote_cache", fx.__dict__["get_remote_cache"])
        _originals.setdefault("load_with_key", fx.load_with_key)
        _originals.setdefault("_compile_fx_inner", _compile_fx._compile_fx_inner)
        _originals.setdefault("_worker_compile_cpp", _codecache._worker_compile_cpp)
        _originals.setdefault("build", _cpp_builder.CppBuilder.build)
        _originals.setdefault("aot_get_remote_cache", _AOTAutogradCache.__dict__["get_remote_cache"])
        _originals.setdefault("config", (_iconfig.fx_graph_cache, _iconfig.fx_graph_remote_cache,
                                         _fconfig.enable_remote_autograd_cache))
        _AOTAutogradCache.get_remote_cache = staticmethod(_get_aot_remote_cache)
        fx.get_remote_cache = staticmethod(_get_remote_cache)
        fx.load_with_key = staticmethod(_load_with_key)
        _compile_fx._compile_fx_inner = _compile_fx_inner
        _codecache._worker_compile_cpp = _worker_compile_cpp
        _cpp_builder.CppBuilder.build = _build
        # kcache is the FX graph cache: Inductor's own folder of graphs is
        # left out, its remote interface is on.
        _iconfig.fx_graph_cache = False
        _iconfig.fx_graph_remote_cache = True
        # AOTAutograd's entries in kcache too (its own folder is still
        # written and looked up first).
        _fconfig.enable_remote_autograd_cache = True
        _enabled = True


def disable() -> None:
    """Inductor's own caches again (for graphs compiled from now on)."""
    global _enabled
    with _lock:
        if not _enabled:
            return
        fx = _codecache.FxGraphCache
        fx.get_remote_cache = _originals["get_remote_cache"]
        fx.load_with_key = staticmethod(_originals["load_with_key"])
        _compile_fx._compile_fx_inner = _originals["_compile_fx_inner"]
        _codecache._worker_compile_cpp = _originals["_worker_compile_cpp"]
        _cpp_builder.CppBuilder.build = _originals["build"]
        _AOTAutogradCache.get_remote_cache = _originals["aot_get_remote_cache"]
        (_iconfig.fx_graph_cache, _iconfig.fx_graph_remote_cache,
         _fconfig.enable_remote_autograd_cache) = _originals.pop("config")
        _enabled = False


def enabled() -> bool:
    """Whether enable() is in effect."""
    return _enabled

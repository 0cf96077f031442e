"""kcache.jax: JAX's persistent compilation cache in kcache.

    import kcache.jax
    kcache.jax.enable()            # before the first jit compile

Every program JAX compiles (each jitted function, and the small helper
programs JAX compiles for itself) is one kcache entry: JAX's serialized,
compressed executable, under a key made of JAX's own cache key (a digest of
the program, the jaxlib version, the platform, XLA flags, compile options
and devices; its prefix, the module name such as ``jit_f``, is the label),
the jax and jaxlib versions and the platform and its version. The key holds
no folder: the paths JAX derives from jax_compilation_cache_dir for XLA's
own caches are hashed as their names under that folder, so processes with
node-local JAX folders over one shared store share every program.

A program that N processes miss at once is compiled once: the first process
owns the key's flight and compiles; the others wait and load its entry. A
compile that raises abandons the flight, and a waiting process takes the
compile over. A program JAX compiles and does not store (under the
thresholds below) leaves a "compile locally" mark in the store for ten
minutes: the processes waiting for it, and those that miss it meanwhile,
compile it at once, in parallel, without a flight. A program with host
callbacks (jax.debug.print, io_callback), which JAX never stores, is not
looked up at all: every process compiles it, as without kcache. Every
program is cached whatever its compile
time or size: enable() sets jax_persistent_cache_min_compile_time_secs and
jax_persistent_cache_min_entry_size_bytes to 0 (JAX's defaults exist because
its file cache is slow; pass them to enable() to keep thresholds). Processes
of a multi-process job all store (JAX's own cache writes only on process 0).

The size limit, verification, statistics, KCACHE_REMOTE (values signed with
KCACHE_REMOTE_SECRET_FILE: an executable is code, and a value that fails its
MAC is a miss) and every other KCACHE_* variable are kcache's. The folder is
$KCACHE_DIR, else <jax_compilation_cache_dir>/kcache when that is set, else
kcache's default folder (and then XLA's GPU autotuning and kernel caches,
which JAX puts under jax_compilation_cache_dir, stay off as they were).
jax_compilation_cache_check_contents still applies.

Plugged in through jax._src.compilation_cache.get_file_cache (the function
that creates JAX's file cache), jax._src.compilation_cache.get_cache_key
(wrapped to leave the folder out), jax._src.compiler.compile_or_get_cached
and jax._src.compiler._compile_and_write_cache (wrapped to end flights).
"""

from __future__ import annotations

import copy
import os
import pathlib
import threading
import time
from typing import Any, Dict, Optional

import jax
import jaxlib
import kcache
from jax._src import compilation_cache as _cc
from jax._src import compiler as _compiler
from jax._src import config as _config
from jax._src import distributed as _distributed
from jax._src.compilation_cache_interface import CacheInterface

from ._hostutil import Flights, ProcessCache, dist_build, log

__all__ = ["KcacheCache", "cache", "enable", "enabled"]

_NAMESPACE = "jax/1"
_ARTIFACT = "executable"


def _default_dir() -> Optional[str]:
    d = _config.compilation_cache_dir.value
    if d and d != _MARKER:
        return os.path.join(d, "kcache")
    return None


# jax_compilation_cache_dir must name something for JAX to build its cache;
# when the user set none, this marker stands for "kcache's folder".
_MARKER = "kcache:"
cache = ProcessCache("jax", _default_dir)
cache.__doc__ = "The process's kcache for JAX (opened on first use, and again after fork)."
_flights = Flights()
_enabled = False
_originals: Dict[str, Any] = {}
_backend = threading.local()  # the platform of the compile this thread is in


def _key(jax_key: str) -> kcache.Key:
    label = jax_key.rsplit("-", 1)[0] if "-" in jax_key else jax_key
    return kcache.key(_NAMESPACE, label=label, jax_key=jax_key, jax=jax.__version__, jaxlib=jaxlib.__version__,
                      jax_build=dist_build("jax", jax), jaxlib_build=dist_build("jaxlib", jaxlib),
                      platform=getattr(_backend, "platform", ""),
                      platform_version=getattr(_backend, "version", ""))


# The debug options into which JAX writes paths under jax_compilation_cache_dir
# (get_compile_options, when XLA's caches are on), each with the name JAX
# puts under that folder. They say where XLA keeps its autotuning results
# and compiled kernels, which is no part of the executable XLA builds.
_CACHE_PATH_OPTIONS = ("xla_gpu_kernel_cache_file", "xla_gpu_per_fusion_autotune_cache_dir")


def _without_cache_paths(compile_options):
    """The compile options as JAX's cache key should see them: a path JAX
    derived from jax_compilation_cache_dir becomes the name JAX gave it
    under that folder (a copy when something changes; the options the
    compiler gets are left alone). Whether a cache is on stays in the key;
    a path that the user set in some other way stays as it is."""
    d = _config.compilation_cache_dir.value
    if not d or d == _MARKER:
        return compile_options
    debug = compile_options.executable_build_options.debug_options
    changes = [n for n in _CACHE_PATH_OPTIONS if getattr(debug, n, "") == str(pathlib.Path(d) / n)]
    if not changes:
        return compile_options
    opts = copy.deepcopy(compile_options)
    debug = opts.executable_build_options.debug_options
    for n in changes:
        setattr(debug, n, "<jax_compilation_cache_dir>/" + n)
    return opts


def _get_cache_key(module, devices, compile_options, backend, *args, **kwargs):
    try:
        compile_options = _without_cache_paths(compile_options)
    except Exception as e:  # JAX's own key, as without kcache
        log("jax", f"cache folder paths left in the key: {e}")
    return _originals["get_cache_key"](module, devices, compile_options, backend, *args, **kwargs)


class KcacheCache(CacheInterface):
    """JAX's CacheInterface over kcache: get() begins the program's flight,
    put() commits it."""

    def __init__(self) -> None:
        d = cache().dir
        self._path = pathlib.Path(d) if d else pathlib.Path(".")

    def get(self, key: str) -> Optional[bytes]:
        if getattr(_backend, "callbacks", False):
            # JAX never stores a program with host callbacks: no lookup, and
            # no flight for other processes to wait on; each compiles it.
            return None
        try:
            k = _key(key)
            c = cache()
        except Exception as e:  # the cache never fails a compile
            log("jax", f"{key[:60]}: lookup failed: {e}")
            return None
        e = _flights.begin(c, k, "jax", key[:60])
        if e is None or _ARTIFACT not in e:
            return None
        return bytes(e[_ARTIFACT])

    def put(self, key: str, value: bytes) -> None:
        try:
            k = _key(key)
            flight = _flights.pop(k.hex)
            if flight is not None:
                flight.commit({_ARTIFACT: value})
            else:
                cache().put(k, {_ARTIFACT: value})
        except Exception as e:
            log("jax", f"{key[:60]}: not stored: {e}")

    def clear(self) -> None:
        pass


def _get_file_cache(path: str):
    c: CacheInterface = KcacheCache()
    if _config.compilation_cache_check_contents.value:
        c = _cc.VerificationCache(c)
    return c, str(c._path)


def _compile_or_get_cached(backend, *args, **kwargs):
    # Flights begun for this program and not ended by its compile (an error)
    # end here, so a waiting process takes over.
    _backend.platform = str(getattr(backend, "platform", ""))
    _backend.version = str(getattr(backend, "platform_version", ""))
    callbacks = kwargs["host_callbacks"] if "host_callbacks" in kwargs else args[3] if len(args) > 3 else None
    outer = getattr(_backend, "callbacks", False)
    _backend.callbacks = bool(callbacks)
    before = _flights.names()
    try:
        return _originals["compile_or_get_cached"](backend, *args, **kwargs)
    finally:
        _backend.callbacks = outer
        _flights.abandon_new(before)


_WRITE_PARAMS = ("backend", "computation", "executable_devices", "compile_options", "host_callbacks", "module_name",
                 "cache_key")


def _compile_and_write_cache(*args, **kwargs):
    # Taken by position or by name, as JAX may call it either way.
    start = time.monotonic()
    executable = _originals["_compile_and_write_cache"](*args, **kwargs)
    named = dict(zip(_WRITE_PARAMS, args))
    try:
        named.update(kwargs)
        backend, host_callbacks = named["backend"], named["host_callbacks"]
        module_name, cache_key = named["module_name"], named["cache_key"]
        k = _key(cache_key).hex
        if _flights.get(k) is not None and not host_callbacks and _distributed.global_state.process_id != 0:
            # JAX stores only on process 0; with kcache every process stores
            # what it compiled, so the others waiting for it can load it.
            took = time.monotonic() - start
            if took >= _config.persistent_cache_min_compile_time_secs.value:
                _cc.put_executable_and_time(cache_key, module_name, executable, backend, int(took))
        if _flights.get(k) is not None:
            # Compiled and not stored (under JAX's thresholds, or a store
            # that failed): the processes waiting for it, and those that miss
            # it for a while, compile it at once instead of in turn.
            _flights.abandon(k, local=True)
    except Exception as e:
        log("jax", f"{named.get('module_name', '?')}: not stored: {e}")
    return executable


def enable(min_compile_time_secs: float = 0.0, min_entry_size_bytes: int = 0) -> None:
    """Makes JAX keep every compiled program in kcache (call it before the
    first compile; a cache JAX opened already is replaced). The thresholds
    are JAX's options: programs that compile faster or are smaller are not
    stored (default: every program is)."""
    global _enabled
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", int(min_entry_size_bytes))
    if not _config.compilation_cache_dir.value:
        jax.config.update("jax_compilation_cache_dir", _MARKER)
        _originals.setdefault("xla_caches", _config.persistent_cache_enable_xla_caches.value)
        # With a cache folder JAX also points XLA's GPU caches into it (and
        # their paths into its keys); without one they were off: they stay
        # off, so the keys do not depend on a folder.
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    if _enabled:
        return
    _originals["get_file_cache"] = _cc.get_file_cache
    _originals["compile_or_get_cached"] = _compiler.compile_or_get_cached
    _originals["_compile_and_write_cache"] = _compiler._compile_and_write_cache
    _originals["get_cache_key"] = _cc.get_cache_key
    _cc.get_file_cache = _get_file_cache
    _cc.get_cache_key = _get_cache_key
    _compiler.compile_or_get_cached = _compile_or_get_cached
    _compiler._compile_and_write_cache = _compile_and_write_cache
    if _cc._cache is not None or _cc._cache_initialized:
        _cc.reset_cache()
    _enabled = True


def disable() -> None:
    """JAX's own file cache again (for programs compiled from now on)."""
    global _enabled
    if not _enabled:
        return
    _cc.get_file_cache = _originals["get_file_cache"]
    _compiler.compile_or_get_cached = _originals["compile_or_get_cached"]
    _compiler._compile_and_write_cache = _originals["_compile_and_write_cache"]
    _cc.get_cache_key = _originals["get_cache_key"]
    if _config.compilation_cache_dir.value == _MARKER:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_persistent_cache_enable_xla_caches", _originals.pop("xla_caches", None))
    _cc.reset_cache()
    _enabled = False


def enabled() -> bool:
    """Whether enable() is in effect."""
    return _enabled

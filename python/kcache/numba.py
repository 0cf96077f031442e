"""kcache.numba: numba's cache of compiled functions in kcache.

    import kcache.numba
    kcache.numba.enable()          # before the @njit(cache=True) definitions

Every function defined with cache=True afterwards (``@jit``, ``@njit``,
``@generated_jit`` dispatchers) keeps its compiled overloads in kcache
instead of numba's __pycache__ index and data files: each overload (one
signature of one function) is one entry, keyed by the function (module and
qualified name, label ``module.qualname``), the digest of its source file
(numba's own cache uses the file's time stamp), its bytecode and closure,
the signature, the target (LLVM triple, CPU name and features), the
function's options (nopython, fastmath, parallel, ...), numba's optimisation
settings and the numba, llvmlite and Python versions.

An overload that N processes miss at once is compiled once: the first
process owns the key's flight and compiles; the others wait and load its
entry. A compile that raises, or a result numba cannot cache (lifted loops,
dynamic globals), abandons the flight, and a waiting process takes the
compile over. The size limit, verification, statistics, KCACHE_REMOTE
(values signed with KCACHE_REMOTE_SECRET_FILE) and every other KCACHE_*
variable are kcache's; the folder is $KCACHE_DIR, else kcache's default.

An entry holds numba's pickled compile result, which is code: it is
unpickled only when it comes from a kcache entry whose checksum (and, from
a remote tier, whose MAC) verified. A damaged entry or a value failing its
MAC is a miss, and the function is compiled again.

Limits: as with numba's own cache, a change to a global constant or to a
jitted function in another module does not change the key. ``cfunc`` and
``vectorize`` keep numba's own cache. Dispatcher.stats reports kcache hits
as cache hits; cache_path is the kcache folder.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import pickle
import sys
import warnings
from typing import Any, Dict, Optional

import kcache
import llvmlite
import numba
from numba.core import compiler as _compiler
from numba.core import config as _config
from numba.core import dispatcher as _dispatcher
from numba.core.caching import _Cache
from numba.core.errors import NumbaWarning
from numba.core.serialize import dumps as _dumps

from ._hostutil import Flights, ProcessCache, log

__all__ = ["FunctionCache", "cache", "enable", "enabled"]

_NAMESPACE = "numba/1"
_ARTIFACT = "cres"

cache = ProcessCache("numba", lambda: None)
cache.__doc__ = "The process's kcache for numba (opened on first use, and again after fork)."
_flights = Flights()
_enabled = False
_originals: Dict[str, Any] = {}


_digests: Dict[tuple, bytes] = {}  # (path, mtime_ns, size) -> SHA-256 of the file


def _source_digest(py_func) -> bytes:
    # The whole source file, as numba's time stamp of it: a jitted callee in
    # the same file is compiled into its callers.
    try:
        path = inspect.getsourcefile(py_func) or inspect.getfile(py_func)
        st = os.stat(path)
        k = (path, st.st_mtime_ns, st.st_size)
        d = _digests.get(k)
        if d is None:
            with open(path, "rb") as f:
                d = _digests[k] = hashlib.sha256(f.read()).digest()
        return d
    except (OSError, TypeError):
        pass
    try:
        return hashlib.sha256(inspect.getsource(py_func).encode("utf-8")).digest()
    except (OSError, TypeError):
        code = py_func.__code__
        return hashlib.sha256(code.co_code + repr(code.co_consts).encode("utf-8")).digest()


class FunctionCache(_Cache):
    """numba's per-function cache (numba.core.caching._Cache) over kcache:
    load_overload() begins the overload's flight, save_overload() commits it."""

    def __init__(self, py_func, targetoptions: Optional[dict] = None) -> None:
        self._py_func = py_func
        self._qualname = getattr(py_func, "__qualname__", py_func.__name__)
        self._label = f"{py_func.__module__}.{self._qualname}"
        self._source = _source_digest(py_func)
        self._options = repr(sorted((k, repr(v)) for k, v in (targetoptions or {}).items() if k != "cache"))
        self._enabled = True
        self._warned = False

    def __repr__(self) -> str:
        return f"<kcache.numba.FunctionCache {self._label}>"

    @property
    def cache_path(self):
        return cache().dir

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def flush(self) -> None:
        # numba flushes before recompile(); kcache entries are never wrong for
        # their key, so there is nothing to drop.
        pass

    def _key(self, sig, codegen) -> kcache.Key:
        code = self._py_func.__code__
        closure = b""
        if self._py_func.__closure__ is not None:
            closure = _dumps(tuple(c.cell_contents for c in self._py_func.__closure__))
        triple, cpu, features = codegen.magic_tuple()
        return kcache.key(
            _NAMESPACE, label=self._label,
            function=self._qualname, module=str(self._py_func.__module__),
            source=self._source, line=int(code.co_firstlineno),
            bytecode=hashlib.sha256(code.co_code).digest(), closure=closure,
            signature=str(sig), triple=str(triple), cpu=str(cpu), cpu_features=str(features),
            options=self._options,
            settings=repr((str(_config.OPT), _config.BOUNDSCHECK, _config.DEBUGINFO_DEFAULT)),
            numba=numba.__version__, llvmlite=llvmlite.__version__,
            python="%d.%d%s" % (sys.version_info[0], sys.version_info[1], getattr(sys, "abiflags", "")))

    def load_overload(self, sig, target_context):
        if not self._enabled:
            return None
        target_context.refresh()
        try:
            key = self._key(sig, target_context.codegen())
        except Exception as e:  # an unpicklable closure: numba could not cache it either
            log("numba", f"{self._label}: not cached ({type(e).__name__}: {e})")
            return None
        try:
            c = cache()
        except Exception as e:  # the cache never fails a compile
            log("numba", f"{self._label}: lookup failed: {e}")
            return None
        entry = _flights.begin(c, key, "numba", self._label)
        if entry is None or _ARTIFACT not in entry:
            return None
        try:
            # The bytes come from a verified kcache entry (checksummed; signed
            # when they came from the remote tier).
            payload = pickle.loads(entry[_ARTIFACT])
            return _compiler.CompileResult._rebuild(target_context, *payload)
        except Exception as e:
            log("numba", f"{self._label}: entry {entry.key_hex} cannot be loaded ({type(e).__name__}: {e}); compiling")
            return None

    def _cachable(self, cres) -> bool:
        why = None
        if any(not x.can_cache for x in cres.lifted):
            why = "it uses lifted code"
        elif cres.library.has_dynamic_globals:
            why = "it uses dynamic globals (such as ctypes pointers and large global arrays)"
        if why is not None and not self._warned:
            self._warned = True
            warnings.warn(f'Cannot cache compiled function "{self._qualname}" as {why}', NumbaWarning)
        return why is None

    def save_overload(self, sig, cres) -> None:
        try:
            key = self._key(sig, cres.codegen)
        except Exception:
            return
        flight = _flights.pop(key.hex)
        try:
            if not self._enabled or not self._cachable(cres):
                if flight is not None:
                    flight.abandon()
                return
            artifacts = {_ARTIFACT: _dumps(cres._reduce())}
            if flight is not None:
                flight.commit(artifacts)
            else:
                cache().put(key, artifacts)
        except Exception as e:  # never fail the compile
            log("numba", f"{self._label}: not stored ({type(e).__name__}: {e})")
            if flight is not None and not flight.done:
                flight.abandon()


def _enable_caching(self) -> None:
    self._cache = FunctionCache(self.py_func, self.targetoptions)


def _compile(self, sig):
    # A flight begun by this compile (in load_overload) and not committed by
    # save_overload (an error, an uncachable result) is abandoned here, so a
    # waiting process takes the compile over.
    if not isinstance(self._cache, FunctionCache):
        return _originals["compile"](self, sig)
    before = _flights.names()
    try:
        return _originals["compile"](self, sig)
    finally:
        _flights.abandon_new(before)


def enable() -> None:
    """Makes every function defined with cache=True from now on keep its
    compiled overloads in kcache. Idempotent."""
    global _enabled
    if _enabled:
        return
    d = _dispatcher.Dispatcher
    if "compile" not in _originals:
        _originals["enable_caching"] = d.enable_caching
        _originals["compile"] = d.compile
        d.compile = _compile
    d.enable_caching = _enable_caching
    _enabled = True


def disable() -> None:
    """Functions defined with cache=True from now on use numba's own cache
    again (those defined before keep kcache)."""
    global _enabled
    if not _enabled:
        return
    # The compile wrapper stays: functions defined before still use kcache.
    _dispatcher.Dispatcher.enable_caching = _originals["enable_caching"]
    _enabled = False


def enabled() -> bool:
    """Whether enable() is in effect."""
    return _enabled

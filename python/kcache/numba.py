"""kcache.numba: numba's cache of compiled functions in kcache.

    import kcache.numba
    kcache.numba.enable()          # before the @njit(cache=True) definitions

Every function defined with cache=True afterwards (``@jit``, ``@njit``,
``@generated_jit`` dispatchers) keeps its compiled overloads in kcache
instead of numba's __pycache__ index and data files: each overload (one
signature of one function) is one entry.

The key is what runs, for every function, whether it has a source file or
not (a notebook cell, ``python -c``, ``exec`` of generated source, a module
in a zip): ``code_key(py_func)``, a SHA-256 over

* the function's code object: bytecode, exception and line tables, first
  line, argument counts, flags, names (co_names, co_varnames, co_freevars,
  co_cellvars, name and qualified name) and co_consts, with the code
  objects nested in it (inner functions, lambdas, comprehensions) keyed the
  same way, recursively;
* the SHA-256 of its source file when there is one (what the bytecode does
  not show, such as an ``@overload`` in the same file; numba's own cache
  checks the file too), nothing when there is none;
* the value of each global it reads (LOAD_GLOBAL in its code and nested
  code, then builtins; a name not bound is keyed as missing), of each
  closure cell and of its defaults: numbers, strings, bytes and None by
  value; tuples (named tuples with their type and fields) element by
  element; numpy arrays by type, dtype, shape, layout flags and bytes;
  numpy scalars and dtypes by value; enum members by class and name and
  value, enum classes by their members; sets and frozensets by their
  elements in an order free of hash seeds; numba types by name; modules by
  name, and for a module outside numba, numpy, llvmlite and the standard
  library, the value of each of its attributes the code reads as an
  attribute (``consts.SCALE``, ``mod.func``), recursively; ``@jitclass``
  classes by their fields and their methods' dispatchers; other classes
  by qualified name and the functions in their namespace; other objects by
  their pickle (an object that does not pickle makes the function
  unkeyable: it is compiled and not stored, one log line);
* recursively, the same for each plain function and dispatcher so reached
  (a jitted callee in another module, a helper called through a module),
  with the dispatcher's options; a function reached again while its own
  key is being made (recursion, mutual recursion) is keyed by its qualified
  name at that point. Functions, builtins and ufuncs of numba, numpy,
  llvmlite and the standard library are keyed by qualified name: their
  versions are in the key and numba compiles its own implementations of
  them.

and beside it the module and qualified name (label ``module.qualname``),
the signature (a dispatcher passed as an argument by its code key, not its
address), the target (LLVM triple, CPU name and features), the function's
options (nopython, fastmath, parallel, ...), numba's OPT, BOUNDSCHECK and
DEBUGINFO settings, and the numba, llvmlite, numpy and Python versions. No
folder is in the key (not numba's cache folder, not the module's path), so
processes with different NUMBA_CACHE_DIR share entries. A global changed
between two compiles (``C = 2`` in a notebook, a callee edited in another
module) is a new key, where numba's own cache (keyed on the bytecode, the
closure and the function's own file) hands back the old build. The code
part is computed once per code object in a process; a function's cache
reuses its last walk while everything it read is unchanged (the same
objects; arrays and pickled values with the same bytes) and walks again
otherwise, so a key is never stale. The key of a lookup is the key its
compile is stored under. A function that reaches a mutual recursion
(f calls g calls f) is compiled and not stored: numba crashes loading such
a function from its own cache (numba 0.68.1).

``Dispatcher.recompile()`` compiles each signature afresh (no lookup) and
replaces the stored entry.

An overload that N processes miss at once is compiled once: the first
process owns the key's flight and compiles; the others wait and load its
entry. A compile that raises abandons the flight, and a waiting process
takes the compile over. A result numba cannot cache (lifted loops, dynamic
globals) marks the key "compile locally" for ten minutes: the waiting
processes, and those that miss it meanwhile, compile it at once, in
parallel. The size limit, verification, statistics, KCACHE_REMOTE
(values signed with KCACHE_REMOTE_SECRET_FILE) and every other KCACHE_*
variable are kcache's; the folder is $KCACHE_DIR, else kcache's default.

An entry holds numba's pickled compile result, which is code: it is
unpickled only when it comes from a kcache entry whose checksum (and, from
a remote tier, whose MAC) verified. A damaged entry or a value failing its
MAC is a miss, and the function is compiled again.

Limits: an ``@overload``, ``@intrinsic`` or typing extension defined in a
file other than those of the functions reached is not in the key (numba's
own cache has the same limit); ``cfunc`` and ``vectorize`` keep numba's
own cache. Dispatcher.stats reports kcache hits as cache hits; cache_path
is the kcache folder.

One module, one concept: numba's cache kept in kcache. The key (code_key
and the walk behind it) exists only for the cache that stores under it
(FunctionCache, installed by enable()), and is defined by what numba
compiles; neither is used without the other.
"""

from __future__ import annotations

import dis
import enum
import hashlib
import os
import pickle
import sys
import types as _pytypes
import warnings
from typing import Any, Dict, List, Optional, Tuple

import kcache
import llvmlite
import numba
import numpy as np
from numba.core import compiler as _compiler
from numba.core import config as _config
from numba.core import dispatcher as _dispatcher
from numba.core import types as _nbtypes
from numba.core.caching import _Cache
from numba.core.errors import NumbaWarning
from numba.core.serialize import dumps as _dumps

from ._hostutil import Flights, ProcessCache, dist_build, log

__all__ = ["FunctionCache", "cache", "code_key", "enable", "enabled"]

_NAMESPACE = "numba/2"
_ARTIFACT = "cres"

cache = ProcessCache("numba", lambda: None)
cache.__doc__ = "The process's kcache for numba (opened on first use, and again after fork)."
_flights = Flights()
_enabled = False
_originals: Dict[str, Any] = {}

# Packages whose functions, classes and modules are keyed by qualified name
# only: their versions are in every key (numba, numpy, llvmlite, Python),
# and numba compiles its own implementations of them, not their bytecode.
_LIBRARIES = frozenset({"numba", "numpy", "llvmlite"})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)
_STDLIB_DIR = os.path.realpath(os.path.dirname(os.__file__)) + os.sep  # lib-dynload is inside
_library_tops: Dict[str, bool] = {}
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_FROM_DICT_OR_GLOBALS"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM", "LOAD_SUPER_ATTR"})
_MISSING = object()


class Unkeyable(Exception):
    """A global or closure value the key cannot hold (numba cannot cache
    such a function either: ctypes pointers, objects that do not pickle)."""


_file_digests: Dict[tuple, bytes] = {}  # (path, mtime_ns, size) -> SHA-256 of the file
_code_infos: Dict[int, tuple] = {}  # id(code) -> (code, _code_info(code))


def _file_digest(code) -> bytes:
    # The whole source file when there is one (numba's own cache checks the
    # file's time stamp): what the bytecode walk cannot see, such as an
    # @overload or @intrinsic defined in the same file, changes the key too.
    # No file (a notebook cell, python -c, exec of a string, a zip): b"".
    path = code.co_filename
    if not path or (path.startswith("<") and path.endswith(">")):  # <string>, <stdin>, <ipython-input-...>
        return b""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return b""
    k = (path, st.st_mtime_ns, st.st_size)
    d = _file_digests.get(k)
    if d is None:
        try:
            with open(path, "rb") as f:
                d = hashlib.sha256(f.read()).digest()
        except OSError:
            return b""
        if len(_file_digests) > 4096:
            _file_digests.clear()
        _file_digests[k] = d
    return d


def _const_text(c) -> bytes:
    # co_consts other than code objects: deterministic across processes
    # (frozensets sorted: string hashes differ per process).
    if isinstance(c, frozenset):
        return b"fs(" + b",".join(sorted(_const_text(x) for x in c)) + b")"
    if isinstance(c, tuple):
        return b"t(" + b",".join(_const_text(x) for x in c) + b")"
    if isinstance(c, _pytypes.CodeType):
        return b"code:" + _code_info(c)[0]
    if isinstance(c, bytes):
        return b"b%d:" % len(c) + c
    if isinstance(c, str):
        b = c.encode("utf-8", "surrogatepass")
        return b"s%d:" % len(b) + b
    return type(c).__name__.encode() + b":" + repr(c).encode("utf-8", "backslashreplace")


def _code_info(code) -> tuple:
    """(digest, names read as globals, names read as attributes, source
    file digest) of a code object and the code objects nested in it; once
    per code object (the file as it was when the code was first keyed: the
    file the code was loaded from, unless it changed before that)."""
    e = _code_infos.get(id(code))
    if e is not None and e[0] is code:
        return e[1]
    h = hashlib.sha256()
    for field in ("co_code", "co_exceptiontable", "co_linetable", "co_lnotab"):
        b = getattr(code, field, None)
        if isinstance(b, bytes):
            h.update(field.encode() + b"%d:" % len(b) + b)
            if field == "co_linetable":
                break  # co_lnotab is derived from it
    ints = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
            code.co_firstlineno, code.co_nlocals)
    h.update(repr(ints).encode())
    for field in ("co_name", "co_qualname"):
        h.update(field.encode() + b"=" + str(getattr(code, field, "")).encode("utf-8", "surrogatepass") + b";")
    for field in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        h.update(field.encode() + b"=" + _const_text(tuple(getattr(code, field))))
    h.update(b"consts=" + _const_text(tuple(code.co_consts)))
    names: List[str] = []
    attrs = set()
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS:
            names.append(ins.argval)
        elif ins.opname in _ATTR_OPS:
            attrs.add(ins.argval)
    for c in code.co_consts:
        if isinstance(c, _pytypes.CodeType):
            _, n2, a2, _ = _code_info(c)
            names.extend(n2)
            attrs.update(a2)
    info = (h.digest(), tuple(dict.fromkeys(n for n in names if isinstance(n, str))), frozenset(attrs),
            _file_digest(code))
    if len(_code_infos) > 65536:  # a long session re-running cells makes new code objects
        _code_infos.clear()
    _code_infos[id(code)] = (code, info)
    return info


def _qualified(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _library_top(top: str) -> bool:
    # numba, numpy, llvmlite, and a standard library module loaded from the
    # standard library's folder (not a user's module that has the name of
    # one, such as test.py or code.py).
    r = _library_tops.get(top)
    if r is None:
        if top in _LIBRARIES:
            r = True
        elif top not in _STDLIB:
            r = False
        else:
            m = sys.modules.get(top)
            f = getattr(m, "__file__", None)
            if m is None:
                return False  # not imported yet: decided when it is
            r = f is None or os.path.realpath(f).startswith(_STDLIB_DIR)
        _library_tops[top] = r
    return r


def _is_library(obj) -> bool:
    mod = obj.__name__ if isinstance(obj, _pytypes.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(mod, str) and _library_top(mod.partition(".")[0])


def _options_text(options: Optional[dict]) -> str:
    return repr(sorted((k, repr(v)) for k, v in (options or {}).items() if k != "cache"))


def _array_digest(v) -> bytes:
    t = type(v)
    flags = (v.flags.c_contiguous, v.flags.f_contiguous, v.flags.writeable, v.flags.aligned)
    h = hashlib.sha256(f"{_qualified(t)}|{v.dtype.str}|{v.dtype.descr}|{v.shape}|{flags}".encode())
    h.update(np.ascontiguousarray(v).tobytes())
    return h.digest()


def _pickle_digest(v) -> bytes:
    try:
        data = pickle.dumps(v, protocol=4)
    except Exception as e:
        if not _is_library(type(v)):
            raise Unkeyable(f"a value of type {_qualified(type(v))} ({type(e).__name__})") from None
        # An object of numba, numpy or the standard library that does not
        # pickle (numba freezes ctypes pointers as dynamic globals, which it
        # never caches): by its type.
        data = b""
    return hashlib.sha256(data).digest()


# What a walk read, re-checked before its digest is used again: (0, mapping,
# name, value): mapping.get(name) is value; (1, obj, attribute, value);
# (2, cell, value); (3, array, digest): same type, layout and bytes; (4, obj,
# digest): same pickle; (5, class, names): same namespace names; (6, set,
# frozenset): same elements.
def _unchanged(seen) -> bool:
    try:
        for o in seen:
            k = o[0]
            if k == 0:
                if o[1].get(o[2], _MISSING) is not o[3]:
                    return False
            elif k == 1:
                if getattr(o[1], o[2], _MISSING) is not o[3]:
                    return False
            elif k == 2:
                try:
                    v = o[1].cell_contents
                except ValueError:
                    v = _MISSING
                if v is not o[2]:
                    return False
            elif k == 3:
                if _array_digest(o[1]) != o[2]:
                    return False
            elif k == 4:
                if _pickle_digest(o[1]) != o[2]:
                    return False
            elif k == 5:
                if tuple(sorted(vars(o[1]))) != o[2]:
                    return False
            elif k == 6:
                if o[1] != o[2]:
                    return False
    except Exception:
        return False
    return True


class _Walk:
    """One key computation: feeds what a function runs into a SHA-256 (see
    the module's documentation) and lists what it read (`seen`), so that a
    later key of the same function can reuse the digest while all of it is
    unchanged. Functions reached twice are digested once; a function
    reached again while it is being digested (recursion, mutual recursion)
    is fed as a back reference to its qualified name."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.done: Dict[int, bytes] = {}
        self.active: set = set()
        self.keep: list = []  # holds what done/active name by id for the walk's lifetime
        self.stack: list = []  # the functions being digested, innermost last
        self.mutual: Optional[str] = None  # a function met again through another one
        self.seen: list = []

    def feed(self, tag: bytes, data: bytes = b"") -> None:
        self.h.update(tag + b"%d:" % len(data) + data)

    def function(self, fn) -> None:
        d = self.done.get(id(fn))
        if d is not None:
            self.feed(b"F", d)
            return
        if id(fn) in self.active:
            self.feed(b"R", _qualified(fn).encode("utf-8", "surrogatepass"))
            if fn is not self.stack[-1]:
                self.mutual = _qualified(fn)
            return
        self.active.add(id(fn))
        self.stack.append(fn)
        self.keep.append(fn)
        outer, self.h = self.h, hashlib.sha256()
        seen = self.seen
        try:
            code = fn.__code__
            closure = fn.__closure__
            defaults = fn.__defaults__
            kwdefaults = fn.__kwdefaults__
            seen += ((1, fn, "__code__", code), (1, fn, "__closure__", closure), (1, fn, "__defaults__", defaults),
                     (1, fn, "__kwdefaults__", kwdefaults))
            digest, names, attrs, file_digest = _code_info(code)
            self.feed(b"code", digest)
            self.feed(b"file", file_digest)
            g = fn.__globals__
            b = getattr(fn, "__builtins__", None)
            if b is None:
                b = g.get("__builtins__", {})
            if isinstance(b, _pytypes.ModuleType):
                b = b.__dict__
            for name in names:
                v = g.get(name, _MISSING)
                seen.append((0, g, name, v))
                if v is _MISSING:
                    v = b.get(name, _MISSING)
                    seen.append((0, b, name, v))
                self.feed(b"g", name.encode("utf-8", "surrogatepass"))
                self.value(v, attrs)
            for cell in closure or ():
                try:
                    v = cell.cell_contents
                except ValueError:  # an empty cell
                    v = _MISSING
                seen.append((2, cell, v))
                self.feed(b"cell")
                self.value(v, attrs)
            self.feed(b"defaults")
            self.value(defaults, attrs)
            for k, v in sorted((kwdefaults or {}).items()):
                seen.append((0, kwdefaults, k, v))
                self.feed(b"kw", k.encode("utf-8", "surrogatepass"))
                self.value(v, attrs)
            d = self.h.digest()
        finally:
            self.h = outer
            self.active.discard(id(fn))
            self.stack.pop()
        self.done[id(fn)] = d
        self.feed(b"F", d)

    def value(self, v, attrs) -> None:
        t = type(v)
        if v is _MISSING:
            self.feed(b"missing")
        elif v is None or t in (bool, int, float, complex):
            self.feed(t.__name__.encode(), repr(v).encode())
        elif t is str:
            self.feed(b"str", v.encode("utf-8", "surrogatepass"))
        elif t is bytes:
            self.feed(b"bytes", v)
        elif isinstance(v, (frozenset, set)):  # in an order that does not depend on hash seeds
            if t is set:
                self.seen.append((6, v, frozenset(v)))
            outer = self.h
            parts = []
            try:
                for x in v:
                    self.h = hashlib.sha256()
                    self.value(x, attrs)
                    parts.append(self.h.digest())
            finally:
                self.h = outer
            self.feed(b"set", _qualified(t).encode() + b"".join(sorted(parts)))
        elif isinstance(v, tuple):
            self.feed(b"tuple", f"{_qualified(t)}{getattr(t, '_fields', '')}/{len(v)}".encode())
            for x in v:
                self.value(x, attrs)
        elif isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise Unkeyable(f"an array of objects ({type(v).__name__})")
            d = _array_digest(v)
            self.seen.append((3, v, d))
            self.feed(b"array", d)
        elif isinstance(v, np.generic):
            self.feed(b"scalar", f"{v.dtype.str}|{v.dtype.descr}".encode() + v.tobytes())
        elif isinstance(v, np.dtype):
            self.feed(b"dtype", f"{v.str}|{v.descr}".encode())
        elif isinstance(v, enum.Enum):
            self.feed(b"enum", f"{_qualified(t)}.{v.name}".encode("utf-8", "surrogatepass"))
            self.value(v.value, attrs)
        elif isinstance(v, _pytypes.ModuleType):
            self.module(v, attrs)
        elif isinstance(v, _pytypes.FunctionType):
            if _is_library(v):
                self.feed(b"libfn", _qualified(v).encode("utf-8", "surrogatepass"))
            else:
                self.function(v)
        elif isinstance(getattr(v, "py_func", None), _pytypes.FunctionType):  # a dispatcher
            self.feed(b"dispatcher", f"{_qualified(t)}|{_options_text(getattr(v, 'targetoptions', None))}".encode(
                "utf-8", "surrogatepass"))
            self.function(v.py_func)
        elif isinstance(v, _nbtypes.Type):
            self.feed(b"nbtype", f"{_qualified(t)}|{v}".encode("utf-8", "surrogatepass"))
        elif isinstance(v, type):
            self.cls(v)
        elif isinstance(v, (_pytypes.BuiltinFunctionType, np.ufunc)):
            self.feed(b"lib", f"{_qualified(t)}|{_qualified(v)}".encode("utf-8", "surrogatepass"))
        else:  # bytearray and other objects: by their pickle
            d = _pickle_digest(v)
            self.seen.append((4, v, d))
            self.feed(b"pickle", _qualified(t).encode("utf-8", "surrogatepass") + d)

    def module(self, m, attrs) -> None:
        # numba freezes module attributes the code reads (mod.CONST,
        # mod.func): those of the names the code reads as attributes.
        self.feed(b"module", m.__name__.encode("utf-8", "surrogatepass"))
        if _is_library(m) or id(m) in self.active:
            return
        self.active.add(id(m))
        self.keep.append(m)
        try:
            d = m.__dict__
            for name in sorted(attrs):
                v = d.get(name, _MISSING)
                self.seen.append((0, d, name, v))
                if v is not _MISSING:
                    self.feed(b"attr", name.encode("utf-8", "surrogatepass"))
                    self.value(v, attrs)
        finally:
            self.active.discard(id(m))

    def cls(self, c) -> None:
        self.feed(b"class", _qualified(c).encode("utf-8", "surrogatepass"))
        if _is_library(c) or id(c) in self.active:
            return
        if isinstance(c, enum.EnumMeta):  # numba reads members by value
            for name, member in c.__members__.items():
                self.feed(b"member", name.encode("utf-8", "surrogatepass"))
                self.value(member.value, frozenset())
            return
        self.active.add(id(c))
        self.keep.append(c)
        try:
            ns = vars(c)
            self.seen.append((5, c, tuple(sorted(ns))))
            for name, v in sorted(ns.items()):
                self.seen.append((0, ns, name, v))
                if isinstance(v, (staticmethod, classmethod)):
                    v = v.__func__
                elif isinstance(v, property):
                    v = v.fget
                if isinstance(v, _pytypes.FunctionType) or isinstance(getattr(v, "py_func", None),
                                                                      _pytypes.FunctionType):
                    self.feed(b"member", name.encode("utf-8", "surrogatepass"))
                    self.value(v, frozenset())
            ct = ns.get("class_type")
            if hasattr(ct, "jit_methods"):  # a @jitclass: its fields and its methods' dispatchers
                self.feed(b"fields", repr([(k, str(t)) for k, t in getattr(ct, "struct", {}).items()]).encode())
                for group in ("jit_methods", "jit_static_methods", "jit_props"):
                    for name, d in sorted((getattr(ct, group, None) or {}).items()):
                        self.feed(group.encode(), name.encode("utf-8", "surrogatepass"))
                        for part in (sorted(d.items()) if isinstance(d, dict) else [("", d)]):
                            self.value(part[1], frozenset())
        finally:
            self.active.discard(id(c))


def code_key(py_func) -> bytes:
    """SHA-256 of what `py_func` runs under numba: its code, the values of
    the globals, closure cells and defaults it reads, and recursively the
    same of the functions and dispatchers it reaches (see the module's
    documentation). Raises Unkeyable for a value the key cannot hold."""
    w = _Walk()
    w.function(py_func)
    return w.h.digest()


_targets: Dict[int, tuple] = {}  # id(codegen) -> (codegen, CPU settings, magic tuple)


def _target(codegen) -> tuple:
    # codegen.magic_tuple() asks LLVM each time; it changes only with
    # numba's CPU settings.
    settings = (_config.CPU_NAME, _config.CPU_FEATURES)
    e = _targets.get(id(codegen))
    if e is None or e[0] is not codegen or e[1] != settings:
        e = _targets[id(codegen)] = (codegen, settings, tuple(str(x) for x in codegen.magic_tuple()))
    return e[2]


def _signature_text(sig) -> str:
    # A dispatcher passed as an argument (first-class functions) is named by
    # what it runs, not by its address.
    args = getattr(sig, "args", sig)
    ret = getattr(sig, "return_type", None)
    if not isinstance(args, tuple):
        return str(sig)
    parts = []
    for a in args:
        if isinstance(a, _nbtypes.Dispatcher):
            parts.append(f"Dispatcher({code_key(a.dispatcher.py_func).hex()})")
        else:
            parts.append(str(a))
    return f"({', '.join(parts)}) -> {ret}"


class FunctionCache(_Cache):
    """numba's per-function cache (numba.core.caching._Cache) over kcache:
    load_overload() begins the overload's flight, save_overload() commits it."""

    def __init__(self, py_func, targetoptions: Optional[dict] = None) -> None:
        self._py_func = py_func
        self._qualname = getattr(py_func, "__qualname__", py_func.__name__)
        self._label = f"{py_func.__module__}.{self._qualname}"
        self._options = _options_text(targetoptions)
        self._enabled = True
        self._fresh = False  # set by Dispatcher.recompile(): compile afresh, replace the entries
        self._warned = False
        self._unkeyable_logged = False
        self._pending: Dict[Any, Tuple[kcache.Key, bool]] = {}  # sig -> (key of its lookup, fresh)
        self._walked: Optional[tuple] = None  # (what the last walk read, its digest, mutual recursion)

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
        # numba flushes in recompile(): the compiles that follow (until
        # recompile returns) skip the lookup and replace what is stored.
        self._fresh = True

    def _code_key(self) -> bytes:
        # The last walk's digest while everything it read is unchanged (the
        # same objects; arrays and pickled values with the same contents),
        # else a new walk.
        w = self._walked
        if w is None or not _unchanged(w[0]):
            walk = _Walk()
            walk.function(self._py_func)
            w = self._walked = (walk.seen, walk.h.digest(), walk.mutual)
        if w[2] is not None:
            # numba crashes loading such functions from its own cache.
            raise Unkeyable(f"it reaches a mutual recursion (through {w[2]}), which numba cannot load from a cache")
        return w[1]

    def _key(self, sig, codegen) -> kcache.Key:
        triple, cpu, features = _target(codegen)
        return kcache.key(
            _NAMESPACE, label=self._label,
            function=self._qualname, module=str(self._py_func.__module__),
            code=self._code_key(),
            signature=_signature_text(sig), triple=triple, cpu=cpu, cpu_features=features,
            options=self._options,
            settings=repr((str(_config.OPT), _config.BOUNDSCHECK, _config.DEBUGINFO_DEFAULT)),
            numba=numba.__version__, llvmlite=llvmlite.__version__, numpy=np.__version__,
            numba_build=dist_build("numba", numba), llvmlite_build=dist_build("llvmlite", llvmlite),
            numpy_build=dist_build("numpy", np),
            python="%d.%d%s" % (sys.version_info[0], sys.version_info[1], getattr(sys, "abiflags", "")))

    def _key_or_none(self, sig, codegen) -> Optional[kcache.Key]:
        try:
            return self._key(sig, codegen)
        except Exception as e:  # Unkeyable, or a value that breaks the walk: numba could not cache it either
            if not self._unkeyable_logged:
                self._unkeyable_logged = True
                log("numba", f"{self._label}: not cached ({type(e).__name__}: {e})")
            return None

    def load_overload(self, sig, target_context):
        if not self._enabled:
            return None
        target_context.refresh()
        key = self._key_or_none(sig, target_context.codegen())
        if key is None:
            return None
        fresh = self._fresh
        self._pending[str(sig)] = (key, fresh)
        if fresh:
            return None
        try:
            c = cache()
        except Exception as e:  # the cache never fails a compile
            log("numba", f"{self._label}: lookup failed: {e}")
            return None
        entry = _flights.begin(c, key, "numba", self._label)
        if entry is None or _ARTIFACT not in entry:
            return None
        self._pending.pop(str(sig), None)
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
        # Stored under the key of this compile's lookup (the values its
        # compile read), else under a key made now.
        pending = self._pending.pop(str(sig), None)
        key, fresh = pending if pending is not None else (self._key_or_none(sig, cres.codegen), self._fresh)
        if key is None:
            self._cachable(cres)  # numba's warning for what it cannot cache
            return
        flight = _flights.pop(key.hex)
        try:
            if not self._enabled or not self._cachable(cres):
                if flight is not None:
                    flight.abandon()
                return
            artifacts = {_ARTIFACT: _dumps(cres._reduce())}
            if flight is not None and not fresh:
                flight.commit(artifacts)
            else:
                if flight is not None:
                    flight.abandon()
                cache().put(key, artifacts)  # replaces an entry stored under the key
        except Exception as e:  # never fail the compile
            log("numba", f"{self._label}: not stored ({type(e).__name__}: {e})")
            if flight is not None and not flight.done:
                flight.abandon()


def _enable_caching(self) -> None:
    self._cache = FunctionCache(self.py_func, self.targetoptions)


def _compile(self, sig):
    # A flight begun by this compile (in load_overload) that save_overload
    # neither committed nor marked (the compile raised) is ended here, so a
    # waiting process takes the compile over.
    if not isinstance(self._cache, FunctionCache):
        return _originals["compile"](self, sig)
    before = _flights.names()
    try:
        return _originals["compile"](self, sig)
    finally:
        _flights.abandon_new(before)


def _recompile(self):
    # numba's recompile() flushes the cache, then compiles each signature
    # again: those compiles skip the lookup and replace the stored entries.
    c = self._cache
    if not isinstance(c, FunctionCache):
        return _originals["recompile"](self)
    try:
        return _originals["recompile"](self)
    finally:
        c._fresh = False


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
        _originals["recompile"] = d.recompile
        d.compile = _compile
        d.recompile = _recompile
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

"""The cache manager Triton is given (TRITON_CACHE_MANAGER=kcache.triton:CacheManager).

A kernel's whole group (source and IR stages, cubin, metadata JSON) is one
kcache entry, stored in one atomic put, so a group mixed from two writers
cannot exist. A group that N processes miss at once is compiled once: the
first get_group() takes the key's single-flight lease (renewed while held)
and returns None, so Triton compiles; put_group() commits the group and lets
the lease go. The others wait inside get_group() and load the committed
entry. Hits are handed to Triton as written-out files (._files).

Each entry is labelled with the kernel's name and carries Triton's parsed
options, the target, Triton's version, a digest of triton_key() and the
values of the module-level names the kernel reads (which Triton 3.0 leaves
out of its hash) as readable components, so `kcache misses` says
which of them changed. A file
an option names (libdevice, in extern_libs) counts by its base name and
content, not its folder, so the key is the same wherever Triton is
installed."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
from typing import Dict, Optional, Tuple

import kcache
from triton.runtime.cache import CacheManager as _TritonCacheManager
from triton.runtime.cache import FileCacheManager

from .._hostutil import file_digest
from ._common import cache, log, to_bytes, triton
from ._files import materialiser
from ._hooks import Lease, drop_leases, watch_unwrapped
from ._key import triton_key_fn

_NAMESPACE = "triton/2"

_key_memo: Dict[Tuple[str, str], kcache.Key] = {}
_triton_key_digest: Optional[str] = None


def forget_keys() -> None:
    """Lets the remembered keys go (at exit: no kcache object outlives the
    interpreter)."""
    _key_memo.clear()


def _readable(v):
    # A component value kcache.key takes as it is (str, bool, a 64-bit
    # int), else its JSON text.
    if isinstance(v, (bool, str)) or (isinstance(v, int) and -2**63 <= v < 2**63):
        return v
    try:
        return json.dumps(v, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(v)


def _file_digest(path: str) -> Optional[str]:
    """The SHA-256 (32 hex digits) of the regular file `path` names
    (_hostutil.file_digest: read again when the file changes); None when it
    names none. OSError when it cannot be read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    digest = file_digest(path)
    if digest is None:
        raise OSError(f"cannot read {path}")
    return digest.hex()[:32]


def _named_file(v: str, any_name: bool = False) -> str:
    """`v`, or "<base name> sha256:<digest of its content>" when it names a
    regular file: when it holds a path separator, or with `any_name` (a
    path Triton opens as it is, relative ones too)."""
    if any_name or os.sep in v or (os.altsep is not None and os.altsep in v):
        digest = _file_digest(v)
        if digest is not None:
            return f"{os.path.basename(v)} sha256:{digest}"
    return v


def _portable(name: str, v):
    """An option's value with each file it names replaced by the file's
    base name and content digest (_named_file), so that the key says what
    the file holds and not where it is installed: extern_libs' paths (its
    (name, path) pairs, or a {name: path} dict), and any str, also inside
    tuples, lists and dicts, that holds a path separator and names a file.
    A value that names no file is returned as it is (its component is
    unchanged)."""
    def path(p):
        return _named_file(p, True) if isinstance(p, str) else _portable("", p)

    if isinstance(v, str):
        return _named_file(v)
    if isinstance(v, dict):
        if name == "extern_libs":
            out = {k: path(x) for k, x in v.items()}
        else:
            out = {k: _portable("", x) for k, x in v.items()}
        return v if all(out[k] is x for k, x in v.items()) else out
    if isinstance(v, (tuple, list)):
        if name == "extern_libs" and all(isinstance(e, (tuple, list)) and len(e) == 2 for e in v):
            out = []
            for e in v:
                p = path(e[1])
                out.append(e if p is e[1] else [e[0], p])
        else:
            out = [_portable("", x) for x in v]
        return v if all(a is b for a, b in zip(out, v)) else out
    return v


def _value_text(v) -> str:
    """A global's value as text that is the same in every process for the
    same value: sets sorted; ValueError for a value whose text is not all of
    it (an address, an array's repr shortened with "...")."""
    inner = getattr(v, "value", v) if type(v).__name__ == "constexpr" else v
    if isinstance(inner, (set, frozenset)):
        text = "%s{%s}" % (type(inner).__name__, ", ".join(sorted(_value_text(x) for x in inner)))
        return f"constexpr[{text}]" if inner is not v else text
    text = repr(v)
    if " at 0x" in text or "..." in text:
        raise ValueError(f"its text is not all of its value ({text[:80]})")
    return text


_hashes_globals: Optional[bool] = None


def _triton_hashes_globals() -> bool:
    """Whether this Triton's own kernel hash holds the values of the
    constexpr globals a kernel reads (JITFunction.cache_key, as read from
    its source: later releases do, 3.0 does not)."""
    global _hashes_globals
    if _hashes_globals is None:
        try:
            import inspect

            from triton.runtime.jit import JITFunction

            _hashes_globals = "constexpr_globals" in inspect.getsource(JITFunction.cache_key.fget)
        except Exception:
            _hashes_globals = False
    return _hashes_globals


def _globals_text(used) -> Optional[str]:
    """The module-level values a kernel (and every JIT function it calls)
    reads, as Triton recorded them while hashing it (JITFunction's
    used_global_vals): [module, name, text] sorted, as JSON. Triton
    releases whose own hash leaves them out (3.0 among those supported)
    would find a kernel compiled with an old value of a changed `SCALE:
    tl.constexpr`. ValueError when a value has no faithful text; None
    instead where Triton's own hash holds them (its hash is in the key)."""
    out = []
    for (name, _), (val, var_dict) in used.items():
        module = var_dict.get("__name__", "?") if isinstance(var_dict, dict) else "?"
        try:
            out.append([str(module), str(name), _value_text(val)])
        except ValueError as e:
            if _triton_hashes_globals():
                return None
            raise ValueError(f"the global {name} of {module}: {e}") from None
    return json.dumps(sorted(out))


def _compile_frame():
    """Triton's compile frame on this thread's stack (the compile that
    called the manager, however many calls lie between), or None."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "compile" and f.f_globals.get("__name__") == "triton.compiler.compiler":
            return f
        f = f.f_back
    return None


def _compile_components() -> Tuple[Optional[str], Optional[dict]]:
    """The label and readable components of the compile that called the
    manager: the kernel's name, target, Triton's parsed options and cache
    invalidating variables, and versions, read from Triton's compile frame.
    A file an option names (libdevice in extern_libs) counts by its base
    name and content, not its folder: the same Triton installed elsewhere
    gives the same key. The rest are functions of Triton's hash (which the
    key holds too), so they add no identity of their own; remembered per
    hash in the process. {} when no Triton compile is on the stack (Triton
    calls the manager nowhere else); None when there is one but its
    components cannot be read: that group is not cached, rather than kept
    under a key that lacks them."""
    global _triton_key_digest
    f = _compile_frame()
    if f is None:
        return None, {}
    try:
        loc = f.f_locals
        del f
        src, target, options = loc.get("src"), loc.get("target"), loc.get("options")
        comps: dict = {"triton_version": triton.__version__,
                       "python": "%d.%d" % sys.version_info[:2]}
        label = getattr(src, "name", None)
        if isinstance(label, str):
            comps["kernel"] = label
        else:
            label = None
        if target is not None:
            comps["target"] = f"{getattr(target, 'backend', '?')}:{getattr(target, 'arch', '?')}:" \
                              f"{getattr(target, 'warp_size', '?')}"
        if options is not None and hasattr(options, "__dict__"):
            for k, v in options.__dict__.items():
                if k not in comps and k not in ("label", "private"):
                    comps[k] = _readable(_portable(k, v))
        used = getattr(getattr(src, "fn", None), "used_global_vals", None)
        text = _globals_text(used) if used else None
        if text is not None:
            comps["globals"] = text
        env_vars = loc.get("env_vars")
        if isinstance(env_vars, dict):
            for k, v in env_vars.items():
                comps[f"env {k}"] = _readable(v)
        if _triton_key_digest is None:
            _triton_key_digest = hashlib.sha256(triton_key_fn()().encode()).hexdigest()[:32]
        comps["triton_key"] = _triton_key_digest
        return label, comps
    except Exception as e:
        log(f"a compile's options cannot be read ({type(e).__name__}: {e}): its kernel is compiled, not cached",
            once="components")
        return None, None


class CacheManager(_TritonCacheManager):
    """Triton's CacheManager over kcache (TRITON_CACHE_MANAGER=kcache.triton:CacheManager)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        # Dump and override folders are for people to read and edit: Triton's
        # own file manager keeps them.
        self._files_only = FileCacheManager(key, override=override, dump=dump) if (override or dump) else None
        self._lease: Optional[Lease] = None
        self._staged: Dict[str, bytes] = {}
        self._paths: Dict[str, str] = {}
        self._group_keys: Dict[str, kcache.Key] = {}

    def _key(self, filename: str, label: Optional[str] = None, comps: Optional[dict] = None) -> kcache.Key:
        memo = (self.key, filename)
        k = _key_memo.get(memo)
        if k is None:
            if comps is None:
                label, comps = None, {}
            comps = {n: v for n, v in comps.items() if n not in ("triton", "file")}
            k = kcache.key(_NAMESPACE, label=label, **comps, triton=self.key, file=filename)
            if len(_key_memo) > 4096:
                _key_memo.clear()
            _key_memo[memo] = k
        return k

    def _group_key(self, filename: str) -> Optional[kcache.Key]:
        """The key of the group `filename`: the one this manager looked up,
        else the one remembered in the process, else made from the
        components of the compile that called. None when those cannot be
        read: the group is then neither looked up nor stored."""
        k = self._group_keys.get(filename) or _key_memo.get((self.key, "__grp__" + filename))
        if k is None:
            label, comps = _compile_components()
            if comps is None:
                return None
            k = self._key("__grp__" + filename, label, comps)
        self._group_keys[filename] = k
        return k

    def _drop_flight(self) -> None:
        if self._lease is not None:
            self._lease.drop()
            self._lease = None

    # ---- groups: one entry, one flight -------------------------------------

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        if self._files_only is not None:
            return self._files_only.get_group(filename)
        self._drop_flight()
        k = self._group_key(filename)
        if k is None:
            return None
        hx = k.hex
        drop_leases(threading.get_ident(), key=hx)  # this thread is back here: that compile is over
        try:
            flight = cache().begin(k)
        except Exception as e:  # the cache never fails a compile
            log(f"lookup failed: {e}")
            return None
        if flight.hit:
            try:
                group = materialiser().materialise(flight.entry)
            except OSError as e:
                log(f"cannot write out {flight.entry.key_hex}: {e}")
                group = None
            if group is not None and filename in group:
                return group
            # Not usable: compile, and let the compile's put_group store it.
            return None
        lease = Lease(flight, hx)
        self._lease = lease
        try:
            watch_unwrapped(lease)
        except Exception:
            pass
        return None

    def put_group(self, filename: str, group: Dict[str, str]) -> Optional[str]:
        if self._files_only is not None:
            return self._files_only.put_group(filename, group)
        artifacts: Dict[str, bytes] = {}
        for name, path in group.items():
            data = self._staged.get(name)
            if data is None:
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError as e:
                    log(f"group {filename}: cannot read {path}: {e}; not stored")
                    self._drop_flight()
                    return None
            artifacts[name] = data
        lease, self._lease = self._lease, None
        flight = lease.take() if lease is not None else None
        try:
            if flight is not None and flight.owner:
                entry, flight = flight.commit(artifacts), None
            else:
                k = self._group_key(filename)
                entry = cache().put(k, artifacts) if k is not None else None
            if entry is not None and cache().tiers():  # nothing to publish with the cache disabled
                materialiser().publish_compiled(entry, {n: p for n, p in group.items() if self._paths.get(n) == p})
        except Exception as e:
            log(f"group {filename} not stored: {e}")
        finally:
            if flight is not None:  # not committed
                try:
                    flight.abandon()
                except Exception:
                    pass
        self._staged.clear()
        grp = json.dumps({"child_paths": group})
        return materialiser().stage(self.key, f"__grp__{filename}", grp.encode())

    # ---- single files (launchers, autotuning results) ----------------------

    def get_file(self, filename: str) -> Optional[str]:
        if self._files_only is not None:
            return self._files_only.get_file(filename)
        path = self._paths.get(filename)
        if path is not None:
            return path
        try:
            e = cache().get(self._key(filename))
            if e is None or filename not in e:
                return None
            paths = materialiser().materialise(e)
        except Exception as err:
            log(f"lookup of {filename} failed: {err}")
            return None
        return paths.get(filename) if paths else None

    def put(self, data, filename: str, binary: bool = True) -> str:
        if self._files_only is not None:
            return self._files_only.put(data, filename, binary=binary)
        data = to_bytes(data)
        path = materialiser().stage(self.key, filename, data)
        self._paths[filename] = path
        if self._lease is not None:
            # Part of the group being compiled: stored with it in put_group.
            self._staged[filename] = data
        else:
            try:
                cache().put(self._key(filename), {filename: data})
            except Exception as e:
                log(f"{filename} not stored: {e}")
        return path

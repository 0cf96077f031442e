"""kcache.warp: Warp's kernel cache in kcache.

    import kcache.warp
    kcache.warp.enable()           # before the first kernel launch

Every module Warp builds (one per Python module of kernels, per device kind,
block size and option set) is one kcache entry holding its binary (the CPU
object file, or the CUDA cubin/PTX), its metadata file and its generated
source, under a key made of Warp's module hash (the kernels' code and the
module's options), the module name (the label), the output file name (which
names the target: CUDA architecture, or the CPU target hash of LLVM version
and ISA features), the block size and Warp's version.

A module that N processes miss at once is built once: the first process
owns the key's flight and builds; the others wait and load its entry. A
build that raises abandons the flight, and a waiting process takes the build
over. The size limit, verification, statistics, KCACHE_REMOTE (values
signed with KCACHE_REMOTE_SECRET_FILE) and every other KCACHE_* variable are
kcache's. The folder is $KCACHE_DIR, else <warp.config.kernel_cache_dir>/kcache.

Warp loads a module from files in its kernel cache folder, so a hit is
written out there: each file is left alone when it already holds the
entry's bytes, else written under a temporary name and renamed into place
(re-written whenever it is missing or differs, so the files Warp loads are
always those of a verified entry; a file that cannot be written makes the
module build as if kcache were not there). A build runs in a folder of its
own and its files are then written out the same way; the folder is removed
when the build ends, however it ends. A process killed mid-build leaves its
folder behind: a later build in the same kernel cache folder removes it once
its process has ended (the rules are at _sweep).

Plugged in by wrapping warp._src.context.Module._compile (the private method
Module.load calls to build a module into the kernel cache, which reports
whether it built). Ahead-of-time builds (wp.compile_aot_module), modules
with strip_hash and autograd-access verification builds keep Warp's path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
import uuid
from typing import Any, Dict, Optional

import kcache
import warp
import warp.config as _wconfig
from warp._src import context as _context

from ._hostutil import Flights, ProcessCache, dist_build, log, write_file

__all__ = ["cache", "enable", "enabled"]

_NAMESPACE = "warp/1"


def _default_dir() -> Optional[str]:
    d = _wconfig.kernel_cache_dir
    return os.path.join(d, "kcache") if d else None


cache = ProcessCache("warp", _default_dir)
cache.__doc__ = "The process's kcache for Warp (opened on first use, and again after fork)."
_flights = Flights()
_enabled = False
_originals: Dict[str, Any] = {}


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


# Build folders (see _compile) are named <module folder>_kcache_<ns>_p<pid>_<8
# hex digits>, where <ns> names this machine's boot and the process's pid
# namespace (absent where it cannot be read: not Linux); Warp's own build
# folder for a build is that name followed by _p<pid>_t<thread>. One that
# a process killed mid-build (SIGKILL, the OOM killer) leaves behind is
# removed by a later build in the same kernel cache folder (_sweep) when:
#  * its <ns> is this process's and no process has its pid: the pid is one of
#    this namespace on this boot, so its builder has ended, whatever the
#    folder's age (a reused pid keeps the folder, until the last rule);
#  * no process here has its pid and it is older than STRAY_DEAD_AGE_S: a
#    folder of another machine or container (a shared kernel cache folder),
#    or one without <ns>, whose pid says nothing here; an hour is longer than
#    any build leaves its folder unchanged;
#  * it is older than STRAY_ANY_AGE_S, whatever its pid (one reused by a live
#    process, or live in another namespace): no build takes a day.
STRAY_DEAD_AGE_S = 3600.0
STRAY_ANY_AGE_S = 86400.0
SWEEP_INTERVAL_S = 600.0  # a process sweeps a kernel cache folder at most this often
_SWEEP_MAX_REMOVED = 64
_SWEEP_MAX_S = 0.2
_STRAY = re.compile(r"\Awp_.+_[0-9a-f]{7}_kcache_(?:([0-9a-f]{12})_)?p([0-9]+)_[0-9a-f]{8}(?:_p[0-9]+_t[0-9]+)?\Z",
                    re.S)
_swept: Dict[str, float] = {}
_swept_lock = threading.Lock()
_ns: Optional[str] = None


def _ns_tag() -> str:
    """12 hex digits naming this boot of the machine and the process's pid
    namespace, or "" where they cannot be read."""
    global _ns
    if _ns is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                boot = f.read().strip()
            st = os.stat("/proc/self/ns/pid")
            _ns = hashlib.sha256(b"%s:%d:%d" % (boot, st.st_dev, st.st_ino)).hexdigest()[:12] if boot else ""
        except (OSError, ValueError):
            _ns = ""
    return _ns


def _pid_alive(pid: int) -> bool:
    """Whether a process has this pid here (True when that cannot be told)."""
    if os.name != "posix" or pid <= 0:
        return True  # Windows' os.kill terminates
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: another user's process
        return True
    return True


def _sweep(folder: str) -> None:
    """Removes the build folders in `folder` (a kernel cache folder) left by
    processes that ended mid-build, by the rules above; at most once per
    SWEEP_INTERVAL_S in a process, _SWEEP_MAX_REMOVED folders and about
    _SWEEP_MAX_S; never raises, one log line at most."""
    try:
        start = time.monotonic()
        with _swept_lock:
            last = _swept.get(folder)
            if last is not None and start - last < SWEEP_INTERVAL_S:
                return
            _swept[folder] = start
        ns, me, now, removed = _ns_tag(), os.getpid(), time.time(), 0
        with os.scandir(folder) as it:
            for e in it:
                if removed >= _SWEEP_MAX_REMOVED or time.monotonic() - start > _SWEEP_MAX_S:
                    break
                m = _STRAY.match(e.name)
                if m is None or int(m.group(2)) == me:
                    continue
                try:
                    if not e.is_dir(follow_symlinks=False):
                        continue
                    age = now - e.stat(follow_symlinks=False).st_mtime
                except OSError:  # gone meanwhile
                    continue
                ended = not _pid_alive(int(m.group(2)))
                if age > STRAY_ANY_AGE_S or (ended and ((ns and m.group(1) == ns) or age > STRAY_DEAD_AGE_S)):
                    shutil.rmtree(e.path, ignore_errors=True)
                    removed += 1
        if removed:
            log("warp", f"removed {removed} build folder(s) of ended processes from {folder}")
    except Exception as e:  # cleaning up never fails a build
        log("warp", f"build folders in {folder} not cleaned up: {e}")


def _write_out(entry: kcache.Entry, output_dir: str, needed) -> bool:
    names = entry.keys()
    if not all(_safe_name(n) for n in names) or not all(n in names for n in needed):
        log("warp", f"entry {entry.key_hex} lacks a module file; building")
        return False
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        log("warp", f"cannot create {output_dir}: {e}; building")
        return False
    for n, data in entry.items():
        if not write_file(os.path.join(output_dir, n), bytes(data)):
            log("warp", f"cannot write {n} into {output_dir}; building")
            return False
    return True


def _compile(self, device=None, output_dir=None, output_name=None, output_arch=None, use_ptx=None, options=None):
    orig = _originals["_compile"]
    if (output_dir is None or output_name is None or options is None or not _wconfig.cache_kernels
            or options.get("verify_autograd_array_access", False) or self.options.get("strip_hash")):
        return orig(self, device, output_dir, output_name, output_arch, use_ptx, options)
    output_dir = os.fspath(output_dir)
    block_dim = options["block_dim"]
    try:
        meta_name = self._get_meta_name(block_dim=block_dim)
        key = kcache.key(_NAMESPACE, label=str(self.name), module=str(self.name),
                         module_hash=bytes(self.get_module_hash(block_dim)), output=str(output_name),
                         block_dim=int(block_dim), arch="cpu" if output_arch is None else str(output_arch),
                         warp=str(_wconfig.version), warp_build=dist_build("warp-lang", warp))
        c = cache()
    except Exception as e:  # the cache never fails a build
        log("warp", f"module {self.name}: lookup failed: {e}")
        return orig(self, device, output_dir, output_name, output_arch, use_ptx, options)
    # The entry, or None: this thread owns the module's flight now (kept in
    # _flights until the build is stored), or builds it without one.
    entry = _flights.begin(c, key, "warp", f"module {self.name}")
    if entry is not None and _write_out(entry, output_dir, (output_name, meta_name)):
        return False
    del entry
    # Build into a folder of this process, then store and write out.
    ns = _ns_tag()
    build_dir = f"{os.path.normpath(output_dir)}_kcache_{ns + '_' if ns else ''}p{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        orig(self, device, build_dir, output_name, output_arch, use_ptx, options)
        artifacts: Dict[str, bytes] = {}
        for n in os.listdir(build_dir):
            p = os.path.join(build_dir, n)
            if os.path.isfile(p) and (n in (output_name, meta_name) or n.startswith(os.path.splitext(meta_name)[0])):
                with open(p, "rb") as f:
                    artifacts[n] = f.read()
        if output_name not in artifacts or meta_name not in artifacts:
            raise FileNotFoundError(f"Warp did not build {output_name} and {meta_name}")
    except BaseException:
        # Nothing stored: the flight ends unstored (a waiting process takes
        # the build over) and the error goes on as Warp raised it. Warp
        # leaves its own build folder when its build raises.
        _flights.abandon(key.hex)
        shutil.rmtree(build_dir, ignore_errors=True)
        shutil.rmtree(f"{build_dir}_p{os.getpid()}_t{threading.get_ident()}", ignore_errors=True)
        raise
    flight = _flights.pop(key.hex)
    entry = None
    try:
        entry = flight.commit(artifacts) if flight is not None else cache().put(key, artifacts)
    except Exception as e:
        log("warp", f"module {self.name}: not stored: {e}")
        if flight is not None and not flight.done:
            flight.abandon()
    shutil.rmtree(build_dir, ignore_errors=True)
    del entry
    _sweep(os.path.dirname(os.path.normpath(output_dir)))
    try:
        os.makedirs(output_dir, exist_ok=True)
        written = all(write_file(os.path.join(output_dir, n), data) for n, data in artifacts.items())
    except OSError:
        written = False
    if not written:
        log("warp", f"module {self.name}: cannot write its files into {output_dir}; Warp builds it there")
        return orig(self, device, output_dir, output_name, output_arch, use_ptx, options)
    return True


def enable() -> None:
    """Makes Warp keep every module it builds in kcache. Idempotent."""
    global _enabled
    if _enabled:
        return
    if "_compile" not in _originals:
        _originals["_compile"] = _context.Module._compile
    _context.Module._compile = _compile
    _enabled = True


def disable() -> None:
    """Warp's own kernel cache again."""
    global _enabled
    if _enabled:
        _context.Module._compile = _originals["_compile"]
        _enabled = False


def enabled() -> bool:
    """Whether enable() is in effect."""
    return _enabled


"""kcache.triton: Triton's kernel cache in kcache (Triton 3.0 to 3.x).

    import kcache.triton; kcache.triton.install()   # at the top of the program

or, without touching the program,

    TRITON_CACHE_MANAGER=kcache.triton:CacheManager

install() sets TRITON_CACHE_MANAGER (unless already set), wraps Triton's
compile so that a compile that raises gives up its single-flight lease at
once, and remembers Triton's `triton_key()` across processes (see below).
The variable alone gives the same cache and the same remembered
`triton_key()`: the package's start-up hook (kcache-boot.pth, run at
interpreter start; python/_kcache_boot.py) does nothing unless the variable
names kcache.triton, and then imports this module right after Triton's
package has loaded, before Triton first computes its key. Where the hook is
not installed (the package put on sys.path by hand), `triton_key()` is
computed by Triton as usual and the wrapper is installed when Triton first
imports the manager, inside the process's first compile, which is watched
instead (a trace function on Triton's compile frame alone, until it
returns; not while a debugger or coverage tool traces).

A kernel's whole group (source and IR stages, cubin, metadata JSON) is one
kcache entry, stored in one atomic put, so a group mixed from two writers
cannot exist. A group that N processes miss at once is compiled once: the
first get_group() takes the key's single-flight lease (renewed while held) and
returns None, so Triton compiles; put_group() commits the group and lets the
lease go. The other processes wait inside get_group() and load the committed
entry. A compile that raises gives the lease up at once (an exception kept
alive, as a notebook keeps the last one, holds nothing), and a process that
dies holding it is taken over at once by a waiter on the same host. The
size limit, eviction, verification and statistics are kcache's
(KCACHE_MAX_SIZE, `kcache stats`).

Each entry is labelled with the kernel's name and carries Triton's parsed
options, the target, Triton's version and a digest of `triton_key()` as
readable components, so `kcache misses` says which of them changed.

The kcache folder is $KCACHE_DIR, else <TRITON_CACHE_DIR>/kcache. Every other
KCACHE_* variable applies too; KCACHE_REMOTE adds a shared Redis tier (values
signed with KCACHE_REMOTE_SECRET_FILE) with cross-machine single-flight.

Triton opens a kernel's files by path, so each hit is written out
("materialised") under <TRITON_CACHE_DIR>/kcache-files/: into a fresh
temporary folder first, which is then renamed into place, so no reader ever
sees half a group. A process that compiles a group publishes its files the
same way (hard links to its own copies). Before a folder is handed to
Triton its files are checked against the entry (size, then bytes; once per
process, then by their inode, size and times, at most once a second): a
file removed or changed is written out again (temporary name, then rename).
A folder that cannot be
written (a read-only TRITON_CACHE_DIR, a full disk) is replaced for this
process by a private temporary folder, removed when it exits: hits are
still served, and a read-only store is never written (KCACHE_READONLY=1
with the files engine; an LMDB store needs its lock file writable, so in a
read-only folder its disk tier is left out and Triton compiles).

The written-out folders have a limit of their own, the value of
KCACHE_MAX_SIZE (default 4G): when they grow past it, the least recently
used are removed (never one used in the last two minutes). Their sizes are
added up when a process starts, at most every ten minutes, and after a
process wrote an eighth of the limit. Folders not used
for a day are removed too; the files a process writes while it compiles
live in a folder of its own, removed when it exits (or by a later process
once it is dead).

triton_key() (Triton's digest of its own sources and of libtriton.so,
hundreds of MB read in every process) is remembered in the kcache store
under the identity of every file and folder it read (path, inode, size,
mtime, ctime): a process whose Triton files all match uses the remembered
value, which is the value Triton computed; any change (a reinstall, a
touched library, an edited module, a module added) computes it afresh.

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend

uses Triton's own remote manager with kcache's Redis tier as the backend
($KCACHE_REMOTE, else redis://$TRITON_REDIS_HOST:$TRITON_REDIS_PORT; HMAC
with $KCACHE_REMOTE_SECRET_FILE): a value that fails its MAC is a miss.
"""

from __future__ import annotations

import atexit
import errno
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, List, Optional, Tuple

import kcache

try:
    import triton
    import triton.runtime.cache as _triton_cache
    from triton.runtime.cache import CacheManager as _TritonCacheManager
    from triton.runtime.cache import FileCacheManager
    from triton.runtime.cache import RemoteCacheBackend as _TritonRemoteCacheBackend
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kcache.triton needs Triton 3.0 or later, which is not installed here "
        f"({_e}): pip install 'kcache[triton]'") from _e


def _version(v: str) -> Tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) or "0"
        out.append(int(digits))
    return tuple(out)


TRITON_VERSION = _version(triton.__version__)
if not (3, 0) <= TRITON_VERSION < (4, 0):
    raise ImportError(f"kcache.triton supports Triton 3.0 to 3.x; this is Triton {triton.__version__}")

try:  # Triton 3.4 and later
    from triton import knobs as _knobs
except ImportError:
    _knobs = None

__all__ = ["CacheManager", "RemoteBackend", "cache", "files_dir", "install", "triton_key", "triton_key_source"]

_NAMESPACE = "triton/2"
_REMOTE_NAMESPACE = "triton-remote/1"
_KEY_NAMESPACE = "triton-key/1"
_DAY_S = 24 * 3600
_TOUCH_S = 60
_RECENT_S = 120
_DEFAULT_FILES_MAX = 4 << 30
_SIZE_SWEEP_S = 600
_RECHECK_S = 1.0  # a folder checked this long ago by this process is not checked again

_lock = threading.RLock()
_cache: Optional[kcache.Cache] = None
_cache_pid = 0
_remote_cache: Optional[kcache.Cache] = None
_remote_pid = 0
_files: Optional["_Files"] = None
_files_pid = 0
_logged = set()


def _log(msg: str, once: Optional[str] = None) -> None:
    if once is not None:
        if once in _logged:
            return
        _logged.add(once)
    if os.environ.get("KCACHE_LOG", "warn") not in ("off", "error"):
        print(f"kcache: warn: triton: {msg}", file=sys.stderr)


def _triton_cache_dir() -> str:
    if _knobs is not None:
        return _knobs.cache.dir
    return os.getenv("TRITON_CACHE_DIR", "").strip() or _triton_cache.default_cache_dir()


def _redis_url() -> str:
    if _knobs is not None:
        host, port = _knobs.cache.redis.host, _knobs.cache.redis.port
    else:
        host, port = os.environ.get("TRITON_REDIS_HOST", "localhost"), os.environ.get("TRITON_REDIS_PORT", "6379")
    return f"redis://{host}:{port}"


def cache() -> kcache.Cache:
    """The process's kcache for Triton (opened on first use, and again in a
    child of fork(), which must not use its parent's)."""
    global _cache, _cache_pid
    c = _cache
    if c is None or _cache_pid != os.getpid():
        with _lock:
            if _cache is None or _cache_pid != os.getpid():
                d = None if os.environ.get("KCACHE_DIR") else os.path.join(_triton_cache_dir(), "kcache")
                _cache = kcache.Cache(d, producer="triton")
                _cache_pid = os.getpid()
            c = _cache
    return c


def files_dir() -> str:
    """Where hits are materialised for Triton to read."""
    return _materialiser().root


def _materialiser() -> "_Files":
    global _files, _files_pid
    f = _files
    if f is None or _files_pid != os.getpid():
        with _lock:
            if _files is None or _files_pid != os.getpid():
                _files = _Files(os.path.join(_triton_cache_dir(), "kcache-files"))
                _files_pid = os.getpid()
            f = _files
    return f


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..") \
        and not name.startswith(".kcache")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse_size(text: str) -> Optional[int]:
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1 << (10 * ("KMGT".index(t[-1]) + 1))
        t = t[:-1]
    try:
        v = float(t)
    except ValueError:
        return None
    return int(v * mult) if v > 0 else None


def _files_limit() -> int:
    text = os.environ.get("KCACHE_MAX_SIZE")
    if text:
        v = _parse_size(text)
        if v is not None:
            return v
    return _DEFAULT_FILES_MAX


def _ident(st: os.stat_result) -> Tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


class _Files:
    """The materialised files: shared, read-only folders of hits named by
    entry (key and creation time), and this process's own staging folder.
    A root that cannot be written is replaced by a private temporary
    folder (removed at exit)."""

    def __init__(self, root: str) -> None:
        self.pid = os.getpid()
        self._staging: Optional[str] = None
        self._verified: Dict[str, Tuple] = {}  # folder -> identities of its checked files
        self._published = 0
        self.limit = _files_limit()
        self.private = False
        self.root = root
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            if not os.access(root, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "not writable", root)
        except OSError as e:
            self._go_private(e)
            return
        self._sweep()

    def _go_private(self, why: OSError) -> None:
        if self.private:
            raise why
        shared = self.root
        self.root = tempfile.mkdtemp(prefix="kcache-triton-")
        self.private = True
        self._staging = None
        self._verified.clear()
        atexit.register(shutil.rmtree, self.root, True)
        _log(f"cannot write {shared} ({why.strerror or why}); hits are written out to {self.root} for this process",
             once="private")

    def _writing(self, fn, *args):
        """Runs a write; a folder that cannot be written moves this process
        to its private folder, where the write is tried once more."""
        try:
            return fn(*args)
        except OSError as e:
            if e.errno not in _UNWRITABLE or self.private:
                raise
            self._go_private(e)
            return fn(*args)

    def _sweep(self, sizes: bool = False) -> None:
        # Removes what nobody can need any more: staging folders of dead
        # processes, temporary folders older than a day, hit folders not
        # used for a day, and the least recently used hit folders beyond
        # the limit. A folder is renamed away first, so a reader never sees
        # one half removed; one used in the last minutes is kept.
        now = time.time()
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        hits = []
        for n in names:
            if n.startswith("."):
                continue
            p = os.path.join(self.root, n)
            dead = False
            try:
                if n.startswith("pid-"):
                    dead = not _pid_alive(int(n.split("-")[1]))
                elif n.startswith("del-"):
                    dead = True
                else:
                    mtime = os.stat(p).st_mtime
                    dead = now - mtime > _DAY_S
                    if not dead and not n.startswith("tmp-"):
                        hits.append((mtime, p))
            except (OSError, ValueError, IndexError):
                continue
            if dead:
                self._remove(p)
        # The sizes: at most every ten minutes (any process; the time of
        # .swept says when), or when this process wrote an eighth of the
        # limit since.
        stamp = os.path.join(self.root, ".swept")
        if not sizes:
            try:
                if now - os.stat(stamp).st_mtime < _SIZE_SWEEP_S:
                    return
            except OSError:
                pass
        try:
            with open(stamp, "wb"):
                pass
        except OSError:
            pass
        total, sized = 0, []
        for mtime, p in hits:
            size = 0
            try:
                for f in os.scandir(p):
                    size += f.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            total += size
            sized.append((mtime, size, p))
        if total <= self.limit:
            return
        for mtime, size, p in sorted(sized):
            if total <= self.limit:
                break
            if now - mtime < _RECENT_S:
                continue
            if self._remove(p):
                total -= size

    def _remove(self, p: str) -> bool:
        gone = os.path.join(self.root, f"del-{os.getpid()}-{uuid.uuid4().hex}")
        try:
            os.rename(p, gone)
        except OSError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def _count(self, nbytes: int) -> None:
        # Written-out bytes since the last sweep: past an eighth of the
        # limit, the folder is swept again.
        self._published += nbytes
        if self._published > self.limit // 8:
            self._published = 0
            self._sweep(sizes=True)

    def _staging_dir(self, key: str) -> str:
        if self._staging is None or os.getpid() != self.pid:
            self.pid = os.getpid()
            self._staging = os.path.join(self.root, f"pid-{self.pid}-{uuid.uuid4().hex[:12]}")
            os.makedirs(self._staging, mode=0o700, exist_ok=True)
            atexit.register(shutil.rmtree, self._staging, True)
        d = os.path.join(self._staging, key)
        os.makedirs(d, mode=0o700, exist_ok=True)
        return d

    def stage(self, key: str, filename: str, data: bytes) -> str:
        """Writes a file this process compiled (temp name, then rename)."""
        def write() -> str:
            path = os.path.join(self._staging_dir(key), filename)
            tmp = f"{path}.tmp.{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            return path
        return self._writing(write)

    def _publish(self, d: str, write) -> None:
        # Fills a fresh temporary folder, then renames it to `d`: a reader
        # sees the whole folder or none of it.
        tmp = os.path.join(self.root, f"tmp-{os.getpid()}-{uuid.uuid4().hex}")
        os.mkdir(tmp, 0o700)
        try:
            write(tmp)
            try:
                os.rename(tmp, d)
            except OSError as e:
                # Another process published the same entry first.
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)

    def _entry_dir(self, entry: kcache.Entry) -> str:
        return os.path.join(self.root, f"{entry.key_hex}.{entry.created_unix_ms}")

    def publish_compiled(self, entry: kcache.Entry, staged: Dict[str, str]) -> None:
        """Publishes the files this process just compiled (hard links to its
        staged copies) as the entry's folder, so that other processes and
        later runs find them without writing them out again."""
        names = entry.keys()
        if not all(_safe_name(n) for n in names):
            return
        d = self._entry_dir(entry)
        if os.path.exists(d):
            return
        size = 0

        def write(tmp: str) -> None:
            nonlocal size
            for n, data in entry.items():
                size += len(data)
                src = staged.get(n)
                if src is not None:
                    try:
                        os.link(src, os.path.join(tmp, n))
                        continue
                    except OSError:
                        pass
                with open(os.path.join(tmp, n), "wb") as f:
                    f.write(data)

        self._publish(d, write)
        self._count(size)

    def materialise(self, entry: kcache.Entry) -> Optional[Dict[str, str]]:
        """The paths of the entry's artifacts, written out once per entry on
        this machine and checked against the entry before each use; None
        when the entry cannot be used."""
        names = entry.keys()
        if not all(_safe_name(n) for n in names):
            _log(f"entry {entry.key_hex} has an unsafe artifact name; ignored")
            return None
        return self._writing(self._materialise, entry, names)

    def _materialise(self, entry: kcache.Entry, names: List[str]) -> Dict[str, str]:
        d = self._entry_dir(entry)
        known = self._verified.get(d)
        if known is not None and time.monotonic() - known[1] < _RECHECK_S:
            # Checked by this process a moment ago: the folder is still there.
            try:
                if time.time() - os.stat(d).st_mtime <= _TOUCH_S:
                    return dict(known[2])
            except OSError:
                pass
        paths = {n: os.path.join(d, n) for n in names}
        try:
            st = os.stat(d)
        except FileNotFoundError:
            size = 0

            def write(tmp: str) -> None:
                nonlocal size
                for n, data in entry.items():
                    size += len(data)
                    with open(os.path.join(tmp, n), "wb") as f:
                        f.write(data)

            self._publish(d, write)
            self._verified.pop(d, None)
            self._check(d, entry, paths)
            self._count(size)
            return paths
        if time.time() - st.st_mtime > _TOUCH_S:
            try:
                os.utime(d)
            except OSError:
                pass  # a folder of another user, or read-only: still usable
        self._check(d, entry, paths)
        return paths

    def _check(self, d: str, entry: kcache.Entry, paths: Dict[str, str]) -> None:
        # Each file against the entry: by their identities when this process
        # checked them before, else size and bytes. A missing or different
        # file is written again (temporary name, then rename).
        known = self._verified.get(d)
        idents = []
        try:
            idents = [_ident(os.stat(p)) for p in paths.values()]
            if known is not None and tuple(idents) == known[0]:
                self._verified[d] = (known[0], time.monotonic(), paths)
                return
        except OSError:
            idents = []
        fixed = []
        for (n, p) in paths.items():
            data = entry[n]
            try:
                st = os.stat(p)
                if st.st_size == len(data):
                    with open(p, "rb") as f:
                        if f.read() == data:
                            continue
            except OSError:
                pass
            tmp = os.path.join(d, f".kcache-tmp-{os.getpid()}-{uuid.uuid4().hex}")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, p)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            fixed.append(n)
        if fixed:
            _log(f"written-out files {', '.join(fixed)} of {os.path.basename(d)} were missing or damaged; written again")
        try:
            self._verified[d] = (tuple(_ident(os.stat(p)) for p in paths.values()), time.monotonic(), paths)
        except OSError:
            self._verified.pop(d, None)


def _to_bytes(data) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


# ---- leases of compiles in flight ------------------------------------------------

class _Lease:
    """A compile's flight, held for its manager. Dropped (abandoned, and
    the Flight let go) when the compile raises, when the same thread comes
    back for the same key, or at exit: so an exception kept alive, whose
    frames keep the manager, keeps no lease and no kcache object."""

    __slots__ = ("flight", "thread", "key")

    def __init__(self, flight: kcache.Flight, key: str) -> None:
        self.flight: Optional[kcache.Flight] = flight
        self.thread = threading.get_ident()
        self.key = key

    def take(self) -> Optional[kcache.Flight]:
        with _lock:
            f, self.flight = self.flight, None
            _leases.discard(self)
        return f

    def drop(self) -> None:
        f = self.take()
        if f is not None:
            try:
                f.abandon()
            except Exception:
                pass


_leases: set = set()


def _drop_leases(thread: Optional[int] = None, since: Optional[set] = None) -> None:
    with _lock:
        mine = [le for le in _leases if (thread is None or le.thread == thread) and (since is None or le not in since)]
    for le in mine:
        le.drop()


_compile_failed = False


def _failed(e: Optional[BaseException]) -> None:
    """A compile raised: its lease goes now, and the frames of Triton's
    finished calls under it let their locals go (MLIR contexts, modules,
    the manager), so an exception kept alive holds none of them."""
    global _compile_failed
    _compile_failed = True
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            try:
                tb.tb_frame.clear()
                # The dict a tracer or f_locals made of its locals, too
                # (before Python 3.13; f_locals is then a proxy without clear).
                locs = tb.tb_frame.f_locals
                if isinstance(locs, dict):
                    locs.clear()
            except Exception:
                pass  # still running (the wrapper, the caller)
            tb = tb.tb_next
        e = e.__cause__ or e.__context__


def _wrap_compile(fn):
    if getattr(fn, "_kcache_wrapped", None) is not None:
        return fn

    @functools.wraps(fn)
    def compile(*args, **kwargs):
        with _lock:
            before = set(_leases)
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            # The compile failed: its lease goes now, not when the
            # exception (and the frames that hold the manager) is freed.
            _drop_leases(threading.get_ident(), before)
            _failed(e)
            raise
        finally:
            _tls.depth -= 1

    compile._kcache_wrapped = fn
    return compile


_tls = threading.local()


def _no_trace(frame, event, arg):
    return None


def _watch_unwrapped(lease: _Lease) -> None:
    """A compile that started before the wrapper was installed (the first
    of a process that names the manager only in TRITON_CACHE_MANAGER):
    Triton's compile frame is watched, with a trace function on that frame
    alone, until it returns; a lease still held then (the compile raised)
    is given up. Not where a tracer (a debugger, coverage) is active."""
    if getattr(_tls, "depth", 0) or sys.gettrace() is not None:
        return
    f = sys._getframe(2)
    while f is not None and not (f.f_code.co_name == "compile"
                                 and f.f_globals.get("__name__") == "triton.compiler.compiler"):
        f = f.f_back
    if f is None:
        return

    def watch(frame, event, arg):
        global _compile_failed
        if event == "return":
            sys.settrace(None)
            if lease.flight is not None:  # not committed: the compile raised
                _compile_failed = True
                lease.drop()
        return watch

    f.f_trace = watch
    f.f_trace_lines = False
    sys.settrace(_no_trace)


def _hook_compile() -> None:
    """Wraps triton.compile wherever Triton keeps a reference to it, and
    Triton's filter_traceback (called when the front end raises, also in a
    compile that started before the wrapper was installed)."""
    import triton.compiler.compiler as cc
    orig = cc.compile
    wrapped = _wrap_compile(orig)
    for modname in ("triton.compiler.compiler", "triton.compiler", "triton", "triton.runtime.jit"):
        m = sys.modules.get(modname)
        if m is not None and getattr(m, "compile", None) is orig:
            setattr(m, "compile", wrapped)
    ft = getattr(cc, "filter_traceback", None)
    if ft is not None and getattr(ft, "_kcache_wrapped", None) is None:
        @functools.wraps(ft)
        def filter_traceback(e):
            global _compile_failed
            _drop_leases(threading.get_ident())
            _compile_failed = True
            return ft(e)
        filter_traceback._kcache_wrapped = ft
        cc.filter_traceback = filter_traceback


# ---- readable keys -----------------------------------------------------------------

_key_memo: Dict[Tuple[str, str], kcache.Key] = {}
_triton_key_digest: Optional[str] = None


def _triton_key_fn():
    return getattr(_triton_cache, "triton_key", None) or getattr(sys.modules.get("triton.compiler.compiler"),
                                                                 "triton_key")


def _readable(v):
    # A component value kcache.key takes as it is (str, bool, a 64-bit
    # int), else its JSON text.
    if isinstance(v, (bool, str)) or (isinstance(v, int) and -2**63 <= v < 2**63):
        return v
    try:
        return json.dumps(v, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(v)


def _compile_components() -> Tuple[Optional[str], dict]:
    """The label and readable components of the compile that called
    get_group: the kernel's name, target, Triton's parsed options and cache
    invalidating variables, and versions, read from Triton's compile frame.
    They are functions of Triton's hash (which the key holds too), so they
    add no identity of their own; remembered per hash in the process. Nothing
    when the caller is not Triton's compile (Triton calls get_group nowhere
    else)."""
    global _triton_key_digest
    try:
        f = sys._getframe(2)
        for _ in range(3):
            if f is None or f.f_code.co_name == "compile":
                break
            f = f.f_back
        if f is None or f.f_code.co_name != "compile":
            return None, {}
        loc = f.f_locals
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
                    comps[k] = _readable(v)
        env_vars = loc.get("env_vars")
        if isinstance(env_vars, dict):
            for k, v in env_vars.items():
                comps[f"env {k}"] = _readable(v)
        if _triton_key_digest is None:
            _triton_key_digest = hashlib.sha256(_triton_key_fn()().encode()).hexdigest()[:32]
        comps["triton_key"] = _triton_key_digest
        return label, comps
    except Exception:
        return None, {}


class CacheManager(_TritonCacheManager):
    """Triton's CacheManager over kcache (TRITON_CACHE_MANAGER=kcache.triton:CacheManager)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        # Dump and override folders are for people to read and edit: Triton's
        # own file manager keeps them.
        self._files_only = FileCacheManager(key, override=override, dump=dump) if (override or dump) else None
        self._lease: Optional[_Lease] = None
        self._staged: Dict[str, bytes] = {}
        self._paths: Dict[str, str] = {}

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

    def _drop_flight(self) -> None:
        if self._lease is not None:
            self._lease.drop()
            self._lease = None

    # ---- groups: one entry, one flight -------------------------------------

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        if self._files_only is not None:
            return self._files_only.get_group(filename)
        self._drop_flight()
        memo = (self.key, "__grp__" + filename)
        k = _key_memo.get(memo)
        if k is None:
            label, comps = _compile_components()
            k = self._key("__grp__" + filename, label, comps)
        hx = k.hex
        with _lock:
            stale = [le for le in _leases if le.key == hx and le.thread == threading.get_ident()]
        for le in stale:
            le.drop()  # this thread is back here: that compile is over
        try:
            flight = cache().begin(k)
        except Exception as e:  # the cache never fails a compile
            _log(f"lookup failed: {e}")
            return None
        if flight.hit:
            try:
                group = _materialiser().materialise(flight.entry)
            except OSError as e:
                _log(f"cannot write out {flight.entry.key_hex}: {e}")
                group = None
            if group is not None and filename in group:
                return group
            # Not usable: compile, and let the compile's put_group store it.
            return None
        lease = _Lease(flight, hx)
        with _lock:
            _leases.add(lease)
        self._lease = lease
        try:
            _watch_unwrapped(lease)
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
                    _log(f"group {filename}: cannot read {path}: {e}; not stored")
                    self._drop_flight()
                    return None
            artifacts[name] = data
        lease, self._lease = self._lease, None
        flight = lease.take() if lease is not None else None
        try:
            if flight is not None and flight.owner:
                entry, flight = flight.commit(artifacts), None
            else:
                entry = cache().put(self._key("__grp__" + filename), artifacts)
            if entry is not None and cache().tiers():  # nothing to publish with the cache disabled
                _materialiser().publish_compiled(entry, {n: p for n, p in group.items() if self._paths.get(n) == p})
        except Exception as e:
            _log(f"group {filename} not stored: {e}")
        finally:
            if flight is not None:  # not committed
                try:
                    flight.abandon()
                except Exception:
                    pass
        self._staged.clear()
        grp = json.dumps({"child_paths": group})
        return _materialiser().stage(self.key, f"__grp__{filename}", grp.encode())

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
            paths = _materialiser().materialise(e)
        except Exception as err:
            _log(f"lookup of {filename} failed: {err}")
            return None
        return paths.get(filename) if paths else None

    def put(self, data, filename: str, binary: bool = True) -> str:
        if self._files_only is not None:
            return self._files_only.put(data, filename, binary=binary)
        data = _to_bytes(data)
        path = _materialiser().stage(self.key, filename, data)
        self._paths[filename] = path
        if self._lease is not None:
            # Part of the group being compiled: stored with it in put_group.
            self._staged[filename] = data
        else:
            try:
                cache().put(self._key(filename), {filename: data})
            except Exception as e:
                _log(f"{filename} not stored: {e}")
        return path


# ---- triton_key() remembered across processes ---------------------------------------

_key_value: Optional[str] = None
_key_source = ""


def triton_key_source() -> str:
    """How this process got triton_key(): "remembered", "computed", or ""
    (not asked through kcache)."""
    return _key_source


def _key_record_key() -> kcache.Key:
    return kcache.key(_KEY_NAMESPACE, label="triton_key", path=os.path.dirname(os.path.abspath(triton.__file__)),
                      version=triton.__version__, python=sys.version)


def _identities(paths) -> List[list]:
    return [[p, *_ident(os.stat(p))] for p in sorted(paths)]


def _compute_triton_key(fn) -> Tuple[str, List[list]]:
    """Triton's own triton_key(), run afresh, and the identities of every
    file it read and of the folders they are in (a module added to one
    changes the folder)."""
    mod = sys.modules[fn.__module__]
    root = os.path.dirname(os.path.abspath(triton.__file__))
    read = set()
    real_open = open

    def recording_open(file, mode="r", *a, **k):
        if isinstance(file, (str, bytes, os.PathLike)):
            read.add(os.path.abspath(os.fsdecode(file)))
        return real_open(file, mode, *a, **k)

    inner = getattr(fn, "__wrapped__", fn)
    had = "open" in mod.__dict__
    saved = mod.__dict__.get("open")
    mod.open = recording_open  # the module's globals come before builtins
    try:
        value = inner()
    finally:
        if had:
            mod.open = saved
        else:
            del mod.open
    dirs = set()
    for p in read:
        d = os.path.dirname(p)
        while d.startswith(root) and d not in dirs:
            dirs.add(d)
            d = os.path.dirname(d)
    return value, _identities(read | dirs)


def triton_key() -> str:
    """Triton's triton_key(), remembered in the kcache store under the
    identity of every file and folder it reads; computed by Triton (and
    remembered) when any of them changed."""
    global _key_value, _key_source
    if _key_value is not None:
        return _key_value
    fn = _original_triton_key()
    k = _key_record_key()
    try:
        e = cache().get(k)
        if e is not None and "record" in e:
            rec = json.loads(bytes(e["record"]))
            try:
                same = _identities(p for p, *_ in rec["files"]) == rec["files"]
            except OSError:
                same = False
            if same and isinstance(rec.get("key"), str):
                _key_value, _key_source = rec["key"], "remembered"
                return _key_value
    except Exception as err:
        _log(f"remembered triton_key unreadable: {err}", once="key-read")
    value, files = _compute_triton_key(fn)
    try:
        if _identities(p for p, *_ in files) == files:  # nothing changed while it was read
            cache().put(k, {"record": json.dumps({"key": value, "files": files})})
    except Exception as err:
        _log(f"triton_key not remembered: {err}", once="key-write")
    _key_value, _key_source = value, "computed"
    return value


def _original_triton_key():
    fn = _triton_key_fn()
    return getattr(fn, "_kcache_original", fn)


def _install_triton_key() -> None:
    orig = _original_triton_key()

    def remembered():
        return triton_key()

    remembered._kcache_original = orig
    remembered.cache_clear = getattr(orig, "cache_clear", lambda: None)
    for name, m in list(sys.modules.items()):
        if (name == "triton" or name.startswith("triton.")) and getattr(m, "triton_key", None) is orig:
            setattr(m, "triton_key", remembered)


_installed = False


def install(remember_triton_key: bool = True) -> None:
    """Makes kcache Triton's cache in this process: sets
    TRITON_CACHE_MANAGER (unless set), wraps Triton's compile (a failed
    compile gives its lease up at once), and, with remember_triton_key,
    remembers triton_key() across processes. Call it before the first
    compile; calling it again does nothing."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    os.environ.setdefault("TRITON_CACHE_MANAGER", "kcache.triton:CacheManager")
    _hook_compile()
    if remember_triton_key:
        _install_triton_key()


def remote_cache() -> kcache.Cache:
    """The process's kcache for RemoteBackend: a memory tier and the Redis tier."""
    global _remote_cache, _remote_pid
    c = _remote_cache
    if c is None or _remote_pid != os.getpid():
        with _lock:
            if _remote_cache is None or _remote_pid != os.getpid():
                _remote_pid = os.getpid()
                url = os.environ.get("KCACHE_REMOTE") or _redis_url()
                _remote_cache = kcache.Cache(remote=url, disk=False, process_single_flight=False, producer="triton")
            c = _remote_cache
    return c


class RemoteBackend(_TritonRemoteCacheBackend):
    """Triton's remote cache backend over kcache's Redis tier
    (TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend)."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._cache = remote_cache()

    def _k(self, filename: str) -> kcache.Key:
        return kcache.key(_REMOTE_NAMESPACE, triton=self._key, file=filename)

    def get(self, filenames: List[str]) -> Dict[str, bytes]:
        out: Dict[str, bytes] = {}
        for f in filenames:
            e = self._cache.get(self._k(f))
            if e is not None and f in e:
                out[f] = bytes(e[f])
        return out

    def put(self, filename: str, data: bytes) -> None:
        self._cache.put(self._k(filename), {filename: _to_bytes(data)})


# Every compile after this import gives its lease up when it raises.
_hook_compile()

# A process that names this manager in TRITON_CACHE_MANAGER and imports it
# before Triton's first compile (the wheel's start-up hook does, right after
# `import triton`: python/_kcache_boot.py) remembers triton_key() as
# install() does.
if os.environ.get("TRITON_CACHE_MANAGER", "").strip().startswith("kcache.triton"):
    _install_triton_key()


@atexit.register
def _close() -> None:
    # Leases still held (a compile whose exception is kept) go first, then
    # the caches: queued remote writes and recency records go out, and no
    # kcache object outlives the interpreter.
    global _cache, _remote_cache
    _drop_leases()
    if _compile_failed:
        # A failed compile's exception may still be alive (kept by the
        # program): the frames of Triton's compile in it let their locals
        # go, so no Triton or kcache object outlives the interpreter.
        import gc
        for o in gc.get_objects():
            if isinstance(o, BaseException) and o.__traceback__ is not None:
                tb = o.__traceback__
                while tb is not None:
                    if tb.tb_frame.f_globals.get("__name__", "").startswith(("triton.", "kcache.")):
                        _failed(o)
                        break
                    tb = tb.tb_next
    _key_memo.clear()
    for c in (_cache, _remote_cache):
        if c is not None:
            try:
                c.close()
            except Exception:
                pass
    _cache = _remote_cache = None

"""kcache.triton: Triton's kernel cache in kcache.

    TRITON_CACHE_MANAGER=kcache.triton:CacheManager

A kernel's whole group (source and IR stages, cubin, metadata JSON) is one
kcache entry, stored in one atomic put, so a group mixed from two writers
cannot exist. A group that N processes miss at once is compiled once: the
first get_group() takes the key's single-flight lease (renewed while held) and
returns None, so Triton compiles; put_group() commits the group and lets the
lease go. The other processes wait inside get_group() and load the committed
entry. A compile that raises drops its manager, which abandons the flight;
a waiting process then takes the compile over. The size limit, eviction,
verification and statistics are kcache's (KCACHE_MAX_SIZE, `kcache stats`).

The kcache folder is $KCACHE_DIR, else <TRITON_CACHE_DIR>/kcache. Every other
KCACHE_* variable applies too; KCACHE_REMOTE adds a shared Redis tier (values
signed with KCACHE_REMOTE_SECRET_FILE) with cross-machine single-flight.

Triton opens a kernel's files by path, so each hit is written out
("materialised") under <TRITON_CACHE_DIR>/kcache-files/: into a fresh
temporary folder first, which is then renamed into place, so no reader ever
sees half a group. A process that compiles a group publishes its files the
same way (hard links to its own copies), so later processes only find the
folder. Folders not used for a day are removed; the files a process writes
while it compiles live in a folder of its own, removed when it exits (or by
a later process once it is dead).

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend

uses Triton's own remote manager with kcache's Redis tier as the backend
($KCACHE_REMOTE, else redis://$TRITON_REDIS_HOST:$TRITON_REDIS_PORT; HMAC
with $KCACHE_REMOTE_SECRET_FILE): a value that fails its MAC is a miss.

Caveat: an exception escaping Triton's compile keeps its frames (and so the
manager and its flight) alive as long as the traceback lives; other
processes wait for that long, bounded by KCACHE's wait bound. A later
get_group() for the same key in the same thread abandons the earlier flight.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import threading
import time
import uuid
import weakref
from typing import Dict, List, Optional

import kcache
from triton import knobs
from triton.runtime.cache import CacheManager as _TritonCacheManager
from triton.runtime.cache import FileCacheManager
from triton.runtime.cache import RemoteCacheBackend as _TritonRemoteCacheBackend

__all__ = ["CacheManager", "RemoteBackend", "cache", "files_dir"]

_NAMESPACE = "triton/1"
_REMOTE_NAMESPACE = "triton-remote/1"
_DAY_S = 24 * 3600
_TOUCH_S = 3600

_lock = threading.Lock()
_cache: Optional[kcache.Cache] = None
_cache_pid = 0
_remote_cache: Optional[kcache.Cache] = None
_remote_pid = 0
_files: Optional["_Files"] = None
_owned = threading.local()  # key hex -> weakref to a flight this thread owns


def _log(msg: str) -> None:
    if os.environ.get("KCACHE_LOG", "warn") not in ("off", "error"):
        import sys
        print(f"kcache: warn: triton: {msg}", file=sys.stderr)


def cache() -> kcache.Cache:
    """The process's kcache for Triton (opened on first use, and again in a
    child of fork(), which must not use its parent's)."""
    global _cache, _cache_pid
    c = _cache
    if c is None or _cache_pid != os.getpid():
        with _lock:
            if _cache is None or _cache_pid != os.getpid():
                d = None if os.environ.get("KCACHE_DIR") else os.path.join(knobs.cache.dir, "kcache")
                _cache = kcache.Cache(d, producer="triton")
                _cache_pid = os.getpid()
            c = _cache
    return c


def files_dir() -> str:
    """Where hits are materialised for Triton to read."""
    return _materialiser().root


def _materialiser() -> "_Files":
    global _files
    f = _files
    if f is None:
        with _lock:
            if _files is None:
                _files = _Files(os.path.join(knobs.cache.dir, "kcache-files"))
            f = _files
    return f


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Files:
    """The materialised files: shared, read-only folders of hits named by
    entry (key and creation time), and this process's own staging folder."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)
        self.pid = os.getpid()
        self._staging: Optional[str] = None
        self._sweep()

    def _sweep(self) -> None:
        # Removes what nobody can need any more: staging folders of dead
        # processes, temporary folders older than a day, and hit folders not
        # used for a day. A folder is renamed away first, so a reader never
        # sees one half removed.
        now = time.time()
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for n in names:
            p = os.path.join(self.root, n)
            dead = False
            try:
                if n.startswith("pid-"):
                    dead = not _pid_alive(int(n.split("-")[1]))
                elif n.startswith("tmp-") or not n.startswith("del-"):
                    dead = now - os.stat(p).st_mtime > _DAY_S
                else:
                    dead = True
            except (OSError, ValueError, IndexError):
                continue
            if dead:
                gone = os.path.join(self.root, f"del-{self.pid}-{uuid.uuid4().hex}")
                try:
                    os.rename(p, gone)
                except OSError:
                    continue
                shutil.rmtree(gone, ignore_errors=True)

    def staging(self, key: str) -> str:
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
        d = self.staging(key)
        path = os.path.join(d, filename)
        tmp = f"{path}.tmp.{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return path

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

        def write(tmp: str) -> None:
            for n, data in entry.items():
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

    def materialise(self, entry: kcache.Entry) -> Optional[Dict[str, str]]:
        """The paths of the entry's artifacts, written out once per entry on
        this machine; None when the entry cannot be used."""
        names = entry.keys()
        if not all(_safe_name(n) for n in names):
            _log(f"entry {entry.key_hex} has an unsafe artifact name; ignored")
            return None
        d = self._entry_dir(entry)
        try:
            st = os.stat(d)
            if time.time() - st.st_mtime > _TOUCH_S:
                os.utime(d)
        except FileNotFoundError:
            def write(tmp: str) -> None:
                for n, data in entry.items():
                    with open(os.path.join(tmp, n), "wb") as f:
                        f.write(data)

            self._publish(d, write)
        return {n: os.path.join(d, n) for n in names}


def _to_bytes(data) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


class CacheManager(_TritonCacheManager):
    """Triton's CacheManager over kcache (TRITON_CACHE_MANAGER=kcache.triton:CacheManager)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        # Dump and override folders are for people to read and edit: Triton's
        # own file manager keeps them.
        self._files_only = FileCacheManager(key, override=override, dump=dump) if (override or dump) else None
        self._flight: Optional[kcache.Flight] = None
        self._staged: Dict[str, bytes] = {}
        self._paths: Dict[str, str] = {}

    def _key(self, filename: str) -> kcache.Key:
        return kcache.key(_NAMESPACE, triton=self.key, file=filename)

    def _drop_flight(self) -> None:
        if self._flight is not None:
            self._flight.abandon()
            self._flight = None

    # ---- groups: one entry, one flight -------------------------------------

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        if self._files_only is not None:
            return self._files_only.get_group(filename)
        self._drop_flight()
        k = self._key("__grp__" + filename)
        owned = getattr(_owned, "flights", None)
        if owned is None:
            owned = _owned.flights = {}
        stale = owned.pop(k.hex, None)
        if stale is not None and stale() is not None:
            stale().abandon()  # this thread is back here: that compile is over
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
        self._flight = flight
        owned[k.hex] = weakref.ref(flight)
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
        flight, self._flight = self._flight, None
        try:
            if flight is not None and flight.owner:
                entry = flight.commit(artifacts)
            else:
                entry = cache().put(self._key("__grp__" + filename), artifacts)
            if entry is not None and cache().tiers():  # nothing to publish with the cache disabled
                _materialiser().publish_compiled(entry, {n: p for n, p in group.items() if self._paths.get(n) == p})
        except Exception as e:
            _log(f"group {filename} not stored: {e}")
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
        if self._flight is not None:
            # Part of the group being compiled: stored with it in put_group.
            self._staged[filename] = data
        else:
            try:
                cache().put(self._key(filename), {filename: data})
            except Exception as e:
                _log(f"{filename} not stored: {e}")
        return path


def remote_cache() -> kcache.Cache:
    """The process's kcache for RemoteBackend: a memory tier and the Redis tier."""
    global _remote_cache, _remote_pid
    c = _remote_cache
    if c is None or _remote_pid != os.getpid():
        with _lock:
            if _remote_cache is None or _remote_pid != os.getpid():
                _remote_pid = os.getpid()
                url = os.environ.get("KCACHE_REMOTE") or f"redis://{knobs.cache.redis.host}:{knobs.cache.redis.port}"
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


@atexit.register
def _close() -> None:
    # Queued remote writes and recency records go out before the process ends.
    for c in (_cache, _remote_cache):
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

"""Pieces shared by the host integrations (kcache.jax, kcache.numba,
kcache.warp, kcache.torch, kcache.wave, kcache.triton): one Cache per
process (reopened after fork), the flights a thread owns while its host
compiles, one-line warnings, files written for a host that reads them by
path, and a host's release as numbers."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import stat
import sys
import threading
import time
import types
import uuid
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import kcache


def release(version: str, parts: int = 2) -> Tuple[int, ...]:
    """The first `parts` numbers of a version string, for a check of the
    release lines supported: "2.15.0+cu132" -> (2, 15), "3.0.0rc1" ->
    (3, 0); the digits of each part, 0 where a part has none."""
    return tuple(int("".join(c for c in p if c.isdigit()) or "0") for p in version.split("+")[0].split(".")[:parts])


def log(host: str, msg: str) -> None:
    """One warning line on stderr (silenced by KCACHE_LOG=off or error)."""
    if os.environ.get("KCACHE_LOG", "warn").strip().lower() not in ("off", "error"):
        print(f"kcache: warn: {host}: {msg}", file=sys.stderr)


class ProcessCache:
    """The process's kcache.Cache for one host, opened on first use and
    again in a child of fork(). `default_dir` returns the folder to use when
    KCACHE_DIR is not set (None: kcache's default folder)."""

    def __init__(self, producer: str, default_dir: Callable[[], Optional[str]]) -> None:
        self._producer = producer
        self._default_dir = default_dir
        self._lock = threading.Lock()
        self._cache: Optional[kcache.Cache] = None
        self._pid = 0

    def __call__(self) -> kcache.Cache:
        c = self._cache
        if c is not None and self._pid == os.getpid():
            return c
        with self._lock:
            if self._cache is None or self._pid != os.getpid():
                d = None if os.environ.get("KCACHE_DIR") else self._default_dir()
                # Hosts load entries as code: a remote only with signed values.
                self._cache = kcache.Cache(d, producer=self._producer, signed_remote_only=True)
                self._pid = os.getpid()
            return self._cache

    def reset(self) -> None:
        with self._lock:
            self._cache = None
            self._pid = 0


# A program its host compiled and would not store (JAX: one under
# jax_persistent_cache_min_compile_time_secs or the minimum entry size;
# numba: lifted loops, dynamic globals) is marked "compile locally" in the
# store for this many seconds: every process then compiles it at once, in
# parallel, without a flight, as it would without kcache. Then one process
# tries again, so a program that became storable is stored. (Every process
# on a store must use the same value: the periods marks are filed under are
# this long.)
LOCAL_TTL_S = 600.0

_MARK_NAMESPACE = "kcache-local/1"
_MARK_ARTIFACT = "until_ms"


def _mark_key(key: kcache.Key, period: int) -> kcache.Key:
    return kcache.key(_MARK_NAMESPACE, label=key.label or None, of=key, period=period)


class _Marks:
    """The "compile locally" marks of the keys of one host Cache. They live
    in the same store (disk and remote tiers) through a second Cache on it,
    so that looking a mark up counts no miss and journals nothing in the
    host's Cache (whose log already says what ails the store: this one
    logs errors only). A mark is a small entry under a key derived from the
    program's key and the period of LOCAL_TTL_S it was written in, holding
    its expiry time; entries are never overwritten, so a mark is looked up
    in the current period and the one before it."""

    def __init__(self, host_cache: kcache.Cache) -> None:
        d = host_cache.dir
        self._cache = kcache.Cache(d, disk=d is not None, producer="kcache-local", memory_size="4M",
                                   miss_journal=0, log="error", signed_remote_only=True)

    def marked(self, key: kcache.Key) -> bool:
        now_ms = int(time.time() * 1000)
        period = now_ms // int(LOCAL_TTL_S * 1000)
        for p in (period, period - 1):
            e = self._cache.get(_mark_key(key, p))
            if e is None or _MARK_ARTIFACT not in e:
                continue
            try:
                if int(bytes(e[_MARK_ARTIFACT]).decode("ascii")) > now_ms:
                    return True
            except ValueError:
                continue
        return False

    def mark(self, key: kcache.Key) -> None:
        ttl_ms = int(LOCAL_TTL_S * 1000)
        now_ms = int(time.time() * 1000)
        self._cache.put(_mark_key(key, now_ms // ttl_ms), {_MARK_ARTIFACT: str(now_ms + ttl_ms)})
        # On disk (and in the remote tier) before the flight ends, so that
        # the process taking the flight over finds it.
        self._cache.flush()


_marks_lock = threading.Lock()
_marks_of: "weakref.WeakKeyDictionary[kcache.Cache, _Marks]" = weakref.WeakKeyDictionary()


def _marks(host_cache: kcache.Cache) -> _Marks:
    with _marks_lock:
        m = _marks_of.get(host_cache)
        if m is None:
            m = _marks_of[host_cache] = _Marks(host_cache)
        return m


def marked_local(cache: kcache.Cache, key: kcache.Key) -> bool:
    """Whether `key` is marked "compile locally" (a cache fault: False)."""
    try:
        return _marks(cache).marked(key)
    except Exception:  # the cache never fails a compile
        return False


class OwnedFlight:
    """A flight this thread owns for its host's compile. commit() stores
    what the host compiled; abandon() says the host compiled and will not
    store it, so the key is marked "compile locally" (other processes waiting
    for it, and those that miss it for LOCAL_TTL_S, compile at once without
    waiting in turn); fail() ends it without a mark (the compile raised: a
    waiting process takes it over)."""

    def __init__(self, flight: kcache.Flight, cache: Optional[kcache.Cache], host: str, label: str) -> None:
        self._flight = flight
        self._cache = cache
        self._host = host
        self._label = label

    @property
    def key(self) -> kcache.Key:
        return self._flight.key

    @property
    def owner(self) -> bool:
        return self._flight.owner

    @property
    def done(self) -> bool:
        return self._flight.done

    @property
    def entry(self) -> Optional[kcache.Entry]:
        return self._flight.entry

    def commit(self, artifacts) -> kcache.Entry:
        return self._flight.commit(artifacts)

    def fail(self) -> None:
        try:
            self._flight.abandon()
        except Exception:  # abandoning never fails a compile
            pass

    def abandon(self) -> None:
        if not self._flight.owner:
            return
        try:
            if self._cache is not None:
                _marks(self._cache).mark(self._flight.key)
        except Exception as e:  # the cache never fails a compile
            log(self._host, f"{self._label}: compile-locally mark not stored: {e}")
        self.fail()


class Flights:
    """The flights the current thread owns (it missed and its host is
    compiling), by key hex, as OwnedFlight. A host compile is wrapped so that
    a flight its compile did not commit ends when the compile returns or
    raises: one the host compiled and will not store (an uncachable program)
    is abandoned with a "compile locally" mark, so the processes waiting for
    it compile at once, in parallel; one whose compile raised fails, and a
    waiting process takes it over."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _owned(self) -> Dict[str, OwnedFlight]:
        d = getattr(self._local, "owned", None)
        if d is None or getattr(self._local, "pid", 0) != os.getpid():
            d = self._local.owned = {}
            self._local.pid = os.getpid()
        return d

    def add(self, name: str, flight: OwnedFlight) -> None:
        if not isinstance(flight, OwnedFlight):  # a kcache.Flight: abandoned without a mark
            flight = OwnedFlight(flight, None, "", name)
        old = self._owned().pop(name, None)
        if old is not None:
            old.fail()
        self._owned()[name] = flight

    def get(self, name: str) -> Optional[OwnedFlight]:
        return self._owned().get(name)

    def begin(self, cache: kcache.Cache, key: kcache.Key, host: str, label: str) -> Optional[kcache.Entry]:
        """A host's lookup of `key`: the entry when it is stored (or another
        process compiled it while this one waited), else None: this thread
        is compiling it already, or it now holds the key's flight (kept here
        until its host compile stores or gives up), or the key is marked
        "compile locally" (compiled here without a flight), or a cache
        fault (one log line; the cache never fails a compile)."""
        if self.get(key.hex) is not None:
            return None
        try:
            flight = cache.begin(key)
        except Exception as e:
            log(host, f"{label}: lookup failed: {e}")
            return None
        if not flight.owner:
            return flight.entry
        if marked_local(cache, key):
            # Found on a miss only (a stored entry is a hit first), and by a
            # waiter that took the flight over from a process that marked it.
            try:
                flight.abandon()
            except Exception:
                pass
            return None
        self.add(key.hex, OwnedFlight(flight, cache, host, label))
        return None

    def pop(self, name: str) -> Optional[OwnedFlight]:
        return self._owned().pop(name, None)

    def names(self) -> List[str]:
        return list(self._owned())

    def abandon(self, name: str, local: bool = False) -> None:
        """Ends the flight `name` if this thread still owns it: with a
        "compile locally" mark when `local` (the host compiled and did not
        store), else without (the compile raised)."""
        f = self._owned().pop(name, None)
        if f is not None:
            f.abandon() if local else f.fail()

    def abandon_new(self, before: List[str], local: bool = False) -> None:
        """Ends the flights begun since names() returned `before`, as
        abandon() does."""
        old = set(before)
        for n in self.names():
            if n not in old:
                self.abandon(n, local)


_digests: Dict[str, Tuple[Tuple[int, int, int, int, int], bytes]] = {}
_digests_lock = threading.Lock()


def file_digest(path: str) -> Optional[bytes]:
    """The SHA-256 of a file's content, or None when it cannot be read;
    remembered in the process while its device, inode, size, mtime and
    ctime stay (a rewrite in place, even with its size and mtime put back,
    changes its ctime)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _digests_lock:
        known = _digests.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    with _digests_lock:
        _digests[path] = (stamp, h.digest())
    return h.digest()


_builds: Dict[str, str] = {}
_builds_lock = threading.Lock()


def dist_build(dist: str, module: Optional[types.ModuleType] = None) -> str:
    """What identifies the installed build of distribution `dist` beyond its
    version string (the version stays a component of its own): a package
    rebuilt or reinstalled under the same version, a nightly, a patched
    wheel, an editable checkout being worked on.

    * Installed from a wheel: "record:" and a digest of its RECORD (every
      file pip wrote, with its SHA-256), leaving out what differs between
      installs of the same wheel: console scripts (whose first line names
      the venv's interpreter), its .dist-info metadata and the __pycache__
      files compiled at install. The same wheel gives the same identity in
      any venv or image.
    * Editable, with no RECORD (a distribution's package), not installed
      under that name (PyTorch's `pytorch-triton` for `triton`), or when
      `module` is not the file the RECORD lists (a checkout on PYTHONPATH
      shadowing the wheel): "tree:" and stat_walk of `module`'s folder (the
      path, size, times and inode of every file in it: its source, its
      extension modules; linked folders followed), read once per process:
      an edit to the checkout is a miss, as the version string would not
      be.
    * Nothing of the above to read: "".
    Remembered for the process."""
    with _builds_lock:
        if dist in _builds:
            return _builds[dist]
    ident = ""
    try:
        mod_file = getattr(module, "__file__", None) if module is not None else None
        record = None
        try:
            d = importlib.metadata.distribution(dist)
            direct = d.read_text("direct_url.json")
            editable = bool(direct) and bool(json.loads(direct).get("dir_info", {}).get("editable"))
            record = None if editable else d.read_text("RECORD")
            if record and mod_file:
                # The module imported must be the file this RECORD lists.
                rel = os.path.relpath(os.path.realpath(mod_file), os.path.realpath(str(d.locate_file(""))))
                if not any(line.split(",", 1)[0] == rel for line in record.splitlines()):
                    record = None
        except importlib.metadata.PackageNotFoundError:
            record = None
        if record:
            kept = sorted(line for line in record.splitlines()
                          if line and "__pycache__/" not in line and ".dist-info/" not in line.split(",", 1)[0]
                          and not (line.startswith("../") and "/bin/" in line.split(",", 1)[0]))
            ident = "record:" + hashlib.sha256("\n".join(kept).encode()).hexdigest()[:32]
        elif mod_file:
            ident = "tree:" + stat_walk(os.path.dirname(os.path.abspath(mod_file)))[:32]
    except Exception as e:  # never fails a host's import or compile
        log("kcache", f"{dist}: its build is not identified ({type(e).__name__}: {e})")
        ident = ""
    with _builds_lock:
        _builds[dist] = ident
    return ident


def stat_walk(root: str) -> str:
    """A digest of the identity (path, size, mtime_ns, ctime_ns, inode) of
    every file under `root`, following symbolic links (each folder walked
    once), without __pycache__ folders. A file that cannot be read counts by
    its path alone. The ctime catches a file rewritten in place with its
    size and mtime put back (`touch -r`, `cp -p` onto it): it cannot be
    set, only moved forward by any change."""
    files: List[Tuple[str, int, int, int, int]] = []
    try:
        top = os.stat(root)
        seen = {(top.st_dev, top.st_ino)}
    except OSError:
        return hashlib.sha256(b"missing " + os.fsencode(root)).hexdigest()
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            files.append((d, -1, -1, -1, -1))
            continue
        with it:
            for e in it:
                if e.name == "__pycache__":
                    continue
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        continue
                    st = e.stat()
                except OSError:
                    files.append((e.path, -1, -1, -1, -1))
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    files.append((e.path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
                elif (st.st_dev, st.st_ino) not in seen:  # a linked folder: walked once
                    seen.add((st.st_dev, st.st_ino))
                    stack.append(e.path)
    files.sort()
    return hashlib.sha256(repr(files).encode()).hexdigest()


def write_file(path: str, data: bytes) -> bool:
    """Makes `path` hold exactly `data`: left alone when it already does,
    else written under a temporary name and renamed into place, so a reader
    sees the old file or the new one, never a part. False when it cannot be
    written."""
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return True
    except OSError:
        pass
    tmp = f"{path}.kcache-tmp.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False

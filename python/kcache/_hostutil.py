"""Pieces shared by the host integrations (kcache.jax, kcache.numba,
kcache.warp): one Cache per process (reopened after fork), the flights a
thread owns while its host compiles, one-line warnings, and files written
for a host that reads them by path."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from typing import Callable, Dict, List, Optional

import kcache


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


class Flights:
    """The flights the current thread owns (it missed and its host is
    compiling), by key hex. A host compile is wrapped so that a flight its
    compile did not commit (an error, an uncachable program) is abandoned
    when the compile returns or raises, and waiting processes take over."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _owned(self) -> Dict[str, kcache.Flight]:
        d = getattr(self._local, "owned", None)
        if d is None or getattr(self._local, "pid", 0) != os.getpid():
            d = self._local.owned = {}
            self._local.pid = os.getpid()
        return d

    def add(self, name: str, flight: kcache.Flight) -> None:
        old = self._owned().pop(name, None)
        if old is not None:
            try:
                old.abandon()
            except Exception:  # the cache never fails a host's compile
                pass
        self._owned()[name] = flight

    def get(self, name: str) -> Optional[kcache.Flight]:
        return self._owned().get(name)

    def begin(self, cache: kcache.Cache, key: kcache.Key, host: str, label: str) -> Optional[kcache.Entry]:
        """A host's lookup of `key`: the entry when it is stored (or another
        process compiled it while this one waited), else None: this thread
        is compiling it already, or it now holds the key's flight (kept here
        until its host compile stores or gives up), or a cache fault (one
        log line; the cache never fails a compile)."""
        if self.get(key.hex) is not None:
            return None
        try:
            flight = cache.begin(key)
        except Exception as e:
            log(host, f"{label}: lookup failed: {e}")
            return None
        if flight.owner:
            self.add(key.hex, flight)
            return None
        return flight.entry

    def pop(self, name: str) -> Optional[kcache.Flight]:
        return self._owned().pop(name, None)

    def names(self) -> List[str]:
        return list(self._owned())

    def abandon(self, name: str) -> None:
        f = self._owned().pop(name, None)
        if f is not None:
            try:
                f.abandon()
            except Exception:  # abandoning never fails a compile
                pass

    def abandon_new(self, before: List[str]) -> None:
        """Abandons the flights begun since names() returned `before`."""
        old = set(before)
        for n in self.names():
            if n not in old:
                self.abandon(n)


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

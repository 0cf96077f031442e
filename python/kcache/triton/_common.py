"""What every part of kcache.triton shares: Triton itself (3.0 to 3.x, or
an ImportError saying what to install), the package's lock and warnings,
Triton's cache folder, and the process's two kcache objects (the store
under the manager, and the Redis tier under RemoteBackend), each opened on
first use and again in a child of fork()."""

from __future__ import annotations

import os
import sys
import threading
from typing import Optional

import kcache

from .._hostutil import release

try:
    import triton
    import triton.runtime.cache as triton_cache
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kcache.triton needs Triton 3.0 or later, which is not installed here "
        f"({_e}): pip install 'kcache-jit[triton]'") from _e


TRITON_VERSION = release(triton.__version__, 3)
if not (3, 0) <= TRITON_VERSION < (4, 0):
    raise ImportError(f"kcache.triton supports Triton 3.0 to 3.x; this is Triton {triton.__version__}")

try:  # Triton 3.4 and later
    from triton import knobs as _knobs
except ImportError:
    _knobs = None

lock = threading.RLock()
_logged = set()


def log(msg: str, once: Optional[str] = None) -> None:
    """One warning line on stderr (silenced by KCACHE_LOG=off or error);
    with `once`, only the first time for that tag."""
    if once is not None:
        if once in _logged:
            return
        _logged.add(once)
    if os.environ.get("KCACHE_LOG", "warn") not in ("off", "error"):
        print(f"kcache: warn: triton: {msg}", file=sys.stderr)


def triton_cache_dir() -> str:
    if _knobs is not None:
        return _knobs.cache.dir
    return os.getenv("TRITON_CACHE_DIR", "").strip() or triton_cache.default_cache_dir()


def _redis_url() -> str:
    if _knobs is not None:
        host, port = _knobs.cache.redis.host, _knobs.cache.redis.port
    else:
        host, port = os.environ.get("TRITON_REDIS_HOST", "localhost"), os.environ.get("TRITON_REDIS_PORT", "6379")
    return f"redis://{host}:{port}"


def to_bytes(data) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


_cache: Optional[kcache.Cache] = None
_cache_pid = 0
_remote_cache: Optional[kcache.Cache] = None
_remote_pid = 0


def cache() -> kcache.Cache:
    """The process's kcache for Triton (opened on first use, and again in a
    child of fork(), which must not use its parent's)."""
    global _cache, _cache_pid
    c = _cache
    if c is None or _cache_pid != os.getpid():
        with lock:
            if _cache is None or _cache_pid != os.getpid():
                d = None if os.environ.get("KCACHE_DIR") else os.path.join(triton_cache_dir(), "kcache")
                # Entries hold cubins and launcher libraries that are
                # loaded as code: a remote is used only with a secret.
                _cache = kcache.Cache(d, producer="triton", signed_remote_only=True)
                _cache_pid = os.getpid()
            c = _cache
    return c


def remote_cache() -> kcache.Cache:
    """The process's kcache for RemoteBackend: a memory tier and the Redis tier."""
    global _remote_cache, _remote_pid
    c = _remote_cache
    if c is None or _remote_pid != os.getpid():
        with lock:
            if _remote_cache is None or _remote_pid != os.getpid():
                _remote_pid = os.getpid()
                url = os.environ.get("KCACHE_REMOTE") or _redis_url()
                _remote_cache = kcache.Cache(remote=url, disk=False, process_single_flight=False, producer="triton",
                                             signed_remote_only=True)
            c = _remote_cache
    return c


def close_caches() -> None:
    """Closes both (at exit): queued remote writes and recency records go
    out, and no kcache object outlives the interpreter."""
    global _cache, _remote_cache
    for c in (_cache, _remote_cache):
        if c is not None:
            try:
                c.close()
            except Exception:
                pass
    _cache = _remote_cache = None

"""Triton's own remote manager over kcache's Redis tier:

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend

($KCACHE_REMOTE, else redis://$TRITON_REDIS_HOST:$TRITON_REDIS_PORT; HMAC
with $KCACHE_REMOTE_SECRET_FILE): a value that fails its MAC is a miss."""

from __future__ import annotations

from typing import Dict, List

import kcache
from triton.runtime.cache import RemoteCacheBackend as _TritonRemoteCacheBackend

from ._common import remote_cache, to_bytes

_REMOTE_NAMESPACE = "triton-remote/1"


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
        self._cache.put(self._k(filename), {filename: to_bytes(data)})

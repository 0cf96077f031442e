"""The work of the processes test_workers.py starts. Spawned and forkserver
children import this module, so it imports nothing but kcache."""

import os
import time

import kcache

NS = "workers/1"

_cache = None
_cache_pid = 0

# A Cache the parent opens before it forks its workers (a module-level
# Cache made at import time); the workers use it as they find it.
inherited = None


def cache(d):
    """One module-level Cache per process, opened on first use: the pattern
    of kcache.triton."""
    global _cache, _cache_pid
    if _cache is None or _cache_pid != os.getpid():
        _cache = kcache.Cache(d, env=False)
        _cache_pid = os.getpid()
    return _cache


def artifacts(i):
    return {"obj": b"object-%d;" % i * 40, "sig": f"kernel_{i}"}


def compile_into(c, keys):
    """Odd keys through get_or_compile, even ones through begin/commit."""
    for i in keys:
        k = kcache.key(NS, i=i)
        if i % 2:
            c.get_or_compile(k, lambda i=i: artifacts(i))
        else:
            with c.begin(k) as f:
                if f.owner:
                    f.commit(artifacts(i))
    return len(keys)


def put_into(c, keys):
    """Plain puts: these go through the group committer."""
    for i in keys:
        c.put(kcache.key(NS, i=i), artifacts(i))
    return len(keys)


def compile_keys(d, keys):
    return compile_into(cache(d), keys)


def compile_keys_inherited(keys):
    return compile_into(inherited, keys)


def compile_then_wait(d, keys, conn):
    """Compiles, says so through `conn`, and waits to be killed."""
    conn.send(compile_into(cache(d), keys))
    while True:
        time.sleep(60)


def missing(d, keys):
    """The keys a fresh Cache (no memory tier) does not find on disk with the
    right bytes."""
    out = []
    with kcache.Cache(d, env=False, memory=False) as c:
        for i in keys:
            e = c.get(kcache.key(NS, i=i))
            if e is None or e.to_dict() != {k: v.encode() if isinstance(v, str) else v
                                            for k, v in artifacts(i).items()}:
                out.append(i)
    return out

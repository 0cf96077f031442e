"""triton_key() remembered across processes.

Triton's triton_key() is a digest of its own sources and of libtriton.so
(hundreds of MB read in every process). It is remembered in the kcache
store under a digest of a stat walk of the whole installed Triton package
folder, its libraries and backends included (the path, size, modification
time and inode of every file; symbolic links followed; __pycache__ left
out): a process whose Triton tree matches uses the remembered value, which
is the value Triton computed; any change (a reinstall, a touched library,
an edited module, a module or backend added or removed) computes it afresh.
The walk runs once per process, in triton_key() (docs/benchmarks.md has
its cost)."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import kcache

from .._hostutil import stat_walk
from ._common import cache, log, triton, triton_cache

_KEY_NAMESPACE = "triton-key/2"


def triton_root() -> str:
    """The installed Triton package folder."""
    return os.path.dirname(os.path.abspath(triton.__file__))


def record_key(root: str, walk: str) -> kcache.Key:
    """The store key of the value remembered for the tree at `root` whose
    stat walk is `walk`."""
    return kcache.key(_KEY_NAMESPACE, label="triton_key", path=root, walk=walk,
                      version=triton.__version__, python=sys.version)


_key_value: Optional[str] = None
_key_source = ""


def triton_key_source() -> str:
    """How this process got triton_key(): "remembered", "computed", or ""
    (not asked through kcache)."""
    return _key_source


def triton_key_fn():
    """The triton_key Triton calls (the remembered one once installed)."""
    return getattr(triton_cache, "triton_key", None) or getattr(sys.modules.get("triton.compiler.compiler"),
                                                                "triton_key")


def _original_triton_key():
    fn = triton_key_fn()
    return getattr(fn, "_kcache_original", fn)


def triton_key() -> str:
    """Triton's triton_key(), remembered in the kcache store under a stat
    walk of the installed Triton; computed by Triton (and remembered) when
    the tree changed."""
    global _key_value, _key_source
    if _key_value is not None:
        return _key_value
    root = triton_root()
    walk = stat_walk(root)
    k = record_key(root, walk)
    try:
        e = cache().get(k)
        if e is not None and "record" in e:
            value = json.loads(bytes(e["record"])).get("key")
            if isinstance(value, str):
                _key_value, _key_source = value, "remembered"
                return value
    except Exception as err:
        log(f"remembered triton_key unreadable: {err}", once="key-read")
    value = _original_triton_key()()
    try:
        if stat_walk(root) == walk:  # nothing changed while Triton read it
            cache().put(k, {"record": json.dumps({"key": value})})
    except Exception as err:
        log(f"triton_key not remembered: {err}", once="key-write")
    _key_value, _key_source = value, "computed"
    return value


def install_triton_key() -> None:
    """Makes Triton call triton_key() above wherever it keeps a reference
    to its own."""
    orig = _original_triton_key()

    def remembered():
        return triton_key()

    remembered._kcache_original = orig
    remembered.cache_clear = getattr(orig, "cache_clear", lambda: None)
    for name, m in list(sys.modules.items()):
        if (name == "triton" or name.startswith("triton.")) and getattr(m, "triton_key", None) is orig:
            setattr(m, "triton_key", remembered)

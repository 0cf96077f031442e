"""kcache: a compilation cache for JIT compilers, from Python.

    import kcache
    cache = kcache.Cache()                    # KCACHE_* environment, like Cache::open(Options::from_env())
    key = kcache.key("mydsl/1", ir=ir_bytes, arch="sm_90", options={"O": 3})
    entry = cache.get_or_compile(key, lambda: {"cubin": compile(ir)})
    entry["cubin"]                            # a read-only memoryview
    entry.source                              # "compiled", "memory", "disk", "remote", "bundle" or "waited"

A key is made of named components (bytes, str, int, bool, dict, list, or
another Key); it does not depend on their order. A compile runs at most once
per key at a time across the threads and processes that share a cache folder;
the others wait and load its entry. The GIL is released during lookups, stores
and waits.

Cache faults (a corrupt entry, a full or read-only disk, a dead remote) are
misses, counted in stats() and logged once; they never raise. Bad usage raises
TypeError or ValueError. An exception raised by a compile function reaches the
caller and nothing is stored; threads that waited for that compile get
CompileError.

Hosts that run their own compile between two calls (Triton, Inductor) use
Cache.begin(): see Flight.

Bundles (shipped, optionally signed, read-only sets of entries): m =
cache.mark(); ... compile what a package needs ...; data =
cache.save_bundle(since=m, key_file="signing.key") makes one as bytes, and
another cache mounts it with cache.load_bundle(data) (or KCACHE_BUNDLES
names bundle files). These calls raise kcache.Error (with .code, the
library's error name) when they cannot be done.

Re-entry: a compile function that asks the cache for its own key (through
get_or_compile or begin), or a thread that calls begin() again for a key whose
flight it owns, would wait for itself; it gets ReentryError at once instead.

Strings: every str handed to kcache (option values and paths, namespaces,
component and artifact names, text values) must be valid text: one holding a
lone surrogate (such as '\udcff', what os.fsdecode makes of bytes that are
not UTF-8) raises ValueError, and so does a NUL in an option value, a path
or a name.

Processes: what a compile produced (get_or_compile, a flight's commit) is on
disk before the call returns: other processes see it, and it is kept however
the process ends, os._exit() and signals included (a `with
multiprocessing.Pool() as pool:` block ends with terminate(), which sends
SIGTERM to the workers); it is synced against a power loss within 100 ms
(before the call returns with sync_commit=True). Plain puts reach the disk through a background
thread that lets a group gather for up to 100 ms. Every open Cache is
flushed when its process ends by a normal path: interpreter exit (atexit)
and the end of a multiprocessing worker (fork, forkserver or spawn;
multiprocessing's finalizers run before the worker's os._exit). A Cache used
in a child of fork() reopens itself there with the same options on its first
call (the parent's handles must not be used across fork), so a module-level
Cache works in forked workers. A process that puts and then leaves through
os._exit() of its own, or is killed, keeps the puts of its last 100 ms only
after Cache.flush(), or with sync_commit=True (KCACHE_SYNC_COMMIT=1), which
makes every put wait for its write.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import _kcache
from ._kcache import Entry, Flight, Key

__all__ = ["Cache", "CompileError", "Entry", "Error", "Flight", "Key", "ReentryError", "bundle_keygen", "key",
           "features", "options", "__version__"]

__version__: str = _kcache.version()


class Error(RuntimeError):
    """An operation that is not a lookup (Cache.mark, Cache.save_bundle,
    Cache.load_bundle, bundle_keygen) could not be done. `code` names the
    code the C ABI returns for the same failure, lowercase without the
    KCACHE_ prefix: "unavailable" (no disk store to mark or bundle),
    "corrupt" (a bundle refused: damaged, badly signed, or not signed by a
    trusted key), "io_error", "not_found", ... Bad arguments raise
    TypeError or ValueError instead."""

    def __init__(self, message: str, code: str = "internal") -> None:
        super().__init__(message)
        self.code: str = code


class CompileError(RuntimeError):
    """A compile failed in another thread while this one waited for it, or a
    flight's commit could not be stored as an entry."""


def _encode_value(v: Any) -> str:
    # Canonical text of a value inside a dict or list component: JSON with
    # sorted keys, so {"a": 1, "b": 2} and {"b": 2, "a": 1} are one key, and
    # 3 and "3" are not.
    if isinstance(v, (bytes, bytearray, memoryview)):
        return json.dumps({"$bytes": bytes(v).hex()})
    try:
        return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"kcache.key: cannot encode {type(v).__name__} inside a dict or list component: {e}") from None


class ReentryError(ValueError):
    """The thread compiling a key asked the cache for the same key again (a
    compile function calling get_or_compile or begin for its own key, or a
    second begin() of a key whose flight this thread owns): waiting would
    never end, so the request is refused at once."""


# Every Cache this process opened and has not closed, flushed when the
# process ends.
_open_caches: "weakref.WeakSet[Cache]" = weakref.WeakSet()
_atexit_pid = 0
_finalizer_pid = 0


def _flush_open_caches() -> None:
    for c in list(_open_caches):
        try:
            c._c._flush_at_exit()
        except Exception:  # a cache fault never fails an exit
            pass


def _note_open() -> None:
    # Registers this process's exit flushes once: atexit for an interpreter
    # that exits, and multiprocessing's own finalizers for its workers, which
    # leave through os._exit() after running them (a worker forked from a
    # parent starts with an empty list of finalizers, so each process
    # registers its own). multiprocessing is not imported for this: a worker
    # has it already.
    global _atexit_pid, _finalizer_pid
    pid = os.getpid()
    if _atexit_pid != pid:
        _atexit_pid = pid
        atexit.register(_flush_open_caches)
    mp_util = sys.modules.get("multiprocessing.util")
    if _finalizer_pid != pid and mp_util is not None:
        _finalizer_pid = pid
        mp_util.Finalize(None, _flush_open_caches, exitpriority=100)


_kcache._set_encoder(_encode_value, CompileError, ReentryError, _note_open, Error)


def key(namespace: str, *, label: Optional[str] = None, private: Iterable[str] = (), **components: Any) -> Key:
    """The cache key of `namespace` (the client and its schema version, e.g.
    "mydsl/1") and the named components.

    `label` names what is compiled (a kernel's or function's name); it is
    not part of the key, but `kcache misses` and `kcache explain` group and
    compare entries by it. `private` lists components whose values must not
    be written anywhere (tokens, user names, paths): the stored manifest and
    the miss journal keep only their digests. A private name that is not a
    component raises ValueError. `label` and `private` are therefore not
    available as component names.

    Component types: bytes-like (hashed as bytes), str, int (64-bit), bool,
    dict (str keys; values JSON-encoded with sorted keys), list or tuple
    (each element JSON-encoded), Key (a digest computed earlier, e.g. of a
    previous stage). The key depends only on the names, types and values,
    never on the order of the arguments. Raises TypeError for other types
    (None, float, objects) and ValueError for an empty namespace.
    """
    if not isinstance(namespace, str):
        raise TypeError("kcache.key: the namespace must be a str")
    if isinstance(private, (str, bytes)):
        raise TypeError("kcache.key: private must be a list of component names, not a single string")
    return _kcache.key(namespace, components, label, tuple(private))


def features() -> Tuple[str, ...]:
    """The features built into this kcache, as a tuple of names in a fixed
    order: the list `kcache --version` prints (the same C++ function,
    kcache::features()). Names: "lmdb" (the LMDB engine), "files" (the
    files engine, always), "zstd" (compressed entries), "redis" (the Redis
    remote), and, in C++ builds only, "llvm", "nvrtc", "opencl". A wheel has
    lmdb, files, zstd and redis: `"lmdb" in kcache.features()`."""
    return _kcache.features()


def bundle_keygen(key_file: Union[str, os.PathLike]) -> None:
    """Writes a new Ed25519 key pair for signing bundles: `key_file`
    (private, mode 0600) and `key_file`.pub (public: what bundle_trust /
    KCACHE_BUNDLE_TRUST names). ValueError when either file exists (a key
    is never overwritten), Error when they cannot be written."""
    _kcache.bundle_keygen(_option_text("key_file", key_file))


def options() -> List[Tuple[str, str, str]]:
    """Every option a Cache takes: (name, KCACHE_* variable or "", what it
    takes). The names are those of the C++ Options, the C ABI and the
    `kcache` tool."""
    return list(_kcache.options())


Artifacts = Mapping[str, Union[bytes, bytearray, memoryview, str]]
Size = Union[int, str]

_OPTION_NAMES = frozenset(name for name, _, _ in _kcache.options())


def _option_text(name: str, v: Any) -> str:
    # The text form Options::set parses: the one parser of every binding.
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"kcache.Cache: option {name}: {v} is negative")
        return str(v)
    if isinstance(v, str):
        return v
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"kcache.Cache: option {name}: {v!r} is not UTF-8") from None
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):  # bundles, bundle_trust: a list of files
        return ":".join(_option_text(name, x) for x in v)
    raise TypeError(f"kcache.Cache: option {name} takes a str, int, bool or list of files, not {type(v).__name__}")


class Cache:
    """A cache: memory tier, disk store (LMDB or files engine) with
    cross-process single-flight, and an optional remote (Redis) tier.

    Options come in one order, the same in C++, C and the `kcache` tool:
    the defaults, then the arguments given here, then the KCACHE_*
    environment (KCACHE_DIR, KCACHE_MAX_SIZE, KCACHE_READONLY,
    KCACHE_DISABLE, KCACHE_REMOTE, ...), so an operator's variable reaches
    every program; pass env=False to ignore the environment. Opening never
    fails for cache reasons: a folder that cannot be used leaves the disk
    tier out (one log line; `dir` is then None). A configured remote is
    asked once when the Cache opens (bounded by its connect timeout), so
    one that cannot be reached is said in one log line at once, even when
    every later lookup is answered by a faster tier.

    dir: the cache folder (default $XDG_CACHE_HOME/kcache or
        ~/.cache/kcache). max_size: the disk limit, bytes or "2G".
    remote: "redis://host:port[/db]" or "redis+cluster://...";
        remote_secret_file: the HMAC secret that signs remote values.
    read_only: look up, never store. engine: "lmdb" or "files".
    memory / memory_size: the in-process tier (default on, 256 MiB; a
        memory_size of 0 leaves it out).
    disk: the disk tier (default on).
    process_single_flight: wait for other processes' compiles (default on).
    lease_ttl_ms, wait_bound_ms: lease expiry and longest wait (see cache.h).
    compression: "none" (default, zero-copy), "zstd" or "auto".
    signed_remote_only: for entries that are loaded as code (pickles,
        executables, shared objects): a remote configured without a
        remote_secret_file is left out, with one log line.
    **options: any other option by name (kcache.options() lists them):
        shared_group, bundles, bundle_trust, explain, recompile, disabled,
        miss_journal, max_entries, durability, log, ...
    Raises TypeError for an unknown option and ValueError for a bad value.
    """

    def __init__(
        self,
        dir: Optional[Union[str, os.PathLike]] = None,
        *,
        max_size: Optional[Size] = None,
        remote: Optional[str] = None,
        remote_secret_file: Optional[str] = None,
        read_only: Optional[bool] = None,
        engine: Optional[str] = None,
        memory: bool = True,
        memory_size: Optional[Size] = None,
        disk: bool = True,
        process_single_flight: Optional[bool] = None,
        lease_ttl_ms: Optional[int] = None,
        wait_bound_ms: Optional[int] = None,
        compression: Optional[str] = None,
        producer: Optional[str] = "python",
        env: bool = True,
        signed_remote_only: bool = False,
        **options: Any,
    ) -> None:
        named = dict(dir=dir, max_size=max_size, remote=remote, remote_secret_file=remote_secret_file,
                     read_only=read_only, engine=engine, memory=memory, memory_size=memory_size, disk=disk,
                     process_single_flight=process_single_flight, lease_ttl_ms=lease_ttl_ms,
                     wait_bound_ms=wait_bound_ms, compression=compression, producer=producer)
        for name in options:
            if name not in _OPTION_NAMES:
                raise TypeError(f"kcache.Cache: unknown option '{name}' (kcache.options() lists them)")
        settings = [(n, _option_text(n, v)) for n, v in list(named.items()) + list(options.items()) if v is not None]
        self._c = _kcache.Cache._open(settings, env, bool(signed_remote_only))
        _open_caches.add(self)
        _note_open()
        # The hot calls go straight to the extension (no Python frame).
        self.get = self._c.get
        self.put = self._c.put
        self.begin = self._c.begin

    # Documented here; bound to the extension's methods in __init__.
    def get(self, key: Key) -> Optional[Entry]:  # type: ignore[no-redef]  # noqa: F811
        """The entry stored under `key`, or None (a miss or a cache fault)."""
        return self._c.get(key)

    def put(self, key: Key, artifacts: Artifacts) -> Optional[Entry]:  # type: ignore[no-redef]  # noqa: F811
        """Stores `artifacts` (name -> bytes or str) under `key` in every
        writable tier; the stored Entry, or None when the cache stores nothing (read_only,
        disabled); faults of the disk and remote tiers are counted, not raised."""
        return self._c.put(key, artifacts)

    def begin(self, key: Key) -> Flight:  # type: ignore[no-redef]  # noqa: F811
        """Starts a flight for `key`: a hit (flight.hit, flight.entry), or this
        caller owns the compile (flight.owner: compile, then flight.commit()
        or flight.abandon()). While another thread or process compiles the
        key, begin() waits (without the GIL) and returns its entry.
        ReentryError when this thread is compiling the key itself (it owns
        an uncommitted flight of it, or calls from its compile function)."""
        return self._c.begin(key)

    def get_or_compile(self, key: Key, compile: Callable[[], Artifacts]) -> Entry:
        """The entry for `key`: from a tier, or from compile() (run at most
        once at a time per key across threads and processes), then stored.
        ReentryError when called for a key this thread is compiling."""
        return self._c.get_or_compile(key, compile)

    def stats(self) -> Dict[str, Any]:
        """Counters of this Cache: hits, misses, compiles, compile_failures,
        waits, faults, compile_us, lease_waits, lease_timeouts,
        lease_takeovers; and under "tiers" a list, fastest first, of
        {"name": "lmdb", "kind": "disk", "stats": {"hits": ..., "entries":
        ..., ...}} (kind: "memory", "disk", "remote", "bundle" or "other"),
        the shape of the C ABI's kcache_stats_json and `kcache stats
        --json`. tier_stats(name) picks one tier's counters."""
        return self._c.stats()

    def tier_stats(self, name: str) -> Optional[Dict[str, int]]:
        """The counters of the first tier called `name` ("memory", "lmdb",
        "files", "redis", ...) or of kind `name` ("disk", "remote", ...), or
        None when there is no such tier."""
        for t in self._c.stats()["tiers"]:
            if t["name"] == name or t["kind"] == name:
                return t["stats"]
        return None

    @property
    def dir(self) -> Optional[str]:
        """The cache folder of the disk store in effect (the dir option, or
        the default $XDG_CACHE_HOME/kcache or ~/.cache/kcache, the folder the
        `kcache` tool uses too); None when the cache has no disk tier (disk
        off, disabled, or a folder that could not be used)."""
        return self._c.dir

    def mark(self) -> int:
        """A position in the disk store's recency records: save_bundle(since=m)
        later takes the entries created or used at or after it, in any
        process using the store. Error (code "unavailable") without a disk
        store."""
        return self._c.mark()

    def save_bundle(self, since: int = 0, key_file: Optional[Union[str, os.PathLike]] = None) -> bytes:
        """A bundle of the disk store as bytes: the entries created or used at
        or after the mark `since` (0: the whole store), signed with the
        Ed25519 private key file `key_file` (`kcache bundle keygen`) unless
        it is None. Making it counts nothing and changes no recency.
        Error: code "unavailable" without a disk store; the key file's
        failure ("not_found", "io_error", "corrupt") otherwise."""
        if isinstance(since, bool) or not isinstance(since, int):
            raise TypeError("Cache.save_bundle: since must be an int (a mark)")
        if since < 0:
            raise ValueError("Cache.save_bundle: since must not be negative")
        kf = None if key_file is None else _option_text("key_file", key_file)
        return self._c.save_bundle(since, kf)

    def load_bundle(self, data: Union[bytes, bytearray, memoryview]) -> None:
        """Mounts bundle bytes (copied) as a read-only tier after the memory
        tier and before the disk store; call it before other threads use the
        cache. Error (code "corrupt") when the bundle is refused: damaged,
        badly signed, or not signed by a key of bundle_trust
        (KCACHE_BUNDLE_TRUST) when that is set; the log says why. A Cache
        reopened in a forked child mounts it again."""
        self._c.load_bundle(data)

    def tiers(self) -> list:
        """Names of the tiers, fastest first."""
        return self._c.tiers()

    def flush(self) -> None:
        """Waits until new entries are written to the disk and remote tiers
        (after it returns, os._exit() or a kill loses none of them), and
        writes buffered recency records. Raises kcache.Error (code
        "no_space", "read_only", "io_error", ...) when entries put since the
        last flush could not be written to the disk store, so none is
        reported kept that is not. With sync_commit=True, put() itself
        returns None for an entry the disk refused."""
        self._c.flush()

    def close(self) -> None:
        """Flushes and closes the cache; later calls raise ValueError."""
        self._c.close()

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._c.closed

    def __enter__(self) -> "Cache":
        """The cache itself; leaving the block closes it."""
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._c.closed:
            return "kcache.Cache(closed)"
        return f"kcache.Cache(dir={self._c.dir!r}, tiers={self._c.tiers()})"

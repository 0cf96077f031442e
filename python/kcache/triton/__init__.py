"""kcache.triton: Triton's kernel cache in kcache (Triton 3.0 to 3.x).

    import kcache.triton; kcache.triton.install()   # at the top of the program

or, without touching the program,

    TRITON_CACHE_MANAGER=kcache.triton:CacheManager

install() sets TRITON_CACHE_MANAGER (unless already set), wraps Triton's
compile so that a compile that raises gives up its single-flight lease at
once, and remembers Triton's `triton_key()` across processes. The variable
alone gives the same cache and the same remembered `triton_key()`: the
package's start-up hook (kcache-boot.pth, run at interpreter start;
python/_kcache_boot.py) does nothing unless the variable names
kcache.triton, and then imports this package right after Triton's package
has loaded, before Triton first computes its key. Where the hook is not
installed (the package put on sys.path by hand), `triton_key()` is computed
by Triton as usual and the wrapper is installed when Triton first imports
the manager, inside the process's first compile, which is watched instead.

A kernel's whole group (source and IR stages, cubin, metadata JSON) is one
kcache entry, stored in one atomic put; a group that N processes miss at
once is compiled once, and the others wait and load it. A compile that
raises gives its lease up at once, leaving its exception and every local of
its frames as they were (`pdb.pm()` sees them), and a process that dies
holding a lease is taken over at once by a waiter on the same host. The
size limit, eviction, verification and statistics are kcache's
(KCACHE_MAX_SIZE, `kcache stats`); `kcache misses` names the option that
changed. The kcache folder is $KCACHE_DIR, else <TRITON_CACHE_DIR>/kcache.
Every other KCACHE_* variable applies too; KCACHE_REMOTE adds a shared
Redis tier (values signed with KCACHE_REMOTE_SECRET_FILE) with
cross-machine single-flight.

Triton opens a kernel's files by path, so each hit is written out under
<TRITON_CACHE_DIR>/kcache-files/, checked against its entry before use and
bounded by KCACHE_MAX_SIZE of its own. A folder that cannot be written (a
read-only TRITON_CACHE_DIR, a full disk) is replaced for the process by a
private temporary one: hits are still served, and a read-only store is
never written (KCACHE_READONLY=1 with the files engine; an LMDB store needs
its lock file writable, so in a read-only folder its disk tier is left out
and Triton compiles).

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend

uses Triton's own remote manager with kcache's Redis tier as the backend.

The parts, one file each: _manager.py (CacheManager), _files.py (the
written-out files and their limit), _hooks.py (the compile wrapper and the
leases of compiles in progress), _key.py (the remembered triton_key()),
_remote.py (RemoteBackend), _common.py (Triton, the process's caches).
"""

from __future__ import annotations

import atexit
import os

from ._common import TRITON_VERSION, cache, close_caches, lock, remote_cache
from ._files import files_dir
from ._hooks import drop_leases, hook_compile
from ._key import install_triton_key, triton_key, triton_key_source
from ._manager import CacheManager, forget_keys
from ._remote import RemoteBackend

__all__ = ["CacheManager", "RemoteBackend", "TRITON_VERSION", "cache", "files_dir", "install", "remote_cache",
           "triton_key", "triton_key_source"]

_installed = False


def install(remember_triton_key: bool = True) -> None:
    """Makes kcache Triton's cache in this process: sets
    TRITON_CACHE_MANAGER (unless set), wraps Triton's compile (a failed
    compile gives its lease up at once), and, with remember_triton_key,
    remembers triton_key() across processes. Call it before the first
    compile; calling it again does nothing."""
    global _installed
    with lock:
        if _installed:
            return
        _installed = True
    os.environ.setdefault("TRITON_CACHE_MANAGER", "kcache.triton:CacheManager")
    hook_compile()
    if remember_triton_key:
        install_triton_key()


# Every compile after this import gives its lease up when it raises.
hook_compile()

# A process that names this manager in TRITON_CACHE_MANAGER and imports it
# before Triton's first compile (the wheel's start-up hook does, right after
# `import triton`: python/_kcache_boot.py) remembers triton_key() as
# install() does.
if os.environ.get("TRITON_CACHE_MANAGER", "").strip().startswith("kcache.triton"):
    install_triton_key()


@atexit.register
def _close() -> None:
    # Leases still held go first, then the remembered keys and the caches.
    drop_leases()
    forget_keys()
    close_caches()

"""The files Triton reads by path: each hit written out ("materialised")
under <TRITON_CACHE_DIR>/kcache-files/, one folder per entry, with a size
limit and a least-recently-used eviction of their own.

A folder is filled under a temporary name and then renamed into place, so
no reader ever sees half a group. A process that compiles a group publishes
its files the same way (hard links to its own copies, staged in a folder of
the process's own, removed when it exits or by a later process once it is
dead). Before a folder is handed to Triton its files are checked against
the entry (size, then bytes; once per process, then by their inode, size
and times, at most once a second): a file removed or changed is written out
again (temporary name, then rename). A root that cannot be written (a
read-only TRITON_CACHE_DIR, a full disk) is replaced for this process by a
private temporary folder, removed when it exits.

The folders are bounded by the value of KCACHE_MAX_SIZE (default 4G): past
it the least recently used are removed (never one used in the last two
minutes). Their sizes are added up when a process starts, at most every ten
minutes, and after a process wrote an eighth of the limit. Folders not used
for a day are removed too."""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
import time
import uuid
from typing import Dict, List, Optional, Tuple

import kcache

from ._common import lock, log, triton_cache_dir

_DAY_S = 24 * 3600
_TOUCH_S = 60
_RECENT_S = 120
_DEFAULT_FILES_MAX = 4 << 30
_SIZE_SWEEP_S = 600
_RECHECK_S = 1.0  # a folder checked this long ago by this process is not checked again


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
        log(f"cannot write {shared} ({why.strerror or why}); hits are written out to {self.root} for this process",
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
            log(f"entry {entry.key_hex} has an unsafe artifact name; ignored")
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
            log(f"written-out files {', '.join(fixed)} of {os.path.basename(d)} were missing or damaged; written again")
        try:
            self._verified[d] = (tuple(_ident(os.stat(p)) for p in paths.values()), time.monotonic(), paths)
        except OSError:
            self._verified.pop(d, None)


_files: Optional[_Files] = None
_files_pid = 0


def materialiser() -> _Files:
    """The process's written-out files (made again in a child of fork())."""
    global _files, _files_pid
    f = _files
    if f is None or _files_pid != os.getpid():
        with lock:
            if _files is None or _files_pid != os.getpid():
                _files = _Files(os.path.join(triton_cache_dir(), "kcache-files"))
                _files_pid = os.getpid()
            f = _files
    return f


def files_dir() -> str:
    """Where hits are materialised for Triton to read."""
    return materialiser().root

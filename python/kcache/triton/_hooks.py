"""Compile hooks: the leases (single-flight flights) of compiles in
progress, and the wrapping of Triton's compile that gives up the lease of a
compile that raised, at once, so that processes and threads waiting for the
same kernel compile it themselves.

The wrapper's own `finally` gives the lease up; the exception, its
traceback and every local of its frames reach the caller as Triton raised
them (`pdb.pm()` and `%debug` see them all), and an exception kept alive
holds no lease. triton.compile is wrapped wherever Triton keeps a reference
to it, and Triton's filter_traceback too (called when the front end
raises). A compile that started before the wrapper was installed (the first
of a process that names the manager only in TRITON_CACHE_MANAGER, where
Triton imports kcache.triton inside that compile) is watched instead: a
trace function on Triton's compile frame alone, until it returns; not while
a debugger or coverage tool traces."""

from __future__ import annotations

import functools
import sys
import threading
from typing import Optional

import kcache

from ._common import lock


class Lease:
    """A compile's flight, held for its manager. Dropped (abandoned, and
    the Flight let go) when the compile raises, when the same thread comes
    back for the same key, or at exit: so an exception kept alive, whose
    frames keep the manager, keeps no lease and no kcache object."""

    __slots__ = ("flight", "thread", "key")

    def __init__(self, flight: kcache.Flight, key: str) -> None:
        self.flight: Optional[kcache.Flight] = flight
        self.thread = threading.get_ident()
        self.key = key
        with lock:
            _leases.add(self)

    def take(self) -> Optional[kcache.Flight]:
        with lock:
            f, self.flight = self.flight, None
            _leases.discard(self)
        return f

    def drop(self) -> None:
        f = self.take()
        if f is not None:
            try:
                f.abandon()
            except Exception:
                pass


_leases: set = set()


def drop_leases(thread: Optional[int] = None, since: Optional[set] = None, key: Optional[str] = None) -> None:
    """Gives up the leases held (of one thread, taken after `since`, for
    one key: each when given)."""
    with lock:
        mine = [le for le in _leases if (thread is None or le.thread == thread)
                and (since is None or le not in since) and (key is None or le.key == key)]
    for le in mine:
        le.drop()


_tls = threading.local()


def _wrap_compile(fn):
    if getattr(fn, "_kcache_wrapped", None) is not None:
        return fn

    @functools.wraps(fn)
    def compile(*args, **kwargs):
        me = threading.get_ident()
        with lock:
            before = set(_leases)
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _tls.depth -= 1
            # A lease this call took and still holds belongs to a compile
            # that raised (one that finished committed it in put_group): it
            # goes now, not when the exception is freed. The exception is
            # left as it is.
            drop_leases(me, before)

    compile._kcache_wrapped = fn
    return compile


def _no_trace(frame, event, arg):
    return None


def watch_unwrapped(lease: Lease) -> None:
    """A compile that started before the wrapper was installed: Triton's
    compile frame is watched, with a trace function on that frame alone,
    until it returns; a lease still held then (the compile raised) is given
    up. Not where a tracer (a debugger, coverage) is active."""
    if getattr(_tls, "depth", 0) or sys.gettrace() is not None:
        return
    f = sys._getframe(2)
    while f is not None and not (f.f_code.co_name == "compile"
                                 and f.f_globals.get("__name__") == "triton.compiler.compiler"):
        f = f.f_back
    if f is None:
        return

    def watch(frame, event, arg):
        if event == "return":
            sys.settrace(None)
            if lease.flight is not None:  # not committed: the compile raised
                lease.drop()
        return watch

    f.f_trace = watch
    f.f_trace_lines = False
    sys.settrace(_no_trace)


def hook_compile() -> None:
    """Wraps triton.compile wherever Triton keeps a reference to it, and
    Triton's filter_traceback (called when the front end raises, also in a
    compile that started before the wrapper was installed)."""
    import triton.compiler.compiler as cc
    orig = cc.compile
    wrapped = _wrap_compile(orig)
    for modname in ("triton.compiler.compiler", "triton.compiler", "triton", "triton.runtime.jit"):
        m = sys.modules.get(modname)
        if m is not None and getattr(m, "compile", None) is orig:
            setattr(m, "compile", wrapped)
    ft = getattr(cc, "filter_traceback", None)
    if ft is not None and getattr(ft, "_kcache_wrapped", None) is None:
        @functools.wraps(ft)
        def filter_traceback(e):
            drop_leases(threading.get_ident())
            return ft(e)
        filter_traceback._kcache_wrapped = ft
        cc.filter_traceback = filter_traceback

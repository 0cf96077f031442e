"""A compile interrupted in one thread (KeyboardInterrupt, SystemExit: a
BaseException that is not an Exception) is that thread's own: it re-raises
there, and a thread waiting on the same key compiles the key itself and
stores it, instead of receiving kcache.CompileError carrying the other
thread's interrupt. An ordinary exception is still shared as a failed
compile. Each case runs in its own interpreter with a time limit."""

import pytest

from snippets import run_snippet

PRELUDE = """
import sys, threading, time
import kcache
c = kcache.Cache(sys.argv[1], env=False)
k = kcache.key("interrupts/1", i=1)
started = threading.Event()
"""


def run(tmp_path, body):
    run_snippet(tmp_path, PRELUDE, body)


@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit"])
def test_interrupted_compile_lets_the_waiter_compile(tmp_path, exc):
    run(tmp_path, f"""
        def interrupted():
            started.set()
            time.sleep(0.3)  # the other thread is waiting on the key by now
            raise {exc}()
        own = []
        def first():
            try:
                c.get_or_compile(k, interrupted)
            except BaseException as e:
                own.append(type(e).__name__)
        waited = []
        def second():
            started.wait()
            time.sleep(0.05)
            waited.append(bytes(c.get_or_compile(k, lambda: {{"obj": b"from the waiter"}})["obj"]))
        a = threading.Thread(target=first)
        b = threading.Thread(target=second)
        a.start(); b.start(); a.join(); b.join()
        assert own == ["{exc}"], own
        assert waited == [b"from the waiter"], waited
        assert bytes(c.get(k)["obj"]) == b"from the waiter"
        """)


def test_interrupt_in_the_only_thread_reaches_the_caller_and_stores_nothing(tmp_path):
    run(tmp_path, """
        def interrupted():
            raise KeyboardInterrupt()
        try:
            c.get_or_compile(k, interrupted)
            raise AssertionError("no KeyboardInterrupt")
        except KeyboardInterrupt:
            pass
        assert c.get(k) is None
        # The key is free again: the next compile is this thread's own.
        assert bytes(c.get_or_compile(k, lambda: {"obj": b"x"})["obj"]) == b"x"
        """)


def test_ordinary_exception_is_still_shared_with_the_waiter(tmp_path):
    run(tmp_path, """
        def failing():
            started.set()
            time.sleep(0.3)
            raise ValueError("bad kernel")
        errs = []
        def first():
            try:
                c.get_or_compile(k, failing)
            except ValueError:
                errs.append("first")
        def second():
            started.wait()
            time.sleep(0.05)
            try:
                c.get_or_compile(k, lambda: {"obj": b"y"})
                errs.append("second compiled")
            except kcache.CompileError:
                errs.append("second shared")
        a = threading.Thread(target=first)
        b = threading.Thread(target=second)
        a.start(); b.start(); a.join(); b.join()
        assert sorted(errs) == ["first", "second shared"], errs
        """)

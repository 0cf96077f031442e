"""Re-entry: the thread compiling a key asks the cache for the same key again
(get_or_compile or begin inside its own compile function, begin twice, or
get_or_compile while it owns the key's flight). It gets kcache.ReentryError
at once instead of waiting for itself for ever. Each case runs in its own
interpreter with a time limit, so a hang fails the test instead of stopping
the suite."""


from snippets import run_snippet

PRELUDE = """
import sys, threading, time
import kcache
c = kcache.Cache(sys.argv[1], env=False)
k = kcache.key("reentry/1", i=1)
"""


def run(tmp_path, body):
    run_snippet(tmp_path, PRELUDE, body, hang="hung: the re-entrant request waited for itself")


def test_get_or_compile_inside_its_own_compile(tmp_path):
    run(tmp_path, """
        inner_runs = []
        caught = []
        def outer():
            try:
                c.get_or_compile(k, lambda: inner_runs.append(1) or {"obj": b"inner"})
            except kcache.ReentryError as e:
                caught.append(str(e))
            return {"obj": b"outer"}
        e = c.get_or_compile(k, outer)
        assert bytes(e["obj"]) == b"outer" and inner_runs == [] and len(caught) == 1, (inner_runs, caught)
        assert "re-entrant" in caught[0]
        assert isinstance(kcache.ReentryError("x"), ValueError)
        # Not caught: it reaches the outer caller, and nothing is stored.
        k2 = kcache.key("reentry/1", i=2)
        try:
            c.get_or_compile(k2, lambda: c.get_or_compile(k2, lambda: {"obj": b"x"}))
            raise AssertionError("no ReentryError")
        except kcache.ReentryError:
            pass
        assert c.get(k2) is None
        """)


def test_begin_inside_get_or_compile(tmp_path):
    run(tmp_path, """
        def outer():
            try:
                c.begin(k)
            except kcache.ReentryError:
                return {"obj": b"refused"}
            return {"obj": b"not refused"}
        assert bytes(c.get_or_compile(k, outer)["obj"]) == b"refused"
        """)


def test_begin_twice_and_get_or_compile_while_owning(tmp_path):
    run(tmp_path, """
        f = c.begin(k)
        assert f.owner
        for call in (lambda: c.begin(k), lambda: c.get_or_compile(k, lambda: {"obj": b"x"})):
            try:
                call()
                raise AssertionError("no ReentryError")
            except kcache.ReentryError:
                pass
        f.commit({"obj": b"first"})
        g = c.begin(k)
        assert g.hit and bytes(g.entry["obj"]) == b"first"
        """)


def test_other_threads_still_wait_for_the_owner(tmp_path):
    run(tmp_path, """
        f = c.begin(k)
        got = []
        t = threading.Thread(target=lambda: got.append(bytes(c.get_or_compile(k, lambda: {"obj": b"other"})["obj"])))
        t.start()
        time.sleep(0.05)
        f.commit({"obj": b"owner"})
        t.join()
        assert got == [b"owner"], got
        """)


def test_second_cache_on_the_same_store(tmp_path):
    # The thread compiling a key in one Cache asks another Cache of the
    # process on the same folder for it: it holds the key's lease, so it
    # compiles without it instead of waiting (up to the wait bound) for
    # itself.
    run(tmp_path, """
        c2 = kcache.Cache(sys.argv[1], env=False)
        runs = []
        def outer():
            c2.get_or_compile(k, lambda: runs.append(1) or {"obj": b"same"})
            return {"obj": b"same"}
        assert bytes(c.get_or_compile(k, outer)["obj"]) == b"same"
        assert runs == [1]
        """)

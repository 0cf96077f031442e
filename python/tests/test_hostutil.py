"""kcache._hostutil: the flights of the host integrations (kcache.jax,
kcache.numba, kcache.warp) and their "compile locally" marks, on a real
store."""

import subprocess
import sys
import time

import kcache
from kcache import _hostutil


def _key(name="p"):
    return kcache.key("hostutil-test/1", label=name, program=name.encode())


def test_a_program_not_stored_is_marked_and_then_compiled_without_a_flight(tmp_path, monkeypatch):
    monkeypatch.setattr(_hostutil, "LOCAL_TTL_S", 2.0)
    store = tmp_path / "kcache"
    c = kcache.Cache(store)
    k = _key()
    flights = _hostutil.Flights()
    assert flights.begin(c, k, "test", "p") is None and flights.get(k.hex) is not None  # owns the flight
    assert not _hostutil.marked_local(c, k)
    flights.abandon_new([], local=True)  # compiled, and the host does not store it
    assert flights.get(k.hex) is None and _hostutil.marked_local(c, k)
    # Another process on the store sees the mark, and its lookup takes no
    # flight: it compiles at once.
    probe = ("import kcache, sys; from kcache import _hostutil as h; h.LOCAL_TTL_S = 2.0; "
             "c = kcache.Cache(sys.argv[1]); "
             "k = kcache.key('hostutil-test/1', label='p', program=b'p'); f = h.Flights(); "
             "print(h.marked_local(c, k), f.begin(c, k, 't', 'p') is None, f.get(k.hex) is None, "
             "c.stats()['misses'], c.stats()['lease_waits'])")
    out = subprocess.run([sys.executable, "-c", probe, str(store)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "1", "0"], out.stderr  # mark lookups count no miss
    # The mark expires: a lookup owns the flight again, and a program that
    # has become storable is stored and found.
    time.sleep(2.1)
    assert not _hostutil.marked_local(c, k)
    assert flights.begin(c, k, "test", "p") is None
    flights.pop(k.hex).commit({"x": b"compiled"})
    c.flush()
    assert bytes(kcache.Cache(store).get(k)["x"]) == b"compiled"


def test_a_failed_compile_leaves_no_mark(tmp_path):
    c = kcache.Cache(tmp_path / "kcache")
    k = _key("failed")
    flights = _hostutil.Flights()
    assert flights.begin(c, k, "test", "failed") is None and flights.get(k.hex) is not None
    flights.abandon_new([])  # the compile raised: a waiting process takes it over
    assert flights.get(k.hex) is None and not _hostutil.marked_local(c, k)
    assert flights.begin(c, k, "test", "failed") is None and flights.get(k.hex) is not None


def test_the_host_abandoning_its_flight_marks_it(tmp_path):
    # numba's save_overload abandons the flight it popped when numba cannot
    # cache the result: that marks the key as abandon(local=True) does.
    c = kcache.Cache(tmp_path / "kcache")
    k = _key("uncachable")
    flights = _hostutil.Flights()
    flights.begin(c, k, "test", "uncachable")
    f = flights.pop(k.hex)
    assert f.owner and not f.done
    f.abandon()
    assert not f.owner and _hostutil.marked_local(c, k)
    f.abandon()  # a second time: nothing


def test_waiters_compile_at_once_once_the_owner_marks_the_key(tmp_path):
    # Four processes wait on a key another one owns; it compiles for 2 s and
    # does not store: each waiter then finds the mark and compiles at once,
    # instead of taking the flight over in turn.
    store = tmp_path / "kcache"
    # Each waiter says "waiting" once it waits on the owner's lease.
    worker = (
        "import kcache, sys, threading, time; from kcache import _hostutil as h; c = kcache.Cache(sys.argv[1])\n"
        "def watch():\n"
        "    while c.stats()['lease_waits'] < 1: time.sleep(0.005)\n"
        "    print('waiting', flush=True)\n"
        "threading.Thread(target=watch, daemon=True).start()\n"
        "k = kcache.key('hostutil-test/1', label='w', program=b'w'); f = h.Flights(); "
        "t = time.time(); assert f.begin(c, k, 't', 'w') is None; owned = f.get(k.hex) is not None; "
        "s = time.time(); time.sleep(2); f.abandon_new([], local=True); "
        "print(owned, round(t, 3), round(s, 3), round(time.time(), 3))")
    c = kcache.Cache(store)
    k = kcache.key("hostutil-test/1", label="w", program=b"w")
    owner = c.begin(k)  # held here while the waiters start
    assert owner.owner
    procs = [subprocess.Popen([sys.executable, "-c", worker, str(store)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    assert [p.stdout.readline().strip() for p in procs] == ["waiting"] * 4
    assert all(p.poll() is None for p in procs)  # waiting
    _hostutil.OwnedFlight(owner, c, "test", "w").abandon()
    released = time.time()
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        owned, asked, started, ended = out.split()
        rows.append((owned == "True", float(asked), float(started), float(ended)))
    assert not any(r[0] for r in rows)  # none took the flight
    # All began within a second of the release, not 2 s after one another.
    assert all(r[2] - released < 1.0 for r in rows), (released, rows)

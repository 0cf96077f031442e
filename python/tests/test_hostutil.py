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


# What identifies an installed build beyond its version (dist_build), with
# real pip installing a wheel offline.

def _wheel(path, body, version="1.0"):
    """A wheel of the distribution `kcdemo` (package kcdemo, a console
    script), as a build backend would write it."""
    import base64
    import hashlib
    import zipfile

    files = {"kcdemo/__init__.py": body.encode(),
             "kcdemo-%s.dist-info/METADATA" % version: f"Metadata-Version: 2.1\nName: kcdemo\nVersion: {version}\n".encode(),
             "kcdemo-%s.dist-info/WHEEL" % version:
                 b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             "kcdemo-%s.dist-info/entry_points.txt" % version: b"[console_scripts]\nkcdemo = kcdemo:main\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("kcdemo-%s.dist-info/RECORD,," % version)
    wheel = path / f"kcdemo-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("kcdemo-%s.dist-info/RECORD" % version, "\n".join(record) + "\n")
    return wheel


def _install(wheel, prefix):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--prefix", str(prefix),
                    str(wheel)], check=True, capture_output=True, text=True)
    return next(prefix.glob("lib/python*/site-packages"))


def _build_of(site, *first, dist="kcdemo"):
    """dist_build of `dist` for the kcdemo package imported with `site` on
    the path (after the folders `first`)."""
    code = ("import sys; sys.path[:0] = sys.argv[2:] + [sys.argv[1]]; import kcdemo; "
            "from kcache import _hostutil as h; print(h.dist_build(%r, kcdemo))" % dist)
    out = subprocess.run([sys.executable, "-c", code, str(site), *map(str, first)], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_the_same_wheel_at_two_paths_is_one_build_and_another_wheel_under_its_version_is_not(tmp_path):
    wheel = _wheel(tmp_path, "def main():\n    return 1\n")
    a = _build_of(_install(wheel, tmp_path / "a"))
    b = _build_of(_install(wheel, tmp_path / "elsewhere" / "b"))
    assert a.startswith("record:") and a == b
    # What pip wrote that differs between installs (the console script's
    # interpreter line, INSTALLER, compiled files) is left out: each is there.
    site = next((tmp_path / "a").glob("lib/python*/site-packages"))
    record = next(site.glob("kcdemo-1.0.dist-info/RECORD")).read_text()
    assert "../../../bin/kcdemo," in record and "__pycache__/" in record and "INSTALLER" in record
    # Rebuilt with other code under the same version: another build.
    (tmp_path / "v2").mkdir()
    other = _wheel(tmp_path / "v2", "def main():\n    return 2\n")
    assert _build_of(_install(other, tmp_path / "c")) not in ("", a)
    # A checkout on the path before the wheel is what is imported: its
    # files, not the wheel's RECORD, identify the build.
    (tmp_path / "checkout" / "kcdemo").mkdir(parents=True)
    (tmp_path / "checkout" / "kcdemo" / "__init__.py").write_text("def main():\n    return 3\n")
    shadowed = _build_of(site, tmp_path / "checkout")
    assert shadowed.startswith("tree:")
    # A package whose distribution has another name than the one asked for
    # (PyTorch's pytorch-triton for triton) is identified by its files too.
    assert _build_of(site, dist="kcdemo-renamed").startswith("tree:")


def test_an_editable_checkout_is_identified_by_its_files(tmp_path):
    src = tmp_path / "checkout"
    (src / "kcdemo").mkdir(parents=True)
    init = src / "kcdemo" / "__init__.py"
    init.write_text("def main():\n    return 1\n")
    # What `pip install -e` leaves in site-packages: a .pth naming the
    # checkout, and metadata whose direct_url.json says editable.
    site = tmp_path / "site"
    info = site / "kcdemo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kcdemo\nVersion: 1.0\n")
    (info / "RECORD").write_text("__editable__.kcdemo-1.0.pth,,\nkcdemo-1.0.dist-info/RECORD,,\n")
    (info / "direct_url.json").write_text('{"url": "file://%s", "dir_info": {"editable": true}}' % src)
    (site / "__editable__.kcdemo-1.0.pth").write_text(str(src) + "\n")
    code = ("import site, sys; site.addsitedir(sys.argv[1]); import kcdemo; from kcache import _hostutil as h; "
            "print(h.dist_build('kcdemo', kcdemo))")

    def build():
        return subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True,
                              check=True).stdout.strip()

    first = build()
    assert first.startswith("tree:") and build() == first
    init.write_text("def main():\n    return 20\n")  # edited, version unchanged
    assert build() not in ("", first)

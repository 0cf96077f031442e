"""`kcache stats --format openmetrics` read by the official OpenMetrics
parser (prometheus_client's), and `--format prometheus` by its 0.0.4
parser, on a store the package wrote: the families are typed as they should
be and the samples carry the store's real counts. `stats --compression` on
entries the package compressed."""

import os
import shutil
import subprocess

import pytest

import kcache

try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_prometheus
except ImportError:  # pragma: no cover - make python installs it
    parse_openmetrics = parse_prometheus = None

needs_parser = pytest.mark.skipif(parse_openmetrics is None,
                                  reason="prometheus_client is not installed (make python installs it)")


def _tool():
    tool = os.environ.get("TEST_KCACHE_TOOL") or shutil.which("kcache")
    if not tool or not os.access(tool, os.X_OK):
        pytest.skip("no kcache tool (TEST_KCACHE_TOOL, set by ctest, or kcache on PATH)")
    return tool


@pytest.fixture
def store(tmp_path):
    """A store with 2 puts, 1 hit and 1 miss, made through the package."""
    d = str(tmp_path / "odd \"store\" \\ name")
    with kcache.Cache(d, memory=False) as c:
        for i in (1, 2):
            c.put(kcache.key("metrics-test/1", n=i), {"obj": b"x" * 3000})
        c.flush()
    with kcache.Cache(d, memory=False) as c:
        assert c.get(kcache.key("metrics-test/1", n=1)) is not None
        assert c.get(kcache.key("metrics-test/1", n=9)) is None
    return d


def _stats(store, fmt, *more):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env["KCACHE_DIR"] = store
    p = subprocess.run([_tool(), "stats", "--format", fmt, *more], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _by_family(families):
    return {f.name: f for f in families}


@needs_parser
def test_openmetrics_is_accepted_by_the_official_parser(store):
    text = _stats(store, "openmetrics")
    fams = _by_family(parse_openmetrics(text))
    import time
    for name in ("hits", "misses", "puts", "evictions", "corrupt", "errors"):
        f = fams["kcache_" + name]
        assert f.type == "counter", (name, f.type)
        # _created: since when the store's counters count (it was just made).
        assert {s.name for s in f.samples} <= {"kcache_" + name + "_total", "kcache_" + name + "_created"}, f.samples
        for s in f.samples:
            if s.name.endswith("_created"):
                assert time.time() - 600 < s.value <= time.time() + 1, s
    for name in ("entries", "bytes", "disk_used_bytes", "max_bytes", "store_up"):
        assert fams["kcache_" + name].type == "gauge", name

    def value(family, sample):
        (s,) = [s for s in fams[family].samples if s.name == sample and s.labels.get("kind", "disk") == "disk"]
        return s.value

    assert value("kcache_hits", "kcache_hits_total") == 1
    assert value("kcache_misses", "kcache_misses_total") == 1
    assert value("kcache_puts", "kcache_puts_total") == 2
    assert value("kcache_entries", "kcache_entries") == 2
    assert value("kcache_bytes", "kcache_bytes") > 6000
    assert value("kcache_store_up", "kcache_store_up") == 1
    (hits,) = [s for s in fams["kcache_hits"].samples if s.labels["kind"] == "disk" and s.name == "kcache_hits_total"]
    assert hits.labels["store"].startswith(store + "/"), hits.labels


@needs_parser
def test_prometheus_text_is_accepted_by_its_parser(store):
    om = _by_family(parse_openmetrics(_stats(store, "openmetrics")))
    prom = _by_family(parse_prometheus(_stats(store, "prometheus")))
    # prometheus_client names a 0.0.4 counter family without _total too.
    assert prom["kcache_hits"].type == "counter"
    assert set(prom) == set(om)
    # The same samples, less OpenMetrics' _created (when the counters began).
    for name, fam in om.items():
        assert [(s.name, s.labels, s.value) for s in prom[name].samples] == \
            [(s.name, s.labels, s.value) for s in fam.samples if not s.name.endswith("_created")], name


def test_stats_compression_counts_what_zstd_saved(tmp_path):
    """`stats --compression` on a store the package wrote with zstd: every
    entry compressed, the artifacts' bytes exact, the stored bytes fewer."""
    import json

    d = str(tmp_path / "z")
    with kcache.Cache(d, memory=False, compression="zstd") as c:
        for i in range(3):
            c.put(kcache.key("metrics-test/1", z=i), {"obj": (b"abcd" * 5000)[: 20000 - i]})
        c.flush()
    comp = json.loads(_stats(d, "json", "--compression"))["compression"]
    assert comp["entries"] == 3 and comp["compressed_entries"] == 3, comp
    assert comp["payload_bytes"] == 20000 + 19999 + 19998, comp
    assert 0 < comp["stored_bytes"] < comp["payload_bytes"] // 10, comp


@needs_parser
def test_a_remotes_counters_of_every_client_parse(tmp_path, redis):
    """Two processes (this one and a child) write through one redis-server in
    two namespaces; `stats` in a third folder shows the server's counts, and
    both parsers accept the namespace families."""
    def work(folder, ns, n, hits=0):
        with kcache.Cache(str(tmp_path / folder), memory=False, remote=redis.url) as c:
            for i in range(n):
                c.put(kcache.key(ns, n=i), {"obj": b"y" * 500})
            for i in range(hits):
                assert c.get(kcache.key(ns, n=i)) is not None
            c.flush()
    work("a", "metrics-alpha/1", 3)
    child = subprocess.run(
        [os.sys.executable, "-c",
         "import kcache, sys\n"
         "with kcache.Cache(sys.argv[1], memory=False, remote=sys.argv[2]) as c:\n"
         "    [c.put(kcache.key('metrics-beta/1', n=i), {'obj': b'z' * 700}) for i in range(2)]\n"
         "    c.flush()\n",
         str(tmp_path / "b"), redis.url], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    # Hits through the remote alone: a folder that has nothing.
    work("c", "metrics-alpha/1", 0, hits=0)
    with kcache.Cache(str(tmp_path / "d"), memory=False, remote=redis.url) as c:
        assert c.get(kcache.key("metrics-alpha/1", n=0)) is not None
        assert c.get(kcache.key("metrics-alpha/1", n=77)) is None

    def stats(fmt):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env["KCACHE_DIR"] = str(tmp_path / "e")
        env["KCACHE_REMOTE"] = redis.url
        p = subprocess.run([_tool(), "stats", "--format", fmt], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout
    om = _by_family(parse_openmetrics(stats("openmetrics")))
    prom = _by_family(parse_prometheus(stats("prometheus")))

    def remote(fams, family, sample, **labels):
        (s,) = [s for s in fams[family].samples
                if s.name == sample and s.labels["kind"] == "remote" and labels.items() <= s.labels.items()]
        return s.value
    for fams in (om, prom):
        assert remote(fams, "kcache_puts", "kcache_puts_total") == 5
        assert remote(fams, "kcache_hits", "kcache_hits_total") == 1
        assert remote(fams, "kcache_misses", "kcache_misses_total") == 1
        assert remote(fams, "kcache_entries", "kcache_entries") == 5
        assert fams["kcache_namespace_puts"].type == "counter"
        assert remote(fams, "kcache_namespace_puts", "kcache_namespace_puts_total", namespace="metrics-alpha/1") == 3
        assert remote(fams, "kcache_namespace_puts", "kcache_namespace_puts_total", namespace="metrics-beta/1") == 2
        assert remote(fams, "kcache_namespace_hits", "kcache_namespace_hits_total", namespace="metrics-alpha/1") == 1
    assert remote(om, "kcache_namespace_puts", "kcache_namespace_puts_created", namespace="metrics-beta/1") > 1.7e9

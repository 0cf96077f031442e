"""pytest plugin for numba's own caching suite (numba.tests.test_caching)
run with kcache.numba enabled in every process (sitecustomize.py beside
this file): each test gets a kcache folder of its own, as numba's tests
each get a __pycache__ of their own, and the tests that check numba's own
cache files or logs, not what a cache does, are deselected, each with why.

    PYTHONPATH=python/tests/numba_suite:python python -m pytest -p kcache_numba_suite \\
        --pyargs numba.tests.test_caching
"""

import os
import shutil
import tempfile

import pytest

_FILES = "counts or reads numba's own cache files (.nbi index and .nbc data files in __pycache__)"

# test id (class::name) -> why it does not apply to kcache.numba
NOT_APPLICABLE = {
    "TestCache::test_caching": _FILES + " after each compile (check_pycache)",
    "TestCache::test_caching_nrt_pruned": _FILES + " (check_pycache)",
    "TestCache::test_inner_then_outer": _FILES + " (check_pycache)",
    "TestCache::test_outer_then_inner": _FILES + " (check_pycache)",
    "TestCache::test_closure": _FILES + " (check_pycache(5): one index, four data files)",
    "TestCache::test_first_class_function": _FILES + " (check_pycache(7))",
    "TestCache::test_nbi_reproducible_after_touch": _FILES + " (compares the .nbi files' bytes)",
    "TestSequentialParForsCache::test_caching": _FILES + " (check_pycache(2))",
    "TestCacheWithCpuSetting::test_user_set_cpu_name":
        _FILES + " (their mtimes, and the keys in the index through _cache._cache_file)",
    "TestCacheWithCpuSetting::test_user_set_cpu_features":
        _FILES + " (their mtimes, and the keys in the index through _cache._cache_file)",
    "TestCacheFileCollision::test_file_location": "reads the index file name (_cache._cache_file._index_name)",
    "TestCacheFileCollision::test_no_collision":
        "counts numba's cache log lines about its files ('index saved', 'data loaded'); the same two "
        "functions are checked for results across processes by test_numba.py",
    "TestCache::test_recompile":
        "asserts numba's stale results: after mod.Z = 10 it expects the code compiled with Z = 1 (6), and "
        "after a fresh import (Z = 1 again) the code recompiled with Z = 10 (15); kcache keys the values "
        "of the globals a function reads, so it gives 15 and 6 (the correct results); recompile() itself "
        "is tested in test_numba.py (test_recompile_replaces_the_entry)",
}


def _test_id(item):
    parts = item.nodeid.split("::")
    return "::".join(parts[-2:])


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KCACHE_TEST_NUMBA_SUITE_ALL"):  # run them too (to see that they do fail)
        return
    kept, dropped = [], []
    for item in items:
        (dropped if _test_id(item) in NOT_APPLICABLE else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    config._kcache_not_applicable = [_test_id(i) for i in dropped]


def pytest_terminal_summary(terminalreporter, config):
    dropped = getattr(config, "_kcache_not_applicable", [])
    terminalreporter.write_line(f"kcache: {len(dropped)} tests deselected (they check numba's own cache files, "
                                "or its stale results):")
    for name in dropped:
        terminalreporter.write_line(f"  {name}: {NOT_APPLICABLE[name]}")


@pytest.fixture(autouse=True)
def _kcache_folder_per_test(monkeypatch):
    import kcache.numba

    assert kcache.numba.enabled(), "kcache.numba is not enabled in the test process (sitecustomize.py)"
    d = tempfile.mkdtemp(prefix="kcache-numba-suite-")
    monkeypatch.setenv("KCACHE_DIR", d)
    kcache.numba.cache.reset()
    yield
    old = kcache.numba.cache._cache
    if old is not None:
        old.flush()
    kcache.numba.cache.reset()
    shutil.rmtree(d, ignore_errors=True)

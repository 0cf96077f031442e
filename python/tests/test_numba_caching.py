"""numba's own caching suite (numba.tests.test_caching, shipped in numba's
wheel) with kcache.numba enabled in the test process and in every process
its tests start (numba_suite/sitecustomize.py), a kcache folder per test.
The tests that check numba's cache files are deselected with a reason each
(numba_suite/kcache_numba_suite.py); every other test must pass."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("numba", reason="numba is not installed in this Python (make python installs it)")

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "numba_suite")


def test_numba_caching_suite_under_kcache(tmp_path):
    spec = importlib.util.spec_from_file_location("kcache_numba_suite", os.path.join(SUITE, "kcache_numba_suite.py"))
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    pids = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "NUMBA_"))}
    env["PYTHONPATH"] = os.pathsep.join([SUITE] + [p for p in [env.get("PYTHONPATH")] if p])
    env["KCACHE_TEST_NUMBA_SUITE_PIDS"] = str(pids)
    env["KCACHE_LOG"] = "off"
    proc = subprocess.run(
        # no:unraisableexception: numba's cfunc test reads the unraisable
        # ZeroDivisionError from stderr, where pytest's hook would take it.
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:unraisableexception",
         "-p", "kcache_numba_suite",
         "-W", "ignore::DeprecationWarning", "--pyargs", "numba.tests.test_caching"],
        env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1500)
    out = proc.stdout
    print(out[-6000:])
    assert proc.returncode == 0, out[-12000:]
    summary = out.strip().splitlines()
    # 43 tests in numba 0.68.1: 13 deselected, 4 skipped as root without
    # IPython (folder permissions cannot be taken away from root), 26 pass.
    counts = {m.group(2): int(m.group(1)) for m in re.finditer(r"(\d+) (passed|failed|error|errors|deselected|skipped)",
                                                              out)}
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0 and counts.get("errors", 0) == 0, summary[-1]
    assert counts.get("deselected", 0) == len(plugin.NOT_APPLICABLE), summary[-1]
    assert counts.get("passed", 0) >= 26, summary[-1]
    # kcache.numba was enabled in the test process and in the processes
    # its tests started (python -c, multiprocessing spawn children).
    assert len(set(pids.read_text().split())) >= 10

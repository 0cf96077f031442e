"""A test's program run in an interpreter of its own, with a time limit,
so that a hang fails the test instead of stopping the suite."""

import subprocess
import sys
import textwrap

import pytest


def run_snippet(tmp_path, prelude, body, hang="hung"):
    """Runs `prelude` + `body` (dedented) with the store folder
    tmp_path/kcache as sys.argv[1]; the program must print "ok" last."""
    code = prelude + textwrap.dedent(body) + "\nprint('ok')\n"
    try:
        p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "kcache")], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(hang)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-3000:]

"""Imported by every Python process started with this folder on PYTHONPATH
(the run of numba's own caching suite, test_numba_caching.py): numba's
cache=True goes to kcache in the test process and in each process its tests
start (subprocess, multiprocessing spawn). Each process that enabled it
appends its pid to $KCACHE_TEST_NUMBA_SUITE_PIDS."""

import os

try:
    import kcache.numba

    kcache.numba.enable()
    _pids = os.environ.get("KCACHE_TEST_NUMBA_SUITE_PIDS")
    if _pids:
        with open(_pids, "a") as _f:
            _f.write(f"{os.getpid()}\n")
except Exception as _e:  # a process without numba (a tool the tests run) goes on without it
    import sys

    print(f"kcache numba suite: kcache.numba not enabled in {sys.argv[:1]}: {_e}", file=sys.stderr)

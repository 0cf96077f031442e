"""Compiles the first N test kernels with Triton (for sm_90, no GPU needed)
under whatever TRITON_CACHE_MANAGER the environment names, and prints one JSON
line: {"cubins": {name: sha256}, "stats": kcache statistics or null}."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton_kernels  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else None
cubins = dict(triton_kernels.compile_all(n))
stats = None
if os.environ.get("TRITON_CACHE_MANAGER", "").startswith("kcache.triton"):
    import kcache.triton
    stats = kcache.triton.cache().stats()
elif os.environ.get("TRITON_REMOTE_CACHE_BACKEND", "").startswith("kcache.triton"):
    import kcache.triton
    kcache.triton.remote_cache().flush()
    stats = kcache.triton.remote_cache().stats()
print(json.dumps({"cubins": cubins, "stats": stats}))

"""Start-up hook of the kcache wheel (run by kcache-boot.pth at interpreter
start). It does nothing unless TRITON_CACHE_MANAGER names kcache.triton.
Then it waits, without importing anything, for the program to import
Triton, and right after Triton's package has loaded imports kcache.triton,
which remembers triton_key() across processes before Triton first computes
it: the warm start that kcache.triton.install() gives, from the variable
alone. Cost in a process that does not set the variable: one environment
lookup."""

import os
import sys


def _wanted() -> bool:
    return os.environ.get("TRITON_CACHE_MANAGER", "").strip().startswith("kcache.triton")


class _TritonWatch:
    """A meta path finder that only watches: for the package `triton` it
    finds the spec with the other finders and wraps that spec's loader so
    that kcache.triton is imported once Triton's package has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "triton":
            return None
        try:
            sys.meta_path.remove(self)  # once, and never for our own lookups
        except ValueError:
            return None
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            run(module)
            _after_triton()

        loader.exec_module = exec_module
        return spec


def _after_triton() -> None:
    if "kcache.triton" in sys.modules:
        return  # being imported already: it installs itself at its end
    try:
        import kcache.triton  # noqa: F401  (installs the triton_key memo when the variable names it)
    except Exception as e:  # the cache never fails a program
        if os.environ.get("KCACHE_LOG", "warn").strip().lower() not in ("off", "error"):
            print(f"kcache: warn: triton: start-up hook: {type(e).__name__}: {e}", file=sys.stderr)


def install() -> None:
    """Called by kcache-boot.pth."""
    if not _wanted() or "triton" in sys.modules:
        return
    if not any(isinstance(f, _TritonWatch) for f in sys.meta_path):
        sys.meta_path.insert(0, _TritonWatch())

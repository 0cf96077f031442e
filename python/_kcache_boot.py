"""Start-up hook of the kcache wheel (run by kcache-boot.pth at interpreter
start). It does nothing unless TRITON_CACHE_MANAGER names kcache.triton or
KCACHE_TORCH is on. Then it waits, without importing anything, for the
program to import the host, and right after the host's package has loaded:

* Triton: imports kcache.triton, which remembers triton_key() across
  processes before Triton first computes it: the warm start that
  kcache.triton.install() gives, from the variable alone;
* PyTorch (KCACHE_TORCH=1): once torch._inductor.compile_fx has loaded
  (torch.compile imports it at a program's first compile, so a program
  that never compiles pays nothing), imports kcache.torch and calls
  enable(): torch.compile's caches are kcache's from the variable alone.

Cost in a process that sets neither variable: two environment lookups."""

import os
import sys


def _wanted_triton() -> bool:
    return os.environ.get("TRITON_CACHE_MANAGER", "").strip().startswith("kcache.triton")


def _wanted_torch() -> bool:
    return os.environ.get("KCACHE_TORCH", "").strip().lower() in ("1", "true", "yes", "on")


def _warn(host: str, e: BaseException) -> None:
    if os.environ.get("KCACHE_LOG", "warn").strip().lower() not in ("off", "error"):
        print(f"kcache: warn: {host}: start-up hook: {type(e).__name__}: {e}", file=sys.stderr)


class _Watch:
    """A meta path finder that only watches: for one module (`triton`,
    `torch._inductor.compile_fx`) it finds the spec with the other finders and wraps that spec's
    loader so that `after` runs once the module has run."""

    def __init__(self, name, after):
        self.name = name
        self.after = after

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
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
        after = self.after

        def exec_module(module):
            run(module)
            after()

        loader.exec_module = exec_module
        return spec


def _after_triton() -> None:
    if "kcache.triton" in sys.modules:
        return  # being imported already: it installs itself at its end
    try:
        import kcache.triton  # noqa: F401  (installs the triton_key memo when the variable names it)
    except Exception as e:  # the cache never fails a program
        _warn("triton", e)


def _after_torch() -> None:
    try:
        import kcache.torch

        kcache.torch.enable()
    except Exception as e:  # the cache never fails a program
        _warn("torch", e)


def _watch(name, after) -> None:
    if name not in sys.modules and not any(isinstance(f, _Watch) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Watch(name, after))


def install() -> None:
    """Called by kcache-boot.pth."""
    if _wanted_triton():
        _watch("triton", _after_triton)
    if _wanted_torch():
        _watch("torch._inductor.compile_fx", _after_torch)

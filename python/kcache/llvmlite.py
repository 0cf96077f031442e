"""kcache.llvmlite: an object cache for llvmlite's MCJIT ExecutionEngine.

    import llvmlite.binding as llvm
    from kcache.llvmlite import ObjectCache

    objects = ObjectCache(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    tm = objects.create_target_machine()
    engine = llvm.create_mcjit_compiler(module, tm)
    objects.attach(engine)            # engine.set_object_cache(objects.notify, objects.getbuffer)
    engine.finalize_object()          # a hit loads the object file; a miss compiles and stores it

The key is the module's bitcode as MCJIT is about to compile it, the target
machine (triple, CPU, features, optimisation level, relocation and code
models) and the LLVM version llvmlite was built with. The object file is one
artifact, "obj". Cache faults are misses; a hit whose object fails to load is
LLVM's error, as with any object cache.

Thread-safety: one ObjectCache may serve several engines and threads.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional

import llvmlite
import llvmlite.binding as llvm

import kcache

__all__ = ["ObjectCache"]

_NAMESPACE = "llvmlite/1"


class ObjectCache:
    """An llvmlite object cache over a kcache Cache.

    cpu, features, opt, reloc, codemodel: the target machine's settings (use
    create_target_machine() so the machine and the key agree).
    triple: the target triple (default: the process's).
    cache: the kcache.Cache to use (default: kcache.Cache(), the KCACHE_*
    environment).
    """

    def __init__(
        self,
        *,
        cpu: str = "",
        features: str = "",
        opt: int = 2,
        reloc: str = "default",
        codemodel: str = "jitdefault",
        triple: Optional[str] = None,
        cache: Optional[kcache.Cache] = None,
    ) -> None:
        if not isinstance(opt, int) or isinstance(opt, bool) or not 0 <= opt <= 3:
            raise ValueError("ObjectCache: opt must be an int from 0 to 3")
        self.cpu = cpu
        self.features = features
        self.opt = opt
        self.reloc = reloc
        self.codemodel = codemodel
        self.triple = triple or llvm.get_process_triple()
        self.cache = cache if cache is not None else kcache.Cache(producer="llvmlite")
        self._target = {
            "triple": self.triple,
            "cpu": cpu,
            "features": features,
            "opt": str(opt),
            "reloc": reloc,
            "codemodel": codemodel,
        }
        self._llvm = ".".join(str(v) for v in llvm.llvm_version_info)
        self._pending: Dict[int, kcache.Key] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def create_target_machine(self) -> "llvm.TargetMachine":
        """The target machine these settings describe."""
        target = llvm.Target.from_triple(self.triple)
        return target.create_target_machine(cpu=self.cpu, features=self.features, opt=self.opt, reloc=self.reloc,
                                            codemodel=self.codemodel, jit=True)

    def key(self, module: "llvm.ModuleRef") -> kcache.Key:
        """The key of `module` (its bitcode) on this target."""
        return kcache.key(_NAMESPACE, bitcode=module.as_bitcode(), target=self._target, llvm=self._llvm,
                          llvmlite=llvmlite.__version__)

    def attach(self, engine: "llvm.ExecutionEngine") -> None:
        """Makes this the engine's object cache."""
        engine.set_object_cache(self.notify, self.getbuffer)

    def getbuffer(self, module: "llvm.ModuleRef") -> Optional[bytes]:
        """llvmlite's getbuffer hook: the stored object file, or None."""
        k = self.key(module)
        entry = self.cache.get(k)
        if entry is not None and "obj" in entry:
            with self._lock:
                self.hits += 1
            return bytes(entry["obj"])
        with self._lock:
            self.misses += 1
            # The key of the IR MCJIT compiles; codegen may change the module
            # before notify() sees it.
            self._pending[id(module)] = k
        return None

    def notify(self, module: "llvm.ModuleRef", buffer: bytes) -> None:
        """llvmlite's notify hook: stores the compiled object file."""
        with self._lock:
            k = self._pending.pop(id(module), None)
        if k is None:
            k = self.key(module)
        self.cache.put(k, {"obj": buffer})

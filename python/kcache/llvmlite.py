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
models), the LLVM version llvmlite was built with, and llvmlite's version and
build (_hostutil.dist_build). The object file is one
artifact, "obj". Cache faults are misses; a hit whose object fails to load is
LLVM's error, as with any object cache.

A module that several threads or processes miss at once is compiled once:
the first owns the key's flight from getbuffer() to notify(), the others
wait and load its object. notify() stores the object in the disk tier
before it returns.

Thread-safety: one ObjectCache may serve several engines and threads.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional

import llvmlite
import llvmlite.binding as llvm

import kcache

from ._hostutil import Flights, dist_build, log

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
        self._flights = Flights()
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
                          llvmlite=llvmlite.__version__, llvmlite_build=dist_build("llvmlite", llvmlite))

    def attach(self, engine: "llvm.ExecutionEngine") -> None:
        """Makes this the engine's object cache."""
        engine.set_object_cache(self.notify, self.getbuffer)

    def getbuffer(self, module: "llvm.ModuleRef") -> Optional[bytes]:
        """llvmlite's getbuffer hook: the stored object file, or None.

        On a miss this thread owns the key's flight until notify() stores
        the object: another thread or process that misses the same module
        meanwhile waits for it and loads it rather than compiling it too."""
        # MCJIT compiles one module at a time on a thread, from getbuffer to
        # notify: a flight still owned here is of a compile that never
        # reached notify (LLVM gave up); it is given up, and a waiting
        # process takes the key over.
        stale = self._flights.names()
        for name in stale:
            self._flights.abandon(name)
        if stale:
            with self._lock:
                for mid in [m for m, k in self._pending.items() if k.hex in stale]:
                    del self._pending[mid]
        k = self.key(module)
        entry = self._flights.begin(self.cache, k, "llvmlite", f"module {module.name}")
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
        """llvmlite's notify hook: stores the compiled object file (in the
        disk tier before it returns, when this thread owns the flight)."""
        with self._lock:
            k = self._pending.pop(id(module), None)
        if k is None:
            k = self.key(module)
        flight = self._flights.pop(k.hex)
        try:
            if flight is not None:
                flight.commit({"obj": bytes(buffer)})
            else:
                self.cache.put(k, {"obj": bytes(buffer)})
        except Exception as e:  # the cache never fails a compile
            log("llvmlite", f"module {module.name}: not stored: {e}")
            if flight is not None and not flight.done:
                flight.fail()

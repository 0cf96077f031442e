// LLVM integration, LLJIT: make_cached_lljit (an LLJIT whose compile layer
// is a CachingCompiler), the target description each JIT configuration
// compiles for (FrontendKeys::for_jit), and BitcodeLoader, which adds
// bitcode to such a JIT keyed on the bytes as read.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/RTDyldObjectLinkingLayer.h>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"
#include "util/util.h"

namespace kcache::llvm {

using namespace detail;

namespace {

// The target machine builder make_cached_lljit uses for `options`.
::llvm::Expected<::llvm::orc::JITTargetMachineBuilder> jit_tmb(const JitOptions& options) {
  auto jtmb = ::llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) return jtmb.takeError();
  if (!options.cpu.empty()) jtmb->setCPU(options.cpu);
  if (!options.features.empty()) jtmb->getFeatures() = ::llvm::SubtargetFeatures(options.features);
  jtmb->setCodeGenOptLevel(compat::codegen_opt_level(options.opt_level));
  return jtmb;
}

// jit_tmb(options) as LLJIT configures it for its own linker when
// options.lljit_linker: where LLJIT links with JITLink (LLVM 19 on x86-64
// ELF, say) it asks for the small code model and PIC, which compile faster
// and make smaller code than RuntimeDyld's large code model. `b`, when
// given, is the builder to configure (make_cached_lljit's own).
::llvm::Expected<::llvm::orc::JITTargetMachineBuilder> configured_tmb(const JitOptions& options,
                                                                      ::llvm::orc::LLJITBuilder* b = nullptr) {
  auto jtmb = jit_tmb(options);
  if (!jtmb || !options.lljit_linker) return jtmb;
  ::llvm::orc::LLJITBuilder own;
  if (!b) b = &own;
  b->setJITTargetMachineBuilder(std::move(*jtmb));
  if (auto err = b->prepareForConstruction()) return err;
  return *b->JTMB;
}

// The target description of the machines jit_tmb(options) makes. It
// depends only on the host and the options jit_tmb reads, so the process
// remembers it: FrontendKeys::for_jit after make_cached_lljit, or a second
// JIT like the first, makes no TargetMachine just to learn it (about 0.1 ms).
class JitTargets {
 public:
  static JitTargets& get() {
    static auto* t = new JitTargets();  // never destroyed: used until exit
    return *t;
  }
  std::optional<TargetDesc> find(const JitOptions& o) {
    std::lock_guard lk(mu_);
    auto it = known_.find(key(o));
    if (it == known_.end()) return std::nullopt;
    return it->second;
  }
  void remember(const JitOptions& o, const TargetDesc& d) {
    std::lock_guard lk(mu_);
    known_.emplace(key(o), d);
  }

 private:
  static std::tuple<std::string, std::string, unsigned, bool> key(const JitOptions& o) {
    return {o.cpu, o.features, std::min(o.opt_level, 3u), o.lljit_linker};
  }
  std::mutex mu_;
  std::map<std::tuple<std::string, std::string, unsigned, bool>, TargetDesc> known_;  // GUARDED_BY(mu_)
};

}  // namespace

kcache::Expected<FrontendKeys> FrontendKeys::for_jit(const JitOptions& options) {
  KeyOptions ko;
  ko.ir_opt_level = static_cast<int>(std::min(options.opt_level, 3u));
  ko.extra = options.key_extra;
  if (auto known = JitTargets::get().find(options)) return FrontendKeys(*known, ko);
  auto jtmb = configured_tmb(options);
  if (!jtmb) return Status(Errc::invalid_argument, ::llvm::toString(jtmb.takeError()));
  auto tm = jtmb->createTargetMachine();
  if (!tm) return Status(Errc::invalid_argument, ::llvm::toString(tm.takeError()));
  TargetDesc desc = TargetDesc::of(**tm);
  JitTargets::get().remember(options, desc);
  return FrontendKeys(desc, ko);
}

kcache::Expected<FrontendKeys> FrontendKeys::for_jit(::llvm::orc::LLJIT& jit) {
  CachingCompiler* cc = CachingCompiler::of(jit);
  if (!cc)
    return Status(Errc::invalid_argument, "FrontendKeys::for_jit: the JIT's compile layer is no CachingCompiler");
  return FrontendKeys(cc->target(), cc->key_options());
}

kcache::Expected<BitcodeLoader> BitcodeLoader::for_jit(::llvm::orc::LLJIT& jit) {
  CachingCompiler* cc = CachingCompiler::of(jit);
  if (!cc) {
    KCACHE_LOG(LogLevel::warn,
               "llvm: BitcodeLoader over a JIT whose compile layer is no CachingCompiler: files are parsed and "
               "added uncached");
    return BitcodeLoader(nullptr, jit, std::nullopt, nullptr);
  }
  if (cc->cache_.options().disabled) return BitcodeLoader(nullptr, jit, std::nullopt, cc->counters_);
  return BitcodeLoader(&cc->cache_, jit, FrontendKeys(cc->target(), cc->key_options()), cc->counters_);
}

kcache::Expected<BitcodeLoader> BitcodeLoader::for_jit(Cache& cache, ::llvm::orc::LLJIT& jit,
                                                       const JitOptions& options) {
  if (CachingCompiler* cc = CachingCompiler::of(jit)) {
    // Said, never obeyed: keys for settings the JIT does not compile with
    // would only ever miss.
    KeyOptions ko = cc->key_options();
    if (&cache != &cc->cache_ || static_cast<int>(std::min(options.opt_level, 3u)) != ko.ir_opt_level ||
        options.key_extra != ko.extra || (!options.cpu.empty() && options.cpu != cc->target().cpu) ||
        (options.counters && options.counters != cc->counters_)) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        KCACHE_LOG(LogLevel::info,
                   "llvm: BitcodeLoader::for_jit given a cache or options unlike its JIT's: the JIT's are used");
    }
  }
  return for_jit(jit);
}

::llvm::Error BitcodeLoader::add(std::unique_ptr<::llvm::MemoryBuffer> bitcode, ::llvm::orc::JITDylib* jd) {
  if (!bitcode) return make_error("BitcodeLoader::add: no buffer");
  ::llvm::orc::JITDylib& dylib = jd ? *jd : jit_->getMainJITDylib();
  std::optional<Key> front;
  if (keys_ && cache_) {
    {
      Tally tally(counters_.get());
      Clocks t0 = tally.now();
      ::llvm::StringRef bytes = bitcode->getBuffer();
      front = keys_->key(hash_bytes(std::string_view(bytes.data(), bytes.size()))).key;
      tally.charge(tally.key, t0);
    }
    if (auto obj = keys_->find(*cache_, *front, counters_.get())) return jit_->addObjectFile(dylib, std::move(obj));
  }
  auto ctx = std::make_unique<::llvm::LLVMContext>();
  auto m = ::llvm::parseBitcodeFile(bitcode->getMemBufferRef(), *ctx);
  if (!m) return m.takeError();
  // The module identifier is the buffer's (parseBitcodeFile sets it): the
  // label comes from it, the key never does.
  if (front) set_frontend_key(**m, *front);
  return jit_->addIRModule(dylib, ::llvm::orc::ThreadSafeModule(std::move(*m), std::move(ctx)));
}

::llvm::Error BitcodeLoader::add_file(const std::string& path, ::llvm::orc::JITDylib* jd) {
  auto buf = ::llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buf) return ::llvm::errorCodeToError(buf.getError());
  return add(std::move(*buf), jd);
}

::llvm::Expected<std::unique_ptr<::llvm::orc::LLJIT>> make_cached_lljit(Cache& cache, JitOptions options) {
  auto jtmb = jit_tmb(options);
  if (!jtmb) return jtmb.takeError();

  CompilerOptions co;
  co.ir_opt_level = static_cast<int>(std::min(options.opt_level, 3u));
  co.key_extra = options.key_extra;
  co.zero_copy = options.zero_copy;
  co.counters = options.counters;

  const bool jtmb_triple_is_elf = jtmb->getTargetTriple().isOSBinFormatELF();
  ::llvm::orc::LLJITBuilder b;
  if (options.compile_threads) b.setNumCompileThreads(options.compile_threads);
  // LLJIT's own choice of linker and of the machine configuration that goes
  // with it, unless RuntimeDyld is asked for: the code a plain LLJIT makes.
  bool rtdyld = true;
  if (options.lljit_linker) {
    auto configured = configured_tmb(options, &b);
    if (!configured) return configured.takeError();
    jtmb = std::move(*configured);
    rtdyld = !b.CreateObjectLinkingLayer;
  } else {
    b.setJITTargetMachineBuilder(*jtmb);
  }
  // One machine gives the JIT its data layout (LLJIT would make a machine
  // of its own for that) and the compiler its target description and first
  // compile: a warm start that compiles nothing makes just this one.
  auto tm = jtmb->createTargetMachine();
  if (!tm) return tm.takeError();
  b.setDataLayout((*tm)->createDataLayout());
  Cache* c = &cache;
  auto first = std::make_shared<std::unique_ptr<::llvm::TargetMachine>>(std::move(*tm));
  b.setCompileFunctionCreator([c, co, first, options](::llvm::orc::JITTargetMachineBuilder j)
                                  -> ::llvm::Expected<std::unique_ptr<::llvm::orc::IRCompileLayer::IRCompiler>> {
    auto cc = *first ? CachingCompiler::create(*c, std::move(j), co, std::move(*first))
                     : CachingCompiler::create(*c, std::move(j), co);
    if (!cc) return cc.takeError();
    // The description the compiler took from its machine, for for_jit.
    JitTargets::get().remember(options, (*cc)->target());
    return std::unique_ptr<::llvm::orc::IRCompileLayer::IRCompiler>(std::move(*cc));
  });
  if (rtdyld && options.arena_memory && jtmb_triple_is_elf) {
    b.setObjectLinkingLayerCreator(
        [](::llvm::orc::ExecutionSession& es,
           const ::llvm::Triple&) -> ::llvm::Expected<std::unique_ptr<::llvm::orc::ObjectLayer>> {
          return std::make_unique<::llvm::orc::RTDyldObjectLinkingLayer>(es, arena_memory_managers());
        });
  }
  auto jit = b.create();
  if (!jit) return jit.takeError();
  if (options.process_symbols) {
    auto gen =
        ::llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess((*jit)->getDataLayout().getGlobalPrefix());
    if (!gen) return gen.takeError();
    (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
  }
  return jit;
}

}  // namespace kcache::llvm

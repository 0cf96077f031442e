// LLVM integration, LLJIT: make_cached_lljit (an LLJIT whose compile layer
// is a CachingCompiler), the target description each JIT configuration
// compiles for (FrontendKeys::for_jit), and BitcodeLoader, which adds
// bitcode to such a JIT keyed on the bytes as read.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/RTDyldObjectLinkingLayer.h>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"
#include "util/util.h"

#if KCACHE_ARENA_JITLINK
#include <llvm/ExecutionEngine/Orc/EPCEHFrameRegistrar.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#if __has_include(<llvm/ExecutionEngine/Orc/EHFrameRegistrationPlugin.h>)
#include <llvm/ExecutionEngine/Orc/EHFrameRegistrationPlugin.h>
#endif
#endif

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

// The file at `path`, as add_file reads it.
::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> read_bitcode(const std::string& path) {
  auto buf = ::llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buf) return ::llvm::errorCodeToError(buf.getError());
  return std::move(*buf);
}

// The module `bitcode` holds, in `ctx`, tagged with its front-end key when
// it has one. The module identifier is the buffer's (parseBitcodeFile sets
// it): the label comes from it, the key never does.
::llvm::Expected<std::unique_ptr<::llvm::Module>> parse_tagged(const ::llvm::MemoryBuffer& bitcode,
                                                               ::llvm::LLVMContext& ctx,
                                                               const std::optional<Key>& front) {
  auto m = ::llvm::parseBitcodeFile(bitcode.getMemBufferRef(), ctx);
  if (m && front) set_frontend_key(**m, *front);
  return m;
}

// The modules of bitcode[i] for each i in `which`, in that order, each in a
// context of its own and tagged with (*fronts)[i] when `fronts` is given;
// when any buffer does not parse, every parse error and no module.
::llvm::Expected<std::vector<::llvm::orc::ThreadSafeModule>> parse_all(
    const std::vector<std::unique_ptr<::llvm::MemoryBuffer>>& bitcode, const std::vector<size_t>& which,
    const std::vector<Key>* fronts) {
  std::vector<::llvm::orc::ThreadSafeModule> modules;
  ::llvm::Error errors = ::llvm::Error::success();
  for (size_t i : which) {
    auto ctx = std::make_unique<::llvm::LLVMContext>();
    auto m = parse_tagged(*bitcode[i], *ctx, fronts ? std::optional<Key>((*fronts)[i]) : std::nullopt);
    if (m)
      modules.emplace_back(std::move(*m), std::move(ctx));
    else
      errors = ::llvm::joinErrors(std::move(errors), m.takeError());
  }
  if (errors) return errors;
  return modules;
}

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
    return BitcodeLoader(nullptr, jit, std::nullopt, nullptr, nullptr);
  }
  if (cc->cache_.options().disabled) return BitcodeLoader(nullptr, jit, std::nullopt, cc->counters_, nullptr);
  return BitcodeLoader(&cc->cache_, jit, FrontendKeys(cc->target(), cc->key_options()), cc->counters_, cc);
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
    front = front_key(*bitcode);
    if (auto obj = keys_->find(*cache_, *front, counters_.get())) return jit_->addObjectFile(dylib, std::move(obj));
  }
  auto ctx = std::make_unique<::llvm::LLVMContext>();
  auto m = parse_tagged(*bitcode, *ctx, front);
  if (!m) return m.takeError();
  return jit_->addIRModule(dylib, ::llvm::orc::ThreadSafeModule(std::move(*m), std::move(ctx)));
}

::llvm::Error BitcodeLoader::add_file(const std::string& path, ::llvm::orc::JITDylib* jd) {
  auto buf = read_bitcode(path);
  if (!buf) return buf.takeError();
  return add(std::move(*buf), jd);
}

::llvm::Error BitcodeLoader::add_all(std::vector<std::unique_ptr<::llvm::MemoryBuffer>> bitcode,
                                     ::llvm::orc::JITDylib* jd, unsigned threads) {
  for (const auto& b : bitcode)
    if (!b) return make_error("BitcodeLoader::add_all: no buffer");
  ::llvm::orc::JITDylib& dylib = jd ? *jd : jit_->getMainJITDylib();
  const size_t n = bitcode.size();
  if (!keys_ || !cache_ || !compiler_) {
    // No keys: parsed and added, as add() would, once every buffer parsed.
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    auto modules = parse_all(bitcode, all, nullptr);
    if (!modules) return modules.takeError();
    for (auto& m : *modules)
      if (auto err = jit_->addIRModule(dylib, std::move(m))) return err;
    return ::llvm::Error::success();
  }
  // 1. Every buffer keyed on its bytes; the set's combined object, when
  // one is stored, is all there is to link.
  std::vector<std::unique_ptr<::llvm::MemoryBuffer>> objects(n);
  std::vector<Key> fronts(n);
  for (size_t i = 0; i < n; ++i) fronts[i] = front_key(*bitcode[i]);
  std::optional<KeyInfo> set = combine_ ? keys_->set_key(fronts) : std::nullopt;
  if (set) {
    bool refused = false;
    if (auto whole = keys_->find_set(*cache_, set->key, counters_.get(), &refused)) {
      // Not added (a name the JITDylib defines already): each module's
      // object instead, so that only the modules at fault fail.
      ::llvm::Error err = jit_->addObjectFile(dylib, std::move(whole));
      if (!err) {
        if (counters_) {
          counters_->lookups.fetch_add(n, std::memory_order_relaxed);
          counters_->hits.fetch_add(n, std::memory_order_relaxed);
          counters_->frontend_hits.fetch_add(n, std::memory_order_relaxed);
        }
        return ::llvm::Error::success();
      }
      ::llvm::consumeError(std::move(err));
      set.reset();  // found but not added: not made again
    } else if (refused) {
      set.reset();
    }
  }
  // Else each looked up: a hit needs no parse.
  for (size_t i = 0; i < n; ++i) objects[i] = keys_->find(*cache_, fronts[i], counters_.get());
  // 2. The misses parsed, largest first: every process takes them in this
  // order, and the last compile to end, which the others may wait for, is
  // then a short one.
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (!objects[i]) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return bitcode[x]->getBufferSize() > bitcode[y]->getBufferSize(); });
  auto modules = parse_all(bitcode, order, &fronts);
  if (!modules) return modules.takeError();
  std::vector<::llvm::Module*> to_compile;
  for (auto& m : *modules) to_compile.push_back(m.getModuleUnlocked());
  // 3. Keyed on their IR and compiled, shared out with the other processes.
  auto compiled = compiler_->compile_all(to_compile, threads);
  ::llvm::Error errors = ::llvm::Error::success();
  for (size_t k = 0; k < compiled.size(); ++k) {
    if (compiled[k])
      objects[order[k]] = std::move(*compiled[k]);
    else
      errors = ::llvm::joinErrors(std::move(errors), compiled[k].takeError());
  }
  modules->clear();
  // 4. With every module's object in hand, the set's combined object made,
  // stored and linked in their place.
  if (set && !errors) {
    std::vector<::llvm::MemoryBufferRef> refs;
    refs.reserve(n);
    for (const auto& obj : objects) refs.push_back(obj->getMemBufferRef());
    if (auto whole = keys_->store_set(*cache_, *set, fronts, refs, counters_.get())) {
      ::llvm::Error err = jit_->addObjectFile(dylib, std::move(whole));
      if (!err) return ::llvm::Error::success();
      ::llvm::consumeError(std::move(err));  // each module's object instead, as above
    }
  }
  // Else the objects handed to the JIT in the caller's order.
  for (auto& obj : objects) {
    if (!obj) continue;
    if (auto err = jit_->addObjectFile(dylib, std::move(obj)))
      errors = ::llvm::joinErrors(std::move(errors), std::move(err));
  }
  return errors;
}

::llvm::Error BitcodeLoader::add_files(const std::vector<std::string>& paths, ::llvm::orc::JITDylib* jd,
                                       unsigned threads) {
  std::vector<std::unique_ptr<::llvm::MemoryBuffer>> bitcode;
  bitcode.reserve(paths.size());
  for (const auto& path : paths) {
    auto buf = read_bitcode(path);
    if (!buf) return buf.takeError();
    bitcode.push_back(std::move(*buf));
  }
  return add_all(std::move(bitcode), jd, threads);
}

Key BitcodeLoader::front_key(const ::llvm::MemoryBuffer& bitcode) {
  Tally tally(counters_.get());
  Clocks t0 = tally.now();
  ::llvm::StringRef bytes = bitcode.getBuffer();
  Key front = keys_->key(hash_bytes(std::string_view(bytes.data(), bytes.size()))).key;
  tally.charge(tally.key, t0);
  return front;
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
#if KCACHE_ARENA_JITLINK
  if (!rtdyld && options.arena_memory && jtmb_triple_is_elf) {
    // LLJIT's own JITLink layer (ObjectLinkingLayer with EH frames
    // registered through the process's registrar), linking into one arena
    // instead of a mapping per object.
    b.setObjectLinkingLayerCreator(
        [](::llvm::orc::ExecutionSession& es,
           const ::llvm::Triple&) -> ::llvm::Expected<std::unique_ptr<::llvm::orc::ObjectLayer>> {
          auto layer = std::make_unique<::llvm::orc::ObjectLinkingLayer>(es, arena_jitlink_memory_manager());
          auto registrar = ::llvm::orc::EPCEHFrameRegistrar::Create(es);
          if (!registrar) return registrar.takeError();
          layer->addPlugin(std::make_unique<::llvm::orc::EHFrameRegistrationPlugin>(es, std::move(*registrar)));
          return std::unique_ptr<::llvm::orc::ObjectLayer>(std::move(layer));
        });
  }
#endif
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

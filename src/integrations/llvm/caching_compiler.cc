// LLVM integration, the caching compiler: an ORC IRCompiler that keys each
// module, finds its object or runs the IR pipeline and the code generator
// once through Cache::get_or_compile, and stores the stage link of a
// module tagged with a front-end key.
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/SmallVectorMemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"
#include "util/util.h"

namespace kcache::llvm {

using namespace detail;

namespace {

// Every CachingCompiler alive in the process (the build has no RTTI to
// tell one from another IRCompiler): CachingCompiler::of looks a JIT's
// compiler up here. Never destroyed.
struct LiveCompilers {
  std::mutex mu;
  std::unordered_set<const void*> live;  // GUARDED_BY(mu)
};
LiveCompilers& live_compilers() {
  static auto* l = new LiveCompilers;
  return *l;
}

}  // namespace

CachingCompiler::CachingCompiler(Cache& cache, ::llvm::orc::JITTargetMachineBuilder jtmb, TargetDesc target,
                                 ::llvm::orc::IRSymbolMapper::ManglingOptions mo, CompilerOptions options)
    : IRCompiler(std::move(mo)),
      cache_(cache),
      jtmb_(std::move(jtmb)),
      target_(std::move(target)),
      opt_(std::move(options)),
      key_base_(target_part(target_, KeyOptions{opt_.ir_opt_level, opt_.key_extra})),
      front_target_(front_target_digest(target_, KeyOptions{opt_.ir_opt_level, opt_.key_extra})) {
  arch_ = ::llvm::Triple(target_.triple).getArch();
  counters_ = opt_.counters ? opt_.counters : std::make_shared<CompileCounters>();
  auto& l = live_compilers();
  std::lock_guard lk(l.mu);
  l.live.insert(static_cast<const ::llvm::orc::IRCompileLayer::IRCompiler*>(this));
}

CachingCompiler::~CachingCompiler() {
  auto& l = live_compilers();
  std::lock_guard lk(l.mu);
  l.live.erase(static_cast<const ::llvm::orc::IRCompileLayer::IRCompiler*>(this));
}

CachingCompiler* CachingCompiler::of(::llvm::orc::LLJIT& jit) {
  ::llvm::orc::IRCompileLayer::IRCompiler* c = &jit.getIRCompileLayer().getCompiler();
  auto& l = live_compilers();
  std::lock_guard lk(l.mu);
  if (!l.live.count(c)) return nullptr;
  return static_cast<CachingCompiler*>(c);
}

::llvm::Expected<std::unique_ptr<CachingCompiler>> CachingCompiler::create(Cache& cache,
                                                                           ::llvm::orc::JITTargetMachineBuilder jtmb,
                                                                           CompilerOptions options) {
  // One TargetMachine up front gives the exact target description (the
  // builder does not expose its codegen level); the first compile uses it.
  auto tm = jtmb.createTargetMachine();
  if (!tm) return tm.takeError();
  return create(cache, std::move(jtmb), std::move(options), std::move(*tm));
}

::llvm::Expected<std::unique_ptr<CachingCompiler>> CachingCompiler::create(
    Cache& cache, ::llvm::orc::JITTargetMachineBuilder jtmb, CompilerOptions options,
    std::unique_ptr<::llvm::TargetMachine> machine) {
  if (!machine) return make_error("CachingCompiler::create: no TargetMachine");
  TargetDesc desc = TargetDesc::of(*machine);
  auto mo = ::llvm::orc::irManglingOptionsFromTargetOptions(machine->Options);
  std::unique_ptr<CachingCompiler> c(
      new CachingCompiler(cache, std::move(jtmb), std::move(desc), std::move(mo), std::move(options)));
  c->machines_.push_back(std::move(machine));  // the first compile's
  return c;
}

kcache::Expected<::llvm::SmallVector<char, 0>> CachingCompiler::compile(::llvm::Module& m) {
  // A machine of this thread's own until the compile ends, then back to the
  // pool: compiles on one TargetMachine must not overlap, and one after
  // another they produce the bytes a fresh machine would, with one
  // exception. LLVM 14's ELF object-file lowering remembers the globals a
  // module lists in @llvm.used in its machine and never forgets them
  // (TargetLoweringObjectFileELF::Used); a later module's global at a
  // reused address would then get a retained section of its own. A machine
  // that generated code for such a module is dropped, not kept (checked on
  // the module code generation reads: after the IR pipeline).
  std::unique_ptr<::llvm::TargetMachine> tm;
  {
    std::lock_guard lk(machines_mu_);
    if (!machines_.empty()) {
      tm = std::move(machines_.back());
      machines_.pop_back();
    }
  }
  if (!tm) {
    auto made = jtmb_.createTargetMachine();
    if (!made) return Status(Errc::compile_failed, ::llvm::toString(made.takeError()));
    tm = std::move(*made);
  }
  struct GiveBack {
    CachingCompiler& c;
    std::unique_ptr<::llvm::TargetMachine>& tm;
    bool keep = true;
    ~GiveBack() {
      if (!keep) return;
      try {
        std::lock_guard lk(c.machines_mu_);
        c.machines_.push_back(std::move(tm));
      } catch (...) {
        // Not kept: the next compile makes a machine again.
      }
    }
  } give_back{*this, tm};
  if (m.getDataLayout().isDefault()) m.setDataLayout(tm->createDataLayout());
  if (opt_.ir_opt_level >= 0) {
    ::llvm::PassBuilder pb(tm.get());
    ::llvm::LoopAnalysisManager lam;
    ::llvm::FunctionAnalysisManager fam;
    ::llvm::CGSCCAnalysisManager cgam;
    ::llvm::ModuleAnalysisManager mam;
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    ::llvm::OptimizationLevel level = ::llvm::OptimizationLevel::O0;
    switch (opt_.ir_opt_level) {
      case 0:
        level = ::llvm::OptimizationLevel::O0;
        break;
      case 1:
        level = ::llvm::OptimizationLevel::O1;
        break;
      case 2:
        level = ::llvm::OptimizationLevel::O2;
        break;
      default:
        level = ::llvm::OptimizationLevel::O3;
        break;
    }
    ::llvm::ModulePassManager mpm = level == ::llvm::OptimizationLevel::O0 ? pb.buildO0DefaultPipeline(level)
                                                                           : pb.buildPerModuleDefaultPipeline(level);
    mpm.run(m, mam);
  }
  ::llvm::SmallVector<char, 0> out;
  {
    ::llvm::raw_svector_ostream os(out);
    ::llvm::legacy::PassManager pm;
    ::llvm::MCContext* ctx = nullptr;
    if (tm->addPassesToEmitMC(pm, ctx, os)) return Status(Errc::compile_failed, "target cannot emit machine code");
    if (m.getNamedGlobal("llvm.used") || m.getNamedGlobal("llvm.compiler.used")) give_back.keep = false;
    pm.run(m);
  }
  return out;
}

struct CachingCompiler::Job {
  explicit Job(::llvm::Module& module, CompileCounters* counters) : m(module), tally(counters) { tally.lookups = 1; }
  ::llvm::Module& m;
  Tally tally;                  // what this module adds to the counters
  std::optional<Digest> front;  // its front-end key tag
  std::optional<KeyInfo> key;   // none: compiled uncached
  Source src = Source::compiled;
  bool compiled_here = false;  // compile() ran on the module (it is optimised now)
};

void CachingCompiler::open_job(Job& job) {
  Clocks t0 = job.tally.now();
  // Tags come off before anything else sees the module: they never reach
  // the object key or the code generator.
  job.front = take_digest_md(job.m, kFrontMd);
  std::optional<Digest> ird = take_digest_md(job.m, kIrDigestMd);
  // No key when the cache is disabled: nothing would be looked up or
  // stored, so a key would be pure cost.
  if (cache_.options().disabled) return;
  auto k = key_of_module(job.m, ird, key_base_);
  job.tally.charge(job.tally.key, t0);
  if (k)
    job.key = std::move(*k);
  else
    KCACHE_LOG(LogLevel::warn, "llvm: no key for module: %s (compiling uncached)", k.error().to_string().c_str());
}

kcache::Expected<std::vector<Artifact>> CachingCompiler::job_artifacts(Job& job) {
  auto obj = run_job(job);
  if (!obj) return obj.error();
  return object_artifacts(::llvm::StringRef(obj->data(), obj->size()));
}

kcache::Expected<::llvm::SmallVector<char, 0>> CachingCompiler::run_job(Job& job) {
  Clocks c0 = job.tally.now();
  job.compiled_here = true;
  auto obj = compile(job.m);
  job.tally.charge(job.tally.compile, c0);
  if (obj) job.tally.codegen_runs = 1;
  return obj;
}

::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> CachingCompiler::close_job(Job& job,
                                                                                   kcache::Expected<Entry> entry) {
  Tally& tally = job.tally;
  auto store_link = [&] {
    if (job.front && put_stage_link(cache_, bound_link_front(*job.front, front_target_), ir_of(*job.key), job.key->key))
      tally.links_stored = 1;
  };
  if (job.key) {
    // The only error get_or_compile(_batch) returns is the compile's own.
    if (!entry) return make_error(entry.error().to_string());
    std::string why;
    auto buf = object_buffer(std::move(*entry), arch_, opt_.zero_copy, &why, /*check=*/!job.compiled_here);
    if (buf) {
      (job.src == Source::compiled || job.src == Source::waited ? tally.misses : tally.hits) = 1;
      store_link();
      return buf;
    }
    if (job.compiled_here) return make_error("code generator produced no usable object: " + why);
    // A stored object we cannot use: never the caller's problem. The module
    // is still unoptimised (another thread compiled, or it came from a
    // tier), so it is compiled below and replaces the bad entry.
    tally.bad_objects = 1;
    KCACHE_LOG(LogLevel::warn, "llvm: stored object %s rejected: %s (recompiling)", job.key->key.hex().c_str(),
               why.c_str());
  }

  // Compiled here, uncached (no key) or in place of a bad stored object.
  tally.misses = 1;
  auto obj = run_job(job);
  if (!obj) return make_error(obj.error().to_string());
  std::string name;
  if (job.key) {
    cache_.put(*job.key, object_artifacts(::llvm::StringRef(obj->data(), obj->size())), tally.compile.wall / 1000);
    store_link();
    name = "kcache:" + job.key->key.hex();
  } else {
    name = job.m.getModuleIdentifier() + "-jitted";
  }
  // The code generator's own buffer, as LLJIT's compiler hands it on: no
  // copy.
  return std::make_unique<::llvm::SmallVectorMemoryBuffer>(std::move(*obj), name,
                                                           /*RequiresNullTerminator=*/false);
}

::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> CachingCompiler::operator()(::llvm::Module& m) {
  Job job(m, counters_.get());
  open_job(job);
  if (!job.key) return close_job(job, Status(Errc::internal, "no key"));
  Clocks t1 = job.tally.now();
  auto entry = cache_.get_or_compile(
      *job.key, [&] { return job_artifacts(job); }, &job.src);
  auto buf = close_job(job, std::move(entry));
  // The lookup's time without the compile it may have run.
  job.tally.lookup += (job.tally.now() - t1) - job.tally.compile;
  return buf;
}

std::vector<::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>>> CachingCompiler::compile_all(
    const std::vector<::llvm::Module*>& modules, unsigned threads) {
  // The batch's time, less what compiles took on this thread, is the
  // lookups' (and the waits'), counted once for the whole batch.
  Tally batch(counters_.get());
  Clocks on_caller;
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::unique_ptr<Job>> jobs;
  jobs.reserve(modules.size());
  std::vector<BatchItem> items;
  std::vector<size_t> keyed;  // the jobs that have items, in item order
  for (::llvm::Module* m : modules) {
    jobs.push_back(std::make_unique<Job>(*m, counters_.get()));
    Job& job = *jobs.back();
    open_job(job);
    if (!job.key) continue;
    keyed.push_back(jobs.size() - 1);
    items.push_back({*job.key, [this, &job, &batch, &on_caller, caller] {
                       Clocks c0 = batch.now();
                       auto r = job_artifacts(job);
                       if (std::this_thread::get_id() == caller) on_caller += batch.now() - c0;
                       return r;
                     }});
  }
  Clocks t1 = batch.now();
  BatchOptions bo;
  bo.threads = threads;
  std::vector<Source> sources;
  std::vector<kcache::Expected<Entry>> entries = cache_.get_or_compile_batch(items, bo, &sources);
  std::vector<::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>>> out;
  out.reserve(jobs.size());
  size_t next = 0;  // into keyed, entries and sources
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = *jobs[i];
    const Clocks before = job.tally.compile;  // close_job compiles here what has no usable entry
    if (next < keyed.size() && keyed[next] == i) {
      job.src = sources[next];
      out.push_back(close_job(job, std::move(entries[next])));
      ++next;
    } else {
      out.push_back(close_job(job, Status(Errc::internal, "no key")));
    }
    on_caller += job.tally.compile - before;
  }
  batch.lookup += (batch.now() - t1) - on_caller;
  return out;
}

}  // namespace kcache::llvm

// LLVM JIT: cold versus warm, per kernel, for the demo's kernel language
// (examples/jit) on ORC LLJIT at -O2.
//
//   BM_JitCold       lower -> O2 + codegen -> link, cache disabled
//                    (KCACHE_DISABLE: no key is computed): the no-cache baseline
//   BM_JitColdCached lower + IR digest (ir_digest, as the module is made) ->
//                    key -> miss -> O2 + codegen -> link -> store, into an
//                    empty disk store each iteration (closing it, which
//                    writes the committer's last group, is untimed)
//   BM_JitColdPair   the two above interleaved in one run, alternating which
//                    goes first: the ratio least moved by a noisy machine
//                    (disk:1 as BM_JitColdCached; disk:0 a memory tier only)
//                    The cached half's Cache is flushed after it, untimed
//                    (reported as flush_us): a process pays that at close.
//                    The cached half honours the KCACHE_* variables.
//   BM_IrDigest      ir_digest of a freshly lowered module
//   BM_ObjectKey     object_key from an IR digest, in a tight loop
//   BM_JitWarm/zc    lower -> key -> lookup + read -> link, from the disk
//                    tier of a fresh Cache (zc=1 zero-copy, zc=0 copies)
//   BM_CompileMachines  code generation of the kernels through one
//                    CachingCompiler (its TargetMachines kept) against a
//                    fresh compiler per kernel, interleaved
//   BM_JitLinkOnly   link the same objects with no cache at all: the
//                    baseline the cache's share of a warm load is held to
//
// After the runs it prints the ratios: warm/cold speedup, cold with the
// cache over no cache, and the cache's lookup+read time (measured inside the
// compiler) over link-only time. Each is the median of its repetitions, as
// is each figure in brackets beside it, so the brackets' quotient need not
// be the ratio shown.
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/RTDyldObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/TargetSelect.h>

#include "kcache/cache.h"
#include "kcache/llvm.h"
#include "kernels.h"

namespace {

constexpr unsigned kBatch = 32;  // kernels per iteration

std::string bench_dir() {
  const char* d = std::getenv("KCACHE_BENCH_DIR");
  if (!d) d = std::getenv("TMPDIR");
  std::string tmpl = std::string(d ? d : "/tmp") + "/kcache-llvm-bench-XXXXXX";
  if (!::mkdtemp(tmpl.data())) std::abort();
  return tmpl;
}

struct World {
  std::string dir = bench_dir();
  std::vector<kjit::Kernel> kernels;
  std::vector<std::string> objects;  // compiled once, for the link-only baseline
  std::vector<kcache::Key> keys;     // the keys make_cached_lljit uses
  World() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    for (unsigned i = 0; i < kBatch; ++i) kernels.push_back(kjit::generate(i));
    // Fill the disk tier and keep the objects.
    kcache::Options o;
    o.dir = dir;
    auto cache = kcache::Cache::open(o);
    auto jit = kcache::llvm::make_cached_lljit(*cache);
    if (!jit) std::abort();
    add_all(**jit, kernels);
    for (auto& k : kernels) {
      if (!(*jit)->lookup(k.name)) std::abort();
    }
    auto compiler = kcache::llvm::CachingCompiler::create(*cache, *llvm::orc::JITTargetMachineBuilder::detectHost());
    for (auto& k : kernels) {
      llvm::LLVMContext ctx;
      auto m = kjit::lower(k, ctx);
      keys.push_back(kcache::llvm::object_key(*m, (*compiler)->target(), kcache::llvm::KeyOptions{2, {}})->key);
      auto obj = (**compiler)(*m);
      if (!obj) std::abort();
      objects.push_back((*obj)->getBuffer().str());
    }
  }
  ~World() {
    std::string rm = "rm -rf '" + dir + "'";
    (void)::system(rm.c_str());
  }
  // As kcache-demo: one context for a JIT's modules; with `tag_ir`, each
  // module is tagged with its IR digest as soon as it is lowered (as the
  // demo does), so the compile does not serialise it again.
  static void add_all(llvm::orc::LLJIT& jit, const std::vector<kjit::Kernel>& ks, bool tag_ir = false) {
    llvm::orc::ThreadSafeContext tsc(std::make_unique<llvm::LLVMContext>());
    for (auto& k : ks) {
      auto m = kjit::lower(k, *tsc.getContext());
      if (tag_ir) kcache::llvm::set_ir_digest(*m, kcache::llvm::ir_digest(*m));
      if (jit.addIRModule(llvm::orc::ThreadSafeModule(std::move(m), tsc))) std::abort();
    }
  }
};

World& world() {
  static World w;
  return w;
}

// Per-kernel means of every run of each benchmark (the library's own
// iteration-count probes first, then one per repetition); the ratios use the
// median of the repetitions (g_us, filled in main).
std::map<std::string, std::vector<double>> g_runs;
std::map<std::string, double> g_us;

void record(const std::string& name, double us) { g_runs[name].push_back(us); }

double cpu_s() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

void lookup_all(llvm::orc::LLJIT& jit) {
  for (auto& k : world().kernels) {
    auto s = jit.lookup(k.name);
    if (!s) std::abort();
    benchmark::DoNotOptimize(kcache::llvm::compat::jit_pointer<void*>(*s));
  }
}

void BM_JitCold(benchmark::State& state) {
  World& w = world();
  kcache::Options off;
  off.disabled = true;
  auto cache = kcache::Cache::open(off);
  double total_s = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto jit = kcache::llvm::make_cached_lljit(*cache);
    if (!jit) std::abort();
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    World::add_all(**jit, w.kernels);
    lookup_all(**jit);
    total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    jit->reset();
    state.ResumeTiming();
  }
  double n = double(state.iterations()) * kBatch;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["us_per_kernel"] = total_s / n * 1e6;
  record("cold", total_s / n * 1e6);
}
BENCHMARK(BM_JitCold)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_JitColdCached(benchmark::State& state) {
  World& w = world();
  double total_s = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::string dir = bench_dir();
    kcache::Options o;
    o.dir = dir;
    o.memory_tier = false;  // as kcache-demo
    auto cache = kcache::Cache::open(o);
    auto jit = kcache::llvm::make_cached_lljit(*cache);
    if (!jit) std::abort();
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    World::add_all(**jit, w.kernels, /*tag_ir=*/true);
    lookup_all(**jit);
    total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    jit->reset();
    cache.reset();
    (void)::system(("rm -rf '" + dir + "'").c_str());
    state.ResumeTiming();
  }
  double n = double(state.iterations()) * kBatch;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["us_per_kernel"] = total_s / n * 1e6;
  record("cold_cached", total_s / n * 1e6);
}
BENCHMARK(BM_JitColdCached)->Unit(benchmark::kMillisecond)->UseRealTime();

// The two cold runs interleaved: each iteration does one batch without the
// cache and one with it (into an empty store), alternating which goes first,
// so that a machine slowing down or speeding up weighs on both alike. The
// ratio of the two sums is the cache's cost on a cold start.
void BM_JitColdPair(benchmark::State& state) {
  World& w = world();
  const bool disk = state.range(0) != 0;
  kcache::Options off;
  off.disabled = true;
  auto nocache = kcache::Cache::open(off);
  double plain_s = 0, cached_s = 0, flush_s = 0;
  auto plain_n = std::make_shared<kcache::llvm::CompileCounters>();
  auto cached_n = std::make_shared<kcache::llvm::CompileCounters>();
  auto batch = [&](kcache::Cache& c, bool tag_ir, const std::shared_ptr<kcache::llvm::CompileCounters>& n) {
    kcache::llvm::JitOptions jo;
    jo.counters = n;
    auto jit = kcache::llvm::make_cached_lljit(c, jo);
    if (!jit) std::abort();
    auto t0 = std::chrono::steady_clock::now();
    World::add_all(**jit, w.kernels, tag_ir);
    lookup_all(**jit);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    jit->reset();
    return s;
  };
  bool cached_first = false;
  for (auto _ : state) {
    std::string dir = bench_dir();
    kcache::Options o = kcache::Options::from_env(kcache::Options{});  // KCACHE_DURABILITY and the rest
    o.dir = dir;
    o.memory_tier = false;  // as kcache-demo
    if (!disk) {
      o.disk_tier = false;
      o.memory_tier = true;
    }
    auto cache = kcache::Cache::open(o);
    auto one_cached = [&] {
      cached_s += batch(*cache, /*tag_ir=*/true, cached_n);
      // The committer's last group (its write and sync, the leases given
      // up) is written now, apart: left pending it would run beside the
      // no-cache half and slow that. A process pays it at close, after its
      // kernels are ready, as in kcache-demo's figures.
      auto f0 = std::chrono::steady_clock::now();
      (void)cache->flush();
      flush_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
    };
    auto one_plain = [&] { plain_s += batch(*nocache, false, plain_n); };
    if (cached_first) {
      one_cached();
      one_plain();
    } else {
      one_plain();
      one_cached();
    }
    cached_first = !cached_first;
    state.PauseTiming();
    cache.reset();
    (void)::system(("rm -rf '" + dir + "'").c_str());
    state.ResumeTiming();
  }
  double n = double(state.iterations()) * kBatch;
  // Where the difference goes: the code generator's own time in each half,
  // and the cache's key and lookup/store time in the cached half.
  state.counters["nocache_us"] = plain_s / n * 1e6;
  state.counters["cached_us"] = cached_s / n * 1e6;
  state.counters["codegen_nocache_us"] = plain_n->compile_ns.load() / n / 1e3;
  state.counters["codegen_cached_us"] = cached_n->compile_ns.load() / n / 1e3;
  state.counters["key_us"] = cached_n->key_ns.load() / n / 1e3;
  state.counters["cache_us"] = cached_n->lookup_ns.load() / n / 1e3;
  state.counters["flush_us"] = flush_s / n * 1e6;
  state.counters["ratio"] = plain_s > 0 ? cached_s / plain_s : 0;
  const std::string tag = disk ? "pair" : "pair_memory";
  record(tag + "_nocache", plain_s / n * 1e6);
  record(tag + "_cached", cached_s / n * 1e6);
  record(tag + "_ratio", plain_s > 0 ? cached_s / plain_s : 0);
}
BENCHMARK(BM_JitColdPair)->ArgName("disk")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// The IR digest of one freshly lowered module (what a front end pays at
// lowering for early cutoff), against lowering it.
void BM_IrDigest(benchmark::State& state) {
  World& w = world();
  llvm::LLVMContext ctx;
  std::vector<std::unique_ptr<llvm::Module>> ms;
  auto t0 = std::chrono::steady_clock::now();
  for (auto& k : w.kernels) ms.push_back(kjit::lower(k, ctx));
  double lower_us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kBatch * 1e6;
  double total_s = 0;
  for (auto _ : state) {
    auto t1 = std::chrono::steady_clock::now();
    for (auto& m : ms) benchmark::DoNotOptimize(kcache::llvm::ir_digest(*m));
    total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  double n = double(state.iterations()) * kBatch;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["us_per_module"] = total_s / n * 1e6;
  state.counters["lower_us"] = lower_us;
  record("ir_digest", total_s / n * 1e6);
}
BENCHMARK(BM_IrDigest)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The object key from a tagged module's IR digest: what CachingCompiler
// computes for each module it is given.
void BM_ObjectKey(benchmark::State& state) {
  (void)world();  // the native target, initialised
  auto tm = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!tm) std::abort();
  auto m = tm->createTargetMachine();
  if (!m) std::abort();
  auto desc = kcache::llvm::TargetDesc::of(**m);
  kcache::llvm::KeyOptions ko{2, {{"client", "bench"}}};
  kcache::Digest d = kcache::hash_bytes("ir");
  for (auto _ : state) benchmark::DoNotOptimize(kcache::llvm::object_key(d, desc, ko));
  state.counters["features_bytes"] = static_cast<double>(desc.features.size());
  state.counters["target_options"] = static_cast<double>(desc.target_options.size());
}
BENCHMARK(BM_ObjectKey)->Unit(benchmark::kMicrosecond);

void BM_JitWarm(benchmark::State& state) {
  World& w = world();
  kcache::Options o;
  o.dir = w.dir;
  o.memory_tier = false;  // as kcache-demo: ORC asks for each key once per process
  auto counters = std::make_shared<kcache::llvm::CompileCounters>();
  double total_s = 0;
  for (auto _ : state) {
    state.PauseTiming();
    // A fresh Cache: its memory tier is empty, so every hit reads the disk tier.
    auto cache = kcache::Cache::open(o);
    kcache::llvm::JitOptions jo;
    jo.counters = counters;
    jo.zero_copy = state.range(0) != 0;
    auto jit = kcache::llvm::make_cached_lljit(*cache, jo);
    if (!jit) std::abort();
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    World::add_all(**jit, w.kernels);
    lookup_all(**jit);
    total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    jit->reset();
    cache.reset();
    state.ResumeTiming();
  }
  if (counters->codegen_runs.load() != 0) state.SkipWithError("warm run compiled");
  double n = double(state.iterations()) * kBatch;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  double key_us = counters->key_ns.load() / n / 1e3;
  double cache_us = counters->lookup_ns.load() / n / 1e3;
  double cache_cpu_us = counters->lookup_cpu_ns.load() / n / 1e3;
  double key_cpu_us = counters->key_cpu_ns.load() / n / 1e3;
  state.counters["cache_cpu_us"] = cache_cpu_us;
  state.counters["key_cpu_us"] = key_cpu_us;
  state.counters["us_per_kernel"] = total_s / n * 1e6;
  state.counters["key_us"] = key_us;
  state.counters["cache_us"] = cache_us;
  std::string tag = state.range(0) ? "warm_zc" : "warm_copy";
  record(tag, total_s / n * 1e6);
  record(tag + "_key", key_us);
  record(tag + "_cache", cache_us);
  record(tag + "_cache_cpu", cache_cpu_us);
  record(tag + "_key_cpu", key_cpu_us);
}
BENCHMARK(BM_JitWarm)->ArgName("zc")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// The cache's part of a warm load on its own: a fresh Cache, then for each
// kernel the disk-tier lookup and the object-file check the compiler does.
// Arg: 1 with the default memory tier (hits are promoted into it), 0 without.
void BM_LookupRead(benchmark::State& state) {
  World& w = world();
  kcache::Options o;
  o.dir = w.dir;
  o.memory_tier = state.range(0) != 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto cache = kcache::Cache::open(o);
    state.ResumeTiming();
    for (auto& k : w.keys) {
      auto e = cache->get(k);
      if (!e) std::abort();
      auto obj = e->artifact("obj");
      auto parsed = llvm::object::ObjectFile::createObjectFile(
          llvm::MemoryBufferRef(llvm::StringRef(obj->data(), obj->size()), "k"));
      if (!parsed) std::abort();
      benchmark::DoNotOptimize(parsed->get());
    }
    state.PauseTiming();
    cache.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kBatch));
}
BENCHMARK(BM_LookupRead)->ArgName("memory_tier")->Arg(1)->Arg(0);

// Code generation of the 32 kernels through CachingCompiler on a disabled
// cache, both ways in every iteration (alternating which goes first): one
// compiler for the batch, whose TargetMachines are kept between compiles,
// against a fresh compiler (so a fresh TargetMachine) for each kernel, as
// every compile had before the machines were kept.
void BM_CompileMachines(benchmark::State& state) {
  World& w = world();
  kcache::Options off;
  off.disabled = true;
  auto nocache = kcache::Cache::open(off);
  auto jtmb = *llvm::orc::JITTargetMachineBuilder::detectHost();
  double kept_s = 0, fresh_s = 0;
  auto compile_all = [&](bool keep) {
    llvm::LLVMContext ctx;
    std::vector<std::unique_ptr<llvm::Module>> ms;
    for (auto& k : w.kernels) ms.push_back(kjit::lower(k, ctx));
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<kcache::llvm::CachingCompiler> one;
    for (auto& m : ms) {
      if (!one || !keep) one = std::move(*kcache::llvm::CachingCompiler::create(*nocache, jtmb));
      if (!(*one)(*m)) std::abort();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  bool kept_first = false;
  for (auto _ : state) {
    if (kept_first) {
      kept_s += compile_all(true);
      fresh_s += compile_all(false);
    } else {
      fresh_s += compile_all(false);
      kept_s += compile_all(true);
    }
    kept_first = !kept_first;
  }
  double n = double(state.iterations()) * kBatch;
  state.counters["kept_us"] = kept_s / n * 1e6;
  state.counters["fresh_us"] = fresh_s / n * 1e6;
  state.counters["ratio"] = fresh_s > 0 ? kept_s / fresh_s : 0;
  record("machines_kept", kept_s / n * 1e6);
  record("machines_fresh", fresh_s / n * 1e6);
  record("machines_ratio", fresh_s > 0 ? kept_s / fresh_s : 0);
}
BENCHMARK(BM_CompileMachines)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_JitLinkOnly(benchmark::State& state) {
  World& w = world();
  const bool arena = state.range(0) != 0;
  double total_s = 0, total_cpu = 0;
  for (auto _ : state) {
    state.PauseTiming();
    llvm::orc::LLJITBuilder b;
    if (arena)
      b.setObjectLinkingLayerCreator(
          [](llvm::orc::ExecutionSession& es,
             const llvm::Triple&) -> llvm::Expected<std::unique_ptr<llvm::orc::ObjectLayer>> {
            return std::make_unique<llvm::orc::RTDyldObjectLinkingLayer>(es, kcache::llvm::arena_memory_managers());
          });
    auto jit = b.create();
    if (!jit) std::abort();
    auto gen =
        llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess((*jit)->getDataLayout().getGlobalPrefix());
    (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_s();
    for (auto& o : w.objects) {
      if ((*jit)->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(o))) std::abort();
    }
    lookup_all(**jit);
    total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_cpu += cpu_s() - c0;
    state.PauseTiming();
    jit->reset();
    state.ResumeTiming();
  }
  double n = double(state.iterations()) * kBatch;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["us_per_kernel"] = total_s / n * 1e6;
  state.counters["cpu_us_per_kernel"] = total_cpu / n * 1e6;
  record(arena ? "link_arena" : "link", total_s / n * 1e6);
  record(arena ? "link_arena_cpu" : "link_cpu", total_cpu / n * 1e6);
}
BENCHMARK(BM_JitLinkOnly)->ArgName("arena")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  size_t reps = 1;
  if (const char* env = std::getenv("BENCHMARK_REPETITIONS")) reps = std::max(1, std::atoi(env));
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_repetitions=", 24) == 0) reps = std::max(1, std::atoi(argv[i] + 24));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (auto& [name, runs] : g_runs) {
    std::vector<double> last(runs.end() - std::min(reps, runs.size()), runs.end());
    std::sort(last.begin(), last.end());
    g_us[name] = last.size() % 2 ? last[last.size() / 2] : (last[last.size() / 2 - 1] + last[last.size() / 2]) / 2;
  }
  if (g_us.count("cold") && g_us.count("warm_zc")) {
    std::printf("ratio: warm (zero-copy) is %.1fx faster than cold per kernel (%.1f us vs %.1f us)\n",
                g_us["cold"] / g_us["warm_zc"], g_us["warm_zc"], g_us["cold"]);
  }
  if (g_us.count("cold") && g_us.count("cold_cached")) {
    std::printf("ratio: cold with the cache is %.3fx the no-cache time per kernel (%.1f us vs %.1f us)\n",
                g_us["cold_cached"] / g_us["cold"], g_us["cold_cached"], g_us["cold"]);
  }
  if (g_us.count("pair_ratio")) {
    std::printf("ratio: interleaved, cold with the cache is %.3fx the no-cache time per kernel (%.1f us vs %.1f us)\n",
                g_us["pair_ratio"], g_us["pair_cached"], g_us["pair_nocache"]);
  }
  if (g_us.count("pair_memory_ratio")) {
    std::printf(
        "ratio: interleaved, memory tier only, cold with the cache is %.3fx the no-cache time per kernel "
        "(%.1f us vs %.1f us)\n",
        g_us["pair_memory_ratio"], g_us["pair_memory_cached"], g_us["pair_memory_nocache"]);
  }
  if (g_us.count("machines_ratio")) {
    std::printf(
        "ratio: code generation with the compiler's TargetMachines kept takes %.3fx the time with a fresh one "
        "per kernel (%.1f us vs %.1f us)\n",
        g_us["machines_ratio"], g_us["machines_kept"], g_us["machines_fresh"]);
  }
  if (g_us.count("ir_digest") && g_us.count("pair_nocache")) {
    std::printf("ratio: the IR digest is %.2f%% of a no-cache cold kernel (%.1f us vs %.1f us)\n",
                100 * g_us["ir_digest"] / g_us["pair_nocache"], g_us["ir_digest"], g_us["pair_nocache"]);
  }
  if (g_us.count("warm_zc") && g_us.count("warm_copy")) {
    std::printf("ratio: cache lookup+read per kernel, zero-copy %.2f us vs copy %.2f us\n", g_us["warm_zc_cache"],
                g_us["warm_copy_cache"]);
  }
  if (g_us.count("link") && g_us.count("link_arena")) {
    std::printf(
        "ratio: linking into the arena (make_cached_lljit's default) takes %.3fx the time of "
        "SectionMemoryManager (%.1f us vs %.1f us per kernel; CPU %.3fx)\n",
        g_us["link_arena"] / g_us["link"], g_us["link_arena"], g_us["link"], g_us["link_arena_cpu"] / g_us["link_cpu"]);
  }
  // Against linking as make_cached_lljit links (into the arena).
  if (g_us.count("link_arena") && g_us.count("warm_zc")) {
    std::printf(
        "ratio: cache lookup+read is %.1f%% of link-only time (%.2f us vs %.1f us per kernel); "
        "with key hashing %.1f%%\n",
        100 * g_us["warm_zc_cache"] / g_us["link_arena"], g_us["warm_zc_cache"], g_us["link_arena"],
        100 * (g_us["warm_zc_cache"] + g_us["warm_zc_key"]) / g_us["link_arena"]);
    std::printf(
        "ratio: in CPU time, cache lookup+read is %.1f%% of link-only time (%.2f us vs %.1f us per kernel); "
        "with key hashing %.1f%%\n",
        100 * g_us["warm_zc_cache_cpu"] / g_us["link_arena_cpu"], g_us["warm_zc_cache_cpu"], g_us["link_arena_cpu"],
        100 * (g_us["warm_zc_cache_cpu"] + g_us["warm_zc_key_cpu"]) / g_us["link_arena_cpu"]);
  }
  return 0;
}

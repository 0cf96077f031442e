// What "why did it miss" costs a miss: appending to the miss journal (the
// default), and with KCACHE_EXPLAIN the comparison with every stored entry
// of an LMDB store of 100 / 1,000 entries. A hit runs none of it: the hook
// sits after the lookup's hit return.
//
//   build/bench/kcache_bench_explain
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "cache/assembly.h"
#include "cache/journal.h"
#include "kcache/cache.h"
#include "util/util.h"

namespace {

// A key shaped like the LLVM integration's: 12 components, a label.
kcache::KeyInfo module_key(uint64_t i, int opt) {
  return *kcache::KeyBuilder("bench-llvm-obj/1")
              .add_bytes("ir", "module " + std::to_string(i) + std::string(4000, 'i'))
              .add_string("llvm", "17.0.6 0123456789abcdef0123456789abcdef01234567")
              .add_string("triple", "x86_64-pc-linux-gnu")
              .add_string("module_triple", "x86_64-pc-linux-gnu")
              .add_string("cpu", "znver3")
              .add_string("features", "+avx2,+fma,+bmi2,+sse4.2")
              .add_u64("codegen_opt_level", static_cast<uint64_t>(opt))
              .add_i64("ir_opt_level", opt)
              .add_string("code_model", "default")
              .add_string("reloc_model", "pic")
              .add_map("target_options", {{"float_abi", "0"}, {"fp_op_fusion", "1"}})
              .add_map("extra", {{"client", "bench/1"}})
              .label("mod" + std::to_string(i) + ".c")
              .finish();
}

std::string fresh_dir() {
  std::string t = "/tmp/kcache-bench-explain-XXXXXX";
  return ::mkdtemp(t.data());
}

void BM_JournalAppend(benchmark::State& state) {
  std::string dir = fresh_dir();
  kcache::MissJournal j(dir + "/lmdb", 1000);
  kcache::MissRecord r{module_key(1, 3).key, "mod1.c", module_key(1, 3).manifest, 0, 1, "bench"};
  for (auto _ : state) {
    r.time_ms++;
    benchmark::DoNotOptimize(j.append(r));
  }
  std::system(("rm -rf " + dir).c_str());
}
BENCHMARK(BM_JournalAppend)->Unit(benchmark::kMicrosecond);

// The explainer's work for one miss, against an LMDB store of N entries.
void BM_MissExplain(benchmark::State& state) {
  const bool explain = state.range(1) != 0;
  std::string dir = fresh_dir();
  kcache::DiskStoreSpec spec;
  spec.dir = dir;
  spec.engine = kcache::Engine::lmdb;
  spec.leases = false;
  auto store = kcache::open_disk_store(spec);
  if (!store) {
    state.SkipWithError("no LMDB store");
    return;
  }
  for (uint64_t i = 0; i < static_cast<uint64_t>(state.range(0)); ++i) {
    auto k = module_key(i, 2);
    kcache::EntryMeta m;
    m.label = k.label;
    (void)store->tier->put(
        *kcache::EntryBuilder(k.key).add("obj", std::string(2000, 'o')).meta(m).manifest(k.manifest).build());
  }
  kcache::MissExplainer ex(store->tier, std::make_unique<kcache::MissJournal>(store->path, 1000), explain);
  std::vector<kcache::KeyInfo> misses;
  for (uint64_t i = 0; i < 64; ++i) misses.push_back(module_key(i, 3));
  kcache::util::set_log(kcache::LogLevel::warn, dir + "/log");  // the line is written, to a file
  uint64_t i = 0;
  for (auto _ : state) ex.miss(misses[i++ % misses.size()]);
  kcache::util::set_log(kcache::LogLevel::warn, "");
  state.SetLabel(explain ? "journal + explain" : "journal");
  std::system(("rm -rf " + dir).c_str());
}
BENCHMARK(BM_MissExplain)
    ->Args({100, 0})
    ->Args({100, 1})
    ->Args({1000, 0})
    ->Args({1000, 1})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

// Core benchmarks: hit and put latency of each tier, key hashing throughput,
// and what compression costs on a hit, each next to a baseline measured in
// the same process on the same bytes:
//   hit/memcpy/...           copying the artifact from memory (the physical
//                            limit of handing out bytes)
//   hit/llvm_localcache/...  the same hit through llvm::localCache, the
//                            file-per-entry cache ThinLTO uses
// Every hit run also measures a memcpy of the same artifacts right after
// its timed loop and prints it beside the hit (counters memcpy_ns and
// x_memcpy, the hit's CPU time over it); scripts/bench.sh turns the medians
// into ratios (docs/benchmarks.md).
//
// Every hit touches the artifact's first and last byte (or, in the "read"
// runs, every byte) through benchmark::DoNotOptimize, and after each run one
// hit is compared byte for byte with what was stored, so a benchmark cannot
// pass on a wrong or empty answer. The files tier verifies the entry's
// checksum (all bytes) on every get; the LMDB tier on a process's first hit
// of an entry and again whenever the entry is rewritten ("lmdb_every":
// on every get, DiskTierOptions::verify_every_hit); llvm::localCache
// verifies nothing.
//
// Names: <what>/<tier>/<same|vary|read>/<artifact bytes>. "same" repeats
// one key; "vary" cycles through a set of keys whose artifacts total about
// 64 MiB (at least 4, at most 4096 keys), so larger sizes leave the CPU
// caches; "read" repeats one key and the caller reads every byte of the
// artifact, as a loader would (localCache maps large files lazily, so
// touching two bytes of its hit reads two pages, not the artifact).
#include <benchmark/benchmark.h>
#include <link.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/tier.h"

#if KCACHE_BENCH_HAVE_LLVM
#include "llvm_file_cache.h"
#endif

namespace {

using kcache::Entry;
using kcache::Key;

constexpr int64_t kSizes[] = {1 << 10, 16 << 10, 256 << 10, 4 << 20};
constexpr size_t kVaryBytes = size_t(64) << 20;

// ---- data ----------------------------------------------------------------

// Incompressible, distinct per seed (splitmix64).
std::string random_bytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(s.data() + i, &z, std::min<size_t>(8, n - i));
  }
  return s;
}

// A key made the way a JIT client makes one: namespace, IR digest, target,
// options, so the stored manifest has a realistic size.
kcache::KeyInfo make_key(std::string_view ns, uint64_t id, uint64_t size) {
  std::string ir = "module-" + std::to_string(id) + "-" + std::to_string(size);
  auto k = kcache::KeyBuilder(ns)
               .add_bytes("ir", ir)
               .add_string("target", "x86_64-unknown-linux-gnu")
               .add_string("cpu", "znver4")
               .add_u64("opt_level", 3)
               .finish();
  return *k;
}

Entry make_entry(const kcache::KeyInfo& k, const std::string& name, std::string data, kcache::Compression c) {
  kcache::EntryMeta m;
  m.created_unix_ms = 1700000000000;
  m.compile_cost_us = 250000;
  m.producer = "kcache-bench";
  auto e = kcache::EntryBuilder(k.key).add(name, std::move(data)).meta(m).manifest(k.manifest).compression(c).build();
  if (!e) {
    std::fprintf(stderr, "building a bench entry failed: %s\n", e.error().to_string().c_str());
    std::abort();
  }
  return std::move(e).value();
}

struct DataSet {
  size_t size = 0;
  std::vector<Key> keys;
  std::vector<std::string> hex;        // the llvm::localCache key of each
  std::vector<std::string> artifacts;  // what each entry holds under "obj"
  std::vector<Entry> entries;
};

const DataSet& data_for(size_t size) {
  static std::map<size_t, DataSet> sets;
  auto it = sets.find(size);
  if (it != sets.end()) return it->second;
  DataSet& d = sets[size];
  d.size = size;
  size_t n = std::clamp<size_t>(kVaryBytes / size, 4, 4096);
  for (size_t i = 0; i < n; ++i) {
    auto k = make_key("kcache-bench/1", i, size);
    d.keys.push_back(k.key);
    d.hex.push_back(k.key.hex());
    d.artifacts.push_back(random_bytes(size, size * 1000003 + i));
    d.entries.push_back(make_entry(k, "obj", d.artifacts.back(), kcache::Compression::none));
  }
  return d;
}

// ---- stores --------------------------------------------------------------

// Never destroyed: the atexit handler that removes the folder runs after
// function-local statics constructed later would have been destroyed.
const std::string& root_dir() {
  static const std::string* root = [] {
    std::string base = getenv("KCACHE_BENCH_DIR") ? getenv("KCACHE_BENCH_DIR")
                       : getenv("TMPDIR")         ? getenv("TMPDIR")
                                                  : "/tmp";
    std::string tmpl = base + "/kcache-bench-XXXXXX";
    if (!mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(root_dir(), ec);
    });
    return new std::string(tmpl);
  }();
  return *root;
}

std::shared_ptr<kcache::Tier> open_or_die(kcache::Expected<std::shared_ptr<kcache::Tier>> t, const char* what) {
  if (!t) {
    std::fprintf(stderr, "opening the %s tier failed: %s\n", what, t.error().to_string().c_str());
    std::abort();
  }
  return *t;
}

kcache::DiskTierOptions disk_options(kcache::Durability d) {
  kcache::DiskTierOptions o;
  o.max_bytes = uint64_t(8) << 30;  // nothing the benchmarks store is evicted
  o.durability = d;
  return o;
}

// One instance of each store for the whole run: a warm process.
struct Stores {
  std::shared_ptr<kcache::Tier> memory, lmdb, lmdb_nosync, files;
  std::shared_ptr<kcache::Tier> lmdb_every;   // LMDB, verifying the checksum of every hit
  std::unique_ptr<kcache::Cache> cache_lmdb;  // the facade over the LMDB tier alone
#if KCACHE_BENCH_HAVE_LLVM
  std::unique_ptr<kcache_bench::LlvmFileCache> llvm;
#endif
  std::map<std::pair<const void*, size_t>, bool> filled;

  Stores() {
    kcache::MemoryTierOptions mo;
    mo.max_bytes = uint64_t(2) << 30;
    memory = kcache::make_memory_tier(mo);
    lmdb = open_or_die(kcache::open_lmdb_tier(root_dir() + "/lmdb", disk_options(kcache::Durability::normal)), "lmdb");
    lmdb_nosync = open_or_die(
        kcache::open_lmdb_tier(root_dir() + "/lmdb-nosync", disk_options(kcache::Durability::none)), "lmdb");
    kcache::DiskTierOptions every = disk_options(kcache::Durability::normal);
    every.verify_every_hit = true;
    lmdb_every = open_or_die(kcache::open_lmdb_tier(root_dir() + "/lmdb-every", every), "lmdb");
    files =
        open_or_die(kcache::open_files_tier(root_dir() + "/files", disk_options(kcache::Durability::normal)), "files");
    cache_lmdb = kcache::Cache::with_tiers({lmdb});
#if KCACHE_BENCH_HAVE_LLVM
    std::string err;
    llvm = kcache_bench::LlvmFileCache::open(root_dir() + "/llvm", &err);
    if (!llvm) {
      std::fprintf(stderr, "llvm::localCache: %s\n", err.c_str());
      std::abort();
    }
#endif
  }

  // Stores every entry of `d` in `t` once.
  void fill(kcache::Tier& t, const DataSet& d) {
    auto id = std::make_pair(static_cast<const void*>(&t), d.size);
    if (filled[id]) return;
    for (const auto& e : d.entries) {
      auto st = t.put(e);
      if (!st.is_ok()) {
        std::fprintf(stderr, "filling %s failed: %s\n", std::string(t.name()).c_str(), st.to_string().c_str());
        std::abort();
      }
    }
    (void)t.flush();
    filled[id] = true;
  }
#if KCACHE_BENCH_HAVE_LLVM
  void fill_llvm(const DataSet& d) {
    auto id = std::make_pair(static_cast<const void*>(llvm.get()), d.size);
    if (filled[id]) return;
    for (size_t i = 0; i < d.keys.size(); ++i)
      if (!llvm->put(d.hex[i], d.artifacts[i])) std::abort();
    filled[id] = true;
  }
#endif
};

std::unique_ptr<Stores> g_stores;

Stores& stores() {
  if (!g_stores) g_stores = std::make_unique<Stores>();
  return *g_stores;
}

// ---- hits ----------------------------------------------------------------

inline void touch(std::string_view v) {
  benchmark::DoNotOptimize(v[0]);
  benchmark::DoNotOptimize(v[v.size() - 1]);
}

// What a loader does with a hit: read every byte (here, XOR of 8-byte words).
// Kept out of line and aligned: the loop is two instructions, and where the
// linker happens to place it (across a 64-byte fetch boundary or not) once
// changed "read" hits by up to 1.9x between two builds of identical code.
[[gnu::noinline, gnu::aligned(64)]] void consume(std::string_view v) {
  uint64_t acc = 0;
  for (size_t i = 0; i + 8 <= v.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, v.data() + i, 8);
    acc ^= w;
  }
  benchmark::DoNotOptimize(acc);
}

// same: one key, first and last byte touched; vary: keys cycle, first and
// last byte touched; read: one key, every byte read by the caller.
enum class Pattern { same, vary, read };

inline void use(Pattern p, std::string_view v) {
  if (p == Pattern::read)
    consume(v);
  else
    touch(v);
}

inline double thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// The baseline of a hit, in the same run: CPU ns per memcpy of the same
// artifacts, keys in the same order, bytes used the same way, as many
// times as the hit ran (at most 200,000).
double memcpy_ns(const DataSet& d, Pattern p, size_t n, int64_t times) {
  std::unique_ptr<char, decltype(&std::free)> dst(static_cast<char*>(std::aligned_alloc(64, d.size)), &std::free);
  times = std::clamp<int64_t>(times, 1, 200000);
  size_t i = 0;
  const double t0 = thread_cpu_ns();
  for (int64_t k = 0; k < times; ++k) {
    std::memcpy(dst.get(), d.artifacts[i].data(), d.size);
    use(p, std::string_view(dst.get(), d.size));
    if (++i == n) i = 0;
  }
  return (thread_cpu_ns() - t0) / static_cast<double>(times);
}

// Runs `hit(i)` (which must look key i up and touch its bytes) in the
// timed loop, then checks one answer in full. Counters: "memcpy_ns", the
// baseline measured right after (memcpy_ns()), and "x_memcpy", this hit's
// CPU time over it.
template <class Hit, class Fetch>
void run_hit(benchmark::State& state, const DataSet& d, Pattern p, Hit hit, Fetch fetch) {
  const size_t n = p == Pattern::vary ? d.keys.size() : 1;
  size_t i = 0;
  const double t0 = thread_cpu_ns();
  for (auto _ : state) {
    if (!hit(i)) {
      state.SkipWithError("unexpected miss");
      return;
    }
    if (++i == n) i = 0;
  }
  const double hit_ns = (thread_cpu_ns() - t0) / static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.size));
  state.counters["keys"] = static_cast<double>(n);
  const double base = memcpy_ns(d, p, n, state.iterations());
  state.counters["memcpy_ns"] = base;
  state.counters["x_memcpy"] = base > 0 ? hit_ns / base : 0;
  size_t last = n - 1;
  if (!fetch(last, [&](std::string_view got) { return got == d.artifacts[last]; }))
    state.SkipWithError("a hit returned wrong bytes");
}

// A hit through a kcache tier (or the Cache facade): get, find the
// artifact, touch it, drop the entry (which ends an LMDB read).
template <class Get>
void kcache_hit(benchmark::State& state, const DataSet& d, Pattern p, Get get) {
  auto hit = [&](size_t i) {
    std::optional<Entry> e = get(d.keys[i]);
    if (!e) return false;
    auto a = e->artifact("obj");
    if (!a || a->empty()) return false;
    use(p, *a);
    return true;
  };
  auto fetch = [&](size_t i, auto check) {
    std::optional<Entry> e = get(d.keys[i]);
    return e && e->artifact("obj") && check(*e->artifact("obj"));
  };
  run_hit(state, d, p, hit, fetch);
}

std::optional<Entry> tier_get(kcache::Tier& t, const Key& k) {
  auto r = t.get(k);
  if (!r || !r->has_value()) return std::nullopt;
  return std::move(**r);
}

void BM_HitMemcpy(benchmark::State& state, Pattern p) {
  const DataSet& d = data_for(static_cast<size_t>(state.range(0)));
  std::unique_ptr<char, decltype(&std::free)> dst(static_cast<char*>(std::aligned_alloc(64, d.size)), &std::free);
  auto hit = [&](size_t i) {
    std::memcpy(dst.get(), d.artifacts[i].data(), d.size);
    use(p, std::string_view(dst.get(), d.size));
    return true;
  };
  auto fetch = [&](size_t i, auto check) {
    std::memcpy(dst.get(), d.artifacts[i].data(), d.size);
    return check(std::string_view(dst.get(), d.size));
  };
  run_hit(state, d, p, hit, fetch);
}

void BM_HitTier(benchmark::State& state, std::shared_ptr<kcache::Tier> Stores::*which, Pattern p) {
  const DataSet& d = data_for(static_cast<size_t>(state.range(0)));
  kcache::Tier& t = *(stores().*which);
  stores().fill(t, d);
  kcache_hit(state, d, p, [&](const Key& k) { return tier_get(t, k); });
}

void BM_HitCache(benchmark::State& state, Pattern p) {
  const DataSet& d = data_for(static_cast<size_t>(state.range(0)));
  stores().fill(*stores().lmdb, d);
  kcache::Cache& c = *stores().cache_lmdb;
  kcache_hit(state, d, p, [&](const Key& k) { return c.get(k); });
}

#if KCACHE_BENCH_HAVE_LLVM
void BM_HitLlvm(benchmark::State& state, Pattern p) {
  const DataSet& d = data_for(static_cast<size_t>(state.range(0)));
  stores().fill_llvm(d);
  auto& c = *stores().llvm;
  auto hit = [&](size_t i) {
    bool ok;
    std::string_view v = c.get(d.hex[i], &ok);
    if (!ok || v.size() != d.size) return false;
    use(p, v);
    c.release();
    return true;
  };
  auto fetch = [&](size_t i, auto check) {
    bool ok;
    std::string_view v = c.get(d.hex[i], &ok);
    bool good = ok && check(v);
    c.release();
    return good;
  };
  run_hit(state, d, p, hit, fetch);
}
#endif

// ---- puts ----------------------------------------------------------------

// Puts cycle through the data set's keys, so each replaces an entry already
// stored (the files and LMDB stores do not grow during the run).
void BM_PutTier(benchmark::State& state, std::shared_ptr<kcache::Tier> Stores::*which) {
  const DataSet& d = data_for(static_cast<size_t>(state.range(0)));
  kcache::Tier& t = *(stores().*which);
  size_t i = 0;
  for (auto _ : state) {
    auto st = t.put(d.entries[i]);
    if (!st.is_ok()) {
      state.SkipWithError(st.to_string().c_str());
      return;
    }
    if (++i == d.entries.size()) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.size));
}

#if KCACHE_BENCH_HAVE_LLVM
// localCache never replaces an entry, so each put uses a fresh key; the
// files are removed outside the timed region every 64 puts.
void BM_PutLlvm(benchmark::State& state) {
  const DataSet& d = data_for(static_cast<size_t>(state.range(0)));
  auto& c = *stores().llvm;
  std::string dir = root_dir() + "/llvm";
  static uint64_t serial = 0;
  std::vector<std::string> written;
  auto cleanup = [&] {
    for (const auto& k : written) std::filesystem::remove(dir + "/llvmcache-" + k);
    written.clear();
  };
  size_t i = 0;
  for (auto _ : state) {
    std::string key = "put-" + std::to_string(++serial);
    if (!c.put(key, d.artifacts[i])) {
      state.SkipWithError("llvm::localCache put failed");
      return;
    }
    written.push_back(std::move(key));
    if (++i == d.artifacts.size()) i = 0;
    if (written.size() == 64) {
      state.PauseTiming();
      cleanup();
      state.ResumeTiming();
    }
  }
  cleanup();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.size));
}
#endif

// ---- misses ----------------------------------------------------------------

// What a miss costs the compiling thread on top of its compile, as a JIT
// meets it on a cold start: get_or_compile of a new key on a Cache opened
// the way kcache-demo opens one (LMDB, cross-process leases, the miss
// journal, the committer; no memory tier), against the compile function
// alone ("compile_only": a copy of the artifact). CPU time of the calling
// thread; the committer's writes run on a thread of their own.
void BM_Miss(benchmark::State& state, bool cached) {
  const size_t size = static_cast<size_t>(state.range(0));
  const std::string artifact = random_bytes(size, 7);
  auto compile = [&]() -> kcache::Expected<std::vector<kcache::Artifact>> {
    return std::vector<kcache::Artifact>{{"obj", artifact}};
  };
  static uint64_t serial = 0;
  std::unique_ptr<kcache::Cache> cache;
  if (cached) {
    kcache::Options o;
    o.dir = root_dir() + "/miss-" + std::to_string(++serial);
    o.memory_tier = false;
    cache = kcache::Cache::open(o);
  }
  std::vector<kcache::KeyInfo> keys;
  size_t next = 0;
  for (auto _ : state) {
    if (next == keys.size()) {
      state.PauseTiming();
      keys.clear();
      for (int i = 0; i < 256; ++i) keys.push_back(make_key("miss/1", ++serial, size));
      next = 0;
      state.ResumeTiming();
    }
    if (cached) {
      auto e = cache->get_or_compile(keys[next], compile);
      if (!e) {
        state.SkipWithError(e.error().to_string().c_str());
        return;
      }
      benchmark::DoNotOptimize(e->artifacts().front().data.data());
    } else {
      auto a = compile();
      benchmark::DoNotOptimize(a->front().data.data());
    }
    ++next;
  }
  // After the loop: outside the timed region.
  if (cache) {
    (void)cache->flush();
    // Every miss was stored: the last one reads back whole.
    auto back = cache->get(keys[next - 1].key);
    if (!back || back->artifact("obj") != std::optional<std::string_view>(artifact))
      state.SkipWithError("the last miss did not read back");
  }
}

// ---- key hashing -----------------------------------------------------------

void BM_HashKeyBuilder(benchmark::State& state) {
  std::string in = random_bytes(static_cast<size_t>(state.range(0)), 7);
  for (auto _ : state) {
    auto k = kcache::KeyBuilder("kcache-bench/1").add_bytes("ir", in).finish();
    benchmark::DoNotOptimize(k);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_HashBytes(benchmark::State& state) {
  std::string in = random_bytes(static_cast<size_t>(state.range(0)), 7);
  for (auto _ : state) {
    auto k = kcache::hash_bytes(in);
    benchmark::DoNotOptimize(k);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_HashMemcpy(benchmark::State& state) {
  std::string in = random_bytes(static_cast<size_t>(state.range(0)), 7);
  std::string out(in.size(), '\0');
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// ---- compression -------------------------------------------------------------

#ifndef KCACHE_BENCH_PTX
#define KCACHE_BENCH_PTX ""
#endif

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// PTX text produced by LLVM's NVPTX backend (see bench/core.cmake);
// KCACHE_BENCH_PTX in the environment overrides the file.
const std::string& ptx_sample() {
  static std::string s = [] {
    const char* p = getenv("KCACHE_BENCH_PTX");
    return read_all(p && *p ? p : KCACHE_BENCH_PTX);
  }();
  return s;
}

// Machine code: the loaded libc's file, found through the dynamic loader.
const std::string& elf_sample() {
  static std::string s = [] {
    std::string path;
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, size_t, void* out) {
          if (info->dlpi_name && std::strstr(info->dlpi_name, "/libc.so")) {
            *static_cast<std::string*>(out) = info->dlpi_name;
            return 1;
          }
          return 0;
        },
        &path);
    return path.empty() ? std::string() : read_all(path);
  }();
  return s;
}

// `size` bytes of the sample from an eighth of the way in (past ELF headers,
// into code; into function bodies of the PTX).
std::string slice(const std::string& sample, size_t size) {
  if (sample.size() < size + sample.size() / 8) return std::string();
  return sample.substr(sample.size() / 8, size);
}

const std::string& sample_of(int which) { return which == 0 ? ptx_sample() : elf_sample(); }

void BM_CompressHit(benchmark::State& state, int which, kcache::Compression c) {
  size_t size = static_cast<size_t>(state.range(0));
  std::string bytes = slice(sample_of(which), size);
  if (bytes.empty()) {
    state.SkipWithError("sample artifact not available");
    return;
  }
  auto k = make_key("kcache-bench/compress", uint64_t(which) * 16 + static_cast<uint64_t>(c), size);
  Entry e = make_entry(k, "obj", bytes, c);
  kcache::Tier& t = *stores().lmdb;
  if (!t.put(e).is_ok()) {
    state.SkipWithError("put failed");
    return;
  }
  for (auto _ : state) {
    std::optional<Entry> got = tier_get(t, k.key);
    if (!got || !got->artifact("obj")) {
      state.SkipWithError("unexpected miss");
      return;
    }
    touch(*got->artifact("obj"));
  }
  auto got = tier_get(t, k.key);
  if (!got || got->artifact("obj") != std::optional<std::string_view>(bytes)) state.SkipWithError("wrong bytes");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
  state.counters["ratio"] = static_cast<double>(e.payload_size()) / static_cast<double>(e.encoded().size());
  state.counters["stored_bytes"] = static_cast<double>(e.encoded().size());
  state.counters["compressed"] = e.compressed() ? 1 : 0;
}

// What building (and compressing) the entry costs a put.
void BM_CompressBuild(benchmark::State& state, int which, kcache::Compression c) {
  size_t size = static_cast<size_t>(state.range(0));
  std::string bytes = slice(sample_of(which), size);
  if (bytes.empty()) {
    state.SkipWithError("sample artifact not available");
    return;
  }
  auto k = make_key("kcache-bench/compress", 99, size);
  for (auto _ : state) {
    Entry e = make_entry(k, "obj", bytes, c);
    benchmark::DoNotOptimize(e.encoded().data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
}

// What building a small entry costs the compiling thread right after a
// compile: a ~2 KiB object under a JIT-sized key (13 components, readable
// values, one of them a ~700-byte string such as a CPU feature list) and a
// label, uncompressed. Only build() is timed.
void BM_BuildSmallEntry(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0));
  const std::string bytes = random_bytes(size, 11);
  std::string features;
  while (features.size() < 700) features += "+avx512f,+avx512bw,+avx512vl,+bmi2,";
  features.resize(700);
  auto k = *kcache::KeyBuilder("kcache-bench/small")
                .add_bytes("ir", "module-small")
                .add_string("target", "x86_64-unknown-linux-gnu")
                .add_string("cpu", "znver4")
                .add_string("features", features.substr(0, 200))
                .add_u64("opt_level", 3)
                .add_u64("code_model", 1)
                .add_u64("reloc_model", 2)
                .add_bool("fast_math", false)
                .add_bool("debug_info", false)
                .add_string("abi", "sysv")
                .add_string("jit", "orc-lazy")
                .add_string("compiler", "llvm-18.1.8")
                .add_i64("inline_threshold", 225)
                .label("small_kernel")
                .finish();
  // KeyBuilder keeps at most 256 bytes of a string; an integration may store
  // a longer readable value, as the full feature list here.
  for (auto& it : k.manifest.items)
    if (it.name == "features") it.value = features;
  kcache::EntryMeta m;
  m.created_unix_ms = 1700000000000;
  m.compile_cost_us = 25000;
  m.producer = "kcache-bench";
  m.label = k.label;
  // build() is const: the builder is filled once, so only build() is timed.
  kcache::EntryBuilder b(k.key);
  b.add("obj", bytes).meta(m).manifest(k.manifest);
  for (auto _ : state) {
    auto e = b.build();
    if (!e) {
      state.SkipWithError(e.error().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(e->encoded().data());
  }
  auto e = b.build();
  if (!e || e->artifact("obj") != std::optional<std::string_view>(bytes) || e->manifest().items.size() != 13)
    state.SkipWithError("wrong entry");
  else
    state.counters["entry_bytes"] = static_cast<double>(e->encoded().size());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
}

// ---- opening a store --------------------------------------------------------------

// A store of `entries` 1 KiB entries, filled once per size: a JIT's cache
// after a cold start (kcache-demo's holds 480).
const std::string& filled_store(int64_t entries) {
  static std::map<int64_t, std::string> dirs;
  auto it = dirs.find(entries);
  if (it != dirs.end()) return it->second;
  std::string dir = root_dir() + "/open-" + std::to_string(entries);
  auto tier = open_or_die(kcache::open_lmdb_tier(dir + "/lmdb", disk_options(kcache::Durability::none)), "lmdb");
  std::vector<Entry> batch;
  for (int64_t i = 0; i < entries; ++i) {
    batch.push_back(make_entry(make_key("open/1", static_cast<uint64_t>(i), 1024), "obj",
                               random_bytes(1024, static_cast<uint64_t>(i)), kcache::Compression::none));
    if (batch.size() == 256 || i + 1 == entries) {
      tier->put_many(batch);
      batch.clear();
    }
  }
  (void)tier->flush();
  return dirs[entries] = dir;
}

// open/lmdb/check:C: the LMDB tier alone, with (1) or without (0) the
// structure check at open, which reads every branch and leaf page.
void BM_OpenLmdb(benchmark::State& state) {
  const std::string dir = filled_store(state.range(0)) + "/lmdb";
  kcache::DiskTierOptions o = disk_options(kcache::Durability::normal);
  o.check_on_open = state.range(1) != 0;
  for (auto _ : state) {
    auto t = open_or_die(kcache::open_lmdb_tier(dir, o), "lmdb");
    state.PauseTiming();
    t.reset();
    state.ResumeTiming();
  }
}

// open/cache: Cache::open as a JIT opens it (the folder's LMDB store, its
// lease table and miss journal, no memory tier); closing is not timed.
void BM_OpenCache(benchmark::State& state) {
  kcache::Options o;
  o.dir = filled_store(state.range(0));
  o.memory_tier = false;
  for (auto _ : state) {
    auto c = kcache::Cache::open(o);
    state.PauseTiming();
    if (c->tiers().empty()) {
      state.SkipWithError("no tier opened");
      return;
    }
    c.reset();
    state.ResumeTiming();
  }
}

// ---- registration ------------------------------------------------------------

void register_all() {
  using S = Stores;
  struct TierCase {
    const char* name;
    std::shared_ptr<kcache::Tier> S::*which;
  };
  const TierCase hit_tiers[] = {
      {"memory", &S::memory}, {"lmdb", &S::lmdb}, {"lmdb_every", &S::lmdb_every}, {"files", &S::files}};
  for (auto [pattern, p] :
       {std::pair{"same", Pattern::same}, std::pair{"vary", Pattern::vary}, std::pair{"read", Pattern::read}}) {
    auto add = [](benchmark::internal::Benchmark* b) {
      for (int64_t s : kSizes) b->Arg(s);
    };
    add(benchmark::RegisterBenchmark((std::string("hit/memcpy/") + pattern).c_str(), BM_HitMemcpy, p));
    for (const auto& t : hit_tiers)
      add(benchmark::RegisterBenchmark((std::string("hit/") + t.name + "/" + pattern).c_str(), BM_HitTier, t.which, p));
    add(benchmark::RegisterBenchmark((std::string("hit/cache_lmdb/") + pattern).c_str(), BM_HitCache, p));
#if KCACHE_BENCH_HAVE_LLVM
    add(benchmark::RegisterBenchmark((std::string("hit/llvm_localcache/") + pattern).c_str(), BM_HitLlvm, p));
#endif
  }

  const TierCase put_tiers[] = {
      {"memory", &S::memory}, {"lmdb", &S::lmdb}, {"lmdb_nosync", &S::lmdb_nosync}, {"files", &S::files}};
  for (const auto& t : put_tiers) {
    auto* b = benchmark::RegisterBenchmark((std::string("put/") + t.name).c_str(), BM_PutTier, t.which);
    for (int64_t s : kSizes) b->Arg(s);
  }
#if KCACHE_BENCH_HAVE_LLVM
  {
    auto* b = benchmark::RegisterBenchmark("put/llvm_localcache", BM_PutLlvm);
    for (int64_t s : kSizes) b->Arg(s);
  }
#endif

  for (auto [name, cached] : {std::pair{"miss/compile_only", false}, std::pair{"miss/cache_lmdb", true}})
    benchmark::RegisterBenchmark(name, BM_Miss, cached)->Arg(2 << 10)->Arg(16 << 10);

  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> hashes[] = {
      {"hash/key_builder", BM_HashKeyBuilder}, {"hash/hash_bytes", BM_HashBytes}, {"hash/memcpy", BM_HashMemcpy}};
  for (auto [name, fn] : hashes) benchmark::RegisterBenchmark(name, fn)->Arg(16 << 10)->Arg(1 << 20);

  const char* kinds[] = {"ptx", "elf"};
  for (int which = 0; which < 2; ++which) {
    for (auto [mode, c] :
         {std::pair{"none", kcache::Compression::none}, std::pair{"automatic", kcache::Compression::automatic}}) {
      std::string base = std::string("compress/") + kinds[which] + "/" + mode;
      benchmark::RegisterBenchmark((base + "/hit").c_str(), BM_CompressHit, which, c)
          ->Arg(16 << 10)
          ->Arg(256 << 10)
          ->Arg(768 << 10);
      benchmark::RegisterBenchmark((base + "/build").c_str(), BM_CompressBuild, which, c)
          ->Arg(16 << 10)
          ->Arg(256 << 10)
          ->Arg(768 << 10);
    }
  }
  benchmark::RegisterBenchmark("build/small_entry", BM_BuildSmallEntry)->Arg(2 << 10);
  benchmark::RegisterBenchmark("open/lmdb", BM_OpenLmdb)
      ->ArgNames({"entries", "check"})
      ->ArgsProduct({{480, 10000}, {1, 0}});
  benchmark::RegisterBenchmark("open/cache", BM_OpenCache)->ArgNames({"entries"})->Arg(480)->Arg(10000);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // Close the stores (and their background threads) before atexit removes
  // their folders.
  g_stores.reset();
  return 0;
}

// Bundle benchmarks: how long opening a bundle takes at 1k, 10k and 100k
// entries (map the file, check the header, the index checksum and, signed,
// the Ed25519 signature), and the latency of a bundle hit next to an LMDB
// hit of the same entries measured in the same run.
//
//   open/<unsigned|signed>/<entries>   open_bundle + dropping the tier
//   hit/lmdb/<entries>                  LMDB tier get, keys in a fixed random order
//   hit/bundle/<entries>                the same keys from a bundle of the same store;
//                                       counter vs_lmdb = bundle ns / LMDB ns
//   hit/bundle_signed/<entries>         the same from a signed bundle (each entry's
//                                       SHA-256 is checked at its first hit only)
//
// Each hit touches the artifact's first and last byte, and after each run
// one hit is compared with what was stored, so a run cannot pass on a wrong
// answer. Files live in a temp folder removed at exit.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kcache/bundle.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/tier.h"

namespace {

using namespace kcache;

std::string g_dir;
double g_lmdb_ns = 0;

Key key_of(uint64_t i) { return KeyBuilder("bench/bundle").add_u64("i", i).finish()->key; }

std::string bytes_of(uint64_t i, size_t n) {
  std::string s(n, '\0');
  uint64_t x = i * 0x9e3779b97f4a7c15ull + 1;
  for (size_t j = 0; j < n; j += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(s.data() + j, &x, std::min<size_t>(8, n - j));
  }
  return s;
}

Entry entry_of(uint64_t i, size_t n) {
  auto k = KeyBuilder("bench/bundle").add_u64("i", i).finish();
  EntryMeta m;
  m.created_unix_ms = 1700000000000ull;
  m.producer = "bench";
  return *EntryBuilder(k->key).add("obj", bytes_of(i, n)).meta(m).manifest(k->manifest).build();
}

const std::string& key_file() {
  static std::string f = [] {
    std::string p = g_dir + "/key";
    if (!bundle_keygen(p).is_ok()) std::abort();
    return p;
  }();
  return f;
}

// A bundle of n entries of 128-byte artifacts (made once per size).
std::string bundle_file(uint64_t n, bool sign) {
  static std::map<std::pair<uint64_t, bool>, std::string> made;
  auto it = made.find({n, sign});
  if (it != made.end()) return it->second;
  MemoryTierOptions mo;
  mo.max_bytes = uint64_t(4) << 30;
  auto mem = make_memory_tier(mo);
  for (uint64_t i = 0; i < n; ++i) (void)mem->put(entry_of(i, 128));
  std::string path = g_dir + "/open-" + std::to_string(n) + (sign ? "-signed" : "") + ".kcb";
  BundleWriteOptions o;
  if (sign) o.sign_key_file = key_file();
  if (!write_bundle(*mem, BundleSelection{}, path, o)) std::abort();
  return made[{n, sign}] = path;
}

void BM_Open(benchmark::State& state, bool sign) {
  uint64_t n = static_cast<uint64_t>(state.range(0));
  std::string path = bundle_file(n, sign);
  std::vector<std::string> trust;
  if (sign) trust.push_back(key_file() + ".pub");
  for (auto _ : state) {
    auto t = open_bundle(path, trust);
    if (!t) {
      state.SkipWithError(t.error().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(t->get());
  }
  state.counters["entries"] = static_cast<double>(n);
}

// The hit set: n entries of `kHitBytes` in LMDB, and bundles of that store.
constexpr size_t kHitBytes = 4096;
struct HitSet {
  std::shared_ptr<Tier> lmdb, bundle, bundle_signed;
  std::vector<Key> order;
};
HitSet& hit_set(uint64_t n) {
  static std::map<uint64_t, HitSet> sets;
  auto it = sets.find(n);
  if (it != sets.end()) return it->second;
  HitSet& h = sets[n];
  std::string dir = g_dir + "/lmdb-" + std::to_string(n);
  DiskTierOptions o;
  o.durability = Durability::none;
  o.max_bytes = uint64_t(8) << 30;
  o.max_entries = n * 2;
  h.lmdb = *open_lmdb_tier(dir, o);
  for (uint64_t i = 0; i < n; ++i) (void)h.lmdb->put(entry_of(i, kHitBytes));
  (void)h.lmdb->flush();
  // Read through a second, read-only tier object: bundling is no use.
  auto src = make_read_only(*open_lmdb_tier(dir, o));
  std::string p = dir + ".kcb", ps = dir + "-signed.kcb";
  if (!write_bundle(*src, BundleSelection{}, p)) std::abort();
  BundleWriteOptions so;
  so.sign_key_file = key_file();
  if (!write_bundle(*src, BundleSelection{}, ps, so)) std::abort();
  h.bundle = *open_bundle(p);
  h.bundle_signed = *open_bundle(ps, {key_file() + ".pub"});
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i < n; ++i) h.order.push_back(key_of(i));
  std::shuffle(h.order.begin(), h.order.end(), rng);
  return h;
}

enum class Which { lmdb, bundle, bundle_signed };

void BM_Hit(benchmark::State& state, Which which) {
  uint64_t n = static_cast<uint64_t>(state.range(0));
  HitSet& h = hit_set(n);
  Tier& t = which == Which::lmdb ? *h.lmdb : which == Which::bundle ? *h.bundle : *h.bundle_signed;
  size_t i = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto r = t.get(h.order[i]);
    if (!r || !r->has_value()) {
      state.SkipWithError("miss");
      return;
    }
    auto a = (**r).artifact("obj");
    benchmark::DoNotOptimize(a->front());
    benchmark::DoNotOptimize(a->back());
    if (++i == h.order.size()) i = 0;
  }
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
              static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  auto check = t.get(key_of(n / 2));
  if (!check || !check->has_value() || *(**check).artifact("obj") != bytes_of(n / 2, kHitBytes))
    state.SkipWithError("wrong bytes");
  if (which == Which::lmdb)
    g_lmdb_ns = ns;
  else if (g_lmdb_ns > 0)
    state.counters["vs_lmdb"] = ns / g_lmdb_ns;
}

}  // namespace

BENCHMARK_CAPTURE(BM_Open, unsigned, false)
    ->Name("open/unsigned")
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(100000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Open, signed, true)
    ->Name("open/signed")
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(100000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Hit, lmdb, Which::lmdb)->Name("hit/lmdb")->Arg(10000);
BENCHMARK_CAPTURE(BM_Hit, bundle, Which::bundle)->Name("hit/bundle")->Arg(10000);
BENCHMARK_CAPTURE(BM_Hit, bundle_signed, Which::bundle_signed)->Name("hit/bundle_signed")->Arg(10000);

int main(int argc, char** argv) {
  std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                     "/kcache-bundle-bench-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return 1;
  g_dir = tmpl;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
  return 0;
}

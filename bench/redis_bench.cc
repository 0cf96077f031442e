// Redis tier: remote hit latency on loopback next to a local (LMDB) hit of
// the same entry measured in the same run, and pipelined multi-get
// throughput next to one GET per key. The benchmark starts its own
// redis-server on a free loopback port.
//
// Counters: p50_us / p99_us per call; x_local = remote p50 / local p50;
// items_per_second for batches; x_sequential = batch rate / one-by-one rate.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/redis.h"
#include "kcache/tier.h"
#include "redis_server.h"

using namespace kcache;

namespace {

struct World {
  std::string dir;
  std::unique_ptr<test::RedisServer> server;
  std::string error;
};

World& world() {
  static World* w = [] {
    auto* w = new World;
    char tmpl[] = "/tmp/kcache-redis-bench-XXXXXX";
    if (char* p = ::mkdtemp(tmpl)) w->dir = p;
    w->server = std::make_unique<test::RedisServer>(w->dir);
    if (!w->server->ok()) w->error = w->server->error();
    std::atexit([] {
      World& x = world();
      x.server.reset();
      std::string cmd = "rm -rf '" + x.dir + "'";
      (void)std::system(cmd.c_str());
    });
    return w;
  }();
  return *w;
}

Key key_of(uint64_t i, uint64_t salt) {
  return KeyBuilder("bench").add_u64("i", i).add_u64("salt", salt).finish()->key;
}

Entry entry_of(const Key& k, size_t n) {
  std::string data(n, '\0');
  for (size_t j = 0; j < n; ++j) data[j] = static_cast<char>((j * 131) ^ (j >> 7));
  return *EntryBuilder(k).add("obj", std::move(data)).build();
}

std::shared_ptr<RedisTier> make_tier(bool mac, bool shared_stats = true) {
  RedisTierOptions o;
  o.shared_stats = shared_stats;
  o.write_queue_depth = 4096;
  o.command_timeout_ms = 5000;
  if (mac) o.secret = "bench-secret";
  auto t = make_redis_tier(world().server->url(), o);
  return t ? *t : nullptr;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Latencies of `n` calls of fn, in microseconds.
template <class F>
std::vector<double> sample(int n, F&& fn) {
  std::vector<double> v;
  v.reserve(n);
  for (int i = 0; i < n; ++i) {
    double t0 = now_us();
    fn();
    v.push_back(now_us() - t0);
  }
  return v;
}

// Args: entry bytes, MAC on (1) or off (0).
void BM_RemoteHit(benchmark::State& state) {
  if (!world().error.empty()) return state.SkipWithError(world().error.c_str());
  size_t size = static_cast<size_t>(state.range(0));
  bool mac = state.range(1) != 0;
  auto tier = make_tier(mac);
  Key k = key_of(size, mac);
  Entry e = entry_of(k, size);
  if (!tier->put(e).is_ok() || !tier->flush().is_ok()) return state.SkipWithError("put failed");

  // Baseline: a local hit of the same entry in an LMDB tier, same run.
  std::string ldir = world().dir + "/lmdb-" + std::to_string(size) + "-" + std::to_string(mac);
  auto local = open_lmdb_tier(ldir);
  if (!local || !(*local)->put(e).is_ok()) return state.SkipWithError("local tier failed");
  auto local_us = sample(200, [&] {
    auto g = (*local)->get(k);
    benchmark::DoNotOptimize(g);
  });

  std::vector<double> remote_us;
  for (auto _ : state) {
    double t0 = now_us();
    auto g = tier->get(k);
    remote_us.push_back(now_us() - t0);
    if (!g || !g->has_value()) return state.SkipWithError("remote miss");
    benchmark::DoNotOptimize(g);
  }
  double p50 = percentile(remote_us, 0.5), lp50 = percentile(local_us, 0.5);
  state.counters["p50_us"] = p50;
  state.counters["p99_us"] = percentile(remote_us, 0.99);
  state.counters["local_p50_us"] = lp50;
  state.counters["x_local"] = lp50 > 0 ? p50 / lp50 : 0;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}
BENCHMARK(BM_RemoteHit)
    ->Args({16 << 10, 0})
    ->Args({16 << 10, 1})
    ->Args({256 << 10, 0})
    ->Args({256 << 10, 1})
    ->Args({4 << 20, 0})
    ->Args({4 << 20, 1})
    ->ArgNames({"bytes", "mac"})
    ->UseRealTime();

// What the statistics every client adds to on the server cost a hit: one
// 16 KiB entry with a manifest (so its namespace is counted), looked up by
// two tiers in turn, one sending shared statistics and one not, in the
// same run. x_without = p50 with / p50 without.
void BM_RemoteHitSharedStats(benchmark::State& state) {
  if (!world().error.empty()) return state.SkipWithError(world().error.c_str());
  auto with = make_tier(false, true), without = make_tier(false, false);
  auto info = KeyBuilder("bench/shared-stats").add_u64("i", 1).finish();
  std::string data(16 << 10, 'x');
  Entry e = *EntryBuilder(info->key).manifest(info->manifest).add("obj", std::move(data)).build();
  if (!with->put(e).is_ok() || !with->flush().is_ok()) return state.SkipWithError("put failed");
  std::vector<double> on_us, off_us;
  for (auto _ : state) {
    for (auto* t : {&with, &without}) {
      double t0 = now_us();
      auto g = (*t)->get(info->key);
      (t == &with ? on_us : off_us).push_back(now_us() - t0);
      if (!g || !g->has_value()) return state.SkipWithError("remote miss");
      benchmark::DoNotOptimize(g);
    }
  }
  double on = percentile(on_us, 0.5), off = percentile(off_us, 0.5);
  state.counters["with_p50_us"] = on;
  state.counters["without_p50_us"] = off;
  state.counters["x_without"] = off > 0 ? on / off : 0;
}
BENCHMARK(BM_RemoteHitSharedStats)->Iterations(4000)->UseRealTime();

// Args: entry bytes, keys per batch, MAC on (1) or off (0).
void BM_GetMany(benchmark::State& state) {
  if (!world().error.empty()) return state.SkipWithError(world().error.c_str());
  size_t size = static_cast<size_t>(state.range(0));
  size_t batch = static_cast<size_t>(state.range(1));
  auto tier = make_tier(state.range(2) != 0);
  std::vector<Key> keys;
  for (size_t i = 0; i < batch; ++i) {
    keys.push_back(key_of(1000000 + i, size * 2 + static_cast<size_t>(state.range(2))));
    if (!tier->put(entry_of(keys.back(), size)).is_ok()) return state.SkipWithError("put failed");
  }
  if (!tier->flush().is_ok()) return state.SkipWithError("flush failed");

  // Baseline: the same keys one GET at a time, same run.
  double t0 = now_us();
  for (const Key& k : keys) {
    auto g = tier->get(k);
    if (!g || !g->has_value()) return state.SkipWithError("sequential miss");
  }
  double seq_rate = static_cast<double>(batch) / ((now_us() - t0) / 1e6);

  double busy_us = 0;
  for (auto _ : state) {
    double s = now_us();
    auto got = tier->get_many(keys);
    busy_us += now_us() - s;
    for (auto& g : got)
      if (!g) return state.SkipWithError("batch miss");
    benchmark::DoNotOptimize(got);
  }
  double rate = static_cast<double>(state.iterations() * batch) / (busy_us / 1e6);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * batch));
  state.counters["entries_per_s"] = rate;
  state.counters["x_sequential"] = rate / seq_rate;
}
BENCHMARK(BM_GetMany)
    ->Args({1 << 10, 256, 1})
    ->Args({16 << 10, 256, 0})
    ->Args({16 << 10, 256, 1})
    ->Args({16 << 10, 1024, 1})
    ->ArgNames({"bytes", "batch", "mac"})
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

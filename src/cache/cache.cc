// The Cache facade: ordered tiers, promotion, single-flight, fault policy.
//
// Lookup path: get() asks each tier in order; a fault is logged, counted and
// treated as a miss; the first hit is promoted into the faster writable
// tiers. Compile path: get_or_compile() looks up, then joins or leads a
// flight for the key (one per key in this process); the leader looks up once
// more (another thread may have just stored it), compiles, builds the entry
// and stores it in every writable tier; waiters get the leader's result.
#include "kcache/cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdio>
#include <future>
#include <mutex>
#include <unordered_map>

#include "cache/impl.h"
#include "kcache/assembly.h"
#include "util/util.h"

namespace kcache {

std::string_view source_name(Source s) noexcept {
  switch (s) {
    case Source::compiled: return "compiled";
    case Source::memory: return "memory";
    case Source::disk: return "disk";
    case Source::remote: return "remote";
    case Source::other: return "other";
    case Source::waited: return "waited";
    case Source::bundle: return "bundle";
  }
  return "?";
}

Cache::Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cache::~Cache() {
  impl_->stop_heartbeat();
  flush();
  if (impl_->opt.print_stats) std::fprintf(stderr, "%s", stats().to_string().c_str());
}

std::unique_ptr<Cache> Cache::with_tiers(std::vector<std::shared_ptr<Tier>> tiers, const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  // Read-only covers the shared stores; the process's own memory tier still
  // takes promotions, or every hit would be a disk read and a copy.
  for (auto& t : tiers)
    impl->add(options.read_only && t->writable() && t->kind() != TierKind::memory ? make_read_only(t) : t);
  return std::unique_ptr<Cache>(new Cache(std::move(impl)));
}

std::unique_ptr<Cache> Cache::open(const Options& options) {
  util::set_log(options.log_level, options.log_file);
  return open(assemble(options), options);
}

std::unique_ptr<Cache> Cache::open(Assembly assembly, const Options& options) {
  auto c = with_tiers(std::move(assembly.tiers), options);
  c->impl_->leases = std::move(assembly.leases);
  return c;
}

void Cache::set_leases(std::shared_ptr<Leases> leases) { impl_->leases = std::move(leases); }

std::optional<Entry> Cache::get(const Key& key, Source* source) {
  if (impl_->opt.disabled) return std::nullopt;
  return impl_->lookup(key, source);
}

bool Cache::put(const Entry& entry) {
  if (impl_->opt.disabled) return false;
  return impl_->store(entry);
}

std::optional<Entry> Cache::put(const KeyInfo& key, std::vector<Artifact> artifacts, uint64_t compile_cost_us) {
  auto e = impl_->build(key, std::move(artifacts), compile_cost_us);
  if (!e) {
    KCACHE_LOG(LogLevel::warn, "put: %s", e.error().to_string().c_str());
    return std::nullopt;
  }
  put(*e);
  return std::move(e).value();
}

Expected<Entry> Cache::get_or_compile(const Key& key, const CompileFn& compile, Source* source) {
  KeyInfo info;
  info.key = key;
  return get_or_compile(info, compile, source);
}

Expected<Entry> Cache::get_or_compile(const KeyInfo& key, const CompileFn& compile, Source* source) {
  Impl::Outcome o;
  return impl_->resolve(key, compile, source, true, &o);
}

// The compile path. With wait_for_others false, a key whose lease another
// process holds is answered with outcome busy (and an unavailable status)
// instead of waiting, so a batch can do other work first.
Expected<Entry> Cache::Impl::resolve(const KeyInfo& key, const CompileFn& compile, Source* source,
                                     bool wait_for_others, Outcome* outcome, bool count_miss) {
  *outcome = Outcome::done;
  auto run_compile = [&]() -> Expected<Entry> {
    uint64_t t0 = util::now_mono_us();
    compiles.fetch_add(1, std::memory_order_relaxed);
    auto arts = compile();
    uint64_t dt = util::now_mono_us() - t0;
    compile_us.fetch_add(dt, std::memory_order_relaxed);
    if (!arts) {
      compile_failures.fetch_add(1, std::memory_order_relaxed);
      return std::move(arts).error();
    }
    auto e = build(key, std::move(arts).value(), dt);
    if (!e) {
      compile_failures.fetch_add(1, std::memory_order_relaxed);
      return std::move(e).error();
    }
    return e;
  };
  if (source) *source = Source::compiled;
  if (opt.disabled) return run_compile();
  if (!opt.recompile) {
    if (auto hit = lookup(key.key, source, count_miss)) return std::move(*hit);
  }

  std::shared_ptr<Flight> flight;
  std::promise<Expected<Entry>> promise;
  {
    std::lock_guard lk(flights_mu);
    auto it = flights.find(key.key);
    if (it != flights.end()) {
      flight = it->second;
    } else {
      auto f = std::make_shared<Flight>();
      f->result = promise.get_future().share();
      flights.emplace(key.key, f);
    }
  }
  if (flight) {
    waits.fetch_add(1, std::memory_order_relaxed);
    if (source) *source = Source::waited;
    Expected<Entry> r = flight->result.get();
    if (flight->busy.load() && wait_for_others) return resolve(key, compile, source, true, outcome, false);
    if (flight->busy.load()) *outcome = Outcome::busy;
    return r;
  }

  // Leading the flight. Whatever happens below (a result, an error, an
  // exception from the compile function or from a tier), the guard hands a
  // result to every waiting thread, unregisters the flight and gives the
  // lease up, after the entry is stored so that other processes find it.
  struct FlightGuard {
    Impl& impl;
    const Key& key;
    std::promise<Expected<Entry>>& promise;
    bool leased = false;
    bool done = false;
    void finish(const Expected<Entry>& r, bool busy) {
      if (done) return;
      done = true;
      if (leased) impl.unhold(key);
      std::lock_guard lk(impl.flights_mu);
      auto it = impl.flights.find(key);
      if (busy && it != impl.flights.end()) it->second->busy.store(true);
      promise.set_value(r);
      if (it != impl.flights.end()) impl.flights.erase(it);
    }
    ~FlightGuard() {
      if (!done) finish(Status(Errc::compile_failed, "compile function threw an exception"), false);
    }
  } guard{*this, key.key, promise};
  auto finish = [&](Expected<Entry> r, bool busy = false) {
    guard.finish(r, busy);
    return r;
  };

  // Another thread may have stored it between our lookup and our flight.
  if (!opt.recompile) {
    if (auto hit = lookup(key.key, source, false)) return finish(std::move(*hit));
  }

  // Another process may be compiling it. Waiting polls the lease only (no
  // lookups, so a long wait is not hundreds of counted misses): its holder
  // stores the entry before giving the lease up, so once the lease is ours,
  // one lookup finds the entry, or shows that the holder failed or died.
  if (leases && !opt.read_only) {
    uint64_t start = util::now_mono_us(), sleep_us = 1000;
    bool waited = false;
    for (;;) {
      LeaseResult lr = leases->acquire(key.key, ttl_ms());
      if (lr == LeaseResult::acquired) {
        guard.leased = true;
        hold(key.key);
        if (!opt.recompile) {
          if (auto hit = lookup(key.key, source, false)) {
            if (waited && source && *source != Source::memory) *source = Source::waited;
            return finish(std::move(*hit));
          }
        }
        break;
      }
      if (lr == LeaseResult::error) break;  // compile without coordination
      if (!wait_for_others) {
        *outcome = Outcome::busy;
        return finish(Status(Errc::unavailable, "another process is compiling this key"), true);
      }
      if (!waited) {
        lease_waits.fetch_add(1, std::memory_order_relaxed);
        waited = true;
      }
      if (util::now_mono_us() - start >= bound_ms() * 1000) {
        lease_timeouts.fetch_add(1, std::memory_order_relaxed);
        KCACHE_LOG(LogLevel::info, "waited %llu ms for another process to compile %s; compiling here",
                   static_cast<unsigned long long>(bound_ms()), key.key.hex().c_str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min<uint64_t>(sleep_us * 3 / 2, 50000);
    }
  }

  Expected<Entry> r = run_compile();
  if (r) {
    if (source) *source = Source::compiled;
    store(*r);
  }
  return finish(std::move(r));
}

void Cache::add_tier(std::shared_ptr<Tier> tier) {
  bool wrap = impl_->opt.read_only && tier->writable() && tier->kind() != TierKind::memory;
  if (tier->kind() == TierKind::bundle) {
    size_t at = 0;
    auto& ts = impl_->tiers;
    while (at < ts.size() && (ts[at]->kind() == TierKind::memory || ts[at]->kind() == TierKind::bundle)) ++at;
    ts.insert(ts.begin() + static_cast<std::ptrdiff_t>(at), std::move(tier));
    impl_->no_writes.insert(impl_->no_writes.begin() + static_cast<std::ptrdiff_t>(at),
                            std::make_unique<std::atomic<bool>>(false));
    return;
  }
  impl_->add(wrap ? make_read_only(std::move(tier)) : std::move(tier));
}

const std::vector<std::shared_ptr<Tier>>& Cache::tiers() const noexcept { return impl_->tiers; }
const Options& Cache::options() const noexcept { return impl_->opt; }

void Cache::flush() {
  for (auto& t : impl_->tiers) {
    Status st = t->flush();
    if (!st.is_ok()) impl_->fault(*t, "flush", st);
  }
}

CacheStats Cache::stats() const {
  CacheStats s;
  for (auto& t : impl_->tiers) s.tiers.push_back({std::string(t->name()), t->stats()});
  s.hits = impl_->hits.load();
  s.misses = impl_->misses.load();
  s.compiles = impl_->compiles.load();
  s.compile_failures = impl_->compile_failures.load();
  s.waits = impl_->waits.load();
  s.faults = impl_->faults.load();
  s.compile_us = impl_->compile_us.load();
  s.lease_waits = impl_->lease_waits.load();
  s.lease_timeouts = impl_->lease_timeouts.load();
  s.lease_takeovers = impl_->leases ? impl_->leases->takeovers() : 0;
  return s;
}

std::string CacheStats::to_string() const {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "kcache: %llu hits, %llu misses, %llu compiles (%llu failed, %.3f s), %llu waits, %llu faults\n",
                (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)compiles,
                (unsigned long long)compile_failures, compile_us / 1e6, (unsigned long long)waits,
                (unsigned long long)faults);
  out += buf;
  for (const auto& t : tiers) {
    std::snprintf(buf, sizeof buf,
                  "  %-10s %8llu hits %8llu misses %8llu puts %6llu evictions %4llu corrupt %4llu errors %8llu entries %12s\n",
                  t.name.c_str(), (unsigned long long)t.stats.hits, (unsigned long long)t.stats.misses,
                  (unsigned long long)t.stats.puts, (unsigned long long)t.stats.evictions,
                  (unsigned long long)t.stats.corrupt, (unsigned long long)t.stats.errors,
                  (unsigned long long)t.stats.entries, util::format_size(t.stats.bytes).c_str());
    out += buf;
  }
  return out;
}

std::string CacheStats::to_json() const {
  std::string out = "{";
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "\"hits\":%llu,\"misses\":%llu,\"compiles\":%llu,\"compile_failures\":%llu,\"waits\":%llu,"
                "\"faults\":%llu,\"compile_us\":%llu,\"lease_waits\":%llu,\"lease_timeouts\":%llu,"
                "\"lease_takeovers\":%llu,\"tiers\":[",
                (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)compiles,
                (unsigned long long)compile_failures, (unsigned long long)waits, (unsigned long long)faults,
                (unsigned long long)compile_us, (unsigned long long)lease_waits,
                (unsigned long long)lease_timeouts, (unsigned long long)lease_takeovers);
  out += buf;
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (i) out += ",";
    out += "{\"name\":\"" + util::json_escape(tiers[i].name) + "\",\"stats\":" + tier_stats_json(tiers[i].stats) + "}";
  }
  out += "]}";
  return out;
}

}  // namespace kcache

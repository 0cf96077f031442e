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

#include <atomic>
#include <cstdio>
#include <future>
#include <mutex>
#include <unordered_map>

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
  }
  return "?";
}

static Source source_of(const Tier& t) {
  std::string_view n = t.name();
  if (n.starts_with("memory")) return Source::memory;
  if (n.starts_with("lmdb") || n.starts_with("files")) return Source::disk;
  if (n.starts_with("redis")) return Source::remote;
  return Source::other;
}

struct Cache::Impl {
  Options opt;
  std::vector<std::shared_ptr<Tier>> tiers;
  // Per tier: writes switched off for this process after a full disk or a
  // read-only folder (said once in the log).
  std::vector<std::unique_ptr<std::atomic<bool>>> no_writes;

  struct Flight {
    std::shared_future<Expected<Entry>> result;
  };
  std::mutex flights_mu;
  std::unordered_map<Key, std::shared_ptr<Flight>> flights;  // GUARDED_BY(flights_mu)

  std::atomic<uint64_t> hits{0}, misses{0}, compiles{0}, compile_failures{0}, waits{0}, faults{0}, compile_us{0};

  void add(std::shared_ptr<Tier> t) {
    tiers.push_back(std::move(t));
    no_writes.push_back(std::make_unique<std::atomic<bool>>(false));
  }

  void fault(const Tier& t, const char* op, const Status& st) {
    faults.fetch_add(1, std::memory_order_relaxed);
    KCACHE_LOG(LogLevel::warn, "%.*s %s: %s (treated as a miss)", static_cast<int>(t.name().size()),
               t.name().data(), op, st.to_string().c_str());
  }

  bool put_into(size_t i, const Entry& e) {
    Tier& t = *tiers[i];
    if (!t.writable() || no_writes[i]->load(std::memory_order_relaxed)) return false;
    Status st = t.put(e);
    if (st.is_ok()) return true;
    if (st.code() == Errc::no_space || st.code() == Errc::read_only) {
      if (!no_writes[i]->exchange(true)) {
        faults.fetch_add(1, std::memory_order_relaxed);
        KCACHE_LOG(LogLevel::warn, "%.*s put: %s; writes to this tier are off for this process",
                   static_cast<int>(t.name().size()), t.name().data(), st.to_string().c_str());
      }
      return false;
    }
    if (st.code() == Errc::too_large) {
      KCACHE_LOG(LogLevel::info, "%.*s put: %s", static_cast<int>(t.name().size()), t.name().data(),
                 st.to_string().c_str());
      return false;
    }
    fault(t, "put", st);
    return false;
  }

  std::optional<Entry> lookup(const Key& key, Source* src) {
    for (size_t i = 0; i < tiers.size(); ++i) {
      auto r = tiers[i]->get(key);
      if (!r) {
        fault(*tiers[i], "get", r.error());
        continue;
      }
      if (!r->has_value()) continue;
      Entry e = std::move(**r);
      if (i > 0) {
        // Faster tiers outlive a pinned read: give them heap bytes.
        Entry promoted = e.pinned() ? e.detach() : e;
        for (size_t j = 0; j < i; ++j) put_into(j, promoted);
      }
      hits.fetch_add(1, std::memory_order_relaxed);
      if (src) *src = source_of(*tiers[i]);
      return e;
    }
    misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }

  bool store(const Entry& e) {
    if (opt.read_only) return false;
    bool any = false;
    for (size_t i = 0; i < tiers.size(); ++i) any |= put_into(i, e);
    return any;
  }

  Expected<Entry> build(const KeyInfo& key, std::vector<Artifact> arts, uint64_t cost_us) {
    EntryBuilder b(key.key);
    for (auto& a : arts) b.add(std::move(a));
    EntryMeta m;
    m.created_unix_ms = util::now_unix_ms();
    m.compile_cost_us = cost_us;
    m.producer = opt.producer;
    b.meta(std::move(m)).manifest(key.manifest).compression(opt.compression);
    return b.build();
  }
};

Cache::Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cache::~Cache() {
  flush();
  if (impl_->opt.print_stats) std::fprintf(stderr, "%s", stats().to_string().c_str());
}

std::unique_ptr<Cache> Cache::with_tiers(std::vector<std::shared_ptr<Tier>> tiers, const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  for (auto& t : tiers) impl->add(options.read_only && t->writable() ? make_read_only(t) : t);
  return std::unique_ptr<Cache>(new Cache(std::move(impl)));
}

std::unique_ptr<Cache> Cache::open(const Options& options) {
  util::set_log(options.log_level, options.log_file);
  std::vector<std::shared_ptr<Tier>> tiers;
  if (options.disabled) return with_tiers({}, options);
  if (options.memory_tier) {
    MemoryTierOptions mo;
    mo.max_bytes = options.memory_bytes;
    tiers.push_back(make_memory_tier(mo));
  }
  if (options.disk_tier) {
    std::string dir = options.dir.empty() ? Options::default_dir() : options.dir;
    std::string engine = options.engine;
#if KCACHE_HAVE_LMDB
    if (engine.empty()) engine = "lmdb";
#else
    if (engine.empty() || engine == "lmdb") engine = "files";
#endif
    Expected<std::shared_ptr<Tier>> disk = Status(Errc::unavailable, "no cache folder (HOME and XDG_CACHE_HOME unset)");
    if (!dir.empty()) {
      Status st = util::make_dirs(dir, 0700);
      if (st.is_ok() && ::access(dir.c_str(), W_OK) != 0) st = util::errno_status(errno, dir);
      if (!st.is_ok()) {
        disk = st;
      } else if (engine == "files") {
        disk = open_files_tier(dir + "/files", options.disk);
      } else {
        disk = open_lmdb_tier(dir + "/lmdb", options.disk);
      }
    }
    if (disk) {
      tiers.push_back(std::move(disk).value());
    } else {
      KCACHE_LOG(LogLevel::warn, "running without a disk tier: %s", disk.error().to_string().c_str());
    }
  }
  return with_tiers(std::move(tiers), options);
}

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
  Impl& I = *impl_;
  auto run_compile = [&]() -> Expected<Entry> {
    uint64_t t0 = util::now_mono_us();
    I.compiles.fetch_add(1, std::memory_order_relaxed);
    auto arts = compile();
    uint64_t dt = util::now_mono_us() - t0;
    I.compile_us.fetch_add(dt, std::memory_order_relaxed);
    if (!arts) {
      I.compile_failures.fetch_add(1, std::memory_order_relaxed);
      return std::move(arts).error();
    }
    auto e = I.build(key, std::move(arts).value(), dt);
    if (!e) {
      I.compile_failures.fetch_add(1, std::memory_order_relaxed);
      return std::move(e).error();
    }
    return e;
  };
  if (source) *source = Source::compiled;
  if (I.opt.disabled) return run_compile();
  if (!I.opt.recompile) {
    if (auto hit = I.lookup(key.key, source)) return std::move(*hit);
  }

  std::promise<Expected<Entry>> promise;
  std::shared_ptr<Impl::Flight> flight;
  {
    std::lock_guard lk(I.flights_mu);
    auto it = I.flights.find(key.key);
    if (it != I.flights.end()) {
      flight = it->second;
    } else {
      auto f = std::make_shared<Impl::Flight>();
      f->result = promise.get_future().share();
      I.flights.emplace(key.key, f);
    }
  }
  if (flight) {
    I.waits.fetch_add(1, std::memory_order_relaxed);
    if (source) *source = Source::waited;
    return flight->result.get();
  }

  auto finish = [&](Expected<Entry> r) {
    promise.set_value(r);
    std::lock_guard lk(I.flights_mu);
    I.flights.erase(key.key);
    return r;
  };
  // Another thread may have stored it between our lookup and our flight.
  if (!I.opt.recompile) {
    if (auto hit = I.lookup(key.key, source)) return finish(std::move(*hit));
  }
  Expected<Entry> r = Status(Errc::internal, "unset");
  try {
    r = run_compile();
  } catch (...) {
    finish(Status(Errc::compile_failed, "compile function threw an exception"));
    throw;
  }
  if (r) {
    if (source) *source = Source::compiled;
    I.store(*r);
  }
  return finish(std::move(r));
}

void Cache::add_tier(std::shared_ptr<Tier> tier) {
  impl_->add(impl_->opt.read_only && tier->writable() ? make_read_only(std::move(tier)) : std::move(tier));
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
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "\"hits\":%llu,\"misses\":%llu,\"compiles\":%llu,\"compile_failures\":%llu,\"waits\":%llu,"
                "\"faults\":%llu,\"compile_us\":%llu,\"tiers\":[",
                (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)compiles,
                (unsigned long long)compile_failures, (unsigned long long)waits, (unsigned long long)faults,
                (unsigned long long)compile_us);
  out += buf;
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (i) out += ",";
    out += "{\"name\":\"" + util::json_escape(tiers[i].name) + "\",\"stats\":" + tier_stats_json(tiers[i].stats) + "}";
  }
  out += "]}";
  return out;
}

}  // namespace kcache

// Private: the Cache's state, shared by cache.cc (single keys) and
// batch.cc (batches).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

inline Source source_of(const Tier& t) {
  switch (t.kind()) {
    case TierKind::memory: return Source::memory;
    case TierKind::disk: return Source::disk;
    case TierKind::remote: return Source::remote;
    case TierKind::bundle: return Source::bundle;
    case TierKind::other: return Source::other;
  }
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
    std::atomic<bool> busy{false};  // leader gave up: another process holds the lease
  };
  std::mutex flights_mu;
  std::unordered_map<Key, std::shared_ptr<Flight>> flights;  // GUARDED_BY(flights_mu)

  std::atomic<uint64_t> hits{0}, misses{0}, compiles{0}, compile_failures{0}, waits{0}, faults{0}, compile_us{0};
  std::atomic<uint64_t> lease_waits{0}, lease_timeouts{0};

  // Cross-process single-flight. Held leases are renewed by a heartbeat
  // thread every ttl/3 while their compiles run. The heartbeat's mutex and
  // condition variable live on the heap so that a forked child can abandon
  // the ones it inherited (a parent thread may have been waiting on them).
  std::shared_ptr<Leases> leases;
  std::unique_ptr<std::mutex> hb_mu = std::make_unique<std::mutex>();
  std::unique_ptr<std::condition_variable> hb_cv = std::make_unique<std::condition_variable>();
  std::unordered_map<Key, int> held;  // GUARDED_BY(*hb_mu): key -> holders in this process
  bool hb_stop = false;               // GUARDED_BY(*hb_mu)
  std::thread hb;

  uint64_t ttl_ms() const { return opt.lease_ttl_ms ? opt.lease_ttl_ms : 10000; }
  uint64_t bound_ms() const { return opt.wait_bound_ms ? opt.wait_bound_ms : 300000; }

  // The fork generation this Cache's heartbeat state belongs to
  // (util::fork_generation).
  std::atomic<uint64_t> fork_gen{util::fork_generation()};

  // In a child of fork(), the inherited heartbeat thread does not exist and
  // its mutex or condition variable may be in a state no thread of the child
  // will ever change: leak all three (never joined, unlocked or destroyed)
  // and start afresh. The first thread of the child to get here does it;
  // a child is expected to begin using an inherited Cache from one thread.
  void forget_inherited_heartbeat() {
    uint64_t now = util::fork_generation(), was = fork_gen.load();
    if (was == now || !fork_gen.compare_exchange_strong(was, now)) return;
    if (hb.joinable()) new std::thread(std::move(hb));
    (void)hb_mu.release();
    (void)hb_cv.release();
    hb_mu = std::make_unique<std::mutex>();
    hb_cv = std::make_unique<std::condition_variable>();
    hb_stop = false;
    held.clear();
  }

  void hold(const Key& k) {
    forget_inherited_heartbeat();
    std::lock_guard lk(*hb_mu);
    ++held[k];
    if (!hb.joinable()) hb = std::thread([this] { heartbeat(); });
  }
  void unhold(const Key& k) {
    forget_inherited_heartbeat();
    {
      std::lock_guard lk(*hb_mu);
      if (auto it = held.find(k); it != held.end() && --it->second == 0) held.erase(it);
    }
    leases->release(k);
  }
  void heartbeat() {
    std::unique_lock lk(*hb_mu);
    while (!hb_stop) {
      hb_cv->wait_for(lk, std::chrono::milliseconds(std::max<uint64_t>(ttl_ms() / 3, 1)));
      if (hb_stop) break;
      std::vector<Key> keys;
      for (const auto& [k, n] : held) keys.push_back(k);
      lk.unlock();
      for (const auto& k : keys)
        if (!leases->renew(k, ttl_ms()))
          KCACHE_LOG(LogLevel::info, "lease on %s was lost (taken over); compiling on regardless",
                     k.hex().c_str());
      lk.lock();
    }
  }
  void stop_heartbeat() {
    forget_inherited_heartbeat();
    {
      std::lock_guard lk(*hb_mu);
      hb_stop = true;
    }
    hb_cv->notify_all();
    if (hb.joinable()) hb.join();
  }

  enum class Outcome { done, busy };
  // count_miss=false: the caller already counted this request's miss.
  Expected<Entry> resolve(const KeyInfo& key, const CompileFn& compile, Source* source, bool wait_for_others,
                          Outcome* outcome, bool count_miss = true);

  void add(std::shared_ptr<Tier> t) {
    tiers.push_back(std::move(t));
    no_writes.push_back(std::make_unique<std::atomic<bool>>(false));
  }

  void fault(const Tier& t, const char* op, const Status& st) {
    faults.fetch_add(1, std::memory_order_relaxed);
    // A tier that is switched off (breaker open, handle from before a
    // fork) says so once, not on every call.
    if (st.code() == Errc::unavailable) {
      std::lock_guard lk(said_mu);
      if (!said_unavailable.insert(&t).second) return;
    }
    KCACHE_LOG(LogLevel::warn, "%.*s %s: %s (treated as a miss)", static_cast<int>(t.name().size()),
               t.name().data(), op, st.to_string().c_str());
  }
  std::mutex said_mu;
  std::set<const Tier*> said_unavailable;  // GUARDED_BY(said_mu)

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

  // count=false: a re-check of a key whose miss was already counted; no
  // miss is counted here or in the tiers.
  std::optional<Entry> lookup(const Key& key, Source* src, bool count = true) {
    for (size_t i = 0; i < tiers.size(); ++i) {
      auto r = tiers[i]->get(key, count ? MissCount::counted : MissCount::uncounted);
      if (!r) {
        fault(*tiers[i], "get", r.error());
        continue;
      }
      if (!r->has_value()) continue;
      Entry e = std::move(**r);
      if (i > 0) {
        // Faster tiers outlive a pinned read: give them heap bytes, and
        // return those too so the caller holds no read transaction.
        if (e.pinned()) e = e.detach();
        for (size_t j = 0; j < i; ++j) put_into(j, e);
      }
      hits.fetch_add(1, std::memory_order_relaxed);
      if (src) *src = source_of(*tiers[i]);
      return e;
    }
    if (count) misses.fetch_add(1, std::memory_order_relaxed);
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

}  // namespace kcache

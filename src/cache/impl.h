// Private: the Cache's state, shared by cache.cc (single keys) and
// batch.cc (batches).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

inline Source source_of(const Tier& t) {
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
    std::atomic<bool> busy{false};  // leader gave up: another process holds the lease
  };
  std::mutex flights_mu;
  std::unordered_map<Key, std::shared_ptr<Flight>> flights;  // GUARDED_BY(flights_mu)

  std::atomic<uint64_t> hits{0}, misses{0}, compiles{0}, compile_failures{0}, waits{0}, faults{0}, compile_us{0};
  std::atomic<uint64_t> lease_waits{0}, lease_timeouts{0};

  // Cross-process single-flight. Held leases are renewed by a heartbeat
  // thread every ttl/3 while their compiles run.
  std::shared_ptr<Leases> leases;
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  std::unordered_map<Key, int> held;  // GUARDED_BY(hb_mu): key -> holders in this process
  bool hb_stop = false;               // GUARDED_BY(hb_mu)
  std::thread hb;

  uint64_t ttl_ms() const { return opt.lease_ttl_ms ? opt.lease_ttl_ms : 10000; }
  uint64_t bound_ms() const { return opt.wait_bound_ms ? opt.wait_bound_ms : 300000; }

  // The fork generation this Cache was made in (util::fork_generation). A
  // Cache used in a child of a fork() must not join the parent's heartbeat
  // thread, which does not exist there.
  uint64_t fork_gen = util::fork_generation();

  // REQUIRES: hb_mu held. In a forked child, the inherited std::thread
  // names a thread of the parent: leak the object instead of joining it.
  void forget_inherited_heartbeat() {
    if (fork_gen == util::fork_generation()) return;
    if (hb.joinable()) new std::thread(std::move(hb));  // never joined, never freed
    hb_stop = false;
    held.clear();
    fork_gen = util::fork_generation();
  }

  void hold(const Key& k) {
    std::lock_guard lk(hb_mu);
    forget_inherited_heartbeat();
    ++held[k];
    if (!hb.joinable()) hb = std::thread([this] { heartbeat(); });
  }
  void unhold(const Key& k) {
    {
      std::lock_guard lk(hb_mu);
      if (auto it = held.find(k); it != held.end() && --it->second == 0) held.erase(it);
    }
    leases->release(k);
  }
  void heartbeat() {
    std::unique_lock lk(hb_mu);
    while (!hb_stop) {
      hb_cv.wait_for(lk, std::chrono::milliseconds(std::max<uint64_t>(ttl_ms() / 3, 1)));
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
    {
      std::lock_guard lk(hb_mu);
      forget_inherited_heartbeat();
      hb_stop = true;
    }
    hb_cv.notify_all();
    if (hb.joinable()) hb.join();
  }

  enum class Outcome { done, busy };
  Expected<Entry> resolve(const KeyInfo& key, const CompileFn& compile, Source* source, bool wait_for_others,
                          Outcome* outcome);

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
        // Faster tiers outlive a pinned read: give them heap bytes, and
        // return those too so the caller holds no read transaction.
        if (e.pinned()) e = e.detach();
        for (size_t j = 0; j < i; ++j) put_into(j, e);
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

}  // namespace kcache

// Private: cross-process single-flight for the Cache. A key's lease says
// which process compiles it; the others wait for that process's entry.
//
// claim() takes the lease, or, while another live process holds it, polls
// it (1 ms growing to 50 ms; no lookups, so a long wait is not hundreds of
// counted misses) until it frees up or goes stale (holder dead or expired),
// or until the wait bound passes. The holder stores its entry before it lets
// the lease go, so once the lease is ours one lookup finds the entry, or
// shows that the holder failed or died. Held leases are renewed every ttl/3
// by a heartbeat thread while their compiles run.
//
// Its clock reads, polling sleeps and the heartbeat's waits go through an
// Env (kcache/env.h, the system's by default), so a test can drive a wait
// to its end with a clock it moves by hand.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <unordered_map>

#include "kcache/env.h"
#include "kcache/key.h"
#include "kcache/lease.h"
#include "util/worker.h"

namespace kcache {

class LeaseWait {
 public:
  LeaseWait(uint64_t ttl_ms, uint64_t bound_ms, std::shared_ptr<Env> env = nullptr)
      : ttl_ms_(ttl_ms), bound_ms_(bound_ms), env_(env ? std::move(env) : Env::posix()) {}
  ~LeaseWait() { stop(); }
  LeaseWait(const LeaseWait&) = delete;
  LeaseWait& operator=(const LeaseWait&) = delete;

  // Set-up, before the Cache is shared between threads.
  void set_leases(std::shared_ptr<Leases> leases) { leases_ = std::move(leases); }
  bool active() const noexcept { return leases_ != nullptr; }

  enum class Claim {
    held,           // this process holds the lease (release() it)
    busy,           // another process holds it and the caller would not wait
    timed_out,      // waited the bound; compile without the lease
    uncoordinated,  // the lease store failed; compile without it
  };
  // wait=false: answer busy at once instead of waiting. *waited says
  // whether this call waited for another process.
  Claim claim(const Key& key, bool wait, bool* waited);
  // Gives up a lease claim() returned as held.
  void release(const Key& key);
  // Stops the heartbeat (close, or before the leases go away).
  void stop();

  uint64_t waits() const noexcept { return waits_.load(std::memory_order_relaxed); }
  uint64_t timeouts() const noexcept { return timeouts_.load(std::memory_order_relaxed); }
  uint64_t takeovers() const noexcept { return leases_ ? leases_->takeovers() : 0; }

 private:
  void hold(const Key& k);
  // Renews the held leases every renew_period_us(), the first time at `next`
  // (the Env's monotonic clock).
  void heartbeat(uint64_t next);
  uint64_t renew_period_us() const noexcept { return std::max<uint64_t>(ttl_ms_ / 3, 1) * 1000; }
  void renew_after_fork();

  const uint64_t ttl_ms_, bound_ms_;
  const std::shared_ptr<Env> env_;  // never null
  std::shared_ptr<Leases> leases_;
  bool inherited_ = false;  // inherited across fork(): no heartbeat thread
  std::atomic<uint64_t> waits_{0}, timeouts_{0};

  // The heartbeat thread; its mutex guards held_ and stop_.
  util::Worker hb_;
  std::unordered_map<Key, int> held_;  // GUARDED_BY(hb_.mu()): key -> holders in this process
  bool stop_ = false;                  // GUARDED_BY(hb_.mu())
};

}  // namespace kcache

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
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kcache/key.h"
#include "kcache/lease.h"
#include "util/util.h"

namespace kcache {

class LeaseWait {
 public:
  LeaseWait(uint64_t ttl_ms, uint64_t bound_ms) : ttl_ms_(ttl_ms), bound_ms_(bound_ms) {}
  ~LeaseWait() { stop(); }
  LeaseWait(const LeaseWait&) = delete;
  LeaseWait& operator=(const LeaseWait&) = delete;

  // Set-up, before the Cache is shared between threads.
  void set_leases(std::shared_ptr<Leases> leases) { leases_ = std::move(leases); }
  bool active() const noexcept { return leases_ != nullptr; }

  enum class Claim {
    held,       // this process holds the lease (release() it)
    busy,       // another process holds it and the caller would not wait
    timed_out,  // waited the bound; compile without the lease
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
  void heartbeat();
  void forget_inherited_heartbeat();

  const uint64_t ttl_ms_, bound_ms_;
  std::shared_ptr<Leases> leases_;
  std::atomic<uint64_t> waits_{0}, timeouts_{0};

  // The heartbeat's mutex and condition variable live on the heap so that a
  // forked child can abandon the ones it inherited (a parent thread may have
  // been waiting on them).
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  std::unique_ptr<std::condition_variable> cv_ = std::make_unique<std::condition_variable>();
  std::unordered_map<Key, int> held_;  // GUARDED_BY(*mu_): key -> holders in this process
  bool stop_ = false;                  // GUARDED_BY(*mu_)
  std::thread thread_;
  // The fork generation this state belongs to (util::fork_generation).
  std::atomic<uint64_t> fork_gen_{util::fork_generation()};
};

}  // namespace kcache

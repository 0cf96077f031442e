// Cross-process single-flight: claiming a key's lease, waiting for another
// process's compile, and the heartbeat that renews held leases. See
// lease_wait.h.
#include "cache/lease_wait.h"

#include <algorithm>
#include <vector>

#include "util/util.h"

namespace kcache {

LeaseWait::Claim LeaseWait::claim(const Key& key, bool wait, bool* waited) {
  *waited = false;
  uint64_t start = env_->now_mono_us(), sleep_us = 1000;
  for (;;) {
    LeaseResult lr = leases_->acquire(key, ttl_ms_);
    if (lr == LeaseResult::acquired) {
      hold(key);
      return Claim::held;
    }
    if (lr == LeaseResult::error) return Claim::uncoordinated;
    if (!wait) return Claim::busy;
    if (!*waited) {
      waits_.fetch_add(1, std::memory_order_relaxed);
      *waited = true;
    }
    if (env_->now_mono_us() - start >= bound_ms_ * 1000) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::info, "waited %llu ms for another process to compile %s; compiling here",
                 static_cast<unsigned long long>(bound_ms_), key.hex().c_str());
      return Claim::timed_out;
    }
    env_->sleep_us(sleep_us);
    sleep_us = std::min<uint64_t>(sleep_us * 3 / 2, 50000);
  }
}

// A child of fork() holds none of its parent's leases.
void LeaseWait::renew_after_fork() {
  if (!hb_.renewed()) return;
  stop_ = false;
  held_.clear();
  inherited_ = true;
}

void LeaseWait::hold(const Key& k) {
  renew_after_fork();
  std::lock_guard lk(hb_.mu());
  ++held_[k];
  // A child of fork() using its parent's Cache starts no thread (threads
  // started after a fork of a threaded process are unsafe): its leases go
  // unrenewed and expire after the TTL, when a waiter may compile too.
  // The first renewal is due ttl/3 after this claim, not after the thread
  // gets to run.
  if (!inherited_) hb_.start([this, first = env_->now_mono_us() + renew_period_us()] { heartbeat(first); });
}

void LeaseWait::release(const Key& k) {
  renew_after_fork();
  {
    std::lock_guard lk(hb_.mu());
    if (auto it = held_.find(k); it != held_.end() && --it->second == 0) held_.erase(it);
  }
  leases_->release(k);
}

void LeaseWait::heartbeat(uint64_t next) {
  const uint64_t period_us = renew_period_us();
  std::unique_lock lk(hb_.mu());
  while (!stop_) {
    // wait_us may return early (a notify, or an Env whose clock moves by
    // hand): renew only once the period passed on the Env's clock.
    const uint64_t now = env_->now_mono_us();
    if (now < next) {
      env_->wait_us(hb_.cv(), lk, next - now);
      continue;
    }
    next = now + period_us;
    std::vector<Key> keys;
    for (const auto& [k, n] : held_) keys.push_back(k);
    lk.unlock();
    for (const auto& k : keys)
      if (!leases_->renew(k, ttl_ms_))
        KCACHE_LOG(LogLevel::info, "lease on %s was lost (taken over); compiling on regardless", k.hex().c_str());
    lk.lock();
  }
}

void LeaseWait::stop() {
  renew_after_fork();
  {
    std::lock_guard lk(hb_.mu());
    stop_ = true;
  }
  hb_.cv().notify_all();
  hb_.join();
}

}  // namespace kcache

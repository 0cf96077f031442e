// Cross-process single-flight: claiming a key's lease, waiting for another
// process's compile, and the heartbeat that renews held leases. See
// lease_wait.h.
#include "cache/lease_wait.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "util/util.h"

namespace kcache {

LeaseWait::Claim LeaseWait::claim(const Key& key, bool wait, bool* waited) {
  *waited = false;
  uint64_t start = util::now_mono_us(), sleep_us = 1000;
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
    if (util::now_mono_us() - start >= bound_ms_ * 1000) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::info, "waited %llu ms for another process to compile %s; compiling here",
                 static_cast<unsigned long long>(bound_ms_), key.hex().c_str());
      return Claim::timed_out;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<uint64_t>(sleep_us * 3 / 2, 50000);
  }
}

// In a child of fork(), the inherited heartbeat thread does not exist and
// its mutex or condition variable may be in a state no thread of the child
// will ever change: leak all three (never joined, unlocked or destroyed)
// and start afresh. The first thread of the child to get here does it; a
// child is expected to begin using an inherited Cache from one thread.
void LeaseWait::forget_inherited_heartbeat() {
  uint64_t now = util::fork_generation(), was = fork_gen_.load();
  if (was == now || !fork_gen_.compare_exchange_strong(was, now)) return;
  if (thread_.joinable()) new std::thread(std::move(thread_));
  (void)mu_.release();
  (void)cv_.release();
  mu_ = std::make_unique<std::mutex>();
  cv_ = std::make_unique<std::condition_variable>();
  stop_ = false;
  held_.clear();
}

void LeaseWait::hold(const Key& k) {
  forget_inherited_heartbeat();
  std::lock_guard lk(*mu_);
  ++held_[k];
  if (!thread_.joinable()) thread_ = std::thread([this] { heartbeat(); });
}

void LeaseWait::release(const Key& k) {
  forget_inherited_heartbeat();
  {
    std::lock_guard lk(*mu_);
    if (auto it = held_.find(k); it != held_.end() && --it->second == 0) held_.erase(it);
  }
  leases_->release(k);
}

void LeaseWait::heartbeat() {
  std::unique_lock lk(*mu_);
  while (!stop_) {
    cv_->wait_for(lk, std::chrono::milliseconds(std::max<uint64_t>(ttl_ms_ / 3, 1)));
    if (stop_) break;
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
  forget_inherited_heartbeat();
  {
    std::lock_guard lk(*mu_);
    stop_ = true;
  }
  cv_->notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kcache

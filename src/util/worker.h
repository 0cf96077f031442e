// Private: a background thread with the mutex and condition variable that
// guard its work, safe to inherit across fork().
//
// A child of fork() has none of its parent's threads, and a mutex that a
// parent thread held at the fork stays locked in the child for ever. So the
// first call in a child abandons the inherited thread, mutex and condition
// variable (leaks them: never joined, unlocked or destroyed) and starts
// afresh; the owner then drops the state those guarded (renewed() says so).
// A child is expected to begin using an inherited object from one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "util/util.h"

namespace kcache::util {

class Worker {
 public:
  Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // True when this call found the state inherited from a parent process and
  // replaced it: the caller must reset what the mutex guarded.
  bool renewed() {
    uint64_t now = fork_generation(), was = gen_.load();
    if (was == now || !gen_.compare_exchange_strong(was, now)) return false;
    if (thread_.joinable()) abandon(new std::thread(std::move(thread_)));
    abandon(mu_.release());
    abandon(cv_.release());
    mu_ = std::make_unique<std::mutex>();
    cv_ = std::make_unique<std::condition_variable>();
    return true;
  }
  std::mutex& mu() noexcept { return *mu_; }
  std::condition_variable& cv() noexcept { return *cv_; }
  // Starts fn on the thread unless it runs. REQUIRES: mu() held.
  void start(std::function<void()> fn) {
    if (!thread_.joinable()) thread_ = std::thread(std::move(fn));
  }
  // REQUIRES: mu() not held, and the thread told to stop.
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  std::unique_ptr<std::condition_variable> cv_ = std::make_unique<std::condition_variable>();
  std::thread thread_;
  std::atomic<uint64_t> gen_{fork_generation()};
};

}  // namespace kcache::util

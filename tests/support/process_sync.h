// Synchronisation for tests that run several processes or threads: a
// one-way signal over a pipe, a bounded wait for an observable condition,
// and a watcher that signals once a cache waits for another process's
// lease. Tests order their steps on these rather than on sleeps, which a
// loaded machine stretches past any fixed length.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kcache/cache.h"

namespace kcache::test {

// A one-way signal between processes (a pipe made before fork()): post()
// on one side, wait() on the other. Each post() lets one wait() through.
// wait() is bounded, so a test that goes wrong fails instead of hanging.
class Signal {
 public:
  Signal() {
    if (::pipe(fd_) != 0) fd_[0] = fd_[1] = -1;
  }
  ~Signal() {
    for (int f : fd_)
      if (f >= 0) ::close(f);
  }
  Signal(const Signal&) = delete;
  Signal& operator=(const Signal&) = delete;

  bool ok() const { return fd_[0] >= 0; }
  void post() const {
    char x = 1;
    (void)!::write(fd_[1], &x, 1);
  }
  // True once a post() arrives; false after timeout_ms without one.
  bool wait(int timeout_ms = 60000) const {
    pollfd p{fd_[0], POLLIN, 0};
    char x;
    return ::poll(&p, 1, timeout_ms) == 1 && ::read(fd_[0], &x, 1) == 1;
  }

 private:
  int fd_[2];
};

// Polls pred until it holds (true) or bound_ms pass (false).
template <class F>
bool wait_until(F pred, int bound_ms = 60000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(bound_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Calls then() once `c` has begun waiting for a lease another process
// holds (its lease_waits count is above `before`), from a thread that polls
// the cache's statistics. The thread stops when this object is destroyed,
// whether or not the wait came.
class OnLeaseWait {
 public:
  template <class F>
  OnLeaseWait(const Cache& c, F then, uint64_t before = 0)
      : thread_([&c, then, before, this] {
          while (!stop_.load()) {
            if (c.stats().lease_waits > before) {
              then();
              return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  ~OnLeaseWait() {
    stop_ = true;
    thread_.join();
  }
  OnLeaseWait(const OnLeaseWait&) = delete;
  OnLeaseWait& operator=(const OnLeaseWait&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kcache::test

// Synchronisation for tests that run several processes or threads: a
// one-way signal over a pipe, a bounded wait for an observable condition,
// and a watcher that signals once a cache waits for another process's
// lease, and a forked child that reports back. Tests order their steps on
// these rather than on sleeps, which a loaded machine stretches past any
// fixed length.
#pragma once

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <type_traits>

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

// A forked child running a function whose result, a trivially copyable
// report, comes back through a pipe: fork_report(fn) starts it and
// join_report() waits for it. A child that dies, is stopped by its alarm
// (240 s: a child that goes wrong fails, never hangs the test) or reports
// nothing gives a default-made report, so a report type has a field whose
// default says "failed".
template <class R>
struct Forked {
  pid_t pid = -1;
  int fd = -1;
};

template <class F, class R = std::invoke_result_t<F&>>
Forked<R> fork_report(F fn) {
  static_assert(std::is_trivially_copyable_v<R>, "a report crosses a pipe as bytes");
  int p[2];
  if (::pipe(p) != 0) return {};
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::alarm(240);
    R r = fn();
    (void)!::write(p[1], &r, sizeof r);
    ::_exit(0);
  }
  ::close(p[1]);
  if (pid < 0) {
    ::close(p[0]);
    return {};
  }
  return {pid, p[0]};
}

template <class R>
R join_report(Forked<R> c) {
  R r{};
  if (c.pid < 0) return r;
  R got{};
  ssize_t n = ::read(c.fd, &got, sizeof got);
  ::close(c.fd);
  int st = 0;
  ::waitpid(c.pid, &st, 0);
  if (n == static_cast<ssize_t>(sizeof got) && WIFEXITED(st) && WEXITSTATUS(st) == 0) r = got;
  return r;
}

}  // namespace kcache::test

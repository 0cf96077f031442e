// Private: the worker pool of a cooperative batch (Cache::get_or_compile_batch,
// nvrtc::Compiler::compile_all). Each item is first tried without waiting
// for another process; an item another process holds is set aside and
// tried again, waiting this time, only once nothing else is left. So N
// processes given overlapping lists in any order each compile what nobody
// else holds instead of queueing behind one another.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "util/util.h"

namespace kcache {

// The threads of a batch: `requested`, else $KCACHE_JOBS, else the number of
// CPUs; never more than `items` (and at least one).
inline unsigned batch_threads(unsigned requested, size_t items) {
  unsigned threads = requested;
  if (!threads) {
    if (auto j = util::parse_size(util::getenv_str("KCACHE_JOBS")); j && *j > 0) threads = static_cast<unsigned>(*j);
  }
  if (!threads) threads = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(items, 1)));
}

// Runs `step(i, wait)` for each index in `todo` on `threads` threads (the
// caller's thread is one of them). step returns true when item i is done,
// false when another process holds it (only when `wait` is false): i is
// then set aside and stepped again with wait=true after every other item
// has been taken. An exception from step stops the pool and is rethrown in
// the caller's thread once every worker has been joined (an exception
// escaping a worker thread would terminate).
template <typename Step>
void run_batch(std::deque<size_t> todo, unsigned threads, Step&& step) {
  std::mutex mu;
  std::deque<size_t> deferred;  // GUARDED_BY(mu)
  std::exception_ptr failure;   // GUARDED_BY(mu)
  auto worker = [&] {
    for (;;) {
      size_t i;
      bool wait;
      {
        std::lock_guard lk(mu);
        if (failure) return;
        if (!todo.empty()) {
          i = todo.front();
          todo.pop_front();
          wait = false;
        } else if (!deferred.empty()) {
          i = deferred.front();
          deferred.pop_front();
          wait = true;
        } else {
          return;
        }
      }
      try {
        if (!step(i, wait)) {
          std::lock_guard lk(mu);
          deferred.push_back(i);
        }
      } catch (...) {
        std::lock_guard lk(mu);
        if (!failure) failure = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace kcache

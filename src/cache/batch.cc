// Batch compilation: one lookup pass, then a pool of workers compiles the
// misses. Keys that another process is compiling are set aside and awaited
// only when nothing else is left, so N processes given the same batch in any
// order share the work instead of queueing behind one another.
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "cache/impl.h"
#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

std::vector<Expected<Entry>> Cache::get_or_compile_batch(const std::vector<BatchItem>& items,
                                                         const BatchOptions& options, std::vector<Source>* sources) {
  const size_t n = items.size();
  std::vector<std::optional<Expected<Entry>>> out(n);
  std::vector<Source> src(n, Source::compiled);
  std::mutex mu;
  size_t done = 0;
  auto report = [&](size_t i) {  // REQUIRES: mu held
    ++done;
    if (options.progress) options.progress(done, n, i, src[i]);
  };

  // Pass 1: lookups, in the caller's thread (a hit costs about a read).
  std::deque<size_t> todo;
  for (size_t i = 0; i < n; ++i) {
    std::optional<Entry> hit = impl_->look_up(items[i].key.key, &src[i], Access::counted);
    if (hit) {
      out[i].emplace(std::move(*hit));
      std::lock_guard lk(mu);
      report(i);
    } else {
      impl_->explain_miss(items[i].key);
      todo.push_back(i);
    }
  }

  // Pass 2: compile misses; defer keys held by other processes.
  unsigned threads = options.threads;
  if (!threads) {
    if (auto j = util::parse_size(util::getenv_str("KCACHE_JOBS")); j && *j > 0) threads = static_cast<unsigned>(*j);
  }
  if (!threads) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(todo.size(), 1)));

  std::deque<size_t> deferred;
  // An exception from a compile function or the progress callback stops
  // the pool and is rethrown in the caller's thread once every worker has
  // been joined (an exception escaping a worker thread would terminate).
  std::exception_ptr failure;
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
        Impl::Outcome o;
        Source s = Source::compiled;
        auto r = impl_->resolve(items[i].key, items[i].compile, &s, wait, &o, Access::uncounted);
        std::lock_guard lk(mu);
        if (o == Impl::Outcome::busy) {
          deferred.push_back(i);
          continue;
        }
        src[i] = s;
        out[i].emplace(std::move(r));
        report(i);
      } catch (...) {
        std::lock_guard lk(mu);
        if (!failure) failure = std::current_exception();
        return;
      }
    }
  };
  {
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
  }
  if (failure) std::rethrow_exception(failure);

  std::vector<Expected<Entry>> results;
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (out[i])
      results.push_back(std::move(*out[i]));
    else
      results.push_back(Status(Errc::internal, "batch item not resolved"));
  }
  if (sources) *sources = std::move(src);
  return results;
}

}  // namespace kcache

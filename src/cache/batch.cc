// Batch compilation: one lookup pass, then a pool of workers compiles the
// misses. Keys that another process is compiling are set aside and awaited
// only when nothing else is left, so N processes given the same batch in any
// order share the work instead of queueing behind one another (the pool:
// batch_pool.h).
#include <deque>
#include <mutex>
#include <optional>

#include "cache/batch_pool.h"
#include "cache/impl.h"
#include "kcache/cache.h"

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
  const unsigned threads = batch_threads(options.threads, todo.size());
  run_batch(std::move(todo), threads, [&](size_t i, bool wait) {
    Impl::Outcome o;
    Source s = Source::compiled;
    auto r = impl_->resolve(items[i].key, items[i].compile, &s, wait, &o, Access::uncounted);
    if (o == Impl::Outcome::busy) return false;
    std::lock_guard lk(mu);
    src[i] = s;
    out[i].emplace(std::move(r));
    report(i);
    return true;
  });

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

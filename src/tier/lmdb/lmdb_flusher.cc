// The recency an LMDB tier's hits leave, and the thread that writes it
// (lmdb_flusher.h).
#include "tier/lmdb/lmdb_flusher.h"

#include <chrono>
#include <system_error>
#include <utility>

#include "util/util.h"

namespace kcache {

RecencyFlusher::RecencyFlusher(const LmdbEnv& env, Env& clock, const PendingCounters& counters, unsigned batch,
                               std::function<Status()> flush)
    : env_(env), clock_(clock), counters_(counters), batch_(batch), flush_(std::move(flush)) {}

RecencyFlusher::~RecencyFlusher() { stop(); }

void RecencyFlusher::touched(const Key& key) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    touched_[key] = clock_.now_unix_ms();
    wake = due(touched_.size()) && start_locked();
  }
  if (wake) cv_->notify_one();
}

void RecencyFlusher::counted() {
  bool wake;
  {
    std::lock_guard lk(mu_);
    wake = due(touched_.size()) && start_locked();
  }
  if (wake) cv_->notify_one();
}

RecencyFlusher::Touched RecencyFlusher::take() {
  Touched t;
  std::lock_guard lk(mu_);
  t.swap(touched_);
  return t;
}

void RecencyFlusher::restore(const Touched& t) {
  std::lock_guard lk(mu_);
  for (const auto& [k, ms] : t) touched_.emplace(k, ms);
}

void RecencyFlusher::clear() {
  std::lock_guard lk(mu_);
  touched_.clear();
}

void RecencyFlusher::stop() {
  if (!cv_) return;  // abandoned
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_->notify_all();
  if (thread_.joinable()) thread_.join();
}

void RecencyFlusher::abandon() {
  new std::thread(std::move(thread_));  // never joined, never freed
  (void)cv_.release();
}

bool RecencyFlusher::due(size_t touched) const {
  return touched >= batch_ ||
         counters_.pending(c_hits) + counters_.pending(c_misses) >= 16 * static_cast<int64_t>(batch_);
}

bool RecencyFlusher::start_locked() {
  if (thread_.joinable()) return true;
  if (stop_ || failed_ || env_.inherited()) return false;
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::system_error& e) {
    failed_ = true;
    KCACHE_LOG(LogLevel::warn, "lmdb: cannot start the recency flusher (%s): recency is written at flush or close",
               e.what());
    return false;
  }
  return true;
}

void RecencyFlusher::loop() {
  std::unique_lock lk(mu_);
  // After a failed flush (a full disk) what was not stored stays pending
  // and the next try waits out a whole period, so hits do not turn into
  // a write attempt each.
  auto not_before = std::chrono::steady_clock::time_point::min();
  while (!stop_) {
    // Started because a flush was due: check before the first wait.
    bool is_due = due(touched_.size());
    if (!is_due || std::chrono::steady_clock::now() < not_before) {
      cv_->wait_for(lk, std::chrono::seconds(5));
      continue;
    }
    lk.unlock();
    Status st = flush_();
    if (!st.is_ok()) {
      KCACHE_LOG(LogLevel::debug, "lmdb recency flush: %s", st.to_string().c_str());
      not_before = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    lk.lock();
  }
}

}  // namespace kcache

// Private: what an LMDB tier's hits and misses leave to be written (the
// recency of each entry hit; the counters are the tier's PendingCounters)
// and the thread that writes it in batches, so the hit path never takes
// the store's write lock.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kcache/env.h"
#include "kcache/key.h"
#include "kcache/status.h"
#include "tier/core/counters.h"
#include "tier/lmdb/lmdb_env.h"

namespace kcache {

// Thread-safety: every call may come from any thread. The thread starts
// the first time there is enough to write: a process that hits a few
// entries and stores nothing has no thread of kcache's (what it buffered
// is written at close, or by the tier's flush()).
class RecencyFlusher {
 public:
  using Touched = std::unordered_map<Key, uint64_t>;  // key -> last hit ms

  // `flush` writes everything pending (it takes it with take()); `counters`
  // are the tier's, whose pending hits and misses also make a flush due
  // after `batch` x 16; `env` says whether this process may write at all
  // (not in a child of fork()); `clock` dates the hits.
  RecencyFlusher(const LmdbEnv& env, Env& clock, const PendingCounters& counters, unsigned batch,
                 std::function<Status()> flush);
  // Stops the thread; see also abandon().
  ~RecencyFlusher();
  RecencyFlusher(const RecencyFlusher&) = delete;
  RecencyFlusher& operator=(const RecencyFlusher&) = delete;

  // A hit on `key`, now.
  void touched(const Key& key);
  // A counter moved (a miss): writes when enough is pending.
  void counted();

  // Takes the recency not yet stored (to ride along with a write
  // transaction); give it back with restore() when that fails.
  Touched take();
  void restore(const Touched& t);
  // Drops the recency not yet stored (the store was cleared).
  void clear();

  // Stops and joins the thread (the tier then flushes what is left).
  void stop();
  // In a child of fork(): the thread does not exist here, so its handle
  // must not be joined (that would wait forever), and the condition
  // variable it was waiting on must not be destroyed (glibc waits for that
  // waiter too). Both are leaked.
  void abandon();

 private:
  // Enough buffered that the thread should write it.
  bool due(size_t touched) const;
  // Starts the thread unless it runs already; false where none may run
  // (closing, or a child of fork(), whose store is its parent's) or none
  // could be started (no thread left to the process: the records stay
  // pending, written at flush or close; one log line, no further try).
  // REQUIRES: mu_.
  bool start_locked();
  void loop();

  const LmdbEnv& env_;
  Env& clock_;
  const PendingCounters& counters_;
  const unsigned batch_;
  const std::function<Status()> flush_;
  std::mutex mu_;
  // On the heap so that a child of fork() can leak it (abandon()).
  std::unique_ptr<std::condition_variable> cv_ = std::make_unique<std::condition_variable>();
  Touched touched_;      // GUARDED_BY(mu_)
  bool stop_ = false;    // GUARDED_BY(mu_)
  bool failed_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;   // GUARDED_BY(mu_) while it starts
};

}  // namespace kcache

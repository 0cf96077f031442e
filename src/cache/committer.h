// Private: plain puts off the caller's path (group commit).
//
// Cache::put puts a new entry into its memory tier at once and hands it to
// the committer for the slower tiers (disk, remote); the caller goes on.
// (What a compile produced is not handed over: the Cache writes it in the
// compiling thread, so it is on disk when get_or_compile or a flight's
// commit returns.) The committer thread lets a group gather for up to
// 100 ms (less when flush() waits, at close, or when 256 entries or 64 MiB
// wait), takes every entry waiting and writes them as one group per tier
// (Tier::put_many: for LMDB one transaction and one sync), then runs each
// entry's `then`. Until then find() still has the entry, so a lookup of a
// key in flight to disk is served. flush() waits for everything handed over
// before it; so does stop() (the Cache's close).
//
// The queue is bounded (entries and bytes): submit() waits when it is full,
// so a compiler faster than its disk is slowed down, never left to grow
// memory without bound.
//
// The gathering wait runs on an Env's clock (kcache/env.h, the system's by
// default), so a test can hold a group open or end its wait by moving a
// clock by hand.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cache/tier_chain.h"
#include "kcache/env.h"
#include "util/worker.h"

namespace kcache {

class Committer {
 public:
  explicit Committer(TierChain& chain, std::shared_ptr<Env> env = nullptr)
      : chain_(chain), env_(env ? std::move(env) : Env::posix()) {}
  ~Committer() { stop(); }
  Committer(const Committer&) = delete;
  Committer& operator=(const Committer&) = delete;

  // Queues e for the chain's tiers that are not memory tiers; `then` runs on
  // the committer thread once they have it (or failed to take it). Returns
  // the entry's number for outcome().
  uint64_t submit(Entry e, std::function<void()> then);
  // An entry was committed without its sync (TierChain::store, synced
  // false): the committer syncs the slow tiers (TierChain::sync) within the
  // same lingering window as a group, once for every request made in it.
  // flush() waits for that sync too.
  void request_sync();
  // The newest entry of `key` waiting to be written, if any.
  std::optional<Entry> find(const Key& key);
  bool idle() const noexcept { return waiting_.load(std::memory_order_acquire) == 0; }
  // Waits until everything submitted before the call was written.
  void flush();
  // The same, waiting at most `bound`; false when it ran out first.
  bool flush_for(std::chrono::milliseconds bound);
  // Entries a disk tier did not take since the last call (written, not
  // waiting): ok when none, else the first one's reason and how many.
  Status take_failures();
  // Why entry `seq` (submit's number, written by now) is not on disk, or
  // ok. Only the newest kMaxFailures failures are remembered.
  Status outcome(uint64_t seq);
  // flush(), then ends the thread (a later submit() starts it again).
  void stop();

  uint64_t groups() const noexcept { return groups_.load(std::memory_order_relaxed); }

 private:
  struct Item {
    Entry entry;
    std::function<void()> then;
    uint64_t seq;
  };
  void run();
  void renew_after_fork();
  bool group_full() const;  // REQUIRES: worker_.mu() held

  TierChain& chain_;
  const std::shared_ptr<Env> env_;  // never null
  util::Worker worker_;
  std::deque<Item> queue_;  // GUARDED_BY(worker_.mu())
  std::unordered_map<Key, std::pair<uint64_t, Entry>>
      inflight_;                                             // GUARDED_BY(worker_.mu()): key -> newest (seq, entry)
  uint64_t submitted_ = 0, written_ = 0, queued_bytes_ = 0;  // GUARDED_BY(worker_.mu())
  uint64_t sync_requested_ = 0, synced_ = 0;                 // GUARDED_BY(worker_.mu())
  static constexpr size_t kMaxFailures = 1024;
  std::deque<std::pair<uint64_t, Status>> failed_;  // GUARDED_BY(worker_.mu()): (seq, why), newest last
  uint64_t failures_ = 0, reported_ = 0;            // GUARDED_BY(worker_.mu())
  Status first_unreported_;                         // GUARDED_BY(worker_.mu())
  void record(const std::vector<Item>& group, const std::vector<Status>& r);  // REQUIRES: worker_.mu() held
  unsigned flushing_ = 0;   // GUARDED_BY(worker_.mu()): flush() callers waiting
  bool stop_ = false;       // GUARDED_BY(worker_.mu())
  bool inherited_ = false;  // this object was inherited across fork()
  // written_ grew or the queue shrank; on the heap for the same reason as
  // the worker's own (see util/worker.h).
  std::unique_ptr<std::condition_variable> done_cv_ = std::make_unique<std::condition_variable>();
  std::atomic<uint64_t> waiting_{0};
  std::atomic<uint64_t> groups_{0};
};

}  // namespace kcache

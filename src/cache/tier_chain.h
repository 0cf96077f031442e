// Private: the Cache's tiers in order, fastest first, and the fault policy.
//
// lookup() asks each tier in turn; a fault is logged, counted and treated as
// a miss, and the next tier is asked; a hit in a slower tier is copied to
// heap memory and put into the faster ones (promotion). store() puts an
// entry into every writable tier; a tier that reports a full disk or a
// read-only folder gets no more writes from this process (said once).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kcache/cache.h"

namespace kcache {

// Where a hit from `t` came from, by the tier's kind.
Source source_of(const Tier& t) noexcept;

class TierChain {
 public:
  void add(std::shared_ptr<Tier> t);
  const std::vector<std::shared_ptr<Tier>>& tiers() const noexcept { return tiers_; }

  // The first tier's hit, promoted into the faster tiers. Access::
  // uncounted: a re-check of a request whose miss was already counted (no
  // miss is counted here or in the tiers).
  std::optional<Entry> lookup(const Key& key, Source* src, Access count);
  // Puts into every writable tier; true if any took it.
  bool store(const Entry& e) { return store(e, Tiers::all); }
  enum class Tiers { all, memory, slow };  // slow: every tier that is not a memory tier
  // synced=false: Tier::put_unsynced (the commit skips the durability's
  // sync; sync() makes it durable).
  bool store(const Entry& e, Tiers which, bool synced = true);
  // Tier::sync of every slow writable tier.
  void sync();
  // Puts a group into every slow tier, one Tier::put_many each. Per entry:
  // ok, or why a disk tier does not hold it (a failed write, or writes to
  // that tier turned off for this process). A remote tier's refusals are
  // not reported: it is written behind and reports its own.
  std::vector<Status> store_group(const std::vector<Entry>& es);
  // Whether a slow tier is writable (its writes may be turned off for now).
  bool has_slow_writable() const;
  // Pushes buffered records of every tier to its store; the first disk
  // tier's failure, if any.
  Status flush();
  // Counts a fault and logs it once per event; a tier switched off
  // (Errc::unavailable: breaker open, handle from before a fork) says so
  // once for the life of this chain. A store-wide fault of a write or flush
  // (not_found, io_error: a store folder deleted under the process) is said
  // once per episode: again only after a put into that tier succeeded.
  void fault(const Tier& t, const char* op, const Status& st);

  // A hit served outside the tiers (an entry on its way to them).
  void note_hit() noexcept { hits_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t hits() const noexcept { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const noexcept { return misses_.load(std::memory_order_relaxed); }
  uint64_t faults() const noexcept { return faults_.load(std::memory_order_relaxed); }

 private:
  bool put_into(size_t i, const Entry& e, bool synced = true);
  bool writes_to(size_t i) const;
  // Whether what tier i refuses is a lost entry for flush() and
  // sync_commit (a disk tier; not a memory tier, not a remote one).
  bool reports(size_t i) const;
  // Why tier i takes no writes now.
  Status off_status(size_t i) const;
  // The fault policy for the result of a put into tier i.
  bool took(size_t i, const Status& st);

  std::vector<std::shared_ptr<Tier>> tiers_;
  // Per tier: writes switched off for this process after a full disk or a
  // read-only folder (a full disk: until kRetryFullUs have passed, then one
  // write is tried again, so room made by a trim is used).
  struct Off {
    std::atomic<bool> on{false};
    std::atomic<uint64_t> until_us{0};  // 0: for good (read-only)
    std::atomic<Errc> why{Errc::ok};
  };
  std::vector<std::unique_ptr<Off>> no_writes_;
  static constexpr uint64_t kRetryFullUs = 5'000'000;
  std::atomic<uint64_t> hits_{0}, misses_{0}, faults_{0};
  std::mutex said_mu_;
  std::set<const Tier*> said_unavailable_;                     // GUARDED_BY(said_mu_)
  std::set<std::tuple<const Tier*, std::string, Errc>> said_;  // GUARDED_BY(said_mu_); this episode's
  std::atomic<bool> in_episode_{false};                        // said_ is not empty
};

}  // namespace kcache

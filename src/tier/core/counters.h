// Per-store counters of a disk engine, written in batches.
//
// Both disk engines keep their counters in the store itself (LMDB: the
// `stats` database; files: the flock'ed `stats` file), so every process
// sees the same totals. Writing them on every hit would put a write on the
// hit path, so each process holds its changes here as pending deltas, adds
// them to a stored snapshot when asked for stats(), and hands them to the
// engine's store function when it flushes (or when a write of its own goes
// to the store anyway). What could not be stored stays pending, so a
// failing or read-only disk loses no count of this process.
//
// Thread-safety: every method is safe for concurrent use.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

// The counters a store keeps, in their stored order.
enum StoreCounter : int { c_hits, c_misses, c_puts, c_evictions, c_corrupt, c_errors, c_entries, c_bytes, c_count };

// Each stored counter's TierStats field; its name (as LMDB stores it) is
// that field's name in TierStats::kFields.
inline constexpr std::array<uint64_t TierStats::*, c_count> kStoreCounterFields = {
    &TierStats::hits,    &TierStats::misses, &TierStats::puts,    &TierStats::evictions,
    &TierStats::corrupt, &TierStats::errors, &TierStats::entries, &TierStats::bytes};
std::string_view store_counter_name(int c) noexcept;

using CounterValues = std::array<uint64_t, c_count>;
using CounterDeltas = std::array<int64_t, c_count>;

// v += d, each clamped at 0 (a total never goes below nothing, even when a
// process that counted a removal raced with a recount).
void add_deltas(CounterValues& v, const CounterDeltas& d) noexcept;
bool any_delta(const CounterDeltas& d) noexcept;

// Lock-free: a hit adds to its counter with one relaxed atomic add, so the
// hit path takes no lock for counting. take() and restore() move each
// counter's delta whole (no count is lost or counted twice), though not as
// one snapshot of all counters, which nothing needs.
class PendingCounters {
 public:
  void add(StoreCounter c, int64_t n = 1) noexcept { d_[c].fetch_add(n, std::memory_order_relaxed); }
  // Deltas that take `now` (a stats() of the store) to 0 for every
  // counter but entries and bytes, for StoreAdmin::zero_counters.
  void add_zeroing(const TierStats& now) noexcept {
    for (int c = 0; c < c_count; ++c)
      if (c != c_entries && c != c_bytes)
        add(static_cast<StoreCounter>(c), -static_cast<int64_t>(now.*kStoreCounterFields[c]));
  }
  // The pending delta of one counter.
  int64_t pending(StoreCounter c) const noexcept { return d_[c].load(std::memory_order_relaxed); }
  // Takes every pending delta (they are zero here afterwards); give them
  // back with restore() when they could not be stored.
  CounterDeltas take() noexcept;
  void restore(const CounterDeltas& d) noexcept;
  // Hands the pending deltas to `store` (nothing is called when there are
  // none); what it fails to store stays pending. The deltas are not held
  // while store runs, so counts made meanwhile are never lost.
  template <class F>
  Status flush(F&& store) {
    CounterDeltas d = take();
    if (!any_delta(d)) return Status();
    Status st = store(d);
    if (!st.is_ok()) restore(d);
    return st;
  }
  // A write refused because the store was opened read-only: counted in
  // this process only (a read-only store is never written). Returns the
  // refusal, naming what was refused and the store.
  Status refuse(std::string_view what, std::string_view store) noexcept;
  // `stored` plus this process's pending deltas, as the TierStats fields
  // the store keeps, and this process's refusals as `rejected`.
  TierStats stats(const CounterValues& stored) const noexcept;

 private:
  std::array<std::atomic<int64_t>, c_count> d_{};
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace kcache

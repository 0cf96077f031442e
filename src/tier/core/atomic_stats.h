// TierStats counted by many threads at once, for tiers whose counters live
// in this process only (remote, bundle): one atomic per TierStats field,
// named by the field's member pointer, so a new field needs no new code.
//
// Thread-safety: every method is safe for concurrent use.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "kcache/tier.h"

namespace kcache {

class AtomicTierStats {
 public:
  // Adds n to `field`; returns the value before.
  uint64_t add(uint64_t TierStats::*field, uint64_t n = 1) noexcept {
    return v_[index(field)].fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t get(uint64_t TierStats::*field) const noexcept { return v_[index(field)].load(std::memory_order_relaxed); }
  // The count of `field`, set back to 0.
  uint64_t take(uint64_t TierStats::*field) noexcept { return v_[index(field)].exchange(0, std::memory_order_relaxed); }
  TierStats snapshot() const noexcept {
    TierStats s;
    for (size_t i = 0; i < TierStats::kFields.size(); ++i)
      s.*TierStats::kFields[i].member = v_[i].load(std::memory_order_relaxed);
    return s;
  }

 private:
  static size_t index(uint64_t TierStats::*field) noexcept {
    for (size_t i = 0; i < TierStats::kFields.size(); ++i)
      if (TierStats::kFields[i].member == field) return i;
    return 0;  // unreachable: every field is in the table
  }
  std::array<std::atomic<uint64_t>, TierStats::kFields.size()> v_{};
};

}  // namespace kcache

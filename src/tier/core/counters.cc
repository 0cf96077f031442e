// Pending counter deltas of the disk engines (tier/core/counters.h).
#include "tier/core/counters.h"

#include <algorithm>

namespace kcache {

std::string_view store_counter_name(int c) noexcept {
  for (const auto& f : TierStats::kFields)
    if (f.member == kStoreCounterFields[static_cast<size_t>(c)]) return f.name;
  return "?";
}

void add_deltas(CounterValues& v, const CounterDeltas& d) noexcept {
  for (size_t i = 0; i < v.size(); ++i) {
    if (d[i] < 0) {
      const uint64_t n = static_cast<uint64_t>(-d[i]);
      v[i] = n > v[i] ? 0 : v[i] - n;
    } else {
      v[i] += static_cast<uint64_t>(d[i]);
    }
  }
}

bool any_delta(const CounterDeltas& d) noexcept {
  return std::any_of(d.begin(), d.end(), [](int64_t x) { return x != 0; });
}

CounterDeltas PendingCounters::take() noexcept {
  CounterDeltas out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = d_[i].exchange(0, std::memory_order_relaxed);
  return out;
}

void PendingCounters::restore(const CounterDeltas& d) noexcept {
  for (size_t i = 0; i < d.size(); ++i)
    if (d[i] != 0) d_[i].fetch_add(d[i], std::memory_order_relaxed);
}

TierStats PendingCounters::stats(const CounterValues& stored) const noexcept {
  CounterValues v = stored;
  CounterDeltas d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = d_[i].load(std::memory_order_relaxed);
  add_deltas(v, d);
  TierStats s;
  for (size_t i = 0; i < v.size(); ++i) s.*kStoreCounterFields[i] = v[i];
  s.rejected = rejected_.load(std::memory_order_relaxed);
  return s;
}

Status PendingCounters::refuse(std::string_view what, std::string_view store) noexcept {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  return Status(Errc::read_only,
                std::string(what) + " refused: the store " + std::string(store) + " was opened read-only");
}

}  // namespace kcache

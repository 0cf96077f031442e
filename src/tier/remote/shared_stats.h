// The counts a remote tier adds to the statistics its server keeps for
// every client (kcache/remote.h, RemoteServerStats): counted on the
// lookup's path, taken in batches by the thread that sends them, given
// back when a send could not reach the server; and the server's named
// counters read back into one report.
//
// Thread-safety: Unsent's methods are safe for concurrent use.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kcache/entry.h"
#include "kcache/remote.h"
#include "tier/core/atomic_stats.h"

namespace kcache::remote_stats {

struct NsCounts {
  uint64_t hits = 0, puts = 0, put_bytes = 0;
};

// One send's worth of counts.
struct Batch {
  std::array<uint64_t, RemoteServerStats::kShared.size()> totals{};  // in kShared's order
  std::map<std::string, NsCounts> ns;
  // As the server names them ("hits", "ns:NAME:puts", ...), zeros left out.
  std::vector<std::pair<std::string, uint64_t>> named() const;
};

class Unsent {
 public:
  // Adds n to `field` when it is one of RemoteServerStats::kShared.
  void add(uint64_t TierStats::*field, uint64_t n) noexcept;
  // A hit (put false) or a put of `e`, under its key's namespace. An entry
  // without a manifest has none; beyond kMaxNamespaces waiting names, or a
  // name longer than kMaxNamespaceLen, the totals alone count it.
  void note(const Entry& e, bool put, uint64_t value_bytes);
  // Everything counted since the last take, set back to zero.
  Batch take();
  // A batch that could not be sent, counted again for the next send.
  void give_back(const Batch& b);

  static constexpr size_t kMaxNamespaces = 256, kMaxNamespaceLen = 200;

 private:
  AtomicTierStats totals_;
  std::mutex mu_;
  std::map<std::string, NsCounts> ns_;  // GUARDED_BY(mu_)
};

// The server's counters by name (RemoteTransport::read_stats) and its count
// of values as one report; names it does not know are left out.
RemoteServerStats report(const std::vector<std::pair<std::string, uint64_t>>& named, const RemoteStored& stored);

}  // namespace kcache::remote_stats

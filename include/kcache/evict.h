// kcache/evict.h — removing chosen entries from a disk store: those not
// used for a while, those of one key namespace, or both (as ccache's
// --evict-older-than and --evict-namespace); `kcache trim --older-than
// DURATION --namespace NS` and Python's Cache.evict(). Also what a store's
// entries take before and after compression (`kcache stats --compression`).
//
// Both walk the store's entries (StoreAdmin::list) and read them with
// Access::peek: no counter, recency record or repair changes. An entry's
// age is counted from its last use (its recency record; the creation time
// when the store has none); its namespace is its key manifest's (an entry
// stored without a manifest has none and matches no namespace). Entries
// removed here are removals, not evictions: the store's `evictions`
// counter counts those the size limits made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

class Cache;

struct EvictSelection {
  // Entries last used more than this many ms ago (0: any age).
  uint64_t older_than_ms = 0;
  // Entries of this key namespace only (nullopt: any).
  std::optional<std::string> ns;
};

struct EvictResult {
  uint64_t evicted = 0;  // entries removed
  uint64_t bytes = 0;    // their encoded bytes
  uint64_t kept = 0;     // entries left
};

// Removes the entries of `store` (a tier with an admin(): a disk store)
// that match every part of `selection`. invalid_argument when the
// selection is empty (that is StoreAdmin::clear), unavailable for a tier
// without an admin, read_only for a store opened read-only.
Expected<EvictResult> evict_entries(Tier& store, const EvictSelection& selection);
// The same on the disk store of `cache` (flushed first); what goes from the
// store goes from its memory tier too.
Expected<EvictResult> evict_entries(Cache& cache, const EvictSelection& selection);

struct CompressionStats {
  uint64_t entries = 0;
  uint64_t compressed_entries = 0;  // entries stored compressed (zstd)
  uint64_t stored_bytes = 0;        // encoded bytes, as stored
  uint64_t payload_bytes = 0;       // the artifacts' bytes, uncompressed
};
// Reads every entry of `store` (decompressing those stored compressed).
Expected<CompressionStats> compression_stats(Tier& store);

}  // namespace kcache

// Private: the maintenance of an LMDB store, apart from its reads and
// writes (lmdb_tier.cc): the entries listed and checked (verify, with
// --fix), the store cleared, the intact entries of a damaged store salvaged
// into a fresh one, eviction of the least recently used entries, and the
// totals recomputed when they drift.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/env.h"
#include "kcache/key.h"
#include "kcache/status.h"
#include "kcache/tier.h"
#include "tier/lmdb/lmdb_env.h"
#include "tier/lmdb/lmdb_records.h"

namespace kcache {

class LmdbMaintenance {
 public:
  // `max_bytes` and `max_entries` are the store's limits, which puts keep
  // (make_room_locked); `clock` dates recency records.
  LmdbMaintenance(LmdbEnv& env, StoreRecords& records, Env& clock, uint64_t max_bytes, uint64_t max_entries)
      : env_(env), records_(records), clock_(clock), max_bytes_(max_bytes), max_entries_(max_entries) {}

  Status list(const std::function<bool(const ListItem&)>& fn);
  // Checks every entry; with fix, removes those that fail and recomputes
  // the totals.
  Expected<VerifyReport> verify(bool fix);
  // Removes every entry but those whose overflow run is damaged.
  Status clear();

  // Copies the intact entries of the store moved aside to `from_dir` into
  // this fresh one, with their last-use times, in transactions of up to 256
  // entries or 64 MiB. Reads take each value's place and size from its leaf
  // (checked at open) and its checksum decides, so a damaged overflow page
  // header, which only frees would trust, costs nothing here. Returns the
  // entries copied.
  uint64_t salvage(const std::string& from_dir, uint64_t map_size);

  // Puts that take the store over a limit remove the oldest entries (never
  // those of `group`) in their own transaction, down to the limits, at most
  // a batch of them. REQUIRES: write txn, the group already put.
  int make_room_locked(MDB_txn* txn, const std::vector<std::pair<Key, std::string_view>>& group);

  // Removes oldest entries until bytes <= target_bytes and entries <=
  // target_entries, in transactions of at most a batch of deletions so
  // that other writers are never blocked for long. The write lock makes
  // each batch exclusive, and each batch re-reads the totals, so concurrent
  // evictors never remove more than needed.
  Expected<uint64_t> evict(uint64_t target_bytes, uint64_t target_entries);

  // Recomputes entries/bytes from the entries database, and rebuilds the
  // meta/lru records of entries that lack them.
  Status repair_totals();

 private:
  // Deletes the oldest entries, in this transaction, until bytes <=
  // target_bytes and entries <= target_entries or a batch are gone,
  // passing over the keys in `keep` (when given). *removed: how many went.
  // REQUIRES: write txn.
  int evict_locked(MDB_txn* txn, uint64_t target_bytes, uint64_t target_entries, const std::vector<Key>* keep,
                   size_t* removed);

  LmdbEnv& env_;
  StoreRecords& records_;
  Env& clock_;
  const uint64_t max_bytes_, max_entries_;
};

}  // namespace kcache

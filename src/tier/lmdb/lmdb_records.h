// Private: the records of an LMDB store and the changes made to them inside
// one write transaction, shared by the tier (lmdb_tier.cc) and its
// maintenance (lmdb_maintenance.cc). The named databases:
//   entries : key[16] -> encoded entry (docs/format.md)
//   meta    : key[16] -> u64 last_use_ms | u64 size
//   lru     : u64be last_use_ms | key[16] -> "" (recency index, oldest first)
//   stats   : counter name -> u64 (hits, misses, puts, evictions, corrupt,
//             errors, entries, bytes)
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <string_view>

#include "kcache/key.h"
#include "kcache/status.h"
#include "tier/core/counters.h"
#include "tier/lmdb/lmdb_env.h"

namespace kcache {

inline MDB_val mdb_val(const void* p, size_t n) { return MDB_val{n, const_cast<void*>(p)}; }
inline MDB_val mdb_val(const Key& k) { return mdb_val(k.bytes.data(), 16); }

// What StoreRecords::remove returns for an entry whose overflow run has a
// damaged page header: LMDB would free pages by that header (lmdb_env.h,
// overflow_run_intact), so the entry is left in place.
inline constexpr int kRunDamaged = MDB_LAST_ERRCODE + 1000;

// An LMDB return code, or kRunDamaged, as a Status.
Status tier_status(int rc, std::string_view what);

// Counts one record walked by eviction or repair (lmdb_records_visited).
void note_record_visited() noexcept;

// The record changes of one store. Every int-returning call is an LMDB
// return code. REQUIRES (all but get_counter): a write transaction of `env`.
class StoreRecords {
 public:
  explicit StoreRecords(LmdbEnv& env) : env_(env) {}

  uint64_t get_counter(MDB_txn* txn, int c);
  int put_counter(MDB_txn* txn, int c, uint64_t value);
  // Adds `delta` to counter `c`, clamped at 0.
  int add_counter(MDB_txn* txn, int c, int64_t delta);
  int add_counters(MDB_txn* txn, const CounterDeltas& counts);

  // Writes key's meta record and its recency record at `ms`.
  int set_meta(MDB_txn* txn, const Key& key, uint64_t ms, uint64_t size);
  // Moves key's recency record to `ms` (never back).
  int touch(MDB_txn* txn, const Key& key, uint64_t ms);
  // Deletes key's entry, meta and lru records and updates the totals. Sets
  // *removed_size to the removed size (0 if absent); kRunDamaged leaves a
  // damaged entry in place.
  int remove(MDB_txn* txn, const Key& key, uint64_t* removed_size);

  // remove() in a transaction of its own, counting a corrupt entry when
  // `count_corrupt`.
  Status remove_entry(const Key& key, bool count_corrupt);

 private:
  LmdbEnv& env_;
};

}  // namespace kcache

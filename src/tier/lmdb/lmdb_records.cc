// The records of an LMDB store (lmdb_records.h): counters, recency and
// removal inside one write transaction.
#include "tier/lmdb/lmdb_records.h"

#include <atomic>
#include <cstring>
#include <string>

#include "util/util.h"

namespace kcache {

namespace {

void lru_key(char out[24], uint64_t ms, const Key& k) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(ms >> (8 * (7 - i)));
  std::memcpy(out + 8, k.bytes.data(), 16);
}

// Records walked by eviction and repair, for tests of put cost.
std::atomic<uint64_t> g_records_visited{0};

}  // namespace

Status tier_status(int rc, std::string_view what) {
  if (rc == kRunDamaged)
    return Status(Errc::corrupt,
                  "lmdb " + std::string(what) + ": an entry's overflow pages are damaged; left in place");
  return mdb_status(rc, what);
}

void note_record_visited() noexcept { g_records_visited.fetch_add(1, std::memory_order_relaxed); }

uint64_t lmdb_records_visited() noexcept { return g_records_visited.load(std::memory_order_relaxed); }

uint64_t StoreRecords::get_counter(MDB_txn* txn, int c) {
  std::string_view name = store_counter_name(c);
  MDB_val k = mdb_val(name.data(), name.size()), v;
  if (mdb_get(txn, env_.stats, &k, &v) != 0 || v.mv_size != 8) return 0;
  return util::get_u64(static_cast<const char*>(v.mv_data));
}

int StoreRecords::put_counter(MDB_txn* txn, int c, uint64_t value) {
  std::string b;
  util::put_u64(b, value);
  std::string_view name = store_counter_name(c);
  MDB_val k = mdb_val(name.data(), name.size()), v = mdb_val(b.data(), 8);
  return mdb_put(txn, env_.stats, &k, &v, 0);
}

int StoreRecords::add_counter(MDB_txn* txn, int c, int64_t delta) {
  if (delta == 0) return 0;
  uint64_t cur = get_counter(txn, c);
  uint64_t next = delta < 0 && static_cast<uint64_t>(-delta) > cur ? 0 : cur + delta;
  return put_counter(txn, c, next);
}

int StoreRecords::add_counters(MDB_txn* txn, const CounterDeltas& counts) {
  for (int i = 0; i < c_count; ++i) {
    int rc = add_counter(txn, i, counts[i]);
    if (rc) return rc;
  }
  return 0;
}

int StoreRecords::touch(MDB_txn* txn, const Key& key, uint64_t ms) {
  MDB_val k = mdb_val(key), v;
  int rc = mdb_get(txn, env_.meta, &k, &v);
  if (rc == MDB_NOTFOUND) return 0;  // evicted meanwhile
  if (rc) return rc;
  if (v.mv_size != 16) return 0;
  uint64_t old_ms = util::get_u64(static_cast<const char*>(v.mv_data));
  uint64_t size = util::get_u64(static_cast<const char*>(v.mv_data) + 8);
  if (old_ms >= ms) return 0;
  char lk[24];
  lru_key(lk, old_ms, key);
  MDB_val lkv = mdb_val(lk, 24);
  rc = mdb_del(txn, env_.lru, &lkv, nullptr);
  if (rc && rc != MDB_NOTFOUND) return rc;
  return set_meta(txn, key, ms, size);
}

int StoreRecords::set_meta(MDB_txn* txn, const Key& key, uint64_t ms, uint64_t size) {
  std::string m;
  util::put_u64(m, ms);
  util::put_u64(m, size);
  MDB_val k = mdb_val(key), mv = mdb_val(m.data(), 16);
  int rc = mdb_put(txn, env_.meta, &k, &mv, 0);
  if (rc) return rc;
  char lk[24];
  lru_key(lk, ms, key);
  MDB_val lkv = mdb_val(lk, 24), empty = mdb_val("", 0);
  return mdb_put(txn, env_.lru, &lkv, &empty, 0);
}

int StoreRecords::remove(MDB_txn* txn, const Key& key, uint64_t* removed_size) {
  *removed_size = 0;
  // Forgotten whether or not the transaction commits: at worst, one more
  // verification.
  env_.verified.forget(key);
  MDB_val k = mdb_val(key), v;
  int rc = mdb_get(txn, env_.meta, &k, &v);
  if (rc == 0 && v.mv_size == 16) {
    uint64_t ms = util::get_u64(static_cast<const char*>(v.mv_data));
    char lk[24];
    lru_key(lk, ms, key);
    MDB_val lkv = mdb_val(lk, 24);
    rc = mdb_del(txn, env_.lru, &lkv, nullptr);
    if (rc && rc != MDB_NOTFOUND) return rc;
  }
  rc = mdb_del(txn, env_.meta, &k, nullptr);
  if (rc && rc != MDB_NOTFOUND) return rc;
  rc = mdb_get(txn, env_.entries, &k, &v);
  if (rc == MDB_NOTFOUND) return 0;
  if (rc) return rc;
  if (!env_.overflow_run_intact(v)) {
    env_.mark_damaged("entry " + key.hex() + ": the page header of its overflow run is damaged");
    return kRunDamaged;
  }
  *removed_size = v.mv_size;
  rc = mdb_del(txn, env_.entries, &k, nullptr);
  if (rc) return rc;
  rc = add_counter(txn, c_entries, -1);
  if (!rc) rc = add_counter(txn, c_bytes, -static_cast<int64_t>(*removed_size));
  return rc;
}

Status StoreRecords::remove_entry(const Key& key, bool count_corrupt) {
  KCACHE_TRY(MDB_txn * txn, env_.begin_write());
  uint64_t size;
  int rc = remove(txn, key, &size);
  if (!rc && count_corrupt) rc = add_counter(txn, c_corrupt, 1);
  if (rc) {
    env_.abort_write(txn);
    return tier_status(rc, "remove");
  }
  rc = env_.commit_write(txn);
  return rc ? mdb_status(rc, "commit remove") : Status();
}

}  // namespace kcache

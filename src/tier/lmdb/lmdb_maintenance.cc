// The maintenance of an LMDB store (lmdb_maintenance.h): list, verify,
// clear, salvage, eviction and the totals' repair.
#include "tier/lmdb/lmdb_maintenance.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "entry/buffer.h"
#include "util/util.h"

namespace kcache {

namespace {

// The most entries one eviction transaction deletes.
constexpr size_t kEvictBatch = 512;

}  // namespace

Status LmdbMaintenance::list(const std::function<bool(const ListItem&)>& fn) {
  KCACHE_TRY(MDB_txn * txn, env_.begin_read());
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn, env_.meta, &cur);
  if (rc) {
    env_.end_read(txn);
    return mdb_status(rc, "cursor");
  }
  MDB_val k, v;
  std::vector<ListItem> items;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size != 16 || v.mv_size != 16) continue;
    ListItem it;
    std::memcpy(it.key.bytes.data(), k.mv_data, 16);
    it.last_use_ms = util::get_u64(static_cast<const char*>(v.mv_data));
    it.size = util::get_u64(static_cast<const char*>(v.mv_data) + 8);
    items.push_back(it);
  }
  mdb_cursor_close(cur);
  env_.end_read(txn);
  if (rc != MDB_NOTFOUND) return mdb_status(rc, "list");
  for (const auto& it : items)
    if (!fn(it)) break;
  return Status();
}

Expected<VerifyReport> LmdbMaintenance::verify(bool fix) {
  VerifyReport rep;
  uint64_t entries = 0, bytes = 0, other_format = 0;
  {
    KCACHE_TRY(MDB_txn * txn, env_.begin_read());
    MDB_cursor* cur;
    int rc = mdb_cursor_open(txn, env_.entries, &cur);
    if (rc) {
      env_.end_read(txn);
      return mdb_status(rc, "cursor");
    }
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      ++rep.checked;
      Key key{};
      if (k.mv_size == 16) std::memcpy(key.bytes.data(), k.mv_data, 16);
      std::string_view enc(static_cast<const char*>(v.mv_data), v.mv_size);
      Status st = k.mv_size != 16                ? Status(Errc::corrupt, "bad key length")
                  : !env_.overflow_run_intact(v) ? Status(Errc::corrupt, "overflow page header damaged")
                                                 : Entry::check(enc, &key);
      if (st.is_ok()) {
        auto d = Entry::decode(make_heap_buffer(std::string(enc)), &key);
        if (!d) st = d.error();
      }
      if (st.code() == Errc::stale_format) {
        // Written by a build with another entry format, which may still
        // share the store (a rolling upgrade): unusable here, not damaged.
        ++other_format;
      } else if (!st.is_ok()) {
        rep.bad.emplace_back(key, st.message());
      } else {
        ++entries;
        bytes += v.mv_size;
      }
    }
    mdb_cursor_close(cur);
    env_.end_read(txn);
    if (rc != MDB_NOTFOUND) return mdb_status(rc, "verify walk");
  }
  if (other_format)
    KCACHE_LOG(LogLevel::info, "lmdb verify %s: %llu entries of another format version left in place",
               env_.dir().c_str(), static_cast<unsigned long long>(other_format));
  if (fix) {
    for (const auto& [k, why] : rep.bad)
      if (records_.remove_entry(k, /*count_corrupt=*/true).is_ok()) ++rep.removed;
    KCACHE_RETURN_IF_ERROR(repair_totals());
  }
  return rep;
}

Status LmdbMaintenance::clear() {
  KCACHE_TRY(MDB_txn * txn, env_.begin_write());
  env_.verified.clear();
  // Entries are deleted one by one, each overflow run freed only after
  // its own page header checked out (overflow_run_intact); mdb_drop would
  // free every run by its header unchecked. An entry whose run is damaged
  // stays (with fresh recency records) for the salvage at the next open.
  std::vector<std::pair<Key, uint64_t>> kept;
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn, env_.entries, &cur);
  MDB_val k, v;
  for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;) {
    if (!env_.overflow_run_intact(v)) {
      Key key{};
      if (k.mv_size == 16) std::memcpy(key.bytes.data(), k.mv_data, 16);
      env_.mark_damaged("entry " + key.hex() + ": the page header of its overflow run is damaged");
      if (k.mv_size == 16) kept.emplace_back(key, v.mv_size);
      rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
      continue;
    }
    char at[16];
    if (k.mv_size == 16) std::memcpy(at, k.mv_data, 16);
    bool key_ok = k.mv_size == 16;
    rc = mdb_cursor_del(cur, 0);
    if (rc) break;
    // The next record: the first key after the one deleted.
    MDB_val next = key_ok ? mdb_val(at, 16) : mdb_val("", 0);
    rc = key_ok ? mdb_cursor_get(cur, &next, &v, MDB_SET_RANGE) : mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    if (!rc && key_ok) k = next;
  }
  if (cur) mdb_cursor_close(cur);
  if (rc == MDB_NOTFOUND) rc = 0;
  for (MDB_dbi d : {env_.meta, env_.lru})
    if (!rc) rc = mdb_drop(txn, d, 0);
  uint64_t now = clock_.now_unix_ms(), kept_bytes = 0;
  for (const auto& [key, size] : kept) {
    if (!rc) rc = records_.set_meta(txn, key, now, size);
    kept_bytes += size;
  }
  if (!rc) rc = records_.put_counter(txn, c_entries, kept.size());
  if (!rc) rc = records_.put_counter(txn, c_bytes, kept_bytes);
  if (rc) {
    env_.abort_write(txn);
    return tier_status(rc, "clear");
  }
  rc = env_.commit_write(txn);
  return rc ? mdb_status(rc, "commit clear") : Status();
}

uint64_t LmdbMaintenance::salvage(const std::string& from_dir, uint64_t map_size) {
  (void)::unlink(LmdbEnv::damaged_marker(from_dir).c_str());
  auto from = LmdbEnv::open(from_dir, map_size, false, false, true);
  if (!from) {
    KCACHE_LOG(LogLevel::info, "lmdb salvage of %s: %s", from_dir.c_str(), from.error().to_string().c_str());
    return 0;
  }
  LmdbEnv& old = **from;
  auto rtxn = old.begin_read();
  if (!rtxn) return 0;
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(*rtxn, old.entries, &cur);
  struct Item {
    Key key;
    std::string_view enc;
    uint64_t ms;
  };
  std::vector<Item> batch;
  uint64_t batch_bytes = 0, copied = 0, skipped = 0;
  auto write_batch = [&]() -> bool {
    if (batch.empty()) return true;
    auto txn = env_.begin_write();
    if (!txn) return false;
    int wrc = 0;
    for (const auto& it : batch) {
      MDB_val k = mdb_val(it.key), v{it.enc.size(), nullptr};
      wrc = mdb_put(*txn, env_.entries, &k, &v, MDB_RESERVE | MDB_NOOVERWRITE);
      if (wrc == MDB_KEYEXIST) continue;  // stored meanwhile through this tier
      if (wrc) break;
      std::memcpy(v.mv_data, it.enc.data(), it.enc.size());
      wrc = records_.set_meta(*txn, it.key, it.ms, it.enc.size());
      if (!wrc) wrc = records_.add_counter(*txn, c_entries, 1);
      if (!wrc) wrc = records_.add_counter(*txn, c_bytes, static_cast<int64_t>(it.enc.size()));
      if (wrc) break;
    }
    if (wrc) {
      env_.abort_write(*txn);
      KCACHE_LOG(LogLevel::info, "lmdb salvage into %s: %s", env_.dir().c_str(),
                 mdb_status(wrc, "put").to_string().c_str());
      return false;
    }
    if (env_.commit_write(*txn) != 0) return false;
    copied += batch.size();
    batch.clear();
    batch_bytes = 0;
    return true;
  };
  MDB_val k, v;
  uint64_t now = util::now_unix_ms();
  for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    Key key{};
    if (k.mv_size != 16) {
      ++skipped;
      continue;
    }
    std::memcpy(key.bytes.data(), k.mv_data, 16);
    std::string_view enc(static_cast<const char*>(v.mv_data), v.mv_size);
    if (!Entry::check(enc, &key).is_ok() || !Entry::decode(make_heap_buffer(std::string(enc)), &key)) {
      ++skipped;
      continue;
    }
    uint64_t ms = now;
    MDB_val mk = mdb_val(key), mv;
    if (mdb_get(*rtxn, old.meta, &mk, &mv) == 0 && mv.mv_size == 16)
      ms = util::get_u64(static_cast<const char*>(mv.mv_data));
    batch.push_back({key, enc, ms});
    batch_bytes += enc.size();
    if ((batch.size() >= 256 || batch_bytes >= (uint64_t(64) << 20)) && !write_batch()) break;
  }
  if (rc == MDB_NOTFOUND) (void)write_batch();
  if (cur) mdb_cursor_close(cur);
  old.end_read(*rtxn);
  KCACHE_LOG(LogLevel::warn, "lmdb store %s: %llu intact entries salvaged from %s, %llu left there", env_.dir().c_str(),
             static_cast<unsigned long long>(copied), from_dir.c_str(), static_cast<unsigned long long>(skipped));
  return copied;
}

int LmdbMaintenance::make_room_locked(MDB_txn* txn, const std::vector<std::pair<Key, std::string_view>>& group) {
  if (records_.get_counter(txn, c_bytes) <= max_bytes_ && records_.get_counter(txn, c_entries) <= max_entries_)
    return 0;
  std::vector<Key> keep;
  keep.reserve(group.size());
  for (const auto& g : group) keep.push_back(g.first);
  size_t removed = 0;
  return evict_locked(txn, max_bytes_, max_entries_, &keep, &removed);
}

int LmdbMaintenance::evict_locked(MDB_txn* txn, uint64_t target_bytes, uint64_t target_entries,
                                  const std::vector<Key>* keep, size_t* removed) {
  *removed = 0;
  uint64_t b = records_.get_counter(txn, c_bytes), e = records_.get_counter(txn, c_entries);
  if (b <= target_bytes && e <= target_entries) return 0;
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn, env_.lru, &cur);
  if (rc) return rc;
  std::vector<Key> victims;
  MDB_val k, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
       rc == 0 && victims.size() < kEvictBatch && (b > target_bytes || e > target_entries);
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    note_record_visited();
    if (k.mv_size != 24) continue;
    Key key;
    std::memcpy(key.bytes.data(), static_cast<const char*>(k.mv_data) + 8, 16);
    if (keep && std::find(keep->begin(), keep->end(), key) != keep->end()) continue;
    MDB_val ek = mdb_val(key), ev;
    if (mdb_get(txn, env_.entries, &ek, &ev) == 0 && !env_.overflow_run_intact(ev)) {
      // Never freed (delete_locked): passed over, left for the salvage
      // of the store at its next open.
      env_.mark_damaged("entry " + key.hex() + ": the page header of its overflow run is damaged");
      continue;
    }
    victims.push_back(key);
    MDB_val mk = mdb_val(key), mv;
    if (mdb_get(txn, env_.meta, &mk, &mv) == 0 && mv.mv_size == 16)
      b -= std::min(b, util::get_u64(static_cast<const char*>(mv.mv_data) + 8));
    if (e) --e;
  }
  mdb_cursor_close(cur);
  if (rc && rc != MDB_NOTFOUND) return rc;
  for (const auto& key : victims) {
    uint64_t sz;
    rc = records_.remove(txn, key, &sz);
    if (rc) return rc;
  }
  *removed = victims.size();
  return records_.add_counter(txn, c_evictions, static_cast<int64_t>(victims.size()));
}

Expected<uint64_t> LmdbMaintenance::evict(uint64_t target_bytes, uint64_t target_entries) {
  uint64_t total = 0;
  for (;;) {
    KCACHE_TRY(MDB_txn * txn, env_.begin_write());
    uint64_t bytes = records_.get_counter(txn, c_bytes), entries = records_.get_counter(txn, c_entries);
    if (bytes <= target_bytes && entries <= target_entries) {
      if (total == 0) {
        env_.abort_write(txn);
        return total;
      }
      // LMDB lets a writer reuse the pages a transaction freed only once
      // another one has committed after it: this commit (the totals
      // rewritten as they are) makes the pages the last batch freed
      // usable by the next put, which on a full file system is the room
      // the eviction was for. Its failure changes nothing.
      if (records_.put_counter(txn, c_bytes, bytes) != 0) {
        env_.abort_write(txn);
        return total;
      }
      (void)env_.commit_write(txn);
      return total;
    }
    size_t removed = 0;
    int rc = evict_locked(txn, target_bytes, target_entries, nullptr, &removed);
    if (!rc && removed == 0) {
      // Totals say over the limit but nothing is indexed: repair them.
      env_.abort_write(txn);
      KCACHE_RETURN_IF_ERROR(repair_totals());
      return total;
    }
    if (rc) {
      env_.abort_write(txn);
      return tier_status(rc, "evict");
    }
    rc = env_.commit_write(txn);
    if (rc) return mdb_status(rc, "commit evict");
    total += removed;
  }
}

Status LmdbMaintenance::repair_totals() {
  KCACHE_TRY(MDB_txn * txn, env_.begin_write());
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn, env_.entries, &cur);
  uint64_t n = 0, bytes = 0;
  std::vector<std::pair<Key, uint64_t>> missing;
  MDB_val k, v;
  for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    note_record_visited();
    ++n;
    bytes += v.mv_size;
    if (k.mv_size != 16) continue;
    MDB_val mv;
    if (mdb_get(txn, env_.meta, &k, &mv) != 0) {
      Key key;
      std::memcpy(key.bytes.data(), k.mv_data, 16);
      missing.emplace_back(key, v.mv_size);
    }
  }
  mdb_cursor_close(cur);
  rc = rc == MDB_NOTFOUND ? 0 : rc;
  uint64_t now = clock_.now_unix_ms();
  for (const auto& [key, size] : missing)
    if (!rc) rc = records_.set_meta(txn, key, now, size);
  if (!rc) rc = records_.put_counter(txn, c_entries, n);
  if (!rc) rc = records_.put_counter(txn, c_bytes, bytes);
  if (rc) {
    env_.abort_write(txn);
    return mdb_status(rc, "repair");
  }
  rc = env_.commit_write(txn);
  return rc ? mdb_status(rc, "commit repair") : Status();
}

}  // namespace kcache

// LMDB disk engine.
//
// One environment (data.mdb + lock.mdb) per folder, opened once per process
// (LMDB forbids opening an environment twice in one process, so handles are
// shared through a registry keyed by device and inode).
//
// Named databases:
//   entries : key[16] -> encoded entry (docs/format.md)
//   meta    : key[16] -> u64 last_use_ms | u64 size
//   lru     : u64be last_use_ms | key[16] -> "" (recency index, oldest first)
//   stats   : counter name -> u64 (hits, misses, puts, evictions, corrupt,
//             errors, entries, bytes)
//
// Invariants, true after every committed write transaction:
//   * a key is in `entries` iff it is in `meta`, and then `lru` holds exactly
//     one record (meta.last_use_ms, key);
//   * stats.entries / stats.bytes equal the count and summed sizes of
//     `entries` (verify --fix recomputes them if they ever drift).
// An entry, its metadata and its counters change in one transaction, so a
// SIGKILL at any instant leaves either the old or the new state.
//
// Reads are zero-copy: a hit returns an Entry whose bytes point into the map
// and which pins its read transaction until the last copy is dropped.
// Hits are recorded in memory; a background thread writes recency and
// counters in batches, so the hit path never takes the write lock.
//
// Nothing frees an entry's overflow run before its own page header checked
// out (LmdbEnv::overflow_run_intact): an entry whose run is damaged stays in
// place, a miss, until the next open moves the store aside and salvages the
// rest into a fresh one.
//
// The environment it shares with the leases is lmdb_env.cc; the structural
// check of the file at open is lmdb_check.cc.
#include <fcntl.h>
#include <lmdb.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "entry/buffer.h"
#include "kcache/env.h"
#include "kcache/tier.h"
#include "tier/core/counters.h"
#include "tier/lmdb/lmdb_env.h"
#include "util/util.h"

namespace kcache {

namespace {

MDB_val val(const void* p, size_t n) { return MDB_val{n, const_cast<void*>(p)}; }
MDB_val val(const Key& k) { return val(k.bytes.data(), 16); }

void lru_key(char out[24], uint64_t ms, const Key& k) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(ms >> (8 * (7 - i)));
  std::memcpy(out + 8, k.bytes.data(), 16);
}

// Records walked by eviction and repair, for tests of put cost.
std::atomic<uint64_t> g_records_visited{0};

// The most entries one eviction transaction deletes.
constexpr size_t kEvictBatch = 512;

// What delete_locked returns for an entry whose overflow run has a damaged
// page header: LMDB would free pages by that header (lmdb_env.h,
// overflow_run_intact), so the entry is left in place.
constexpr int kRunDamaged = MDB_LAST_ERRCODE + 1000;

Status tier_status(int rc, std::string_view what) {
  if (rc == kRunDamaged)
    return Status(Errc::corrupt,
                  "lmdb " + std::string(what) + ": an entry's overflow pages are damaged; left in place");
  return mdb_status(rc, what);
}

}  // namespace

uint64_t lmdb_records_visited() noexcept { return g_records_visited.load(std::memory_order_relaxed); }

namespace {

// Bytes of a hit: they live in the map, pinned by the read transaction.
class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(std::shared_ptr<LmdbEnv> env, MDB_txn* txn, std::string_view bytes)
      : env_(std::move(env)), txn_(txn), bytes_(bytes) {
    env_->pinned.fetch_add(1, std::memory_order_relaxed);
  }
  ~PinnedBuffer() override {
    env_->pinned.fetch_sub(1, std::memory_order_relaxed);
    env_->end_read(txn_);
  }
  std::string_view bytes() const noexcept override { return bytes_; }
  bool pinned() const noexcept override { return true; }

 private:
  std::shared_ptr<LmdbEnv> env_;
  MDB_txn* txn_;
  std::string_view bytes_;
};

class LmdbTier final : public Tier, public StoreAdmin {
 public:
  LmdbTier(std::shared_ptr<LmdbEnv> env, const DiskTierOptions& o)
      : env_(std::move(env)), opt_(o), clock_(Env::or_posix(opt_.env)) {
    const DiskLimits l = effective_limits(o);
    max_bytes_ = l.max_bytes;
    max_entries_ = l.max_entries;
    low_water_ = l.low_water;
    max_entry_ = l.max_entry_bytes;
    batch_ = l.recency_batch;
    // The flusher starts the first time there is enough to write
    // (start_flusher_locked): a process that hits a few entries and stores
    // nothing has no thread of kcache's (what it buffered is written at
    // close, or by flush()).
  }
  ~LmdbTier() override {
    if (env_->inherited()) {
      // A child of fork(): the flusher thread does not exist here, so its
      // handle must not be joined (that would wait forever), and the
      // condition variable it was waiting on must not be destroyed (glibc
      // waits for that waiter too). Both are leaked, and nothing is
      // flushed: the store belongs to the parent.
      new std::thread(std::move(flusher_));  // never joined, never freed
      (void)pend_cv_.release();
      return;
    }
    {
      std::lock_guard lk(pend_mu_);
      stop_ = true;
    }
    pend_cv_->notify_all();
    if (flusher_.joinable()) flusher_.join();
    (void)flush();
  }

  std::string_view name() const noexcept override { return "lmdb"; }
  TierKind kind() const noexcept override { return TierKind::disk; }
  bool writable() const noexcept override { return !read_only_; }
  StoreAdmin* admin() noexcept override { return this; }

  // Counts a damaged store found (and moved aside) when opening.
  void note_corrupt() { count(c_corrupt); }

  // Copies the intact entries of the store moved aside to `from` into this
  // fresh one, with their last-use times, in transactions of up to 256
  // entries or 64 MiB. Reads take each value's place and size from its leaf
  // (checked at open) and its checksum decides, so a damaged overflow page
  // header, which only frees would trust, costs nothing here. Returns the
  // entries copied.
  uint64_t salvage(const std::string& from_dir, uint64_t map_size) {
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
      auto txn = env_->begin_write();
      if (!txn) return false;
      int wrc = 0;
      for (const auto& it : batch) {
        MDB_val k = val(it.key), v{it.enc.size(), nullptr};
        wrc = mdb_put(*txn, env_->entries, &k, &v, MDB_RESERVE | MDB_NOOVERWRITE);
        if (wrc == MDB_KEYEXIST) continue;  // stored meanwhile through this tier
        if (wrc) break;
        std::memcpy(v.mv_data, it.enc.data(), it.enc.size());
        wrc = set_meta(*txn, it.key, it.ms, it.enc.size());
        if (!wrc) wrc = add_counter(*txn, c_entries, 1);
        if (!wrc) wrc = add_counter(*txn, c_bytes, static_cast<int64_t>(it.enc.size()));
        if (wrc) break;
      }
      if (wrc) {
        env_->abort_write(*txn);
        KCACHE_LOG(LogLevel::info, "lmdb salvage into %s: %s", env_->dir().c_str(),
                   mdb_status(wrc, "put").to_string().c_str());
        return false;
      }
      if (env_->commit_write(*txn) != 0) return false;
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
      MDB_val mk = val(key), mv;
      if (mdb_get(*rtxn, old.meta, &mk, &mv) == 0 && mv.mv_size == 16)
        ms = util::get_u64(static_cast<const char*>(mv.mv_data));
      batch.push_back({key, enc, ms});
      batch_bytes += enc.size();
      if ((batch.size() >= 256 || batch_bytes >= (uint64_t(64) << 20)) && !write_batch()) break;
    }
    if (rc == MDB_NOTFOUND) (void)write_batch();
    if (cur) mdb_cursor_close(cur);
    old.end_read(*rtxn);
    KCACHE_LOG(LogLevel::warn, "lmdb store %s: %llu intact entries salvaged from %s, %llu left there",
               env_->dir().c_str(), static_cast<unsigned long long>(copied), from_dir.c_str(),
               static_cast<unsigned long long>(skipped));
    return copied;
  }

  Status flush() override {
    // Nothing to write in a child of fork() (it counts nothing there), nor
    // in a read-only store (nothing is ever written there).
    if (env_->inherited() || read_only_) return Status();
    return put_once({}, "flush");
  }

  Status sync() override {
    if (env_->inherited() || read_only_) return Status();
    return env_->sync();
  }

  Status zero_counters() override {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("zero counters");
    counters_.add_zeroing(stats());
    return flush();
  }

  // Recency records (meta/lru) hold wall-clock ms of a put or a hit.
  Expected<uint64_t> mark() override {
    if (env_->inherited()) return env_->inherited_error();
    KCACHE_RETURN_IF_ERROR(flush());
    return clock_.next_unix_ms();
  }

  Status list(const std::function<bool(const ListItem&)>& fn) override {
    if (env_->inherited()) return env_->inherited_error();
    KCACHE_TRY(MDB_txn * txn, env_->begin_read());
    MDB_cursor* cur;
    int rc = mdb_cursor_open(txn, env_->meta, &cur);
    if (rc) {
      env_->end_read(txn);
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
    env_->end_read(txn);
    if (rc != MDB_NOTFOUND) return mdb_status(rc, "list");
    for (const auto& it : items)
      if (!fn(it)) break;
    return Status();
  }

  Expected<VerifyReport> verify(bool fix) override {
    if (env_->inherited()) return env_->inherited_error();
    if (fix && read_only_) return refuse("verify --fix");
    (void)flush();
    VerifyReport rep;
    uint64_t entries = 0, bytes = 0, other_format = 0;
    {
      KCACHE_TRY(MDB_txn * txn, env_->begin_read());
      MDB_cursor* cur;
      int rc = mdb_cursor_open(txn, env_->entries, &cur);
      if (rc) {
        env_->end_read(txn);
        return mdb_status(rc, "cursor");
      }
      MDB_val k, v;
      for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        ++rep.checked;
        Key key{};
        if (k.mv_size == 16) std::memcpy(key.bytes.data(), k.mv_data, 16);
        std::string_view enc(static_cast<const char*>(v.mv_data), v.mv_size);
        Status st = k.mv_size != 16                 ? Status(Errc::corrupt, "bad key length")
                    : !env_->overflow_run_intact(v) ? Status(Errc::corrupt, "overflow page header damaged")
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
      env_->end_read(txn);
      if (rc != MDB_NOTFOUND) return mdb_status(rc, "verify walk");
    }
    if (other_format)
      KCACHE_LOG(LogLevel::info, "lmdb verify %s: %llu entries of another format version left in place",
                 env_->dir().c_str(), static_cast<unsigned long long>(other_format));
    if (fix) {
      for (const auto& [k, why] : rep.bad)
        if (remove_entry(k, /*count_corrupt=*/true).is_ok()) ++rep.removed;
      KCACHE_RETURN_IF_ERROR(repair_totals());
    }
    return rep;
  }

  Expected<uint64_t> trim(uint64_t max_bytes) override {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("trim");
    (void)flush();
    return evict(max_bytes, max_entries_);
  }

  Status clear() override {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("clear");
    {
      std::lock_guard lk(pend_mu_);
      touched_.clear();
    }
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    // Entries are deleted one by one, each overflow run freed only after
    // its own page header checked out (overflow_run_intact); mdb_drop would
    // free every run by its header unchecked. An entry whose run is damaged
    // stays (with fresh recency records) for the salvage at the next open.
    std::vector<std::pair<Key, uint64_t>> kept;
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->entries, &cur);
    MDB_val k, v;
    for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;) {
      if (!env_->overflow_run_intact(v)) {
        Key key{};
        if (k.mv_size == 16) std::memcpy(key.bytes.data(), k.mv_data, 16);
        env_->mark_damaged("entry " + key.hex() + ": the page header of its overflow run is damaged");
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
      MDB_val next = key_ok ? val(at, 16) : val("", 0);
      rc = key_ok ? mdb_cursor_get(cur, &next, &v, MDB_SET_RANGE) : mdb_cursor_get(cur, &k, &v, MDB_FIRST);
      if (!rc && key_ok) k = next;
    }
    if (cur) mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND) rc = 0;
    for (MDB_dbi d : {env_->meta, env_->lru})
      if (!rc) rc = mdb_drop(txn, d, 0);
    uint64_t now = clock_.now_unix_ms(), kept_bytes = 0;
    for (const auto& [key, size] : kept) {
      if (!rc) rc = set_meta(txn, key, now, size);
      kept_bytes += size;
    }
    if (!rc) rc = put_counter(txn, c_entries, kept.size());
    if (!rc) rc = put_counter(txn, c_bytes, kept_bytes);
    if (rc) {
      env_->abort_write(txn);
      return tier_status(rc, "clear");
    }
    rc = env_->commit_write(txn);
    return rc ? mdb_status(rc, "commit clear") : Status();
  }

 protected:
  std::string_view admin_name() const noexcept override { return name(); }

  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override {
    // In a child of fork() this returns before any lock or counter is
    // touched: a thread of the parent may have held them at the fork.
    if (env_->inherited()) return env_->inherited_error();
    KCACHE_TRY(MDB_txn * txn, env_->begin_read());
    MDB_val k = val(key), v;
    // Guarded: a data file truncated under the map is a miss, not SIGBUS.
    int rc = env_->get_guarded(txn, env_->entries, &k, &v);
    if (rc == EFAULT) {
      env_->end_read(txn);
      if (access != Access::peek) count(c_errors);
      return env_->lost_error();
    }
    if (rc == MDB_NOTFOUND) {
      env_->end_read(txn);
      if (access == Access::counted) miss_counted();
      return std::optional<Entry>();
    }
    if (rc) {
      env_->end_read(txn);
      if (access != Access::peek) count(c_errors);
      return mdb_status(rc, "get");
    }
    std::string_view bytes(static_cast<const char*>(v.mv_data), v.mv_size);
    std::shared_ptr<const Buffer> buf;
    if (env_->pinned.load(std::memory_order_relaxed) < kMaxPinned) {
      buf = std::make_shared<PinnedBuffer>(env_, txn, bytes);
    } else {
      // Each pinned hit holds a reader slot; a caller that keeps many
      // entries alive gets copies instead of exhausting the reader table.
      auto copy = std::make_shared<AlignedBuffer>(bytes.size());
      const bool copied = util::copy_guarded(copy->data(), bytes.data(), bytes.size());
      env_->end_read(txn);
      if (!copied) {
        env_->mark_lost(env_->dir() + "/data.mdb was truncated under this process");
        if (access != Access::peek) count(c_errors);
        return env_->lost_error();
      }
      buf = std::move(copy);
    }
    auto e = Entry::decode(std::move(buf), &key);
    if (!e && e.error().code() == Errc::stale_format) {
      // Another build's entry: a miss, left for the build that reads it.
      if (access == Access::counted) miss_counted();
      return std::optional<Entry>();
    }
    if (!e) {
      // Counted (stored with the removal, in a read-only store in this
      // process only); a peek leaves it all as it was.
      if (access != Access::peek) {
        count(c_corrupt);
        if (!read_only_) (void)remove_entry(key, false);
      }
      return Status(Errc::corrupt, "lmdb entry " + key.hex() + ": " + e.error().message());
    }
    if (access != Access::peek) note_hit(key);
    return std::optional<Entry>(std::move(e).value());
  }

  Status put_one(const Entry& entry, bool sync) {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("put");
    std::string_view enc = entry.encoded();
    if (enc.size() > max_entry_) {
      count(c_errors);
      return Status(Errc::too_large, "entry of " + util::format_size(enc.size()) +
                                         " exceeds the largest entry stored (" + util::format_size(max_entry_) + ")");
    }
    Status st = put_group({{entry.key(), enc}}, /*retry=*/true, sync);
    if (!st.is_ok()) count(c_errors);
    return st;
  }
  Status do_put(const Entry& entry) override { return put_one(entry, /*sync=*/true); }
  Status do_put_unsynced(const Entry& entry) override { return put_one(entry, /*sync=*/false); }

 public:
  // One write transaction (and one sync) for the whole group: what the
  // Cache's committer hands over (group commit).
  std::vector<Status> put_many(const std::vector<Entry>& entries) override {
    std::vector<Status> out(entries.size());
    if (env_->inherited() || read_only_) {
      for (auto& s : out) s = read_only_ ? refuse("put") : env_->inherited_error();
      return out;
    }
    std::vector<std::pair<Key, std::string_view>> group;
    std::vector<size_t> index;
    for (size_t i = 0; i < entries.size(); ++i) {
      std::string_view enc = entries[i].encoded();
      if (enc.size() < kEntryHeaderSize) {
        out[i] = Status(Errc::invalid_argument, "put of an entry that was not built");
      } else if (enc.size() > max_entry_) {
        count(c_errors);
        out[i] =
            Status(Errc::too_large, "entry of " + util::format_size(enc.size()) +
                                        " exceeds the largest entry stored (" + util::format_size(max_entry_) + ")");
      } else {
        group.emplace_back(entries[i].key(), enc);
        index.push_back(i);
      }
    }
    if (group.empty()) return out;
    std::vector<Status> got(group.size());
    Status stop;
    put_split(group, 0, group.size(), got, stop);
    for (size_t j = 0; j < index.size(); ++j) {
      if (!got[j].is_ok()) count(c_errors);
      out[index[j]] = got[j];
    }
    return out;
  }

 protected:
  Status do_remove(const Key& key) override {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("remove");
    return remove_entry(key, false);
  }

  TierStats do_stats() override {
    if (env_->inherited()) return TierStats();  // the store's counters are the parent's
    CounterValues v{};
    auto txn = env_->begin_read();
    if (txn) {
      for (int i = 0; i < c_count; ++i) v[i] = get_counter(*txn, i);
      env_->end_read(*txn);
    }
    return counters_.stats(v);
  }

 private:
  Status refuse(const char* what) { return counters_.refuse(what, env_->dir()); }

  // Free space (for unprivileged users) below what one commit of `need`
  // bytes may write, with room for the B-tree pages that change with it.
  bool disk_nearly_full(uint64_t need) {
    struct statvfs v;
    if (::statvfs(env_->dir().c_str(), &v) != 0) return false;
    uint64_t free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    return free_bytes < need + (uint64_t(1) << 20) || v.f_favail == 0;
  }

  void count(StoreCounter c, int64_t n = 1) { counters_.add(c, n); }

  // Recency and counter changes not yet stored, taken to ride along with a
  // write transaction, and given back when it fails.
  struct Pending {
    std::unordered_map<Key, uint64_t> touched;
    CounterDeltas counts;
  };
  Pending take_pending() {
    Pending p;
    {
      std::lock_guard lk(pend_mu_);
      p.touched.swap(touched_);
    }
    p.counts = counters_.take();
    return p;
  }
  void restore_pending(const Pending& p) {
    counters_.restore(p.counts);
    std::lock_guard lk(pend_mu_);
    for (const auto& [k, ms] : p.touched) touched_.emplace(k, ms);
  }

  // Enough buffered that the flusher should write it.
  bool flush_due(size_t touched) const {
    return touched >= batch_ ||
           counters_.pending(c_hits) + counters_.pending(c_misses) >= 16 * static_cast<int64_t>(batch_);
  }

  void note_hit(const Key& key) {
    bool wake;
    const bool writes = !read_only_;
    count(c_hits);
    {
      std::lock_guard lk(pend_mu_);
      if (writes) touched_[key] = clock_.now_unix_ms();
      wake = writes && flush_due(touched_.size()) && start_flusher_locked();
    }
    if (wake) pend_cv_->notify_one();
  }

  void miss_counted() {
    count(c_misses);
    if (read_only_) return;
    bool wake;
    {
      std::lock_guard lk(pend_mu_);
      wake = flush_due(touched_.size()) && start_flusher_locked();
    }
    if (wake) pend_cv_->notify_one();
  }

  // Starts the flusher thread unless it runs already; false where none may
  // run (closing, or a child of fork(), whose store is its parent's) or
  // none could be started (no thread left to the process: the records stay
  // pending, written at flush or close; one log line, no further try).
  // REQUIRES: pend_mu_.
  bool start_flusher_locked() {
    if (flusher_.joinable()) return true;
    if (stop_ || flusher_failed_ || env_->inherited()) return false;
    try {
      flusher_ = std::thread([this] { flusher_loop(); });
    } catch (const std::system_error& e) {
      flusher_failed_ = true;
      KCACHE_LOG(LogLevel::warn, "lmdb: cannot start the recency flusher (%s): recency is written at flush or close",
                 e.what());
      return false;
    }
    return true;
  }

  void flusher_loop() {
    std::unique_lock lk(pend_mu_);
    // After a failed flush (a full disk) what was not stored stays pending
    // and the next try waits out a whole period, so hits do not turn into
    // a write attempt each.
    auto not_before = std::chrono::steady_clock::time_point::min();
    while (!stop_) {
      // Started because a flush was due: check before the first wait.
      bool due = flush_due(touched_.size());
      if (!due || std::chrono::steady_clock::now() < not_before) {
        pend_cv_->wait_for(lk, std::chrono::seconds(5));
        continue;
      }
      lk.unlock();
      Status st = flush();
      if (!st.is_ok()) {
        KCACHE_LOG(LogLevel::debug, "lmdb recency flush: %s", st.to_string().c_str());
        not_before = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
      lk.lock();
    }
  }

  static uint64_t get_counter(MDB_txn* txn, MDB_dbi dbi, int c) {
    std::string_view name = store_counter_name(c);
    MDB_val k = val(name.data(), name.size()), v;
    if (mdb_get(txn, dbi, &k, &v) != 0 || v.mv_size != 8) return 0;
    return util::get_u64(static_cast<const char*>(v.mv_data));
  }
  uint64_t get_counter(MDB_txn* txn, int c) { return get_counter(txn, env_->stats, c); }
  int put_counter(MDB_txn* txn, int c, uint64_t value) {
    std::string b;
    util::put_u64(b, value);
    std::string_view name = store_counter_name(c);
    MDB_val k = val(name.data(), name.size()), v = val(b.data(), 8);
    return mdb_put(txn, env_->stats, &k, &v, 0);
  }
  int add_counter(MDB_txn* txn, int c, int64_t delta) {
    if (delta == 0) return 0;
    uint64_t cur = get_counter(txn, c);
    uint64_t next = delta < 0 && static_cast<uint64_t>(-delta) > cur ? 0 : cur + delta;
    return put_counter(txn, c, next);
  }
  int add_counters(MDB_txn* txn, const CounterDeltas& counts) {
    for (int i = 0; i < c_count; ++i) {
      int rc = add_counter(txn, i, counts[i]);
      if (rc) return rc;
    }
    return 0;
  }

  // Moves k's recency record to `ms`. REQUIRES: write txn.
  int touch_locked(MDB_txn* txn, const Key& key, uint64_t ms) {
    MDB_val k = val(key), v;
    int rc = mdb_get(txn, env_->meta, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;  // evicted meanwhile
    if (rc) return rc;
    if (v.mv_size != 16) return 0;
    uint64_t old_ms = util::get_u64(static_cast<const char*>(v.mv_data));
    uint64_t size = util::get_u64(static_cast<const char*>(v.mv_data) + 8);
    if (old_ms >= ms) return 0;
    char lk[24];
    lru_key(lk, old_ms, key);
    MDB_val lkv = val(lk, 24);
    rc = mdb_del(txn, env_->lru, &lkv, nullptr);
    if (rc && rc != MDB_NOTFOUND) return rc;
    return set_meta(txn, key, ms, size);
  }

  int set_meta(MDB_txn* txn, const Key& key, uint64_t ms, uint64_t size) {
    std::string m;
    util::put_u64(m, ms);
    util::put_u64(m, size);
    MDB_val k = val(key), mv = val(m.data(), 16);
    int rc = mdb_put(txn, env_->meta, &k, &mv, 0);
    if (rc) return rc;
    char lk[24];
    lru_key(lk, ms, key);
    MDB_val lkv = val(lk, 24), empty = val("", 0);
    return mdb_put(txn, env_->lru, &lkv, &empty, 0);
  }

  // Deletes key's entry, meta and lru records and updates totals.
  // REQUIRES: write txn. Sets *size to the removed size (0 if absent).
  int delete_locked(MDB_txn* txn, const Key& key, uint64_t* removed_size) {
    *removed_size = 0;
    MDB_val k = val(key), v;
    int rc = mdb_get(txn, env_->meta, &k, &v);
    if (rc == 0 && v.mv_size == 16) {
      uint64_t ms = util::get_u64(static_cast<const char*>(v.mv_data));
      char lk[24];
      lru_key(lk, ms, key);
      MDB_val lkv = val(lk, 24);
      rc = mdb_del(txn, env_->lru, &lkv, nullptr);
      if (rc && rc != MDB_NOTFOUND) return rc;
    }
    rc = mdb_del(txn, env_->meta, &k, nullptr);
    if (rc && rc != MDB_NOTFOUND) return rc;
    rc = mdb_get(txn, env_->entries, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (!env_->overflow_run_intact(v)) {
      env_->mark_damaged("entry " + key.hex() + ": the page header of its overflow run is damaged");
      return kRunDamaged;
    }
    *removed_size = v.mv_size;
    rc = mdb_del(txn, env_->entries, &k, nullptr);
    if (rc) return rc;
    rc = add_counter(txn, c_entries, -1);
    if (!rc) rc = add_counter(txn, c_bytes, -static_cast<int64_t>(*removed_size));
    return rc;
  }

  Status remove_entry(const Key& key, bool count_corrupt) {
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    uint64_t size;
    int rc = delete_locked(txn, key, &size);
    if (!rc && count_corrupt) rc = add_counter(txn, c_corrupt, 1);
    if (rc) {
      env_->abort_write(txn);
      return tier_status(rc, "remove");
    }
    rc = env_->commit_write(txn);
    return rc ? mdb_status(rc, "commit remove") : Status();
  }

  // Puts group[first, last) in one transaction. When it does not fit (a
  // full file system), the halves are tried apart, so that what fits is
  // stored. Once a single entry does not fit, or a part fails otherwise,
  // the rest get that failure (*stop) untried. A part of a group found not
  // to fit reports an I/O error (LMDB's short write) as no_space too.
  void put_split(const std::vector<std::pair<Key, std::string_view>>& group, size_t first, size_t last,
                 std::vector<Status>& out, Status& stop, bool part_of_full = false) {
    if (!stop.is_ok()) {
      for (size_t i = first; i < last; ++i) out[i] = stop;
      return;
    }
    std::vector<std::pair<Key, std::string_view>> part(group.begin() + static_cast<ptrdiff_t>(first),
                                                       group.begin() + static_cast<ptrdiff_t>(last));
    Status st = put_group(part, /*retry=*/!part_of_full);
    if (part_of_full && st.code() == Errc::io_error)
      st = Status(Errc::no_space, st.message() + " (the file system is full)");
    if (st.code() == Errc::no_space && last - first > 1) {
      size_t mid = first + (last - first) / 2;
      put_split(group, first, mid, out, stop, true);
      put_split(group, mid, last, out, stop, true);
      return;
    }
    if (!st.is_ok()) stop = st;
    for (size_t i = first; i < last; ++i) out[i] = st;
  }

  // Puts every (key, encoded entry) in one transaction; on a full map,
  // makes room and tries once more; then evicts if over the limits.
  // retry=false: no room is made and no second try (a part of a group
  // that did not fit after both).
  // sync=false: the commit skips the durability's sync (put_unsynced).
  Status put_group(const std::vector<std::pair<Key, std::string_view>>& group, bool retry = true, bool sync = true) {
    Status st = put_once(group, "put", sync);
    if (retry && st.code() == Errc::no_space) {
      // The map is full: make room and try once more.
      (void)evict(static_cast<uint64_t>(max_bytes_ * low_water_ * 0.5), max_entries_);
      st = put_once(group, "put", sync);
    }
    uint64_t need = 0;
    for (const auto& g : group) need += g.second.size();
    if (st.code() == Errc::io_error && disk_nearly_full(need)) {
      // LMDB reports a short write of a page (a full file system) as EIO;
      // say what it is, so the caller turns writes off instead of retrying.
      st = Status(Errc::no_space, st.message() + " (the file system is full)");
    }
    if (st.is_ok()) maybe_evict();
    return st;
  }

  // Puts the group (none: a flush) in one transaction, with this process's
  // pending recency and counters riding along; what was not stored stays
  // pending, for the next flush or put.
  Status put_once(const std::vector<std::pair<Key, std::string_view>>& group, const char* what = "put",
                  bool sync = true) {
    Pending p = take_pending();
    const auto& [touched, counts] = p;
    if (group.empty() && touched.empty() && !any_delta(counts)) return Status();
    auto restore = [&] { restore_pending(p); };
    auto txn_or = env_->begin_write();
    if (!txn_or) {
      restore();
      return txn_or.error();
    }
    MDB_txn* txn = *txn_or;
    int rc = 0;
    const uint64_t now = clock_.now_unix_ms();
    for (const auto& [key, enc] : group) {
      uint64_t old_size = 0;
      if (!rc) rc = delete_locked(txn, key, &old_size);
      // A damaged entry is left in place (the store is marked for salvage);
      // the rest of a group still goes in.
      if (rc == kRunDamaged && group.size() > 1) {
        rc = 0;
        continue;
      }
      MDB_val k = val(key), v;
      v.mv_size = enc.size();
      v.mv_data = nullptr;
      if (!rc) rc = mdb_put(txn, env_->entries, &k, &v, MDB_RESERVE);
      if (!rc) {
        std::memcpy(v.mv_data, enc.data(), enc.size());
        rc = set_meta(txn, key, now, enc.size());
      }
      if (!rc) rc = add_counter(txn, c_entries, 1);
      if (!rc) rc = add_counter(txn, c_bytes, static_cast<int64_t>(enc.size()));
      if (!rc) rc = add_counter(txn, c_puts, 1);
    }
    for (const auto& [tk, ms] : touched)
      if (!rc) rc = touch_locked(txn, tk, ms);
    if (!rc) rc = add_counters(txn, counts);
    // The group is stored with the room it needs: the oldest entries go in
    // this transaction, so no commit leaves the store over its limits
    // (beyond what the group alone brings) and no writer waits behind
    // another's eviction.
    if (!rc && !group.empty()) rc = make_room_locked(txn, group);
    if (rc) {
      env_->abort_write(txn);
      restore();
      return tier_status(rc, what);
    }
    rc = env_->commit_write(txn, sync);
    if (rc) {
      restore();
      return mdb_status(rc, std::string("commit ") + what);
    }
    return Status();
  }

  void maybe_evict() {
    auto s = do_stats();
    if (s.bytes <= max_bytes_ && s.entries <= max_entries_) return;
    auto r = evict(static_cast<uint64_t>(max_bytes_ * low_water_), static_cast<uint64_t>(max_entries_ * low_water_));
    if (!r) KCACHE_LOG(LogLevel::warn, "lmdb eviction failed: %s", r.error().to_string().c_str());
  }

  // Puts that take the store over a limit remove the oldest entries (never
  // those of `group`) in their own transaction, down to the limits, at most
  // kEvictBatch of them. REQUIRES: write txn, the group already put.
  int make_room_locked(MDB_txn* txn, const std::vector<std::pair<Key, std::string_view>>& group) {
    if (get_counter(txn, c_bytes) <= max_bytes_ && get_counter(txn, c_entries) <= max_entries_) return 0;
    std::vector<Key> keep;
    keep.reserve(group.size());
    for (const auto& g : group) keep.push_back(g.first);
    size_t removed = 0;
    return evict_locked(txn, max_bytes_, max_entries_, &keep, &removed);
  }

  // Deletes the oldest entries, in this transaction, until bytes <=
  // target_bytes and entries <= target_entries or kEvictBatch are gone,
  // passing over the keys in `keep` (when given). *removed: how many went.
  // REQUIRES: write txn.
  int evict_locked(MDB_txn* txn, uint64_t target_bytes, uint64_t target_entries, const std::vector<Key>* keep,
                   size_t* removed) {
    *removed = 0;
    uint64_t b = get_counter(txn, c_bytes), e = get_counter(txn, c_entries);
    if (b <= target_bytes && e <= target_entries) return 0;
    MDB_cursor* cur;
    int rc = mdb_cursor_open(txn, env_->lru, &cur);
    if (rc) return rc;
    std::vector<Key> victims;
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
         rc == 0 && victims.size() < kEvictBatch && (b > target_bytes || e > target_entries);
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      g_records_visited.fetch_add(1, std::memory_order_relaxed);
      if (k.mv_size != 24) continue;
      Key key;
      std::memcpy(key.bytes.data(), static_cast<const char*>(k.mv_data) + 8, 16);
      if (keep && std::find(keep->begin(), keep->end(), key) != keep->end()) continue;
      MDB_val ek = val(key), ev;
      if (mdb_get(txn, env_->entries, &ek, &ev) == 0 && !env_->overflow_run_intact(ev)) {
        // Never freed (delete_locked): passed over, left for the salvage
        // of the store at its next open.
        env_->mark_damaged("entry " + key.hex() + ": the page header of its overflow run is damaged");
        continue;
      }
      victims.push_back(key);
      MDB_val mk = val(key), mv;
      if (mdb_get(txn, env_->meta, &mk, &mv) == 0 && mv.mv_size == 16)
        b -= std::min(b, util::get_u64(static_cast<const char*>(mv.mv_data) + 8));
      if (e) --e;
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND) return rc;
    for (const auto& key : victims) {
      uint64_t sz;
      rc = delete_locked(txn, key, &sz);
      if (rc) return rc;
    }
    *removed = victims.size();
    return add_counter(txn, c_evictions, static_cast<int64_t>(victims.size()));
  }

  // Removes oldest entries until bytes <= target_bytes and entries <=
  // target_entries, in transactions of at most kEvictBatch deletions so
  // that other writers are never blocked for long. The write lock makes
  // each batch exclusive, and each batch re-reads the totals, so concurrent
  // evictors never remove more than needed.
  Expected<uint64_t> evict(uint64_t target_bytes, uint64_t target_entries) {
    uint64_t total = 0;
    for (;;) {
      KCACHE_TRY(MDB_txn * txn, env_->begin_write());
      uint64_t bytes = get_counter(txn, c_bytes), entries = get_counter(txn, c_entries);
      if (bytes <= target_bytes && entries <= target_entries) {
        if (total == 0) {
          env_->abort_write(txn);
          return total;
        }
        // LMDB lets a writer reuse the pages a transaction freed only once
        // another one has committed after it: this commit (the totals
        // rewritten as they are) makes the pages the last batch freed
        // usable by the next put, which on a full file system is the room
        // the eviction was for. Its failure changes nothing.
        if (put_counter(txn, c_bytes, bytes) != 0) {
          env_->abort_write(txn);
          return total;
        }
        (void)env_->commit_write(txn);
        return total;
      }
      size_t removed = 0;
      int rc = evict_locked(txn, target_bytes, target_entries, nullptr, &removed);
      if (!rc && removed == 0) {
        // Totals say over the limit but nothing is indexed: repair them.
        env_->abort_write(txn);
        KCACHE_RETURN_IF_ERROR(repair_totals());
        return total;
      }
      if (rc) {
        env_->abort_write(txn);
        return tier_status(rc, "evict");
      }
      rc = env_->commit_write(txn);
      if (rc) return mdb_status(rc, "commit evict");
      total += removed;
    }
  }

  // Recomputes entries/bytes from the entries database, and rebuilds the
  // meta/lru records of entries that lack them.
  Status repair_totals() {
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    MDB_cursor* cur;
    int rc = mdb_cursor_open(txn, env_->entries, &cur);
    uint64_t n = 0, bytes = 0;
    std::vector<std::pair<Key, uint64_t>> missing;
    MDB_val k, v;
    for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      g_records_visited.fetch_add(1, std::memory_order_relaxed);
      ++n;
      bytes += v.mv_size;
      if (k.mv_size != 16) continue;
      MDB_val mv;
      if (mdb_get(txn, env_->meta, &k, &mv) != 0) {
        Key key;
        std::memcpy(key.bytes.data(), k.mv_data, 16);
        missing.emplace_back(key, v.mv_size);
      }
    }
    mdb_cursor_close(cur);
    rc = rc == MDB_NOTFOUND ? 0 : rc;
    uint64_t now = clock_.now_unix_ms();
    for (const auto& [key, size] : missing)
      if (!rc) rc = set_meta(txn, key, now, size);
    if (!rc) rc = put_counter(txn, c_entries, n);
    if (!rc) rc = put_counter(txn, c_bytes, bytes);
    if (rc) {
      env_->abort_write(txn);
      return mdb_status(rc, "repair");
    }
    rc = env_->commit_write(txn);
    return rc ? mdb_status(rc, "commit repair") : Status();
  }

  std::shared_ptr<LmdbEnv> env_;
  DiskTierOptions opt_;
  // The clock of recency records and marks (opt_.env, or the system's);
  // LMDB's own I/O does not go through it.
  Env& clock_;
  uint64_t max_bytes_, max_entries_, max_entry_;
  double low_water_;
  unsigned batch_;

  const bool read_only_ = opt_.read_only;

  PendingCounters counters_;  // counter deltas not yet stored
  std::mutex pend_mu_;
  // On the heap so that a child of fork() can leak it (see ~LmdbTier).
  std::unique_ptr<std::condition_variable> pend_cv_ = std::make_unique<std::condition_variable>();
  std::unordered_map<Key, uint64_t> touched_;  // GUARDED_BY(pend_mu_): key -> last hit ms
  bool stop_ = false;                          // GUARDED_BY(pend_mu_)
  bool flusher_failed_ = false;                // GUARDED_BY(pend_mu_)
  std::thread flusher_;                        // GUARDED_BY(pend_mu_) while it starts
};

}  // namespace

Expected<std::shared_ptr<Tier>> open_lmdb_tier(const std::string& dir, const DiskTierOptions& options) {
  // The map holds the entries plus B-tree overhead and pages kept for old
  // readers, and is the same in every process with the same or a smaller
  // limit, so none of them ever needs to re-map (lmdb_env.h).
  uint64_t map_size = lmdb_map_size(effective_max_bytes(options));
  bool sync_data = options.durability != Durability::none;
  bool sync_meta = options.durability == Durability::full;
  auto env = LmdbEnv::open(dir, map_size, sync_data, sync_meta, options.check_on_open);
  bool quarantined = false;
  std::shared_ptr<LmdbTier> tier;
  if (!env && env.error().code() == Errc::corrupt && !options.read_only) {
    // A store LMDB cannot use safely is moved aside, never deleted, and a
    // fresh one takes its place: the cache keeps working. Processes that
    // find it damaged at once take turns under a lock beside the folder, and
    // each looks again first, so a fresh store another one just made is
    // used, not moved aside in its turn.
    std::string lock_path = dir + ".quarantine-lock";
    int lfd = util::open_above_std(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd >= 0) {
      while (::flock(lfd, LOCK_EX) != 0 && errno == EINTR) {}
      env = LmdbEnv::open(dir, map_size, sync_data, sync_meta, options.check_on_open);
    }
    if (!env && env.error().code() == Errc::corrupt) {
      std::string aside = dir + ".corrupt-" + std::to_string(util::now_unix_ms()) + "-" + std::to_string(::getpid());
      KCACHE_LOG(LogLevel::warn, "%s; moved aside to %s", env.error().to_string().c_str(), aside.c_str());
      if (::rename(dir.c_str(), aside.c_str()) == 0) {
        env = LmdbEnv::open(dir, map_size, sync_data, sync_meta, options.check_on_open);
        quarantined = env.has_value();
        // Entries that still verify are copied over before the lock is let
        // go, so the processes waiting on it find them.
        if (quarantined) {
          tier = std::make_shared<LmdbTier>(env.value(), options);
          tier->salvage(aside, map_size);
        }
      }
    }
    if (lfd >= 0) ::close(lfd);
  }
  if (!env) return env.error();
  if (!tier) tier = std::make_shared<LmdbTier>(std::move(env).value(), options);
  if (quarantined) tier->note_corrupt();  // the store's own counters show it
  return std::shared_ptr<Tier>(std::move(tier));
}

}  // namespace kcache

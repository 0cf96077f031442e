// LMDB disk engine: the tier, its reads and its writes.
//
// One environment (data.mdb + lock.mdb) per folder, opened once per process
// (LMDB forbids opening an environment twice in one process, so handles are
// shared through a registry keyed by device and inode). Its records
// (lmdb_records.h): entries, their metadata and recency index, and the
// store's counters.
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
// counters in batches (lmdb_flusher.cc), so the hit path never takes the
// write lock.
//
// Nothing frees an entry's overflow run before its own page header checked
// out (LmdbEnv::overflow_run_intact): an entry whose run is damaged stays in
// place, a miss, until the next open moves the store aside and salvages the
// rest into a fresh one.
//
// The environment it shares with the leases is lmdb_env.cc; the structural
// check of the file at open is lmdb_check.cc; listing, verify, clear,
// salvage and eviction are lmdb_maintenance.cc.
#include <fcntl.h>
#include <lmdb.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <unordered_map>
#include <vector>

#include "entry/access.h"
#include "entry/buffer.h"
#include "kcache/env.h"
#include "kcache/tier.h"
#include "tier/core/counters.h"
#include "tier/lmdb/lmdb_env.h"
#include "tier/lmdb/lmdb_flusher.h"
#include "tier/lmdb/lmdb_maintenance.h"
#include "tier/lmdb/lmdb_records.h"
#include "util/util.h"

namespace kcache {

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
      : env_(std::move(env)),
        opt_(o),
        clock_(Env::or_posix(opt_.env)),
        limits_(effective_limits(o)),
        records_(*env_),
        maintenance_(*env_, records_, clock_, limits_.max_bytes, limits_.max_entries),
        flusher_(*env_, clock_, counters_, limits_.recency_batch, [this] { return flush(); }) {}
  ~LmdbTier() override {
    if (env_->inherited()) {
      // A child of fork(): nothing is flushed, the store belongs to the
      // parent, and the flusher is left as it is (RecencyFlusher::abandon).
      flusher_.abandon();
      return;
    }
    flusher_.stop();
    (void)flush();
  }

  std::string_view name() const noexcept override { return "lmdb"; }
  TierKind kind() const noexcept override { return TierKind::disk; }
  bool writable() const noexcept override { return !read_only_; }
  StoreAdmin* admin() noexcept override { return this; }

  // Counts a damaged store found (and moved aside) when opening.
  void note_corrupt() { count(c_corrupt); }

  // The intact entries of the store moved aside to `from_dir`, copied
  // into this fresh one (LmdbMaintenance::salvage).
  uint64_t salvage(const std::string& from_dir, uint64_t map_size) { return maintenance_.salvage(from_dir, map_size); }

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
    return maintenance_.list(fn);
  }

  Expected<VerifyReport> verify(bool fix) override {
    if (env_->inherited()) return env_->inherited_error();
    if (fix && read_only_) return refuse("verify --fix");
    (void)flush();
    return maintenance_.verify(fix);
  }

  Expected<uint64_t> trim(uint64_t max_bytes) override {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("trim");
    (void)flush();
    return maintenance_.evict(max_bytes, max_entries_);
  }

  Status clear() override {
    if (env_->inherited()) return env_->inherited_error();
    if (read_only_) return refuse("clear");
    flusher_.clear();
    return maintenance_.clear();
  }

 protected:
  std::string_view admin_name() const noexcept override { return name(); }

  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override {
    // In a child of fork() this returns before any lock or counter is
    // touched: a thread of the parent may have held them at the fork.
    if (env_->inherited()) return env_->inherited_error();
    KCACHE_TRY(MDB_txn * txn, env_->begin_read());
    MDB_val k = mdb_val(key), v;
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
    // An entry this process verified, at the same place with the same
    // header, skips the checksum pass (lmdb_verified.h); the header is
    // compared as it is in the bytes handed out.
    const bool memo = !opt_.verify_every_hit && bytes.size() >= kEntryHeaderSize;
    bool verified = false;
    std::shared_ptr<const Buffer> buf;
    if (env_->pinned.load(std::memory_order_relaxed) < kMaxPinned && !util::CopiedHits::active()) {
      verified = memo && env_->verified.contains(key, v.mv_data, v.mv_size, bytes.data());
      buf = std::make_shared<PinnedBuffer>(env_, txn, bytes);
    } else {
      // Each pinned hit holds a reader slot; a caller that keeps many
      // entries alive gets copies instead of exhausting the reader table.
      // A caller that copies every hit (util::CopiedHits) gets the copy
      // made here, under the guard, and verified in it.
      auto copy = std::make_shared<AlignedBuffer>(bytes.size());
      const bool copied = util::copy_guarded(copy->data(), bytes.data(), bytes.size());
      env_->end_read(txn);
      if (!copied) {
        env_->mark_lost(env_->dir() + "/data.mdb was truncated under this process");
        if (access != Access::peek) count(c_errors);
        return env_->lost_error();
      }
      verified = memo && env_->verified.contains(key, v.mv_data, v.mv_size, copy->data());
      buf = std::move(copy);
    }
    const char* header = buf->bytes().data();  // kept alive by the Entry
    auto e = verified ? EntryAccess::decode_verified(std::move(buf), &key) : Entry::decode(std::move(buf), &key);
    if (e && memo && !verified) env_->verified.add(key, v.mv_data, v.mv_size, header);
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
        if (!read_only_) (void)records_.remove_entry(key, false);
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
    return records_.remove_entry(key, false);
  }

  TierStats do_stats() override {
    if (env_->inherited()) return TierStats();  // the store's counters are the parent's
    CounterValues v{};
    auto txn = env_->begin_read();
    if (txn) {
      for (int i = 0; i < c_count; ++i) v[i] = records_.get_counter(*txn, i);
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
    RecencyFlusher::Touched touched;
    CounterDeltas counts;
  };
  Pending take_pending() {
    Pending p;
    p.touched = flusher_.take();
    p.counts = counters_.take();
    return p;
  }
  void restore_pending(const Pending& p) {
    counters_.restore(p.counts);
    flusher_.restore(p.touched);
  }

  // A read-only store records no recency (nothing is written there).
  void note_hit(const Key& key) {
    count(c_hits);
    if (!read_only_) flusher_.touched(key);
  }

  void miss_counted() {
    count(c_misses);
    if (!read_only_) flusher_.counted();
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
      (void)maintenance_.evict(static_cast<uint64_t>(max_bytes_ * low_water_ * 0.5), max_entries_);
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
      if (!rc) rc = records_.remove(txn, key, &old_size);
      // A damaged entry is left in place (the store is marked for salvage);
      // the rest of a group still goes in.
      if (rc == kRunDamaged && group.size() > 1) {
        rc = 0;
        continue;
      }
      MDB_val k = mdb_val(key), v;
      v.mv_size = enc.size();
      v.mv_data = nullptr;
      if (!rc) rc = mdb_put(txn, env_->entries, &k, &v, MDB_RESERVE);
      if (!rc) {
        std::memcpy(v.mv_data, enc.data(), enc.size());
        rc = records_.set_meta(txn, key, now, enc.size());
      }
      if (!rc) rc = records_.add_counter(txn, c_entries, 1);
      if (!rc) rc = records_.add_counter(txn, c_bytes, static_cast<int64_t>(enc.size()));
      if (!rc) rc = records_.add_counter(txn, c_puts, 1);
    }
    for (const auto& [tk, ms] : touched)
      if (!rc) rc = records_.touch(txn, tk, ms);
    if (!rc) rc = records_.add_counters(txn, counts);
    // The group is stored with the room it needs: the oldest entries go in
    // this transaction, so no commit leaves the store over its limits
    // (beyond what the group alone brings) and no writer waits behind
    // another's eviction.
    if (!rc && !group.empty()) rc = maintenance_.make_room_locked(txn, group);
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
    auto r = maintenance_.evict(static_cast<uint64_t>(max_bytes_ * low_water_),
                                static_cast<uint64_t>(max_entries_ * low_water_));
    if (!r) KCACHE_LOG(LogLevel::warn, "lmdb eviction failed: %s", r.error().to_string().c_str());
  }

  std::shared_ptr<LmdbEnv> env_;
  DiskTierOptions opt_;
  // The clock of recency records and marks (opt_.env, or the system's);
  // LMDB's own I/O does not go through it.
  Env& clock_;
  const DiskLimits limits_;
  const uint64_t max_bytes_ = limits_.max_bytes, max_entries_ = limits_.max_entries,
                 max_entry_ = limits_.max_entry_bytes;
  const double low_water_ = limits_.low_water;

  const bool read_only_ = opt_.read_only;

  PendingCounters counters_;  // counter deltas not yet stored
  StoreRecords records_;
  LmdbMaintenance maintenance_;
  RecencyFlusher flusher_;  // last: stopped before the rest goes
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

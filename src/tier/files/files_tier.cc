// File-per-entry disk engine, for folders that LMDB must not use (NFS).
//
// Layout under the tier's folder:
//   XX/<32 hex>.kce   one encoded entry per file; XX = first key byte (256
//                     shards keep folders small)
//   tmp/              files being written; published by rename(2), which is
//                     atomic on POSIX file systems including NFS
//   stats             8 little-endian u64 counters (hits, misses, puts,
//                     evictions, corrupt, errors, entries, bytes), updated
//                     under flock(2); that lock also covers every rename
//                     into place and every unlink of an entry, so entries/
//                     bytes stay exact with many writers
//   leases/           the store's lease files (lease/file_leases.cc)
//   evict.lock        flock(2)ed, without waiting, by the one process
//                     evicting; the kernel drops the lock when that process
//                     dies, so a killed evictor is followed at once
//
// Eviction: the evictor walks the shards and removes the oldest files to
// the low-water mark, at most kRemoveBatch per hold of the counters' lock.
// What a walk found and left stays with the process as candidates, oldest
// first; a put that would take the store over a limit removes candidates in
// the same hold of the lock as its rename, so writers make their own room
// and never queue behind an evictor.
//
// Files are made for this user only (0600, folders 0700). In a folder
// shared with a group (setgid and group-writable: Options::shared_group),
// entries are made group-readable, and folders and stats group-writable,
// with the modes set explicitly so the umask cannot take the group's access
// away (the lease files do the same for theirs).
//
// A reader opens the final path, so it sees a whole old entry, a whole new
// entry or nothing; every read is verified (header, key, checksum). Recency
// is each file's mtime, which this engine sets itself (utimensat) in batches,
// never atime. Totals in `stats` drift only when a process dies between a
// rename and the counter update (a few instructions); verify --fix and
// clear recompute them.
//
// The store folder is opened once (O_DIRECTORY | O_NOFOLLOW) and every name
// inside it is resolved from that descriptor (openat, renameat, unlinkat,
// ...), never from the folder's path again: a store folder that another
// user renames away and replaces while this process runs (or that a tmp
// cleaner removes and someone else makes anew) is never read or written
// here; a removed one leaves only misses and failed puts.
//
// Every file operation, clock read and sleep goes through the Env of the
// options (kcache/env.h), so tests can fill the disk, make it read-only,
// fail reads or move time by hand.
//
// One concept, the files engine: reads, puts, eviction, the counters and
// the administration are one class because they share one locking
// protocol (the stats lock over every rename and unlink, evict.lock, the
// eviction candidates a put removes in the same hold); split apart, each
// part would need the others' invariants.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "entry/buffer.h"
#include "kcache/env.h"
#include "kcache/tier.h"
#include "tier/core/counters.h"
#include "tier/files/files_probe.h"
#include "util/util.h"

namespace kcache {
namespace {

// The most entry files one hold of the counters' lock removes: eviction
// takes and gives back the lock between batches, so a put waits behind an
// evictor for one batch at most, never for a whole eviction.
constexpr size_t kRemoveBatch = 32;
// The most candidates a put looks at to make room for itself.
constexpr int kRoomLooks = 64;
// The file the one process evicting holds flock(2)ed.
constexpr const char* kEvictLock = "evict.lock";

// Entry files this process's walks have visited so far (files_probe.h).
std::atomic<uint64_t> g_files_visited{0};

void sub(uint64_t& v, uint64_t n) { v = n > v ? 0 : v - n; }

// A temp-file name no other process or thread can pick: the pid and a
// per-process sequence number are part of it (a random generator copied
// into forked children would repeat itself there).
std::string temp_name(Env& env, const std::string& prefix) {
  static std::atomic<uint64_t> seq{0};
  char b[64];
  std::snprintf(b, sizeof b, ".%d.%llu.%llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(seq.fetch_add(1, std::memory_order_relaxed)),
                static_cast<unsigned long long>(env.now_mono_us()));
  return prefix + b;
}

// Writes data to a fresh temp file in folder `dir` (synced when `sync`);
// on failure nothing is left behind. `where` names the folder in messages.
Status write_temp(Env& env, int dir, const std::string& where, const std::string& prefix, std::string_view data,
                  bool sync, unsigned mode, std::string* out) {
  std::string tmp = temp_name(env, prefix);
  int fd = env.openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return util::errno_status(errno, "create " + where + "/" + tmp);
  if (mode != 0600) (void)env.fchmod(fd, mode);
  int err = util::pwrite_all(env, fd, data);
  if (!err && sync && env.fdatasync(fd) != 0) err = errno;
  if (env.close(fd) != 0 && !err) err = errno;
  if (err) {
    env.unlinkat(dir, tmp);
    return util::errno_status(err, "write " + where + "/" + tmp);
  }
  *out = std::move(tmp);
  return Status();
}

class FilesTier final : public Tier, public StoreAdmin {
 public:
  FilesTier(std::string dir, const DiskTierOptions& o) : dir_(std::move(dir)), env_(o.env ? o.env : Env::posix()) {
    const DiskLimits l = effective_limits(o);
    max_bytes_ = l.max_bytes;
    max_entries_ = l.max_entries;
    low_water_ = l.low_water;
    max_entry_ = l.max_entry_bytes;
    batch_ = l.recency_batch;
    stale_temp_ms_ = l.stale_temp_ms;
    sync_ = o.durability != Durability::none;
    read_only_ = o.read_only;
  }
  ~FilesTier() override {
    (void)flush();
    if (dfd_ >= 0) env_->close(dfd_);
  }

  Status init() {
    if (!read_only_) {
      // The folder itself (and those above it) is made by path, once; what
      // is inside, only through the descriptor.
      shared_ = util::folder_is_shared(dir_, *env_);
      if (env_->mkdir(dir_, shared_ ? 02770 : 0700) != 0 && errno == ENOENT)
        (void)util::make_dirs(dir_, shared_ ? 02770 : 0700, *env_);
    }
    dfd_ = env_->open(dir_, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd_ < 0) return util::errno_status(errno, "open " + dir_);
    struct stat ds;
    shared_ = env_->fstat(dfd_, &ds) == 0 && (ds.st_mode & S_ISGID) && (ds.st_mode & S_IWGRP);
    if (read_only_) {
      // Nothing is made or collected: the store is only read.
      if (env_->accessat(dfd_, ".", R_OK | X_OK) != 0) return util::errno_status(errno, dir_);
      return Status();
    }
    Status st = make_dir("tmp");
    if (st.is_ok()) {
      int fd = open_shared_rw("stats", O_RDWR | O_CREAT | O_CLOEXEC);
      if (fd < 0)
        st = util::errno_status(errno, "open " + dir_ + "/stats");
      else
        env_->close(fd);
    }
    if (!st.is_ok()) {
      // A store this process may only read (a read-only mount, a shipped
      // folder of another user) still serves lookups; its writes fail as
      // read_only, which the Cache takes as "stop writing here".
      if (st.code() == Errc::read_only && env_->accessat(dfd_, ".", R_OK | X_OK) == 0) {
        KCACHE_LOG(LogLevel::info, "files store %s is read-only here (%s)", dir_.c_str(), st.to_string().c_str());
        return Status();
      }
      return st;
    }
    // Temp files of writers that died are collected at open too, not only
    // by walks, so a store that never fills does not keep them forever.
    collect_temps();
    return Status();
  }

  std::string_view name() const noexcept override { return "files"; }
  TierKind kind() const noexcept override { return TierKind::disk; }
  bool writable() const noexcept override { return !read_only_; }
  StoreAdmin* admin() noexcept override { return this; }

  Status flush() override {
    if (lost_.load(std::memory_order_relaxed)) return lost();
    return if_gone(flush_records());
  }

  // A store folder deleted while in use (its descriptor names a folder with
  // no links left): every later write and flush of this process is refused
  // at once with Errc::unavailable, which the Cache says once, instead of a
  // line per compile naming another shard.
  Status if_gone(Status st) {
    if (st.code() != Errc::not_found) return st;
    struct stat ds;
    if (env_->fstat(dfd_, &ds) != 0 || ds.st_nlink != 0) return st;
    lost_.store(true, std::memory_order_relaxed);
    return lost();
  }
  Status lost() const {
    return Status(Errc::unavailable,
                  "the store " + dir_ + " was deleted while in use; this process writes nothing more to it");
  }

  Status flush_records() {
    // A read-only store: a corrupt entry is reported and counted in this
    // process only, never removed; recency (mtimes) and counters are never
    // written; stale temp files are left for a writer to collect.
    if (read_only_) return Status();
    std::unordered_map<Key, uint64_t> touched;
    {
      std::lock_guard lk(mu_);
      touched.swap(touched_);
    }
    for (const auto& [k, ms] : touched) set_mtime_ms(path_of(k), ms);  // gone meanwhile: fine
    // Not stored (a read-only or failing disk): they stay pending here.
    return counters_.flush([&](const CounterDeltas& d) { return update_stored(d, nullptr); });
  }

  Status zero_counters() override {
    if (read_only_) return refuse("zero counters");
    counters_.add_zeroing(stats());
    return flush();
  }

  // Flushes recency, then waits for this tier's clock (which also stamps the
  // mtimes) to pass the current millisecond and returns the next one.
  Expected<uint64_t> mark() override {
    KCACHE_RETURN_IF_ERROR(flush());
    return env_->next_unix_ms();
  }

  void set_mtime_ms(const std::string& rel, uint64_t ms) { (void)env_->set_mtime_ms_at(dfd_, rel, ms); }

  Status list(const std::function<bool(const ListItem&)>& fn) override {
    bool go = true;
    return scan([&](const Key& k, const std::string&, const struct stat& st) {
      if (!go) return;
      go = fn(ListItem{k, static_cast<uint64_t>(st.st_size),
                       static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000});
    });
  }

  Expected<VerifyReport> verify(bool fix) override {
    if (fix && read_only_) return refuse("verify --fix");
    (void)flush();
    VerifyReport rep;
    std::vector<std::pair<Key, std::string>> paths;
    KCACHE_RETURN_IF_ERROR(
        scan([&](const Key& k, const std::string& p, const struct stat&) { paths.emplace_back(k, p); }));
    uint64_t other_format = 0;
    for (const auto& [k, p] : paths) {
      ++rep.checked;
      auto e = read_entry(k, p);
      if (!e && e.error().code() == Errc::not_found) continue;
      if (!e && e.error().code() == Errc::stale_format) {
        // Written by a build with another entry format, which may still
        // share the store (a rolling upgrade): unusable here, not damaged.
        ++other_format;
        continue;
      }
      if (!e) {
        rep.bad.emplace_back(k, e.error().message());
        if (fix && env_->unlinkat(dfd_, p) == 0) ++rep.removed;
      }
    }
    if (other_format)
      KCACHE_LOG(LogLevel::info, "files verify %s: %llu entries of another format version left in place", dir_.c_str(),
                 static_cast<unsigned long long>(other_format));
    if (fix) {
      counters_.add(c_corrupt, static_cast<int64_t>(rep.removed));
      (void)flush();
      KCACHE_RETURN_IF_ERROR(recount());
    }
    return rep;
  }

  Expected<uint64_t> trim(uint64_t max_bytes) override {
    if (read_only_) return refuse("trim");
    (void)flush();
    return evict(max_bytes, max_entries_);
  }

  Status clear() override {
    if (read_only_) return refuse("clear");
    {
      std::lock_guard lk(mu_);
      touched_.clear();
    }
    std::vector<std::string> paths;
    KCACHE_RETURN_IF_ERROR(scan([&](const Key&, const std::string& p, const struct stat&) { paths.push_back(p); }));
    for (const auto& p : paths)
      if (env_->unlinkat(dfd_, p) != 0 && errno != ENOENT) return util::errno_status(errno, "unlink " + full(p));
    return recount();
  }

 protected:
  std::string_view admin_name() const noexcept override { return name(); }

  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override {
    std::string p = path_of(key);
    auto e = read_entry(key, p);
    const bool peek = access == Access::peek;
    if (!e) {
      // Another build's entry is a miss, left for the build that reads it.
      if (e.error().code() == Errc::not_found || e.error().code() == Errc::stale_format) {
        if (access == Access::counted) count(c_misses);
        return std::optional<Entry>();
      }
      if (e.error().code() == Errc::corrupt) {
        // Counted (stored with the removal, in a read-only store in this
        // process only); a peek leaves it all as it was.
        if (!peek) {
          count(c_corrupt);
          if (!read_only_) remove_if_same(p);
        }
        return Status(Errc::corrupt, "files entry " + key.hex() + ": " + e.error().message());
      }
      if (!peek) count(c_errors);
      return e.error();
    }
    if (peek) return std::optional<Entry>(std::move(e).value());
    bool flush_now;
    const bool writes = !read_only_;
    count(c_hits);
    {
      std::lock_guard lk(mu_);
      if (writes) touched_[key] = env_->now_unix_ms();
      flush_now = writes && touched_.size() >= batch_;
    }
    if (flush_now) (void)flush();
    return std::optional<Entry>(std::move(e).value());
  }

  Status do_put(const Entry& entry) override {
    if (lost_.load(std::memory_order_relaxed)) return lost();
    return if_gone(put_entry(entry));
  }

  Status put_entry(const Entry& entry) {
    if (read_only_) return refuse("put");
    std::string_view enc = entry.encoded();
    if (enc.size() > max_entry_) {
      count(c_errors);
      return Status(Errc::too_large, "entry of " + util::format_size(enc.size()) + " exceeds the largest entry stored");
    }
    std::string final_path = path_of(entry.key());
    std::string shard = final_path.substr(0, 2);
    if (Status st = make_dir(shard); !st.is_ok()) {
      count(c_errors);
      return st;
    }
    // The temp file is written outside the lock; the rename and the counter
    // update happen under the counters' lock, so two processes replacing one
    // key cannot both count it as new.
    std::string tmp_prefix = "tmp/" + entry.key().hex();
    std::string tmp;
    Status st = write_temp(*env_, dfd_, dir_, tmp_prefix, enc, sync_, entry_mode(), &tmp);
    if (st.code() == Errc::not_found) {
      // tmp/ was removed (a cleaner, a user): make it again rather than fail
      // every later write. (A store folder that was removed stays removed.)
      (void)make_dir("tmp");
      st = write_temp(*env_, dfd_, dir_, tmp_prefix, enc, sync_, entry_mode(), &tmp);
    }
    if (!st.is_ok()) {
      count(c_errors);
      return st;
    }
    // The recency record starts at kcache's own clock, not the file
    // system's coarser one, so marks (StoreAdmin::mark) compare exactly.
    set_mtime_ms(tmp, env_->now_unix_ms());
    // A put that will need room and has no candidates left walks first,
    // outside the lock, so that it makes its room in the same hold of the
    // lock as it publishes (make_room_locked).
    {
      CounterValues pre{};
      struct stat old;
      const uint64_t adds = env_->statat(dfd_, final_path, &old) == 0 ? 0 : 1;
      if (read_counters(pre).is_ok() &&
          (pre[c_bytes] + enc.size() > max_bytes_ || pre[c_entries] + adds > max_entries_) && !has_candidates())
        refill_candidates();
    }
    // The room first, then the rename, in one hold of the lock: whoever
    // reads the totals never sees the store over its limit by more than
    // this entry. When the candidates run out (other processes removed
    // them), the put walks again outside the lock and tries once more; the
    // second time it publishes in any case.
    CounterValues totals{};
    bool published = false;
    for (int attempt = 0; attempt < 2 && !published; ++attempt) {
      if (attempt == 1) refill_candidates();
      st = with_counters(
          [&](CounterValues& v) {
            struct stat old;
            bool replaced = env_->statat(dfd_, final_path, &old) == 0;
            const uint64_t old_size = replaced ? static_cast<uint64_t>(old.st_size) : 0;
            const uint64_t adds = replaced ? 0 : 1;
            const bool room = make_room_locked(v, final_path, enc.size() > old_size ? enc.size() - old_size : 0, adds);
            if (!room && attempt == 0) return Status();
            if (env_->renameat(dfd_, tmp, final_path) != 0) return util::errno_status(errno, "rename " + full(tmp));
            published = true;
            v[c_puts] += 1;
            sub(v[c_bytes], old_size);
            v[c_entries] += adds;
            v[c_bytes] += enc.size();
            return Status();
          },
          &totals);
      if (!st.is_ok()) break;
    }
    if (!st.is_ok()) {
      env_->unlinkat(dfd_, tmp);
      count(c_errors);
      return st;
    }
    // A put that found no room above (no candidates left from a walk of
    // this process) evicts down to the low-water mark. One that finds
    // another process evicting does not wait for it: it walks the store
    // itself (without the evictor's lock) and makes its own room, so writers do not
    // pile up over the limit while the evictor works.
    auto over = [&] { return totals[c_bytes] > max_bytes_ || totals[c_entries] > max_entries_; };
    bool busy = false;
    for (int pass = 0; pass < 4 && over() && !busy; ++pass) {
      auto r = evict(static_cast<uint64_t>(max_bytes_ * low_water_), static_cast<uint64_t>(max_entries_ * low_water_),
                     &busy);
      if (!r) {
        KCACHE_LOG(LogLevel::warn, "files eviction: %s", r.error().to_string().c_str());
        return Status();
      }
      if (!read_counters(totals).is_ok()) return Status();
    }
    if (busy && over()) {
      refill_candidates();
      (void)with_counters([&](CounterValues& v) {
        (void)make_room_locked(v, final_path, 0, 0);
        return Status();
      });
    }
    return Status();
  }

  Status do_remove(const Key& key) override {
    if (read_only_) return refuse("remove");
    std::string p = path_of(key);
    struct stat pre;
    if (env_->statat(dfd_, p, &pre) != 0) return Status();
    return with_counters([&](CounterValues& v) {
      struct stat st;
      if (env_->statat(dfd_, p, &st) != 0) return Status();
      if (env_->unlinkat(dfd_, p) != 0) {
        if (errno == ENOENT) return Status();
        return util::errno_status(errno, "unlink " + full(p));
      }
      sub(v[c_entries], 1);
      sub(v[c_bytes], static_cast<uint64_t>(st.st_size));
      return Status();
    });
  }

  TierStats do_stats() override {
    CounterValues v{};
    (void)read_counters(v);
    return counters_.stats(v);
  }

 private:
  // An entry file as an eviction walk found it.
  struct Item {
    uint64_t mtime_ns;
    ino_t ino;
    uint64_t size;
    std::string path;  // relative to the store folder
  };

  Status refuse(const char* what) { return counters_.refuse(what, dir_); }

  // Modes (see the top): this user only, or the group of a shared folder.
  unsigned entry_mode() const noexcept { return shared_ ? 0640 : 0600; }
  // A folder directly in the store folder.
  Status make_dir(const std::string& rel) const {
    if (env_->mkdirat(dfd_, rel, shared_ ? 02770 : 0700) != 0) {
      if (errno == EEXIST) return Status();
      return util::errno_status(errno, "mkdir " + full(rel));
    }
    if (shared_) (void)env_->chmodat(dfd_, rel, 02770);
    return Status();
  }
  int open_shared_rw(const std::string& rel, int flags) const {
    int fd = env_->openat(dfd_, rel, flags, shared_ ? 0660 : 0600);
    if (fd >= 0 && shared_ && (flags & O_CREAT)) {
      struct stat st;
      if (env_->fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 0777) != 0660)
        (void)env_->fchmod(fd, 0660);
    }
    return fd;
  }

  // An entry's name, relative to the store folder.
  std::string path_of(const Key& k) const {
    std::string h = k.hex();
    return h.substr(0, 2) + "/" + h + ".kce";
  }
  // A name relative to the store folder as messages give it.
  std::string full(const std::string& rel) const { return dir_ + "/" + rel; }

  void count(StoreCounter c) { counters_.add(c); }

  Expected<Entry> read_entry(const Key& key, const std::string& p) {
    int fd = env_->openat(dfd_, p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return util::errno_status(errno, "open " + full(p));
    struct stat st;
    if (env_->fstat(fd, &st) != 0) {
      int e = errno;
      env_->close(fd);
      return util::errno_status(e, "stat " + full(p));
    }
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < kEntryHeaderSize || size > kMaxEntrySize + kEntryHeaderSize) {
      env_->close(fd);
      return Status(Errc::corrupt, "file size " + std::to_string(size) + " is impossible");
    }
    auto buf = std::make_shared<AlignedBuffer>(size);
    size_t got = 0;
    while (got < size) {
      ssize_t n = env_->pread(fd, buf->data() + got, size - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int e = errno;
        env_->close(fd);
        return util::errno_status(e, "read " + full(p));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    env_->close(fd);
    if (got != size) return Status(Errc::corrupt, "file shrank while read");
    return Entry::decode(std::move(buf), &key);
  }

  // Unlinks p only if it is still the file we found bad (a writer may have
  // just published a good one in its place).
  void remove_if_same(const std::string& p) {
    int fd = env_->openat(dfd_, p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat a;
    bool ok = env_->fstat(fd, &a) == 0;
    env_->close(fd);
    if (!ok) return;
    (void)with_counters([&](CounterValues& v) {
      struct stat b;
      if (env_->statat(dfd_, p, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) return Status();
      if (env_->unlinkat(dfd_, p) == 0) {
        sub(v[c_entries], 1);
        sub(v[c_bytes], static_cast<uint64_t>(a.st_size));
      }
      return Status();
    });
  }

  Status read_counters(CounterValues& v) {
    int fd = env_->openat(dfd_, "stats", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return util::errno_status(errno, "open " + full("stats"));
    char b[8 * c_count] = {};
    ssize_t n = env_->pread(fd, b, sizeof b, 0);
    int e = errno;
    env_->close(fd);
    if (n < 0) return util::errno_status(e, "read stats");
    for (int i = 0; i < c_count; ++i) v[i] = n == static_cast<ssize_t>(sizeof b) ? util::get_u64(b + 8 * i) : 0;
    return Status();
  }

  // Runs fn on the stored counters under an exclusive flock of `stats`,
  // after adding this process's pending deltas, and stores the result. Every
  // change of the set of published files that the counters describe (rename
  // into place, unlink) happens inside fn, so the counters stay exact across
  // processes; only a process killed inside fn can make them drift (verify
  // --fix recounts). Returns the new totals in `out` when given.
  // When fn ran but the totals could not be written back, what fn did
  // (published or removed files) still happened: its change to the totals
  // is kept pending with the deltas, and fn's own result is returned.
  template <class F>
  Status with_counters(F&& fn, CounterValues* out = nullptr) {
    const CounterDeltas d = counters_.take();
    Status fn_status;
    bool ran = false;
    CounterDeltas unstored = d;
    Status stored = update_stored(
        d,
        [&](CounterValues& v) {
          ran = true;
          const CounterValues before = v;
          fn_status = fn(v);
          for (int i = 0; i < c_count; ++i) unstored[i] += static_cast<int64_t>(v[i]) - static_cast<int64_t>(before[i]);
          return fn_status;
        },
        out);
    if (stored.is_ok()) return fn_status;
    counters_.restore(ran ? unstored : d);  // stored on a later flush
    return ran ? fn_status : stored;
  }

  // The store function of the counters: adds `d` to the stored counters,
  // then runs fn (when given) on them, and writes them back, all under the
  // flock. Returns whether `d` was stored; fn's own result is fn's to keep.
  template <class F = std::nullptr_t>
  Status update_stored(const CounterDeltas& d, F&& fn, CounterValues* out = nullptr) {
    std::string p = full("stats");
    int fd = open_shared_rw("stats", O_RDWR | O_CREAT | O_CLOEXEC);
    if (fd < 0) return util::errno_status(errno, "open " + p);
    while (env_->flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
    char b[8 * c_count] = {};
    ssize_t n = env_->pread(fd, b, sizeof b, 0);
    if (n < 0) {
      // Unreadable totals must not be replaced by this process's deltas
      // alone: keep them pending and leave the file as it is.
      Status rs = util::errno_status(errno, "read " + p);
      env_->flock(fd, LOCK_UN);
      env_->close(fd);
      return rs;
    }
    CounterValues v{};
    for (int i = 0; i < c_count; ++i) v[i] = n == static_cast<ssize_t>(sizeof b) ? util::get_u64(b + 8 * i) : 0;
    add_deltas(v, d);
    if constexpr (!std::is_same_v<std::decay_t<F>, std::nullptr_t>) (void)fn(v);
    std::string w;
    for (int i = 0; i < c_count; ++i) util::put_u64(w, v[i]);
    ssize_t wn = env_->pwrite(fd, w.data(), w.size(), 0);
    int e = errno;
    env_->flock(fd, LOCK_UN);
    env_->close(fd);
    if (wn != static_cast<ssize_t>(w.size())) return util::errno_status(wn < 0 ? e : ENOSPC, "write " + p);
    if (out) *out = v;
    return Status();
  }

  // Calls fn for every entry file; also collects stale temp files.
  Status scan(const std::function<void(const Key&, const std::string&, const struct stat&)>& fn) {
    std::vector<std::string> names;
    for (int s = 0; s < 256; ++s) {
      char sh[3];
      std::snprintf(sh, sizeof sh, "%02x", s);
      std::string d = sh;
      names.clear();
      if (env_->list_dir_at(dfd_, d, &names) != 0) continue;
      for (const std::string& n : names) {
        if (n.size() != 36 || !n.ends_with(".kce")) continue;
        auto k = Digest::from_hex(std::string_view(n).substr(0, 32));
        if (!k) continue;
        std::string p = d + "/" + n;
        struct stat st;
        if (env_->statat(dfd_, p, &st) != 0) continue;
        g_files_visited.fetch_add(1, std::memory_order_relaxed);
        fn(*k, p, st);
      }
    }
    collect_temps();
    return Status();
  }

  void collect_temps() {
    if (read_only_) return;
    std::string d = "tmp";
    std::vector<std::string> names;
    if (env_->list_dir_at(dfd_, d, &names) != 0) return;
    uint64_t now = env_->now_unix_ms();
    for (const std::string& n : names) {
      if (n[0] == '.') continue;
      std::string p = d + "/" + n;
      struct stat st;
      if (env_->statat(dfd_, p, &st) != 0) continue;
      uint64_t mt = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000;
      if (mt + stale_temp_ms_ < now) env_->unlinkat(dfd_, p);
    }
  }

  // Sets entries/bytes from a walk of the store, under the counters' lock so
  // that no publish or unlink lands between the walk and the store.
  Status recount() {
    return with_counters([&](CounterValues& v) {
      uint64_t n = 0, bytes = 0;
      KCACHE_RETURN_IF_ERROR(scan([&](const Key&, const std::string&, const struct stat& st) {
        ++n;
        bytes += static_cast<uint64_t>(st.st_size);
      }));
      v[c_entries] = n;
      v[c_bytes] = bytes;
      return Status();
    });
  }

  // The oldest entry files of this process's last eviction walk that it
  // did not remove, oldest first: a put over a limit removes from them,
  // under the counters' lock it already holds, the room it needs (each
  // one checked as eviction checks it; gone or used since: passed over).
  // REQUIRES: the counters' lock (inside with_counters' fn).
  // Returns whether the store now has room for `bytes` and `entries` more
  // (true also when it does not act: see below).
  bool make_room_locked(CounterValues& v, const std::string& keep, uint64_t bytes, uint64_t entries) {
    std::lock_guard lk(cand_mu_);
    // Totals far beyond what the walk found (a damaged `stats` file) are
    // not acted on here: eviction recounts them first.
    if (v[c_bytes] > walked_bytes_ + max_bytes_ / 2 + kMaxEntrySize || v[c_entries] > 2 * walked_entries_ + 1024)
      return true;
    auto over = [&] { return v[c_bytes] + bytes > max_bytes_ || v[c_entries] + entries > max_entries_; };
    for (int looked = 0; over() && next_candidate_ < candidates_.size() && looked < kRoomLooks; ++looked) {
      const Item& it = candidates_[next_candidate_++];
      if (it.path != keep && remove_if_unchanged(it, v)) v[c_evictions] += 1;
    }
    return !over();
  }

  // Unlinks the walked file if it is still the one walked (same inode,
  // same mtime: not replaced, not used since). REQUIRES: the counters' lock.
  bool remove_if_unchanged(const Item& it, CounterValues& v) {
    struct stat cur;
    if (env_->statat(dfd_, it.path, &cur) != 0 || cur.st_ino != it.ino ||
        static_cast<uint64_t>(cur.st_mtim.tv_sec) * 1000000000ull + cur.st_mtim.tv_nsec != it.mtime_ns)
      return false;
    if (env_->unlinkat(dfd_, it.path) != 0) return false;
    sub(v[c_entries], 1);
    sub(v[c_bytes], static_cast<uint64_t>(cur.st_size));
    return true;
  }

  // Every entry file, oldest first (a walk; no lock held).
  std::vector<Item> walk_by_age() {
    std::vector<Item> items;
    (void)scan([&](const Key&, const std::string& p, const struct stat& s) {
      items.push_back({static_cast<uint64_t>(s.st_mtim.tv_sec) * 1000000000ull + s.st_mtim.tv_nsec, s.st_ino,
                       static_cast<uint64_t>(s.st_size), p});
    });
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.mtime_ns < b.mtime_ns; });
    return items;
  }

  // Whether a candidate that is still there is left, passing over those
  // other processes removed since this one's walk (a bounded look).
  bool has_candidates() {
    std::lock_guard lk(cand_mu_);
    for (int looked = 0; next_candidate_ < candidates_.size() && looked < kRoomLooks; ++looked) {
      struct stat st;
      if (env_->statat(dfd_, candidates_[next_candidate_].path, &st) == 0) return true;
      ++next_candidate_;
    }
    return false;
  }

  void refill_candidates() {
    std::vector<Item> items = walk_by_age();
    std::lock_guard lk(cand_mu_);
    walked_bytes_ = 0;
    for (const auto& it : items) walked_bytes_ += it.size;
    walked_entries_ = items.size();
    candidates_ = std::move(items);
    next_candidate_ = 0;
  }

  // One evictor at a time: within this object the evict mutex, across
  // objects and processes an exclusive flock(2) of `evict.lock`, tried
  // without waiting. The kernel drops it when its holder dies, however it
  // dies, so an evictor killed mid-eviction is followed at once: no record
  // to judge, no age to wait out. The lock only spares two processes the
  // same walk: when its file cannot be opened (a full disk, the very case
  // eviction is for), this process evicts without it.
  // Returns the locked descriptor (-1 without one); *busy when another
  // holds it.
  int lock_evictor(bool* busy) {
    int fd = open_shared_rw(kEvictLock, O_RDWR | O_CREAT | O_CLOEXEC);
    if (fd < 0) return -1;
    if (env_->flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    const int err = errno;
    env_->close(fd);
    *busy = err == EWOULDBLOCK;
    return -1;
  }

  // The walk that orders files by recency runs without the counters' lock;
  // the unlinks run under it, each one skipping a file that was replaced or
  // used since the walk, so totals stay exact while others put.
  // Sets *busy when another process is evicting (and does nothing).
  Expected<uint64_t> evict(uint64_t target_bytes, uint64_t target_entries, bool* busy = nullptr) {
    std::unique_lock one(evict_mu_, std::try_to_lock);
    if (!one.owns_lock()) {
      if (busy) *busy = true;
      return uint64_t(0);
    }
    bool other = false;
    const int lock_fd = lock_evictor(&other);
    if (other) {
      if (busy) *busy = true;
      return uint64_t(0);
    }
    std::vector<Item> items;
    Status st = scan([&](const Key&, const std::string& p, const struct stat& s) {
      items.push_back({static_cast<uint64_t>(s.st_mtim.tv_sec) * 1000000000ull + s.st_mtim.tv_nsec, s.st_ino,
                       static_cast<uint64_t>(s.st_size), p});
    });
    uint64_t removed = 0;
    if (st.is_ok()) {
      // Totals far beyond what the walk found (a damaged `stats` file, or one
      // written by a process killed mid-update) would make this loop delete
      // every entry; recount them first. Puts racing with the walk cannot
      // add more than a few entries, far below this margin.
      uint64_t walked_bytes = 0;
      for (const auto& it : items) walked_bytes += it.size;
      CounterValues cur{};
      if (read_counters(cur).is_ok() &&
          (cur[c_entries] > 2 * items.size() + 1024 || cur[c_bytes] > walked_bytes + max_bytes_ / 2)) {
        KCACHE_LOG(LogLevel::warn,
                   "files tier %s: stored totals (%llu entries, %llu bytes) disagree with the store; "
                   "recounting",
                   dir_.c_str(), static_cast<unsigned long long>(cur[c_entries]),
                   static_cast<unsigned long long>(cur[c_bytes]));
        st = recount();
      }
    }
    size_t next = 0;
    if (st.is_ok()) {
      std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.mtime_ns < b.mtime_ns; });
      // In batches, each under its own hold of the counters' lock: puts go
      // on between them.
      for (bool more = true; st.is_ok() && more && next < items.size();) {
        st = with_counters([&](CounterValues& v) {
          uint64_t n = 0;
          for (size_t end = std::min(items.size(), next + kRemoveBatch); next < end; ++next) {
            if (v[c_bytes] <= target_bytes && v[c_entries] <= target_entries) break;
            if (remove_if_unchanged(items[next], v)) ++n;
          }
          more = v[c_bytes] > target_bytes || v[c_entries] > target_entries;
          v[c_evictions] += n;
          removed += n;
          return Status();
        });
      }
    }
    {
      // What is left, oldest first, is where later puts make their room.
      std::lock_guard lk(cand_mu_);
      walked_bytes_ = 0;
      for (const auto& it : items) walked_bytes_ += it.size;
      walked_entries_ = items.size();
      candidates_.assign(std::make_move_iterator(items.begin() + static_cast<ptrdiff_t>(std::min(next, items.size()))),
                         std::make_move_iterator(items.end()));
      next_candidate_ = 0;
    }
    if (lock_fd >= 0) {
      env_->flock(lock_fd, LOCK_UN);
      env_->close(lock_fd);
    }
    if (!st.is_ok()) return st;
    return removed;
  }

  std::string dir_;                 // for messages only
  int dfd_ = -1;                    // the store folder, held from init (see the top)
  const std::shared_ptr<Env> env_;  // never null
  bool shared_ = false;             // dir_ is shared with its group (see the top)
  uint64_t max_bytes_, max_entries_, max_entry_, stale_temp_ms_;
  double low_water_;
  unsigned batch_;
  bool sync_;
  bool read_only_ = false;         // DiskTierOptions::read_only
  std::atomic<bool> lost_{false};  // the store folder was deleted while in use (if_gone)
  std::mutex mu_;
  std::unordered_map<Key, uint64_t> touched_;  // GUARDED_BY(mu_)
  PendingCounters counters_;                   // deltas not yet in `stats`
  std::mutex evict_mu_;                        // one eviction of this object at a time
  std::mutex cand_mu_;                         // taken inside the counters' lock, never around it
  std::vector<Item> candidates_;               // GUARDED_BY(cand_mu_): see make_room_locked
  size_t next_candidate_ = 0;
  uint64_t walked_bytes_ = 0, walked_entries_ = 0;  // GUARDED_BY(cand_mu_): what that walk found             //
                                                    // GUARDED_BY(cand_mu_): the first not yet looked at
};

}  // namespace

uint64_t files_entries_visited() noexcept { return g_files_visited.load(std::memory_order_relaxed); }

Expected<std::shared_ptr<Tier>> open_files_tier(const std::string& dir, const DiskTierOptions& options) {
  auto t = std::make_shared<FilesTier>(dir, options);
  KCACHE_RETURN_IF_ERROR(t->init());
  return std::shared_ptr<Tier>(std::move(t));
}

}  // namespace kcache

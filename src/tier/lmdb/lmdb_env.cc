// The per-process LMDB environment of one store folder (lmdb_env.h): the
// registry that shares it between tier objects and leases, the checks and
// named databases of an open, the pool of read transactions, the write
// transactions, and what a child of fork() may not touch.
#include "tier/lmdb/lmdb_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "tier/lmdb/lmdb_check.h"
#include "util/util.h"

namespace kcache {

Status mdb_status(int rc, std::string_view what) {
  Errc c = Errc::io_error;
  if (rc == MDB_MAP_FULL)
    c = Errc::no_space;
  else if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    c = Errc::corrupt;
  else if (rc == EACCES || rc == EROFS)
    c = Errc::read_only;
  else if (rc == ENOSPC || rc == EDQUOT)
    c = Errc::no_space;
  return Status(c, std::string("lmdb ") + std::string(what) + ": " + mdb_strerror(rc));
}

uint64_t lmdb_map_size(uint64_t max_bytes) noexcept {
  constexpr uint64_t kFloor = uint64_t(64) << 30, kSlack = uint64_t(64) << 20;
  constexpr uint64_t kCeiling = uint64_t(1) << 46;  // 64 TiB: within any 64-bit address space
  uint64_t want = max_bytes > (kCeiling - kSlack) / 2 ? kCeiling : 2 * max_bytes + kSlack;
  want = std::max(want, kFloor);
  long ps = ::sysconf(_SC_PAGESIZE);
  uint64_t page = ps > 0 ? static_cast<uint64_t>(ps) : 4096;
  return (want + page - 1) / page * page;
}

namespace {

// LMDB 0.9.24 opens data.mdb without close-on-exec (its lock file and the
// second data-file handle have it): a program the process execs would keep
// the store open. Sets FD_CLOEXEC on every descriptor of this process that
// refers to the store's files. Another thread exec'ing between
// mdb_env_open and this scan can still pass one on: LMDB offers no hook to
// open with O_CLOEXEC.
void set_cloexec_on_store_fds(MDB_env* env, const std::string& dir) {
  auto mark = [](int fd) {
    int fl = ::fcntl(fd, F_GETFD);
    if (fl >= 0 && !(fl & FD_CLOEXEC)) (void)::fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
  };
  mdb_filehandle_t fd;
  if (mdb_env_get_fd(env, &fd) == 0 && fd >= 0) mark(fd);
  // 0.9.24 and the later 0.9 releases open every other handle with
  // O_CLOEXEC: the one LMDB returns is the only one to mark, and the scan
  // of every descriptor (about 60 µs of a warm start) is for the others.
  int major = 0, minor = 0, patch = 0;
  mdb_version(&major, &minor, &patch);
  if (major == 0 && minor == 9 && patch >= 24) return;
  struct stat data_st, lock_st;
  bool have_data = ::stat((dir + "/data.mdb").c_str(), &data_st) == 0;
  bool have_lock = ::stat((dir + "/lock.mdb").c_str(), &lock_st) == 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return;
  int self = ::dirfd(d);
  while (struct dirent* de = ::readdir(d)) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
    int n = std::atoi(de->d_name);
    struct stat st;
    if (n == self || ::fstat(n, &st) != 0) continue;
    bool ours = (have_data && st.st_dev == data_st.st_dev && st.st_ino == data_st.st_ino) ||
                (have_lock && st.st_dev == lock_st.st_dev && st.st_ino == lock_st.st_ino);
    if (ours) mark(n);
  }
  ::closedir(d);
}

// The maps of this process's open environments (LmdbEnv::map_base_), so
// that find_map never takes another handle's map of the same file for its
// own: a handle inherited across fork() keeps one, and one being closed on
// another thread is unmapped before it leaves this set. Its own mutex, not
// the registry's: an environment is also destroyed with that one held.
std::mutex& live_maps_mu() {
  static auto* mu = new std::mutex();  // never destroyed: used until exit
  return *mu;
}
std::set<const unsigned char*>& live_maps() {
  static auto* maps = new std::set<const unsigned char*>();
  return *maps;
}

}  // namespace

LmdbEnv::~LmdbEnv() {
  if (inherited()) {
    // A child of fork(): aborting a pooled transaction would free the
    // parent's reader slot, and closing the environment would close the
    // lock file and with it this process's fcntl lock on it, held for a
    // fresh environment the child may have opened on the same store
    // (LMDB's "first opener resets the lock file" check relies on it).
    // Leave it all; exit or exec releases the memory and descriptors.
    return;
  }
  for (MDB_txn* t : idle_) mdb_txn_abort(t);
  if (env_) mdb_env_close(env_);
  if (map_base_) {
    std::lock_guard lk(live_maps_mu());
    live_maps().erase(map_base_);
  }
  if (gate_fd_ >= 0) ::close(gate_fd_);
}

bool LmdbEnv::inherited() const noexcept { return fork_gen_ != util::fork_generation(); }

Status LmdbEnv::inherited_error() {
  uint64_t gen = util::fork_generation();
  if (fork_logged_gen_.exchange(gen, std::memory_order_relaxed) != gen)
    KCACHE_LOG(LogLevel::warn, "lmdb store %s was opened before fork(); open a new Cache in the child to use it",
               dir_.c_str());
  return Status(Errc::unavailable, "lmdb store " + dir_ + " opened before fork(); open a new Cache in the child");
}

Status LmdbEnv::resized_error() {
  // Re-mapping (mdb_env_set_mapsize) would move the map under the hits this
  // process still holds; the handle keeps its map, and the store is a miss
  // here until the process opens it again.
  if (!resized_logged_.exchange(true, std::memory_order_relaxed))
    KCACHE_LOG(LogLevel::warn,
               "lmdb store %s: the store's map was grown by a process with a larger size limit; reopen to use it",
               dir_.c_str());
  return Status(Errc::unavailable, "lmdb store " + dir_ +
                                       ": the store's map was grown by a process with a larger size limit; reopen "
                                       "to use it");
}

Expected<std::shared_ptr<LmdbEnv>> LmdbEnv::open(const std::string& dir, uint64_t map_size, bool sync_data,
                                                 bool sync_meta, bool check_structure) {
  KCACHE_RETURN_IF_ERROR(util::make_dirs(dir));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return util::errno_status(errno, "stat " + dir);

  static std::mutex reg_mu;
  static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<LmdbEnv>> registry;
  std::lock_guard lk(reg_mu);
  auto id = std::make_pair(st.st_dev, st.st_ino);
  if (auto it = registry.find(id); it != registry.end()) {
    // A handle inherited through fork() is never shared: this process
    // opens its own.
    if (auto sp = it->second.lock(); sp && !sp->inherited()) {
      if (sp->map_size_ < map_size)
        KCACHE_LOG(LogLevel::info, "lmdb store %s is already open in this process with a %s map; %s asked for",
                   dir.c_str(), util::format_size(sp->map_size_).c_str(), util::format_size(map_size).c_str());
      return sp;
    }
  }

  auto env = std::shared_ptr<LmdbEnv>(new LmdbEnv());
  env->sync_data_ = sync_data;
  env->sync_meta_ = sync_meta;
  env->fork_gen_ = util::fork_generation();
  env->map_size_ = map_size;
  env->dir_ = dir;
  int rc = mdb_env_create(&env->env_);
  if (rc) return mdb_status(rc, "env_create");
  mdb_env_set_maxdbs(env->env_, 8);
  mdb_env_set_maxreaders(env->env_, 1022);
  mdb_env_set_mapsize(env->env_, map_size);
  std::string data = dir + "/data.mdb";
  if (::access(damaged_marker(dir).c_str(), F_OK) == 0)
    return Status(Errc::corrupt, "lmdb store " + dir + " was marked damaged (" + damaged_marker(dir) + ")");
  KCACHE_RETURN_IF_ERROR(check_metas_before_open(data));
  unsigned flags = MDB_NOTLS | MDB_NORDAHEAD;
  if (!sync_data)
    flags |= MDB_NOSYNC;
  else if (!sync_meta)
    flags |= MDB_NOMETASYNC;
  // LMDB opens its files inside mdb_env_open: none of them may take a
  // closed descriptor 0, 1 or 2, or what the program writes to its standard
  // output or error would land in the store.
  util::reserve_std_fds();
  rc = mdb_env_open(env->env_, dir.c_str(), flags, 0600);
  if (rc) return mdb_status(rc, "open " + dir);
  set_cloexec_on_store_fds(env->env_, dir);
  util::note_store_file(data);
  util::note_store_file(dir + "/lock.mdb");
  int dead = 0;
  mdb_reader_check(env->env_, &dead);

  // A data file may end before the last pages the meta page counts (pages
  // LMDB left unwritten, all free: lmdb_check.cc); a page in use beyond the
  // end is check_tree's to find, and faults under a guard on lookup.
  MDB_stat mst;
  mdb_env_stat(env->env_, &mst);
  struct stat fst;
  bool have_fst = ::stat(data.c_str(), &fst) == 0;
  if (have_fst && static_cast<uint64_t>(fst.st_size) < 2ull * mst.ms_psize)
    return Status(Errc::corrupt, "lmdb data file " + data + " is truncated");
  if (have_fst) env->largest_size_.store(static_cast<uint64_t>(fst.st_size));
  env->psize_ = mst.ms_psize;
  if (have_fst) env->find_map(fst);
  // Through LMDB's own map where it was found: the pages the check reads
  // are then mapped for the lookups that follow, not faulted in twice.
  if (check_structure) KCACHE_RETURN_IF_ERROR(check_tree(env->env_, data, env->map_base_, env->map_len_));
  env->gate_fd_ = util::open_above_std((dir + "/lock.mdb").c_str(), O_RDONLY | O_CLOEXEC);
  KCACHE_RETURN_IF_ERROR(env->open_databases());
  registry[id] = env;
  return env;
}

void LmdbEnv::mark_lost(const std::string& why) {
  std::lock_guard lk(lost_mu_);
  if (lost_.load()) return;
  lost_why_ = why;
  lost_.store(true);
}

Status LmdbEnv::lost_error() const {
  std::string why;
  {
    std::lock_guard lk(lost_mu_);
    why = lost_why_;
  }
  return Status(Errc::unavailable, "lmdb store " + dir_ + ": " + why + "; not used until opened again");
}

Status LmdbEnv::check_data_file() {
  if (lost()) return lost_error();
  mdb_filehandle_t fd;
  if (mdb_env_get_fd(env_, &fd) != 0 || fd < 0) return Status();
  // LMDB only ever grows the file: one smaller than this process has seen
  // it was cut under it. (Not the meta page's page count: the file may end
  // before pages LMDB left unwritten, lmdb_check.cc.) The size seen so far
  // is read before this look at the file: read after it, another thread's
  // later (larger) look could have been recorded in between, and this
  // thread's older size would read as a file that shrank.
  const uint64_t seen_before = largest_size_.load();
  struct stat open_st, path_st;
  if (::fstat(fd, &open_st) != 0) return Status();
  const std::string data = dir_ + "/data.mdb";
  if (open_st.st_nlink == 0 || ::stat(data.c_str(), &path_st) != 0 || path_st.st_dev != open_st.st_dev ||
      path_st.st_ino != open_st.st_ino) {
    mark_lost("the store was deleted or replaced while in use (" + data + " is no longer the file open here)");
    return lost_error();
  }
  const uint64_t size = static_cast<uint64_t>(open_st.st_size);
  uint64_t seen = largest_size_.load();
  while (size > seen && !largest_size_.compare_exchange_weak(seen, size)) {}
  if (size < seen_before || size < 2ull * psize_) {
    mark_lost(data + " was truncated under this process");
    return lost_error();
  }
  return Status();
}

int LmdbEnv::get_guarded(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, MDB_val* value) {
  struct Get {
    MDB_txn* txn;
    MDB_dbi dbi;
    MDB_val* key;
    MDB_val* value;
    int rc;
  } g{txn, dbi, key, value, EFAULT};
  // mdb_get in a read transaction only reads the map: no lock, no
  // allocation, nothing to undo when a SIGBUS cuts it short.
  bool ok = util::run_guarded(
      +[](void* p) {
        auto* g = static_cast<Get*>(p);
        g->rc = mdb_get(g->txn, g->dbi, g->key, g->value);
        if (g->rc != 0) return;
        const auto* b = static_cast<const volatile unsigned char*>(g->value->mv_data);
        for (size_t i = 0; i < g->value->mv_size; i += 4096) (void)b[i];
        if (g->value->mv_size) (void)b[g->value->mv_size - 1];
      },
      &g);
  if (ok) return g.rc;
  mark_lost(dir_ + "/data.mdb was truncated under this process");
  return EFAULT;
}

Expected<MDB_txn*> LmdbEnv::begin_read() {
  if (inherited()) return inherited_error();
  if (lost()) return lost_error();
  MDB_txn* t = nullptr;
  {
    std::lock_guard lk(mu_);
    if (!idle_.empty()) {
      t = idle_.back();
      idle_.pop_back();
    }
  }
  int rc;
  if (t) {
    rc = mdb_txn_renew(t);
    if (rc == 0) return t;
    mdb_txn_abort(t);
    if (rc == MDB_MAP_RESIZED) return resized_error();
  }
  rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &t);
  if (rc == MDB_READERS_FULL) {
    int dead = 0;
    mdb_reader_check(env_, &dead);
    rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &t);
  }
  if (rc == MDB_MAP_RESIZED) return resized_error();
  if (rc) return mdb_status(rc, "begin read");
  return t;
}

void LmdbEnv::end_read(MDB_txn* t) {
  // In a child of fork() the transaction's reader slot is the parent's:
  // resetting it would unpin the parent's snapshot. Leak the handle.
  if (inherited()) return;
  mdb_txn_reset(t);
  std::lock_guard lk(mu_);
  if (idle_.size() < 16) {
    idle_.push_back(t);
    return;
  }
  mdb_txn_abort(t);
}

// The named databases of a store that has them are opened in a read
// transaction, so opening an existing store never waits on the writer; only
// a new store (or one written by a version without all of them) takes a
// write transaction, through the gate, to create them.
Status LmdbEnv::open_databases() {
  // (A `leases` database that stores of earlier versions have is left
  // alone: leases live in the lease table beside the store.)
  static const char* const names[] = {"entries", "meta", "lru", "stats"};
  MDB_dbi* dbis[] = {&entries, &meta, &lru, &stats};
  constexpr int kNames = 4;
  MDB_txn* txn;
  int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
  if (rc) return mdb_status(rc, "begin");
  for (int i = 0; i < kNames && rc == 0; ++i) rc = mdb_dbi_open(txn, names[i], 0, dbis[i]);
  if (rc == 0) {
    // Committing a read transaction keeps the handles it opened.
    rc = mdb_txn_commit(txn);
    return rc ? mdb_status(rc, "commit") : Status();
  }
  mdb_txn_abort(txn);
  if (rc != MDB_NOTFOUND) return mdb_status(rc, "open databases");
  KCACHE_TRY(txn, begin_write());
  for (int i = 0; i < kNames; ++i) {
    rc = mdb_dbi_open(txn, names[i], MDB_CREATE, dbis[i]);
    if (rc) {
      abort_write(txn);
      return mdb_status(rc, std::string("open db ") + names[i]);
    }
  }
  rc = commit_write(txn);
  return rc ? mdb_status(rc, "commit") : Status();
}

// LMDB does not say where it mapped the file; /proc/self/maps does: the
// mapping of data.mdb (same device and inode) that is as long as the map
// and is not another open environment's (see live_maps).
void LmdbEnv::find_map(const struct stat& data_st) {
  std::set<const unsigned char*> others;
  {
    std::lock_guard lk(live_maps_mu());
    others = live_maps();
  }
  FILE* f = ::fopen("/proc/self/maps", "re");
  if (!f) return;
  char line[4096];
  // Only lines with the inode are parsed: a JIT's process maps hundreds of
  // library segments.
  const std::string inode = " " + std::to_string(static_cast<unsigned long long>(data_st.st_ino)) + " ";
  while (::fgets(line, sizeof line, f)) {
    if (!std::strstr(line, inode.c_str())) continue;
    unsigned long long lo, hi, off, ino;
    unsigned maj, mnr;
    char perms[8];
    if (::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &lo, &hi, perms, &off, &maj, &mnr, &ino) != 7) continue;
    if (ino != static_cast<unsigned long long>(data_st.st_ino) || off != 0 || ::makedev(maj, mnr) != data_st.st_dev ||
        hi - lo != map_size_)
      continue;
    const auto* at = reinterpret_cast<const unsigned char*>(static_cast<uintptr_t>(lo));
    if (others.count(at)) continue;
    map_base_ = at;
    map_len_ = hi - lo;
    break;
  }
  ::fclose(f);
  if (map_base_) {
    std::lock_guard lk(live_maps_mu());
    live_maps().insert(map_base_);
  }
}

bool LmdbEnv::overflow_run_intact(const MDB_val& v) const noexcept {
  constexpr uint64_t kPageHdr = 16;
  constexpr uint16_t kPOverflow = 0x04;
  const auto* p = static_cast<const unsigned char*>(v.mv_data);
  if (!map_base_ || psize_ == 0) return true;                   // no map found: nothing to compare with
  if (p < map_base_ || p >= map_base_ + map_len_) return true;  // a page this transaction wrote
  uint64_t off = static_cast<uint64_t>(p - map_base_);
  if (off % psize_ != kPageHdr) return true;  // inside a leaf page: no run
  uint64_t pg = off / psize_;
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  uint64_t want = (v.mv_size + kPageHdr + psize_ - 1) / psize_;
  if (pg < 2 || pg > info.me_last_pgno || want > info.me_last_pgno + 1 - pg) return false;
  const unsigned char* h = map_base_ + pg * psize_;
  uint64_t no = 0;
  uint16_t flags = 0;
  uint32_t pages = 0;
  std::memcpy(&no, h, 8);
  std::memcpy(&flags, h + 10, 2);
  std::memcpy(&pages, h + 12, 4);
  return no == pg && flags == kPOverflow && pages == want;
}

void LmdbEnv::mark_damaged(const std::string& why) {
  if (damaged_.exchange(true)) return;
  KCACHE_LOG(LogLevel::warn,
             "lmdb store %s: %s; left in place, the store is moved aside and its intact entries salvaged when "
             "next opened",
             dir_.c_str(), why.c_str());
  (void)util::write_file_atomic(damaged_marker(dir_), why + "\n");
}

bool LmdbEnv::gate_lock(int wait_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  {
    std::unique_lock lk(gate_mu_);
    if (!gate_cv_.wait_until(lk, deadline, [&] { return !gate_held_; })) return false;
    gate_held_ = true;
  }
  if (gate_fd_ < 0) return true;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  int rc = util::flock_within(gate_fd_, LOCK_EX, static_cast<uint64_t>(std::max<int64_t>(left.count(), 0)));
  if (rc != ETIMEDOUT) return true;  // locked, or no flock here: LMDB's mutex alone orders writers
  gate_release();
  return false;
}

void LmdbEnv::gate_release() {
  {
    std::lock_guard lk(gate_mu_);
    gate_held_ = false;
  }
  gate_cv_.notify_one();
}

void LmdbEnv::gate_unlock() {
  if (gate_fd_ >= 0) ::flock(gate_fd_, LOCK_UN);
  gate_release();
}

Expected<MDB_txn*> LmdbEnv::begin_write(int wait_ms) {
  if (inherited()) return inherited_error();
  KCACHE_RETURN_IF_ERROR(check_data_file());
  if (!gate_lock(wait_ms)) {
    if (!busy_logged_.exchange(true, std::memory_order_relaxed))
      KCACHE_LOG(LogLevel::warn, "lmdb store %s: another writer held the store for %d ms; the write is skipped",
                 dir_.c_str(), wait_ms);
    return Status(Errc::timeout,
                  "lmdb store " + dir_ + ": another writer held the store for " + std::to_string(wait_ms) + " ms");
  }
  MDB_txn* t = nullptr;
  int rc = mdb_txn_begin(env_, nullptr, 0, &t);
  if (rc) {
    gate_unlock();
    if (rc == MDB_MAP_RESIZED) return resized_error();
    return mdb_status(rc, "begin write");
  }
  return t;
}

int LmdbEnv::commit_write(MDB_txn* txn, bool sync) {
  // Durability::full keeps its promise (every commit synced whole): an
  // unsynced commit is asked for only under normal.
  const bool skip = !sync && sync_data_ && !sync_meta_;
  if (skip) mdb_env_set_flags(env_, MDB_NOSYNC, 1);
  int rc = mdb_txn_commit(txn);
  if (skip) {
    mdb_env_set_flags(env_, MDB_NOSYNC, 0);
    if (!rc) unsynced_.store(true, std::memory_order_release);
  } else if (!rc && sync_data_) {
    // Its data sync wrote every earlier commit's pages too.
    unsynced_.store(false, std::memory_order_release);
  }
  gate_unlock();
  return rc;
}

Status LmdbEnv::sync() {
  if (inherited() || lost()) return Status();
  if (!unsynced_.exchange(false, std::memory_order_acq_rel)) return Status();
  int rc = mdb_env_sync(env_, 1);
  if (rc) {
    unsynced_.store(true, std::memory_order_release);
    return mdb_status(rc, "sync");
  }
  return Status();
}

void LmdbEnv::abort_write(MDB_txn* txn) {
  mdb_txn_abort(txn);
  gate_unlock();
}

}  // namespace kcache

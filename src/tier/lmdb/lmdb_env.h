// Private: the per-process handle on one LMDB environment, shared by every
// tier object that opens the same folder.
#pragma once

#include <lmdb.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/status.h"
#include "tier/lmdb/lmdb_verified.h"

namespace kcache {

inline constexpr int kMaxPinned = 64;

// An LMDB return code as a Status: map full and ENOSPC are no_space, a
// damaged page is corrupt, EACCES/EROFS read_only, the rest io_error.
Status mdb_status(int rc, std::string_view what);

// Records this process's eviction and repair walks have visited so far:
// lets tests check that a put touches only its own records, not the store.
uint64_t lmdb_records_visited() noexcept;

// The map size every opener of a store uses for a given size limit:
// max(64 GiB, 2 x max_bytes + 64 MiB), rounded up to the page size. It
// depends on nothing else, so processes with the default limits all map
// the same size and none ever grows the file past another's map. The file is sparse and LMDB maps it
// read-only, so a large map costs address space only.
uint64_t lmdb_map_size(uint64_t max_bytes) noexcept;

// Thread-safety: safe for concurrent use by the threads of the process that
// opened it. In a child of fork() it is inert: LMDB forbids using an
// environment across fork(), so every call fails with Errc::unavailable and
// nothing it holds (pooled or pinned read transactions, the environment)
// is released there, since releasing a reader slot in the child would free
// it for the parent, whose pinned pages could then be reused.
class LmdbEnv {
 public:
  // Returns the process's open handle for `dir` if there is one, else opens.
  static Expected<std::shared_ptr<LmdbEnv>> open(const std::string& dir, uint64_t map_size, bool sync_data,
                                                 bool sync_meta, bool check_structure = true);
  ~LmdbEnv();

  // Write transactions pass a gate first: a flock on lock.mdb (which the
  // kernel drops when its holder dies, unlike a wait on LMDB's own writer
  // mutex) and, within the process, a timed mutex. Both are tried for at
  // most `wait_ms`; past it the write is given up with Errc::timeout, so no
  // caller ever waits without bound on another process's write. Every
  // write transaction ends in commit_write or abort_write, which open the
  // gate again.
  static constexpr int kWriteWaitMs = 10000;
  Expected<MDB_txn*> begin_write(int wait_ms = kWriteWaitMs);
  // sync=false: the commit skips the data sync the store's durability asks
  // for (MDB_NOSYNC for this commit alone, set and cleared under the gate,
  // so no other commit of this process runs in between); sync() makes it
  // durable later.
  int commit_write(MDB_txn* txn, bool sync = true);
  // Syncs the data file when a commit skipped its sync since the last one
  // (none under Durability::none, which never syncs).
  Status sync();
  void abort_write(MDB_txn* txn);

  // Whether the overflow run holding `v` (a value read in a write
  // transaction of this environment) has its own page header as LMDB wrote
  // it: page number as its place in the map, overflow type only, and the
  // page count the value's size needs, inside the file. LMDB trusts that
  // header when it frees the run (deleting or replacing the value, or
  // dropping its database), so a run that fails must never be freed. A
  // value kept inside its leaf page has no run: true.
  bool overflow_run_intact(const MDB_val& v) const noexcept;

  // Records that the store holds damage LMDB cannot safely remove (an
  // overflow run with a damaged header): logs once, and leaves a marker
  // (`damaged` in the folder) that makes the next open move the store aside
  // and salvage its intact entries into a fresh one (open_lmdb_tier).
  void mark_damaged(const std::string& why);
  static std::string damaged_marker(const std::string& dir) { return dir + "/damaged"; }

  // A store this process can no longer use: its data file was truncated
  // under the map (a read of a page past the new end would SIGBUS), or
  // the store was deleted or replaced (what this process wrote would go to
  // a file no one else opens). Every read and write is then
  // Errc::unavailable, which the Cache says once per tier, until the store
  // is opened again.
  bool lost() const noexcept { return lost_.load(std::memory_order_relaxed); }
  Status lost_error() const;
  void mark_lost(const std::string& why);
  // mdb_get in read transaction `txn`, then one read of each page of the
  // value found, with SIGBUS caught (util::run_guarded): a data file
  // truncated under the map gives EFAULT and marks the store lost instead
  // of killing the process. The value is then mapped and readable unless
  // the file shrinks again before the caller reads it.
  int get_guarded(MDB_txn* txn, MDB_dbi dbi, MDB_val* key, MDB_val* value);

  // Read transactions come from a pool of reset handles (MDB_NOTLS), so a
  // hit costs a renew rather than a reader-table registration.
  // Errc::unavailable when the map must grow (another process wrote past
  // it) or when called in a child of fork().
  Expected<MDB_txn*> begin_read();
  void end_read(MDB_txn* txn);

  // True in a process forked after this environment was opened: nothing
  // may touch LMDB (or the mutexes of objects using it) there.
  bool inherited() const noexcept;
  // The error every use of an inherited environment returns (logged once).
  Status inherited_error();

  MDB_env* env() const noexcept { return env_; }
  const std::string& dir() const noexcept { return dir_; }
  uint64_t map_size() const noexcept { return map_size_; }
  MDB_dbi entries = 0, meta = 0, lru = 0, stats = 0;
  // Hits handed out that still pin their read transaction (one reader slot
  // each); past kMaxPinned, hits are copied out instead.
  std::atomic<int> pinned{0};
  // The entries whose checksum this process verified (lmdb_verified.h),
  // shared by every tier object on this store.
  VerifiedEntries verified;

 private:
  LmdbEnv() = default;
  Status resized_error();
  // Before a write transaction: whether data.mdb is still the file this
  // process has open (not deleted or replaced) and as long as its pages.
  Status check_data_file();
  Status open_databases();
  void find_map(const struct stat& data_st);
  bool gate_lock(int wait_ms);
  void gate_unlock();
  void gate_release();  // the in-process half only

  MDB_env* env_ = nullptr;
  bool sync_data_ = true;              // the durability syncs data on commit
  bool sync_meta_ = false;             // and the meta page (Durability::full): no commit skips its sync
  std::atomic<bool> unsynced_{false};  // a commit skipped its sync since the last sync()
  uint64_t fork_gen_ = 0;              // util::fork_generation() when opened
  uint64_t map_size_ = 0;
  std::string dir_;
  std::atomic<bool> resized_logged_{false};
  std::atomic<uint64_t> fork_logged_gen_{0};  // generation last warned about
  std::mutex mu_;
  std::vector<MDB_txn*> idle_;  // GUARDED_BY(mu_)
  // The writer gate: the flock'ed descriptor of lock.mdb (-1: none could be
  // opened; LMDB's own mutex still orders writers), and its in-process half.
  int gate_fd_ = -1;
  // The in-process half of the gate: a flag under a mutex, waited for with a
  // condition variable (a std::timed_mutex's timed lock is invisible to
  // ThreadSanitizer, which then reports its unlock).
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool gate_held_ = false;  // GUARDED_BY(gate_mu_)
  std::atomic<bool> busy_logged_{false};
  std::atomic<bool> damaged_{false};
  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mu_;
  std::string lost_why_;  // GUARDED_BY(lost_mu_)
  // LMDB's map of data.mdb (found in /proc/self/maps; null if it was not)
  // and the store's page size.
  const unsigned char* map_base_ = nullptr;
  uint64_t map_len_ = 0;
  uint32_t psize_ = 0;
  // The largest size of data.mdb this process has seen (LMDB never
  // shrinks it; check_data_file).
  std::atomic<uint64_t> largest_size_{0};
};

}  // namespace kcache

// Private: the per-process handle on one LMDB environment, shared by every
// tier object (and the single-flight leases) that open the same folder.
#pragma once

#include <lmdb.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kcache/status.h"

namespace kcache {

inline constexpr int kMaxPinned = 64;

// Records this process's eviction and repair walks have visited so far:
// lets tests check that a put touches only its own records, not the store.
uint64_t lmdb_records_visited() noexcept;

class LmdbEnv {
 public:
  // Returns the process's open handle for `dir` if there is one, else opens.
  static Expected<std::shared_ptr<LmdbEnv>> open(const std::string& dir, uint64_t map_size, bool sync_data,
                                                 bool sync_meta, bool check_structure = true);
  ~LmdbEnv();

  // Read transactions come from a pool of reset handles (MDB_NOTLS), so a
  // hit costs a renew rather than a reader-table registration.
  Expected<MDB_txn*> begin_read();
  void end_read(MDB_txn* txn);
  Expected<MDB_txn*> begin_write();

  MDB_env* env() const noexcept { return env_; }
  const std::string& dir() const noexcept { return dir_; }
  MDB_dbi entries = 0, meta = 0, lru = 0, stats = 0, leases = 0;
  // Hits handed out that still pin their read transaction (one reader slot
  // each); past kMaxPinned, hits are copied out instead.
  std::atomic<int> pinned{0};

 private:
  LmdbEnv() = default;
  MDB_env* env_ = nullptr;
  pid_t pid_ = 0;
  std::string dir_;
  std::mutex mu_;
  std::vector<MDB_txn*> idle_;  // GUARDED_BY(mu_)
};

}  // namespace kcache

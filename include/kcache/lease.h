// kcache/lease.h — leases for cross-process single-flight.
//
// When several processes miss one key at once, one of them should compile it
// and the others wait and read its entry. A Leases object arbitrates: the
// first acquire() of a key wins; later ones answer `busy` while the holder is
// alive and its lease unexpired. A lease is stale, and taken over by the next
// acquire(), once it expires or its holder process is known to be dead (same
// host, PID gone or reused). Holders renew() while they compile, so a short
// TTL detects dead holders quickly without limiting compile time. Nothing a
// crash leaves behind ever needs manual clean-up.
//
// Implementations: a lease table beside the LMDB store (one small file of
// buckets that every process maps, each updated under a robust
// process-shared mutex, which the next locker recovers when its holder
// dies; no system call, no sync and no database writer lock, so a lease
// never waits for the store's commits), and
// lease files for the file-per-entry engine, which may be on NFS (created
// with O_EXCL; a stale one is taken over under a takeover marker, itself
// created with O_EXCL, so one process at a time judges, removes and
// re-creates it; no locks, which NFS does not honour reliably). The remote
// tier's leases (SET NX PX, kcache/remote.h) extend this across machines.
//
// Thread-safety: safe for concurrent use. Each Leases object has its own
// holder token, so two objects in one process do not share leases.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache {

class Env;  // kcache/env.h

enum class LeaseResult : uint8_t {
  acquired = 0,  // this object now holds the lease
  busy = 1,      // a live holder has it
  error = 2,     // the store failed; callers compile without coordination
};

class Leases {
 public:
  virtual ~Leases() = default;
  virtual std::string_view name() const noexcept = 0;
  // Takes the lease for ttl_ms unless a live holder has it. Re-acquiring a
  // lease this object already holds renews it.
  virtual LeaseResult acquire(const Key& key, uint64_t ttl_ms) = 0;
  // Extends a lease this object holds; false if it was lost or never held.
  virtual bool renew(const Key& key, uint64_t ttl_ms) = 0;
  // Gives the lease up (no-op unless held by this object).
  virtual void release(const Key& key) = 0;
  // How many stale leases this object took over (dead or expired holders).
  virtual uint64_t takeovers() const noexcept = 0;
};

// The lease table `dir`/leases2.tab (the LMDB tier's folder: a local file
// system). Its file is opened, read and written through `env`
// (kcache/env.h); null means the system's, Env::posix().
Expected<std::shared_ptr<Leases>> open_table_leases(const std::string& dir, std::shared_ptr<Env> env = nullptr);
// Lease files under `dir`/leases (the files tier's folder). Their file
// operations and clock go through `env` (kcache/env.h); null means the
// system's, Env::posix(): pass the tier's Env (DiskTierOptions::env) so
// leases and entries see the same disk and the same time.
Expected<std::shared_ptr<Leases>> open_file_leases(const std::string& dir, std::shared_ptr<Env> env = nullptr);
// Which of the two goes with a disk store is decided where the store is
// opened (Cache::open).

}  // namespace kcache

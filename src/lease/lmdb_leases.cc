// Leases in the LMDB store: key[16] -> holder record (lease/holder.h), in
// the `leases` database of the same environment as the entries. A waiter
// checks in a read transaction (no write lock) and only takes the write
// lock to acquire a lease that is free or stale. Writes pass the
// environment's writer gate, bounded (lmdb_env.h): a lease that cannot be
// written in time is an error, and the caller compiles uncoordinated.
// Lease commits are not synced: a lease lost in a machine crash is only a
// free key, and a compile must not wait for two syncs to take and give one.
#include <lmdb.h>

#include <atomic>
#include <cstring>

#include "kcache/lease.h"
#include "kcache/tier.h"
#include "lease/holder.h"
#include "tier/lmdb/lmdb_env.h"
#include "util/util.h"

namespace kcache {
namespace {

class LmdbLeases final : public Leases {
 public:
  explicit LmdbLeases(std::shared_ptr<LmdbEnv> env) : env_(std::move(env)) {}
  std::string_view name() const noexcept override { return "lmdb"; }
  uint64_t takeovers() const noexcept override { return takeovers_.load(); }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    // Cheap check first: most calls from waiters find a live holder.
    {
      auto txn = env_->begin_read();
      if (!txn) return LeaseResult::error;
      lease::Holder h;
      bool held = read(*txn, key, &h) && h.token != me && lease::alive(h, util::now_unix_ms());
      env_->end_read(*txn);
      if (held) return LeaseResult::busy;
    }
    auto txn = env_->begin_write();
    if (!txn) return LeaseResult::error;
    lease::Holder h;
    bool had = read(*txn, key, &h);
    if (had && h.token != me && lease::alive(h, util::now_unix_ms())) {
      env_->abort_write(*txn);
      return LeaseResult::busy;
    }
    bool takeover = had && h.token != me;
    if (!write(*txn, key, lease::self(me, ttl_ms)) || env_->commit_write(*txn, /*sync=*/false) != 0) {
      return LeaseResult::error;
    }
    if (takeover) takeovers_.fetch_add(1);
    return LeaseResult::acquired;
  }

  bool renew(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    auto txn = env_->begin_write();
    if (!txn) return false;
    lease::Holder h;
    if (!read(*txn, key, &h) || h.token != me) {
      env_->abort_write(*txn);
      return false;
    }
    if (!write(*txn, key, lease::self(me, ttl_ms))) return false;
    return env_->commit_write(*txn, /*sync=*/false) == 0;
  }

  void release(const Key& key) override {
    const uint64_t me = token_.get();
    auto txn = env_->begin_write();
    if (!txn) return;
    lease::Holder h;
    if (read(*txn, key, &h) && h.token == me) {
      MDB_val k{16, const_cast<uint8_t*>(key.bytes.data())};
      mdb_del(*txn, env_->leases, &k, nullptr);
      env_->commit_write(*txn, /*sync=*/false);
      return;
    }
    env_->abort_write(*txn);
  }

 private:
  bool read(MDB_txn* txn, const Key& key, lease::Holder* h) {
    MDB_val k{16, const_cast<uint8_t*>(key.bytes.data())}, v;
    if (mdb_get(txn, env_->leases, &k, &v) != 0) return false;
    return lease::decode(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size), h);
  }
  // REQUIRES: write txn; aborts it on failure.
  bool write(MDB_txn* txn, const Key& key, const lease::Holder& h) {
    std::string rec = lease::encode(h);
    MDB_val k{16, const_cast<uint8_t*>(key.bytes.data())}, v{rec.size(), rec.data()};
    if (mdb_put(txn, env_->leases, &k, &v, 0) != 0) {
      env_->abort_write(txn);
      return false;
    }
    return true;
  }

  std::shared_ptr<LmdbEnv> env_;
  lease::Token token_;
  std::atomic<uint64_t> takeovers_{0};
};

}  // namespace

Expected<std::shared_ptr<Leases>> open_lmdb_leases(const std::string& dir) {
  // The map size every store uses (lmdb_env.h); an environment the tier
  // already opened in this process is shared.
  auto env = LmdbEnv::open(dir, lmdb_map_size(effective_max_bytes(DiskTierOptions{})), true, false);
  if (!env) return env.error();
  return std::shared_ptr<Leases>(std::make_shared<LmdbLeases>(std::move(env).value()));
}

}  // namespace kcache

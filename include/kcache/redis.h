// kcache/redis.h — the shared tier: a Redis server or a Redis Cluster.
//
// A Redis tier is the cache a team or a cluster of machines shares. It is
// built by make_redis_tier() from a URL:
//   redis://[:password@]host[:port][/db][?option=value&...]
//   redis+cluster://[:password@]host:port[,host:port...][?option=value&...]
// For a cluster, keys are routed by hash slot (CRC16 of the key, {hash tags}
// honoured); MOVED and ASK redirections are followed and MOVED refreshes the
// slot map (CLUSTER SLOTS). Options may also be given in the query string
// under the names of RedisTierOptions' fields (e.g. ?command_timeout_ms=100).
//
// The tier never fails a compile:
//  * every call is bounded: a connect timeout, then a timeout on each socket
//    read and write of a command;
//  * after `breaker_threshold` consecutive failures a circuit breaker opens
//    and every call is skipped (a miss, counted in TierStats::skipped) for
//    `breaker_cooldown_ms`; then one call probes the server again;
//  * put() only queues the write; a background thread sends it. A full
//    queue drops the write (counted in TierStats::dropped).
//
// Authenticity: with a secret, every stored value carries an HMAC-SHA256 over
// the key and the entry bytes (format in docs/format.md, "Redis value"). A
// value whose MAC is missing or wrong is a miss counted in
// TierStats::rejected and is never parsed. Without a secret values are still
// verified by the entry checksum, but anyone who can write to the server can
// hand out code: configure a secret for any shared server.
//
// Cross-machine single-flight: a lease key (SET NX PX) lets one machine
// compile a missing key while the others wait for its result, bounded; a
// lease whose holder died expires and is taken over (see RedisTier).
//
// Caveats: values are whole entries (no streaming), so max_entry_bytes also
// bounds memory per concurrent get; the command timeout bounds each socket
// read, so a very large value on a slow link may take longer in total.
//
// Thread-safety: a RedisTier may be used by many threads at once (each call
// borrows a connection from a per-node pool).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/lease.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

struct RedisTierOptions {
  // Bound on establishing a TCP connection. 0 means the default, 250 ms.
  uint64_t connect_timeout_ms = 250;
  // Bound on each socket read/write of a command. 0 means the default, 500 ms.
  uint64_t command_timeout_ms = 500;
  // Expiry of stored values (PX). 0 (the default) means none.
  uint64_t ttl_ms = 0;
  // Look up, never write (put/remove refused as Errc::read_only).
  bool read_only = false;
  // Prefix of every Redis key this tier uses. Default "kcache:". A prefix
  // holding a {hash tag} sends every key to one cluster slot.
  std::string key_prefix = "kcache:";
  // Largest encoded entry stored or accepted from the server. 0 means the
  // default, 64 MiB.
  uint64_t max_entry_bytes = uint64_t(64) << 20;
  // Consecutive failures that open the circuit breaker. 0 means the
  // default, 3.
  unsigned breaker_threshold = 3;
  // How long an open breaker skips the server. 0 means the default, 10 s.
  uint64_t breaker_cooldown_ms = 10000;
  // Writes waiting for the background thread; more are dropped. 0 means the
  // default, 64.
  unsigned write_queue_depth = 64;
  // HMAC-SHA256 secret. Empty (the default): values carry no MAC and none
  // is checked.
  std::string secret;
};

// Counters beyond TierStats, for tests and `kcache stats`.
struct RedisCounters {
  uint64_t breaker_opens = 0;   // times the breaker went from closed to open
  uint64_t moved = 0;           // MOVED redirections followed
  uint64_t ask = 0;             // ASK redirections followed
  uint64_t slot_refreshes = 0;  // slot maps loaded (CLUSTER SLOTS)
  uint64_t leases_taken = 0;    // leases acquired (including takeovers)
  uint64_t leases_busy = 0;     // acquire_lease calls that found another holder
  uint64_t lease_waits = 0;     // wait_for calls that found the entry
};

// The Redis tier's own interface, beyond Tier. Obtain it with
// std::dynamic_pointer_cast<RedisTier>(tier) on what make_redis_tier returns.
class RedisTier : public Tier {
 public:
  // Entries for many keys in pipelined round trips (one per node and batch of
  // keys); result[i] belongs to keys[i]. Faults are misses.
  virtual std::vector<std::optional<Entry>> get_many(const std::vector<Key>& keys) = 0;

  // Tries to become the one machine that compiles `key`: true if this tier
  // object now holds the lease (it expires after ttl_ms unless renewed or
  // released; acquiring a lease already held renews it), false if another
  // holder has it. An expired lease is gone, so the next caller takes over.
  // An error means the server could not be asked (or the breaker is open).
  // REQUIRES: ttl_ms > 0.
  virtual Expected<bool> acquire_lease(const Key& key, uint64_t ttl_ms) = 0;
  // Extends a lease this object holds; false if it was lost or never held.
  virtual bool renew_lease(const Key& key, uint64_t ttl_ms) = 0;
  // Gives the lease back if this process still holds it. Queued behind this
  // process's pending writes, so waiters see the entry before the lease goes.
  virtual void release_lease(const Key& key) = 0;
  // Waits, polling, until `key` is stored (returns it), or no lease is held
  // on it any more (nullopt: the holder gave up or died; try to acquire), or
  // `bound_ms` passes (nullopt).
  virtual std::optional<Entry> wait_for(const Key& key, uint64_t bound_ms) = 0;

  // Waits (bounded by lack of progress) until queued writes were sent.
  Status flush() override = 0;
  virtual RedisCounters counters() const = 0;
};

// The Redis Cluster hash slot of a Redis key: CRC16 (XMODEM) of the key, or
// of its {hash tag} when it has a non-empty one, modulo 16384.
uint16_t redis_key_slot(std::string_view key) noexcept;

// REQUIRES: url uses the redis:// or redis+cluster:// scheme.
// Fails (invalid_argument) only on a malformed URL or option; an unreachable
// server is not an error (the tier retries, behind its breaker).
Expected<std::shared_ptr<Tier>> make_redis_tier(const std::string& url, const RedisTierOptions& options = {});

// Leases for cross-machine single-flight (what Cache::open uses when a
// remote tier is configured): a lease is held when both `local` (the disk
// tier's leases, for processes of this machine; may be null) and the Redis
// lease of `redis` are taken, so processes queue on their machine and
// machines queue in Redis. When Redis cannot be asked, `local` alone decides.
// Releases are queued behind the tier's pending writes, so a waiter on
// another machine finds the entry before the lease goes.
// REQUIRES: redis was made by make_redis_tier.
std::shared_ptr<Leases> make_redis_leases(std::shared_ptr<Tier> redis, std::shared_ptr<Leases> local);

}  // namespace kcache

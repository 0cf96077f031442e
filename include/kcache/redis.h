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
// The Redis backend is a transport only (connection pools, commands,
// cluster routing, URL parsing); make_redis_tier() puts the remote policy of
// kcache/remote.h over it: timeouts, circuit breaker, bounded asynchronous
// writes, HMAC-SHA256 values, statistics, pipelined multi-get and leases.
//
// Naming on the server (docs/format.md, "Redis value"): for a cache key with
// hex H and the key prefix P, the value lives under P{H} and the lease under
// P{H}:lease (the {H} hash tag keeps both in one cluster slot). Leases are
// SET-if-absent with a PX expiry, compared and changed by small Lua scripts.
//
// Caveats: values are whole entries (no streaming), so max_entry_bytes also
// bounds memory per concurrent get; the command timeout bounds each socket
// read, so a very large value on a slow link may take longer in total.
//
// Thread-safety: a Redis tier or transport may be used by many threads at
// once (each call borrows a connection from a per-node pool).
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
#include "kcache/remote.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

// The remote policy's options (kcache/remote.h) and Redis's own.
struct RedisTierOptions : RemoteTierOptions {
  // Prefix of every Redis key this tier uses. Default "kcache:". A prefix
  // holding a {hash tag} sends every key to one cluster slot.
  std::string key_prefix = "kcache:";
};

// The Redis tier is the remote policy tier over the Redis transport.
using RedisTier = RemoteTier;
using RedisCounters = RemoteCounters;

// The Redis Cluster hash slot of a Redis key: CRC16 (XMODEM) of the key, or
// of its {hash tag} when it has a non-empty one, modulo 16384.
uint16_t redis_key_slot(std::string_view key) noexcept;

// The Redis transport alone, for make_remote_tier (the options' timeouts
// and key prefix are used; the policy's options are not).
// REQUIRES: url uses the redis:// or redis+cluster:// scheme.
// Fails (invalid_argument) only on a malformed URL or option.
Expected<std::shared_ptr<RemoteTransport>> make_redis_transport(const std::string& url,
                                                                const RedisTierOptions& options = {});

// The Redis tier: the remote policy over the Redis transport, with the
// options of the URL's query string applied over `options`.
// REQUIRES: url uses the redis:// or redis+cluster:// scheme.
// Fails (invalid_argument) only on a malformed URL or option; an unreachable
// server is not an error (the tier retries, behind its breaker).
Expected<std::shared_ptr<Tier>> make_redis_tier(const std::string& url, const RedisTierOptions& options = {});

// The same as make_remote_leases (kcache/remote.h); kept for callers that
// name Redis.
std::shared_ptr<Leases> make_redis_leases(std::shared_ptr<Tier> redis, std::shared_ptr<Leases> local);

}  // namespace kcache

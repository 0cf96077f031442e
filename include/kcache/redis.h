// kcache/redis.h — the shared tier: a Redis server or a Redis Cluster.
//
// A Redis remote is the cache a team or a cluster of machines shares. It is
// made by make_redis_remote() (tier and leases) or make_redis_tier() (the
// tier alone) from a URL:
//   redis://[:password@]host[:port][/db][?option=value&...]
//   redis+cluster://[:password@]host:port[,host:port...][?option=value&...]
// For a cluster, keys are routed by hash slot (CRC16 of the key, {hash tags}
// honoured); MOVED and ASK redirections are followed and MOVED refreshes the
// slot map (CLUSTER SLOTS). Options may also be given in the query string,
// under the names of set_remote_option() (e.g. ?command_timeout_ms=100).
//
// The Redis backend is transports only (connection pools, commands,
// cluster routing, URL parsing): one object that is both the value store
// and the lease backend of kcache/remote.h. make_redis_remote() puts the
// remote policy of kcache/remote.h over it: timeouts, circuit breaker,
// bounded asynchronous writes, HMAC-SHA256 values, statistics, pipelined
// multi-get, and the leases.
//
// Naming on the server (docs/format.md, "Redis value"): for a cache key with
// hex H and the key prefix P, the value lives under P{H} and the lease under
// P{H}:lease (the {H} hash tag keeps both in one cluster slot). Leases are
// SET-if-absent with a PX expiry, compared and changed by small Lua scripts.
//
// Caveats: values are whole entries (no streaming), so max_entry_bytes also
// bounds memory per concurrent get (a longer value is refused by the server
// script that looks values up, unread); the command timeout bounds each socket
// read, so a very large value on a slow link may take longer in total.
//
// Thread-safety: a Redis tier, its leases or its transport may be used by
// many threads at once (each call borrows a connection from a per-node
// pool).
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
  // Prefix of every Redis key this tier uses. A prefix holding a {hash tag}
  // sends every key to one cluster slot.
  std::string key_prefix = "kcache:";
};

// The Redis tier is the remote policy tier over the Redis transport.
using RedisTier = RemoteTier;
using RedisCounters = RemoteCounters;

// Sets the option `name` of `o` from its text `value`: what a URL's query
// string does, one option=value at a time. The options, from one table:
//   connect_timeout_ms, command_timeout_ms, breaker_cooldown_ms
//                        milliseconds, a whole number; 0: the default
//   ttl_ms               milliseconds, a whole number; 0: no expiry
//   max_entry_bytes      bytes, a whole number; 0: the default
//   breaker_threshold, breaker_timeouts, write_queue_depth
//                        a whole number; 0: the default
//   read_only, shared_stats
//                        1/0, true/false, yes/no or on/off
//   key_prefix           any text
// The HMAC secret is not among them: it is read from a file
// (Options::remote_secret_file), never from a URL.
// Fails (invalid_argument) naming the option and the form it wants (never
// the rest of the URL), or, for an unknown name, listing the known ones.
Status set_remote_option(RedisTierOptions* o, std::string_view name, std::string_view value);
// The names set_remote_option knows, in its table's order.
std::vector<std::string_view> remote_option_names();

// The Redis Cluster hash slot of a Redis key: CRC16 (XMODEM) of the key, or
// of its {hash tag} when it has a non-empty one, modulo 16384.
uint16_t redis_key_slot(std::string_view key) noexcept;

// The Redis transports alone, for make_remote: one object that is both the
// value store and the lease backend (the options' timeouts and key prefix
// are used, with the URL's query applied; the policy's options are not).
// REQUIRES: url uses the redis:// or redis+cluster:// scheme.
// Fails (invalid_argument) only on a malformed URL or option.
Expected<RemoteTransports> make_redis_transport(const std::string& url, const RedisTierOptions& options = {});

// The Redis remote: the remote policy over the Redis transports, with the
// options of the URL's query string applied over `options`: the tier and
// its leases.
// REQUIRES: url uses the redis:// or redis+cluster:// scheme.
// Fails (invalid_argument) only on a malformed URL or option; an unreachable
// server is not an error (the tier retries, behind its breaker).
Expected<Remote> make_redis_remote(const std::string& url, const RedisTierOptions& options = {});
// The tier alone (make_redis_remote's tier, without leases).
Expected<std::shared_ptr<RemoteTier>> make_redis_tier(const std::string& url, const RedisTierOptions& options = {});

}  // namespace kcache

// kcache/remote.h — a remote tier over any transport: the policy apart from
// the wire.
//
// A remote is three parts:
//  * a RemoteTransport: the value store of one kind of server (connect,
//    get, set, delete, pipelined gets, routing);
//  * a RemoteLeaseBackend, where the server also keeps leases: acquire,
//    renew, release and look up one key's lease record by holder token. A
//    server without leases implements the value store only; one that has
//    both may implement both in one object (Redis does, kcache/redis.h).
//    Another server needs these only (and, for Options::remote_url to
//    reach it, a line in kcache's table of URL schemes);
//  * the policy, made by make_remote() over any of them and the same for
//    all: a RemoteTier over the value store (timeouts, a circuit breaker, a
//    bounded queue of asynchronous writes, HMAC-SHA256 value framing
//    (docs/format.md, "Redis value"), statistics, pipelined multi-get) and,
//    given a lease backend, the RemoteLeases for cross-machine
//    single-flight. The two share one breaker and one write queue, so a
//    lease release is sent after the holder's write of the entry, and a
//    server that timed out on a lookup is skipped by the lease that follows.
//
// A remote never fails a compile, and a slow or dead one costs at most its
// budget:
//  * every transport call is bounded: a connect timeout, then a timeout on
//    each socket read and write of a command;
//  * a timeout is the whole budget of a request: it opens the circuit
//    breaker at once (`breaker_timeouts`, default 1), so the lookup, the
//    lease and the wait that follow in the same request skip the server.
//    Cheap failures (connection refused or reset, error replies) count
//    toward `breaker_threshold` consecutive failures. An open breaker skips
//    every call (a miss, counted in TierStats::skipped) for
//    `breaker_cooldown_ms`; then one call probes the server again;
//  * put() only queues the write; a background thread sends it. A full
//    queue drops the write (counted in TierStats::dropped);
//  * statistics that outlive a process: every client that writes adds its
//    hits, misses, puts, corrupt and rejected values (in all, and per key
//    namespace) to counters the server keeps, sent by the same background
//    thread about once a second and when the tier closes, never on the
//    lookup's path; what is stored now is counted from the server's keys
//    when asked (RemoteTier::server_stats, `kcache stats`);
//  * the tier logs its own faults: one warn line per outage (the first
//    failure after the server last answered), further failures of the same
//    outage at info; a rejected or corrupt value once per key.
//
// Thread-safety: a remote tier, its leases and a transport may be used by
// many threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/lease.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

// Zero and defaults as everywhere (kcache/options.h): each initialiser is
// the default, and every number but ttl_ms reads 0 as unset (the default),
// here as in a URL's query (set_remote_option, kcache/redis.h); ttl_ms 0
// is no expiry.
struct RemoteTierOptions {
  // Bound on establishing a connection, in ms.
  uint64_t connect_timeout_ms = 250;
  // Bound on each socket read/write of a command, in ms.
  uint64_t command_timeout_ms = 500;
  // Expiry of stored values, in ms; 0: none.
  uint64_t ttl_ms = 0;
  // Look up, never write (put/remove refused as Errc::read_only).
  bool read_only = false;
  // Largest encoded entry stored or accepted from the server: 64 MiB.
  uint64_t max_entry_bytes = uint64_t(64) << 20;
  // Consecutive failures that open the circuit breaker.
  unsigned breaker_threshold = 3;
  // Consecutive timeouts that open the circuit breaker: by default one, so
  // a server that stops answering costs one timeout.
  unsigned breaker_timeouts = 1;
  // How long an open breaker skips the server, in ms: 10 s.
  uint64_t breaker_cooldown_ms = 10000;
  // Writes waiting for the background thread; more are dropped.
  unsigned write_queue_depth = 64;
  // HMAC-SHA256 secret. Empty: values carry no MAC and none is checked.
  // Values carry a 16-bit id of the secret: values stored with another
  // secret are misses, said once, and never overwritten by this tier.
  std::string secret;
  // Add this process's hits, misses, puts, corrupt and rejected values to
  // the counters the server keeps for all its clients (RemoteServerStats).
  // A read-only tier never sends them (it writes nothing).
  bool shared_stats = true;
};

// What the server keeps for all its clients (`kcache stats`).
struct RemoteServerStats {
  // Entries stored now and the bytes of their values (framing included),
  // counted from the server's keys when asked.
  uint64_t entries = 0;
  uint64_t bytes = 0;
  // False when counting stopped at its time bound: entries and bytes are
  // then those of the keys counted so far.
  bool complete = true;
  // Since when the shared counters count (their first write, or when they
  // were last zeroed), Unix ms; 0: the server keeps none yet.
  uint64_t since_unix_ms = 0;
  // The shared counters: the fields of kShared, of every client that sends
  // them (RemoteTierOptions::shared_stats); the other fields are 0.
  TierStats counters;
  static constexpr std::array<uint64_t TierStats::*, 5> kShared = {
      &TierStats::hits, &TierStats::misses, &TierStats::puts, &TierStats::corrupt, &TierStats::rejected};
  // The same per key namespace (an entry's manifest's), sorted by name.
  struct Namespace {
    std::string ns;
    uint64_t hits = 0;
    uint64_t puts = 0;
    uint64_t put_bytes = 0;  // value bytes of those puts
  };
  std::vector<Namespace> namespaces;
};

// The values a server stores now (RemoteTransport::count_stored).
struct RemoteStored {
  uint64_t entries = 0;
  uint64_t bytes = 0;
  bool complete = true;  // false: counting stopped at its time bound
};

// Counters of a transport's routing (a clustered server).
struct TransportCounters {
  uint64_t moved = 0;           // MOVED redirections followed
  uint64_t ask = 0;             // ASK redirections followed
  uint64_t slot_refreshes = 0;  // slot maps loaded
};

// Counters beyond TierStats, for tests and `kcache stats`.
struct RemoteCounters {
  uint64_t breaker_opens = 0;  // times the breaker went from closed to open
  uint64_t moved = 0;          // from the transport (TransportCounters)
  uint64_t ask = 0;
  uint64_t slot_refreshes = 0;
  uint64_t leases_taken = 0;  // leases acquired (including takeovers)
  uint64_t leases_busy = 0;   // acquire_lease calls that found another holder
  uint64_t lease_waits = 0;   // wait_for calls that found the entry
  // Failed transport calls, by kind (together TierStats::errors, less the
  // values that could not be encoded).
  uint64_t timeouts = 0;       // no answer within a timeout
  uint64_t unreachable = 0;    // no connection: refused, reset, closed
  uint64_t server_errors = 0;  // the server answered with an error
  uint64_t bad_replies = 0;    // a reply of the wrong type for a key
};

// Bytes of one stored value (null: nothing stored under the key).
using RemoteBytes = std::shared_ptr<const Buffer>;

// The value store of one kind of server. Each call is one request (or one
// pipeline) bounded by the timeouts given to set_timeouts(); the transport
// keeps no policy: no retries beyond following the server's redirections,
// no breaker, no logging. A failed call returns an error whose code says
// what happened, and the policy acts on it:
//   Errc::timeout      no answer within the connect or command timeout;
//   Errc::unavailable  no connection: refused, reset, closed, unreadable
//                      (garbled) stream;
//   Errc::io_error     the server answered with an error reply;
//   Errc::corrupt      the server answered, but with a reply of the wrong
//                      type for this key (the connection is fine);
//   Errc::too_large    (get, get_many) the value is longer than the bound
//                      of set_max_value_bytes (the server is fine).
// Keys are cache keys: the transport names them on its server, and
// documents the naming.
class RemoteTransport {
 public:
  virtual ~RemoteTransport() = default;
  // Short name for stats and logs, e.g. "redis".
  virtual std::string_view name() const noexcept = 0;
  // Bounds every later call: establishing a connection, then each read and
  // write of a command. Called by make_remote before any other call (of
  // this object, and of the lease backend when it is the same object).
  virtual void set_timeouts(uint64_t connect_ms, uint64_t command_ms) = 0;

  // Bounds get and get_many: a value longer than max_bytes is answered
  // with Errc::too_large, ideally without being transferred (Redis asks
  // the server for the length and the value in one scripted round trip).
  // Called by make_remote with the policy's max_entry_bytes plus the value
  // framing. A transport that cannot do better may ignore it: the policy
  // refuses an oversized value after reading it.
  virtual void set_max_value_bytes(uint64_t max_bytes) { (void)max_bytes; }
  // The value stored under `key`, or null.
  virtual Expected<RemoteBytes> get(const Key& key) = 0;
  // Values for many keys in few round trips: on success `out` holds one
  // result per key, in order (a per-key error has the codes above). An
  // error return means the server could not be asked at all.
  virtual Status get_many(const std::vector<Key>& keys, std::vector<Expected<RemoteBytes>>* out) = 0;
  // Stores `value` under `key`, replacing it; ttl_ms 0 means no expiry.
  virtual Status set(const Key& key, std::string_view value, uint64_t ttl_ms) = 0;
  // Removes the value under `key` (absent is fine).
  virtual Status remove(const Key& key) = 0;

  virtual TransportCounters counters() const { return {}; }

  // ---- statistics kept by the server (optional; default: unavailable) ----
  // Whether the calls below work on this server.
  virtual bool keeps_stats() const noexcept { return false; }
  // Adds each (name, amount) to the server's shared counters, and sets
  // their start time ("since_ms") to now_unix_ms when none is set. Names
  // are those of RemoteServerStats as the policy writes them ("hits",
  // "ns:NAME:puts", ...).
  virtual Status add_stats(const std::vector<std::pair<std::string, uint64_t>>& deltas, uint64_t now_unix_ms) {
    (void)deltas;
    (void)now_unix_ms;
    return Status(Errc::unavailable, "this server keeps no statistics");
  }
  // Every shared counter by name, "since_ms" included.
  virtual Expected<std::vector<std::pair<std::string, uint64_t>>> read_stats() {
    return Status(Errc::unavailable, "this server keeps no statistics");
  }
  // Removes every shared counter and sets their start time.
  virtual Status zero_stats(uint64_t now_unix_ms) {
    (void)now_unix_ms;
    return Status(Errc::unavailable, "this server keeps no statistics");
  }
  // Counts the values stored under this transport's naming, stopping after
  // about budget_ms (RemoteStored::complete false).
  virtual Expected<RemoteStored> count_stored(uint64_t budget_ms) {
    (void)budget_ms;
    return Status(Errc::unavailable, "this server cannot count its values");
  }
};

// The lease records of a server: the lease of `key` is one record holding
// its holder's token, with an expiry. Each call is one atomic step on the
// server, bounded and failing as RemoteTransport's calls do. The policy
// sets the timeouts through the value store (set_timeouts), so a backend
// that is another object than the value store bounds its calls itself.
class RemoteLeaseBackend {
 public:
  virtual ~RemoteLeaseBackend() = default;
  // Takes the lease unless another token holds it; renews it if `token`
  // holds it. True when `token` holds it afterwards.
  virtual Expected<bool> lease_acquire(const Key& key, std::string_view token, uint64_t ttl_ms) = 0;
  // Extends the lease if `token` holds it; false otherwise.
  virtual Expected<bool> lease_renew(const Key& key, std::string_view token, uint64_t ttl_ms) = 0;
  // Removes the lease if `token` holds it; false otherwise.
  virtual Expected<bool> lease_release(const Key& key, std::string_view token) = 0;
  // Whether anyone holds the lease of `key`.
  virtual Expected<bool> lease_held(const Key& key) = 0;
  // The token that holds the lease of `key` (nullopt: none). A backend
  // that cannot say returns an error (the default): a holder that died is
  // then waited out until its lease expires.
  virtual Expected<std::optional<std::string>> lease_holder(const Key& key) {
    (void)key;
    return Status(Errc::unavailable, "lease holders are not readable");
  }
};

// The remote tier's own interface, beyond Tier.
class RemoteTier : public Tier {
 public:
  // Entries for many keys in pipelined round trips; result[i] belongs to
  // keys[i]. Faults are misses.
  virtual std::vector<std::optional<Entry>> get_many(const std::vector<Key>& keys) = 0;

  // Waits (bounded by lack of progress) until queued writes were sent.
  Status flush() override = 0;
  // This remote's counters (its leases' included).
  virtual RemoteCounters counters() const = 0;
  // Whether the circuit breaker skips the server now.
  virtual bool breaker_open() const = 0;
  // What the server keeps for all its clients: the shared counters and
  // the values stored now (counting stops after scan_budget_ms). Sends this
  // process's unsent counts first. unavailable when the transport keeps no
  // statistics; an error when the server cannot be asked.
  virtual Expected<RemoteServerStats> server_stats(uint64_t scan_budget_ms) {
    (void)scan_budget_ms;
    return Status(Errc::unavailable, "this remote keeps no statistics");
  }
  // Zeroes the shared counters (refused, read_only, by a read-only tier).
  virtual Status zero_server_stats() { return Status(Errc::unavailable, "this remote keeps no statistics"); }
};

// The remote's leases, made by make_remote() with its tier: one holder
// identity per object, the tier's breaker and the tier's write queue. As
// Leases (acquire/renew/release) they are the remote's lease alone; combine
// them with a machine's own leases with make_remote_leases().
class RemoteLeases : public Leases {
 public:
  // Tries to become the one machine that compiles `key`: true if this
  // object now holds the lease (it expires after ttl_ms unless renewed or
  // released; acquiring a lease already held renews it), false if another
  // holder has it. An expired lease is gone, so the next caller takes over.
  // An error means the server could not be asked (or the breaker is open).
  // REQUIRES: ttl_ms > 0.
  virtual Expected<bool> acquire_lease(const Key& key, uint64_t ttl_ms) = 0;
  // Extends a lease this object holds; false if it was lost or never held.
  virtual bool renew_lease(const Key& key, uint64_t ttl_ms) = 0;
  // Gives the lease back if this object still holds it. Queued behind the
  // tier's pending writes, so waiters see the entry before the lease goes.
  virtual void release_lease(const Key& key) = 0;
  // Removes the lease of `key` when its holder is a process of this host
  // known dead (PID gone, or reused by a process started later): true when
  // it did, so the caller can acquire at once instead of waiting for the
  // lease to expire.
  virtual bool take_over_dead(const Key& key) {
    (void)key;
    return false;
  }
  // Waits, polling, until `key` is stored (returns it), or no lease is held
  // on it any more (nullopt: the holder gave up or died; try to acquire), or
  // `bound_ms` passes, or the server cannot be asked (nullopt).
  virtual std::optional<Entry> wait_for(const Key& key, uint64_t bound_ms) = 0;
  // The remote's counters (the same as its tier's).
  virtual RemoteCounters counters() const = 0;
};

// A remote tier and, when the server keeps leases, its leases.
struct Remote {
  std::shared_ptr<RemoteTier> tier;
  std::shared_ptr<RemoteLeases> leases;  // null: no lease backend
};

// The transports one server offers: its value store and, where it keeps
// leases, its lease backend (possibly the same object).
struct RemoteTransports {
  std::shared_ptr<RemoteTransport> values;
  std::shared_ptr<RemoteLeaseBackend> leases;  // null: the server keeps none
};

// The policy over `values` and, if not null, `leases` (see the top of this
// file). The tier's name is the transport's, with "(ro)" when read-only.
// Fails (invalid_argument) without a transport, and (internal) when the
// options cannot be honoured (no HMAC-SHA256 in OpenSSL).
Expected<Remote> make_remote(std::shared_ptr<RemoteTransport> values, std::shared_ptr<RemoteLeaseBackend> leases,
                             const RemoteTierOptions& options = {});
Expected<Remote> make_remote(const RemoteTransports& transports, const RemoteTierOptions& options = {});
// The tier alone (make_remote without leases).
Expected<std::shared_ptr<RemoteTier>> make_remote_tier(std::shared_ptr<RemoteTransport> values,
                                                       const RemoteTierOptions& options = {});

// Leases for cross-machine single-flight (what the cache's assembly uses
// when a remote with leases is configured): a lease is held when both
// `local` (the disk store's leases, for processes of this machine; may be
// null) and the remote's lease are taken, so processes queue on their
// machine and machines queue on the server. When the remote cannot be asked
// (breaker open), `local` alone decides. Releases are queued behind the
// tier's pending writes, so a waiter on another machine finds the entry
// before the lease goes. A null `remote` gives `local` back.
std::shared_ptr<Leases> make_remote_leases(std::shared_ptr<RemoteLeases> remote, std::shared_ptr<Leases> local);

}  // namespace kcache

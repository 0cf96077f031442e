// kcache/assembly.h — how a cache's tiers are put together from Options.
//
// One assembly serves every front end: Cache::open, the C ABI, Python and
// every `kcache` command call assemble(), so each honours every KCACHE_*
// variable the same way. In order, fastest first:
//
//   memory tier        (Options::memory_tier)
//   bundles            (Options::bundles), read-only
//   disk store         (Options::dir, Options::engine), with its leases
//   remote tier        (Options::remote_url, chosen by URL scheme)
//
// A part that cannot be set up is left out and said once in the log: the
// cache runs with what it has and never fails to open.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/cache.h"
#include "kcache/lease.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

// A disk store opened together with its leases.
struct DiskStore {
  Engine engine = Engine::lmdb;
  std::string dir;   // the cache folder
  std::string path;  // dir + "/" + engine_name(engine)
  std::shared_ptr<Tier> tier;
  std::shared_ptr<Leases> leases;  // null unless asked for and available
};

// Opens the disk store of `engine` in the cache folder `dir` (created 0700
// unless create is false; a store that does not exist then is not_found),
// and, with leases, the leases that go with it. A store that opened without
// its leases is still returned (leases null, said in the log).
// A store another user could have written is refused (unavailable, the
// path and its owner or mode in the message), before it is opened and once
// more after: the cache folder, the engine folder, LMDB's files, the files
// engine's folders, counters and leases must be owned by this user (or
// root) and writable by no one else, or with `shared_group` (see
// Options::shared_group) by members of that group (invalid_argument when
// the group is unknown or this process is not in it).
Expected<DiskStore> open_disk_store(const std::string& dir, Engine engine, const DiskTierOptions& options, bool leases,
                                    bool create = true, const std::string& shared_group = {});

// Where the disk store of `options` lives, whether or not it exists:
// folder, engine and path. dir is empty when no folder can be named.
DiskStore disk_store_location(const Options& options);

// What a remote scheme opens: the tier, and, when the server keeps leases,
// how to make the leases for cross-machine single-flight.
struct OpenedRemote {
  std::shared_ptr<Tier> tier;
  // The remote's leases combined with `local` (the disk store's; may be
  // null). Empty when the server keeps no leases.
  std::function<std::shared_ptr<Leases>(std::shared_ptr<Leases> local)> leases;
};
// One URL scheme of a remote. `open` makes the tier and its leases from the
// URL and the HMAC secret (empty: none).
struct RemoteScheme {
  std::string_view scheme;  // before "://", e.g. "redis"
  Expected<OpenedRemote> (*open)(const std::string& url, const std::string& secret);
};
// Every scheme built in.
std::span<const RemoteScheme> remote_schemes() noexcept;
// The scheme of `url`, if one is built in.
const RemoteScheme* find_remote_scheme(std::string_view url) noexcept;
// Reads an HMAC secret file (trailing newlines dropped; an empty or
// unreadable file is an error: a configured secret is never left out).
Expected<std::string> read_secret_file(const std::string& path);
// The remote for `url`, with the secret in `secret_file` (if set).
Expected<OpenedRemote> open_remote(const std::string& url, const std::string& secret_file);

struct Assembly {
  std::vector<std::shared_ptr<Tier>> tiers;  // fastest first
  std::shared_ptr<Leases> leases;            // cross-process single-flight; may be null
  std::optional<DiskStore> disk;             // the disk store, when it opened
  std::shared_ptr<Tier> remote;              // the remote tier, when it was set up
};

// Opens what `options` names (see the top of this file). Never fails; what
// is left out is logged once. Options::disabled gives no tiers at all.
Assembly assemble(const Options& options);

}  // namespace kcache

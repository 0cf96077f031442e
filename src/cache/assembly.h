// cache/assembly.h — how a cache's tiers are put together from Options.
//
// Internal: the wiring behind Cache::open (disk store spec, engine table,
// remote schemes), not installed; the `kcache` tool and the Python
// extension include it from src/.
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

// What a disk store is and how to open it: one struct instead of
// positional flags, filled from Options by DiskStoreSpec::from so that
// every caller (assemble, bundles, the `kcache` tool) opens a store the
// same way, shared group included.
struct DiskStoreSpec {
  // The cache folder; empty when no folder can be named (no HOME).
  std::string dir;
  Engine engine = default_engine();
  // Limits and durability of the tier.
  DiskTierOptions tier;
  // Group that shares the store (Options::shared_group); empty: none.
  std::string shared_group;
  // Create the folder and store when missing; off: a missing store is
  // not_found.
  bool create = true;
  // Open the store's leases too (cross-process single-flight).
  bool leases = true;
  // Open the store only to read it (DiskTierOptions::read_only): nothing is
  // created (a missing store is not_found, whatever `create` says), the
  // engine writes nothing of its own, and the tier comes wrapped by
  // make_read_only, which refuses writes and names it "lmdb(ro)".
  bool read_only = false;

  // The store Options name: folder (default_dir() when empty), engine,
  // limits, shared group, create_dir, read_only; leases when single-flight
  // is on and the options may write.
  static DiskStoreSpec from(const Options& options);
  // dir + "/" + the engine's folder name; empty when dir is.
  std::string path() const;
};

// A disk store opened together with its leases.
struct DiskStore {
  Engine engine = Engine::lmdb;
  std::string dir;   // the cache folder
  std::string path;  // dir + "/" + engine_name(engine)
  std::shared_ptr<Tier> tier;
  std::shared_ptr<Leases> leases;  // null unless asked for and available
};

// One disk engine, described once: its name, how to open its tier and
// its leases, and the files and folders of a store it owns (checked for
// ownership before and after opening). Assembly, leases and the tool look
// engines up here instead of switching on Engine.
struct EngineInfo {
  Engine engine;
  std::string_view name;  // also the store's folder name in the cache folder
  bool built;             // compiled into this kcache
  Expected<std::shared_ptr<Tier>> (*open_tier)(const std::string& path, const DiskTierOptions& options);
  // The leases go through the tier's Env (options.env) where the engine's
  // lease code does its own file operations.
  Expected<std::shared_ptr<Leases>> (*open_leases)(const std::string& path, const DiskTierOptions& options);
  // The paths under the store's folder `path` that decide what it hands
  // out (the folder itself not included).
  std::vector<std::string> (*owned_paths)(const std::string& path);
};
// Every engine, built or not.
std::span<const EngineInfo> engines() noexcept;
const EngineInfo& engine_info(Engine e) noexcept;

// Opens the disk store `spec` names (the folder created 0700 unless
// spec.create is false; a store that does not exist then is not_found),
// and, with spec.leases, the leases that go with it. A store that opened
// without its leases is still returned (leases null, said in the log).
// A store another user could have written is refused (unavailable, the
// path and its owner or mode in the message), before it is opened and once
// more after: the cache folder, the engine folder and every path the
// engine owns must be owned by this user (or root) and writable by no one
// else, or with a shared group (see Options::shared_group) by members of
// that group (invalid_argument when the group is unknown or this process
// is not in it).
Expected<DiskStore> open_disk_store(const DiskStoreSpec& spec);

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
  // Why a part named by the options was left out (ok when it was not):
  // the disk store (not_found when it does not exist and create_dir is
  // off, which is not logged), the remote, and each refused bundle. A
  // front end that reports them itself (the `kcache` tool) reads these.
  Status disk_error;
  Status remote_error;
  std::vector<Status> bundle_errors;
};

// Opens what `options` names (see the top of this file). Never fails; what
// is left out is logged once. Options::disabled gives no tiers at all.
Assembly assemble(const Options& options);

}  // namespace kcache

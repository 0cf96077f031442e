// kcache/tier.h — one level of storage: key -> entry.
//
// A Tier is a small interface over a store of entries: memory (sharded LRU),
// disk (LMDB or file-per-entry), remote, or a read-only wrapper over another
// tier. The Cache facade orders tiers fastest first.
//
// Contract, for every tier (checked by tests/tier/tier_conformance_test.cc):
//  * get() returns an entry only if it verifies and its header key equals
//    the requested key; a corrupt stored entry is counted, removed (unless
//    the store was opened read-only, or the lookup is Access::peek) and
//    reported as Errc::corrupt, never handed out. An entry of another
//    format version is a plain miss (Errc::stale_format is never returned
//    from get), neither counted corrupt nor removed. The LMDB engine
//    verifies an entry's checksum once per process, as long as the entry
//    stays where and as it was; payload bytes damaged in place after that
//    go unseen by that process unless DiskTierOptions::verify_every_hit.
//  * put() publishes all artifacts of an entry as one unit; a reader sees
//    either nothing or the whole entry. Putting a key again replaces it.
//  * a fault (I/O error, full disk) is an error Status, never a crash.
//
// Public methods check arguments and call the private do_* hooks (the
// non-virtual interface pattern), so checks live in one place.
//
// A Tier is only the request path: get, put, put_many, remove, stats, flush
// (and name, kind, writable). What acts on a store as a whole (list,
// verify, trim, clear, mark) is a separate interface, StoreAdmin, which the
// tiers that can offer it hand out through Tier::admin(). It is an accessor
// on the tier, not a second object made when a store opens, because every
// holder of a tier needs the same answer for it: the Cache (mark, bundles
// from its disk store), the tool (ls, verify, trim, clear), bundles opened
// from bytes, and the read-only wrapper, which hands out an administration
// that refuses what writes. A tier that has none (remote) says so with
// nullptr instead of failing each call at run time.
//
// Thread-safety: every Tier implementation is safe for concurrent use by
// many threads; the disk tiers also by many processes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache {

class Env;  // kcache/env.h

// What a tier is, for the Cache (where a hit came from, what read-only
// covers) and for `kcache stats`.
enum class TierKind : uint8_t {
  memory = 0,  // this process's own, fastest
  disk = 1,    // a store on this machine (LMDB or files engine)
  remote = 2,  // shared over the network (Redis)
  bundle = 3,  // a read-only file of shipped entries
  other = 4,   // anything else a caller adds
};
std::string_view tier_kind_name(TierKind k) noexcept;

// What a lookup may change. The Cache looks a key up again after its first
// miss (another thread or process may have stored it since); one request is
// one miss, so those re-checks pass Access::uncounted. Diagnostics (explain,
// show, the nearest-entry search, bundle making) must leave the cache as
// they found it, so they pass Access::peek.
enum class Access : uint8_t {
  counted = 0,    // a use: hits and misses counted, a hit refreshes recency
  uncounted = 1,  // a re-check after a counted miss: a miss is not counted
  // No side effect at all: nothing counted, no recency refreshed, a corrupt
  // entry reported (Errc::corrupt) but neither counted nor removed.
  peek = 2,
};

struct TierStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t puts = 0;
  uint64_t evictions = 0;
  uint64_t corrupt = 0;   // entries that failed verification
  uint64_t errors = 0;    // other faults (I/O, full disk, ...)
  uint64_t rejected = 0;  // writes refused (read-only, too large)
  uint64_t entries = 0;   // entries now stored
  uint64_t bytes = 0;     // encoded bytes now stored
  uint64_t skipped = 0;   // calls not made: remote switched off (circuit breaker open)
  uint64_t dropped = 0;   // queued writes dropped (write queue full)

  struct Field {
    std::string_view name;  // as JSON, text and stored counters name it
    uint64_t TierStats::*member;
  };
  // Every field, in declaration order: whatever lists, prints, adds or
  // stores the fields walks this table, so a new field is added here once.
  static const std::array<Field, 11> kFields;

  // Adds every field of o.
  TierStats& operator+=(const TierStats& o) noexcept {
    for (const auto& f : kFields) this->*f.member += o.*f.member;
    return *this;
  }
};
inline constexpr std::array<TierStats::Field, 11> TierStats::kFields = {{
    {"hits", &TierStats::hits},
    {"misses", &TierStats::misses},
    {"puts", &TierStats::puts},
    {"evictions", &TierStats::evictions},
    {"corrupt", &TierStats::corrupt},
    {"errors", &TierStats::errors},
    {"rejected", &TierStats::rejected},
    {"entries", &TierStats::entries},
    {"bytes", &TierStats::bytes},
    {"skipped", &TierStats::skipped},
    {"dropped", &TierStats::dropped},
}};

// {"hits":..,"misses":..,...} with every TierStats field.
std::string tier_stats_json(const TierStats& s);

struct ListItem {
  Key key;
  uint64_t size = 0;         // encoded bytes
  uint64_t last_use_ms = 0;  // recency record (0 when unknown)
};

struct VerifyReport {
  uint64_t checked = 0;
  std::vector<std::pair<Key, std::string>> bad;  // key, reason
  uint64_t removed = 0;
};

// Administration of a store as a whole: what `kcache ls`, `verify`, `trim`,
// `clear` and `mark` and bundle making do. Obtained from Tier::admin(); it
// lives as long as its tier. Safe for concurrent use, as its tier is.
class StoreAdmin {
 public:
  virtual ~StoreAdmin() = default;

  // Every stored entry (order unspecified). Returning false stops the walk.
  virtual Status list(const std::function<bool(const ListItem&)>& fn) = 0;
  // Checks every entry; with fix, removes those that fail.
  virtual Expected<VerifyReport> verify(bool fix) = 0;
  // Evicts least recently used entries until bytes <= max_bytes. Default:
  // unavailable.
  virtual Expected<uint64_t> trim(uint64_t max_bytes);
  // Removes every entry. Default: unavailable.
  virtual Status clear();
  // A position in the store's recency records, for bundles of what was made
  // or used after it (kcache/bundle.h): a wall-clock time in ms that any
  // process may use later. Once recency is flushed, every entry created or
  // used after mark() returns lists with last_use_ms >= the mark, and every
  // entry last used before it with a smaller one. Default: unavailable; the
  // disk tiers implement it.
  virtual Expected<uint64_t> mark();
  // Sets the store's counters (hits, misses, puts, evictions, corrupt,
  // errors) to 0; entries and bytes stay what they are. Counts other
  // processes make meanwhile are kept. Default: unavailable; the disk tiers
  // implement it.
  virtual Status zero_counters();

 protected:
  // Used in the messages of the defaults.
  virtual std::string_view admin_name() const noexcept = 0;
};

class Tier {
 public:
  virtual ~Tier() = default;

  // Short name for stats and logs: "memory", "lmdb", "files", "redis", ...
  virtual std::string_view name() const noexcept = 0;
  // Default TierKind::other; every built-in tier says what it is.
  virtual TierKind kind() const noexcept { return TierKind::other; }
  // False for a tier that refuses every put (a bundle, the read-only
  // wrapper, a disk store opened with DiskTierOptions::read_only).
  virtual bool writable() const noexcept { return true; }
  // The store's administration (see StoreAdmin); nullptr for a tier that
  // cannot offer it (a remote cannot list its entries). Valid while the
  // tier lives.
  virtual StoreAdmin* admin() noexcept { return nullptr; }

  // nullopt: a miss. Error: a fault (the caller treats it as a miss).
  Expected<std::optional<Entry>> get(const Key& key, Access access = Access::counted) { return do_get(key, access); }
  // REQUIRES: entry was built (non-empty encoded bytes).
  Status put(const Entry& entry);
  // put() without the sync the store's durability makes a commit wait for:
  // the entry is committed (other processes see it, and it is kept if this
  // process is killed by any signal), and durable against a machine crash
  // once sync() returns (or after a later synced commit). Default: put().
  Status put_unsynced(const Entry& entry);
  // Makes every commit so far as durable as the store's durability says
  // (what put_unsynced committed). Default: nothing to do.
  virtual Status sync() { return Status(); }
  // Puts many entries as one group where the store can (LMDB: one
  // transaction and one sync); result[i] belongs to entries[i]. Default:
  // put() each. REQUIRES: every entry was built.
  virtual std::vector<Status> put_many(const std::vector<Entry>& entries);
  // Removing a key that is absent is ok.
  Status remove(const Key& key) { return do_remove(key); }
  TierStats stats() { return do_stats(); }
  // Pushes buffered recency/statistics records to the store.
  virtual Status flush() { return Status(); }

 protected:
  virtual Expected<std::optional<Entry>> do_get(const Key& key, Access access) = 0;
  virtual Status do_put(const Entry& entry) = 0;
  virtual Status do_put_unsynced(const Entry& entry) { return do_put(entry); }
  virtual Status do_remove(const Key& key) = 0;
  virtual TierStats do_stats() = 0;
};

// ---- Factories -----------------------------------------------------------

// Zero and defaults as everywhere (kcache/options.h): each initialiser is
// the default, and every number here reads 0 as unset (the default).
struct MemoryTierOptions {
  // Bytes of encoded entries held (default 256 MiB).
  uint64_t max_bytes = uint64_t(256) << 20;
  // Number of independently locked shards (default 16).
  unsigned shards = 16;
  // Largest single entry held; the default (0) is one shard's budget.
  uint64_t max_entry_bytes = 0;
};
std::shared_ptr<Tier> make_memory_tier(const MemoryTierOptions& options = {});

enum class Durability : uint8_t {
  // fsync data on commit but not the meta page; a compile's commit
  // (put_unsynced) is synced by the Cache's committer within 100 ms instead.
  // A machine crash may lose the last commits, and a store it leaves
  // damaged is moved aside and salvaged at the next open (never wrong
  // bytes). Process crashes lose nothing. Default.
  normal = 0,
  // fsync everything on every commit, compiles' commits included.
  full = 1,
  // no fsync: fastest; process crashes lose nothing, a machine crash may
  // lose recent commits (entries are checksummed, so never wrong bytes).
  none = 2,
};

// The disk engines. LMDB is the default where it is built; files is for
// network file systems.
enum class Engine : uint8_t { lmdb = 0, files = 1 };
std::string_view engine_name(Engine e) noexcept;  // "lmdb", "files"
std::optional<Engine> parse_engine(std::string_view name) noexcept;
Engine default_engine() noexcept;  // lmdb where built, else files
bool engine_built(Engine e) noexcept;

// Zero and defaults as everywhere (kcache/options.h): each initialiser is
// the default, and every number here reads 0 as unset (the default).
struct DiskTierOptions {
  // Size limit of stored entries in bytes (default 4 GiB).
  uint64_t max_bytes = uint64_t(4) << 30;
  // Entry-count limit (default 200,000).
  uint64_t max_entries = 200000;
  // Eviction to a low-water mark (the files engine's evictor, LMDB on a
  // full map) goes down to this fraction of the limits (default 0.8); a
  // put over a limit only makes its own room. A value outside (0, 1) is
  // taken as the default.
  double low_water = 0.8;
  // Largest single entry accepted; the default (0) is max_bytes / 8.
  uint64_t max_entry_bytes = 0;
  Durability durability = Durability::normal;
  // Hits are recorded in memory and written in batches of this many (or at
  // flush/close); default 256.
  unsigned recency_batch = 256;
  // Temp files older than this are collected (files engine); default 1
  // hour.
  uint64_t stale_temp_ms = 3600'000;
  // Open the store only to read it: the engine writes nothing on its own
  // (no corrupt-entry removal, no recency or counter flushes, no temp-file
  // collection, no moving a damaged store aside), and put, remove, trim,
  // clear and verify --fix are refused with Errc::read_only. Counters of
  // this process's lookups are kept in memory only. For a shipped store or
  // KCACHE_READONLY: how a tier is opened, not a switch on a tier others may
  // share. Caveat: LMDB's readers still register in its lock file, so an
  // LMDB store must be writable to the process at the file-system level.
  // Default off.
  bool read_only = false;
  // LMDB engine: check the store's B-tree structure when a process first
  // opens it, and move a damaged store aside instead of crashing on it
  // (LMDB has no page checksums). Costs 31-37 us at open for 480 entries
  // and 0.71-0.76 ms for 10,000 (docs/benchmarks.md). Default on.
  bool check_on_open = true;
  // LMDB engine: verify the checksum of every hit. Off (the default), each
  // process verifies an entry's checksum on its first hit and, while the
  // entry stays where it is with the same header, skips the checksum pass
  // on later hits: a 16 KiB hit then costs about 1.3 memcpys of its bytes
  // instead of about 3 (docs/benchmarks.md).
  // What that misses: payload bytes damaged in place after this process
  // verified them (docs/design.md, "Verified once per process").
  bool verify_every_hit = false;
  // What the engine asks of the system (kcache/env.h); null means the real
  // one, Env::posix(). The files engine does all its file operations, clock
  // reads and sleeps through it; the LMDB engine only its clock reads (its
  // I/O happens inside liblmdb). Tests pass one that injects faults.
  std::shared_ptr<Env> env;
};

// The limits an engine applies: each 0 (and a low_water outside (0, 1))
// replaced by the field's default. Both disk engines read their limits
// through this, so the defaults live in one place.
struct DiskLimits {
  uint64_t max_bytes, max_entries, max_entry_bytes;
  double low_water;
  unsigned recency_batch;
  uint64_t stale_temp_ms;
};
DiskLimits effective_limits(const DiskTierOptions& o) noexcept;
uint64_t effective_max_bytes(const DiskTierOptions& o) noexcept;
uint64_t effective_max_entries(const DiskTierOptions& o) noexcept;

// LMDB engine: one memory-mapped file in `dir`. Recommended. Must not live on
// a network file system (LMDB's locks rely on shared memory).
Expected<std::shared_ptr<Tier>> open_lmdb_tier(const std::string& dir, const DiskTierOptions& options = {});
// File-per-entry engine: sharded folders under `dir`, publish by rename,
// content verified on read. For NFS-style shared folders.
Expected<std::shared_ptr<Tier>> open_files_tier(const std::string& dir, const DiskTierOptions& options = {});
// Read-only view: get passes through (with the access it was given);
// put/remove and, through its admin(), trim/clear/verify --fix are refused
// (counted as rejected) and never reach the inner tier, whose own state and
// settings it leaves as they are. To write nothing at all to a store, open
// it read-only (DiskTierOptions::read_only); this wrapper is for tiers
// made elsewhere (Cache::add_tier under Options::read_only).
std::shared_ptr<Tier> make_read_only(std::shared_ptr<Tier> inner);

// Features compiled in, e.g. {"lmdb", "zstd", "llvm"}.
std::vector<std::string> features();
const char* version_string() noexcept;

}  // namespace kcache

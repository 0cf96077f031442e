// kcache/cache.h — the Cache facade that JIT compilers embed.
//
// A Cache holds tiers in order, fastest first (memory, disk, then any the
// caller adds). get() walks them; a hit in a slower tier is promoted into the
// faster ones. get_or_compile() runs the caller's compile function at most
// once per key at a time in this process (single-flight): N threads that miss
// one key wait for one compile and all get its result; a failed compile is
// reported to every waiter and nothing is stored. A compile function that
// throws has not failed: the exception reaches its own caller and the
// waiters compile the key themselves (one at a time, as a new flight).
//
// The cache never makes a compile fail. Any cache fault (corrupt entry, full
// disk, read-only folder, dead remote) becomes a miss, a counter, and one log
// line; the only error get_or_compile() returns is the compile's own.
//
// Configuration comes from Options, then the environment overrides it
// (Options::from_env; the order and every option's name and variable are
// at Options below and in option_table()).
//
// Thread-safety: all methods may be called concurrently. set_leases and
// add_tier belong to set-up, before the Cache is shared between threads.
//
// Re-entry: the thread that is compiling a key (inside get_or_compile's
// compile function, or owning a Flight it has not committed or abandoned)
// must not ask for the same key again: it would wait for itself. Such a
// request is refused at once: get_or_compile returns invalid_argument
// (without running its compile function) and begin() returns a Flight
// whose error() says so. A thread that holds a key's cross-process lease
// through another Cache of this process on the same store compiles without
// the lease instead of waiting for itself. is_reentry(status) tells such a
// refusal from other invalid_argument errors (a compile's bad artifacts).
// The leader is the thread that called begin(): a Flight handed to another
// thread to compile keeps it, so that thread's own begin() of the same key
// is refused (not left to wait) until the flight is committed or abandoned.
//
// Exit: what a compile produced (get_or_compile, get_or_compile_batch, a
// Flight's commit) is written to the disk tier, in the calling thread, as
// one commit of its own before the call returns: other processes see it,
// and it is kept however this process ends, _exit() and any signal
// (SIGTERM, SIGKILL) included. Against a power loss it is made durable (as
// the disk tier's durability option says) by the committer thread, once
// for all the compiles of up to 100 ms, or before the call returns under
// Options::sync_commit. A remote tier is written behind, by its own queue. Plain put()s (and stage links) reach
// the disk through a committer thread that lets a group gather for up to
// 100 ms: one transaction and one sync for many entries. Every open Cache
// is flushed by an exit handler (std::atexit), so a process that returns
// from main or calls exit() without closing its caches loses no put
// either; one that ends with _exit() or a signal keeps the puts of the
// last 100 ms only after flush(), or with Options::sync_commit.
//
// fork(): a Cache belongs to the process that opened it. A child of fork()
// opens its own; one it inherited answers every lookup with a miss (the
// disk store refuses handles opened before the fork), compiles still
// succeed, and destroying it is safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/bundle.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/lease.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

// Everything that decides how a Cache is put together and behaves. Every
// field holds its default in its initialiser, and a number's 0 follows the
// one rule of kcache/options.h ("Zero and defaults"): the default, unless
// its comment says what else 0 means ("0: never wait").
//
// One pipeline, whatever the front end (docs/design.md, "Options"):
//   1. the defaults below;
//   2. the program's own settings: fields set in C++, kcache_options_set in
//      C, keyword arguments in Python;
//   3. the KCACHE_* variables of the environment (from_env / apply_env),
//      unless the program opted out of them (C: "env" = "0", Python:
//      env=False, C++: not calling from_env);
//   4. for the `kcache` tool, its own command-line flags (--dir, --engine).
// A later step overrides an earlier one. The operator's switches
// (KCACHE_DISABLE, KCACHE_READONLY, KCACHE_RECOMPILE, KCACHE_DIR, ...) so
// reach a program that hard-codes its settings.
//
// Every option but env has a name (set(), the C ABI, Python's keyword
// arguments, the tool) and most a KCACHE_* variable: option_table() lists
// them with what each takes.
struct Options {
  // Disk folder. Empty: $XDG_CACHE_HOME/kcache, else $HOME/.cache/kcache.
  // "dir", KCACHE_DIR.
  std::string dir;
  // Disk engine; nullopt: default_engine() (LMDB where built). "engine",
  // KCACHE_ENGINE (lmdb or files, any case).
  std::optional<Engine> engine;
  // Group that may share the disk store (a name or a number). "shared_group",
  // KCACHE_SHARED.
  // Empty (the default): a store is used only when its folders and files
  // are owned by this user (or root) and writable by no one else; any other
  // is left out with one log line, as if it could not be opened, because
  // another user could have put entries in it. Set: members of this group
  // may also own them and write through the group (a new store is made
  // with this group, setgid folders and group write, as ccache's shared
  // caches are); write permission for others is still refused. A group
  // that does not exist or that this process is not in leaves the disk
  // store out (said in the log).
  std::string shared_group;
  // Create the cache folder when it does not exist (default). Off: a store
  // that does not exist yet is left out without a word (commands that only
  // read, such as `kcache get`, do not create stores). "create_dir".
  bool create_dir = true;
  // Disk tier limits and durability (see DiskTierOptions for defaults):
  // "max_size" (KCACHE_MAX_SIZE), "max_entries" (KCACHE_MAX_ENTRIES),
  // "durability" (KCACHE_DURABILITY), "check_on_open", "verify_every_hit".
  DiskTierOptions disk;
  // The memory tier and its size in bytes (default 256 MiB; 0: no memory
  // tier, in C++ as by name). "memory", "memory_size" (KCACHE_MEMORY_SIZE).
  bool memory_tier = true;
  uint64_t memory_bytes = MemoryTierOptions().max_bytes;
  // The disk store. "disk".
  bool disk_tier = true;
  // Nothing is looked up or stored; every get_or_compile compiles.
  // "disabled", KCACHE_DISABLE.
  bool disabled = false;
  // Look up, never store. "read_only", KCACHE_READONLY.
  bool read_only = false;
  // Skip lookups, compile, and overwrite what is stored. "recompile",
  // KCACHE_RECOMPILE.
  bool recompile = false;
  // Print statistics to stderr when the Cache is destroyed. "stats",
  // KCACHE_STATS.
  bool print_stats = false;
  // Compression of the entries this Cache builds (they go to every tier;
  // the memory tier counts their decompressed bytes too). Default none.
  // "compression" (none, zstd, auto), KCACHE_COMPRESSION.
  Compression compression = Compression::none;
  // Producer string stored in each entry's metadata. "producer".
  std::string producer;
  // Cross-process single-flight through the disk tier's leases: when
  // processes miss one key at once, one compiles, the others wait for its
  // entry. Off: every process compiles its own misses.
  // "process_single_flight", KCACHE_SINGLE_FLIGHT.
  bool process_single_flight = true;
  // Lease time-to-live in ms (default 10 s; at most a day by name); a
  // holder renews every ttl/3 while it compiles, so this bounds how long a
  // hung-but-alive holder's lease outlives it, not how long a compile may
  // take. "lease_ttl_ms", KCACHE_LEASE_TTL_MS.
  uint64_t lease_ttl_ms = 10000;
  // Longest one process waits for another's compile before compiling the
  // key itself, in ms (default 300 s; 0: never wait; by name at most a
  // week). The same bound holds for a thread waiting on another thread of
  // this process, counted from when that thread began to compile (one log
  // line naming the key's label, then it compiles without the flight), so
  // no arrangement of threads can hang: a compile function that hands its
  // own key to a thread it joins ends at the bound. With 0 a thread of this
  // process is waited for without a bound.
  // "wait_bound_ms", KCACHE_WAIT_BOUND_MS.
  uint64_t wait_bound_ms = 300000;
  // Compiles (get_or_compile, batches, a Flight's commit), which are on
  // disk when they return anyway, are also synced (made durable against a
  // power loss, as the disk tier's durability says) before they return,
  // instead of by the committer within 100 ms. Plain puts (put(), and the
  // stage links kcache/stage.h stores) wait until the disk tier has the
  // entry before they return, instead of leaving it to the committer's
  // next group (a remote tier is written behind, by its own queue; flush()
  // waits for it): for hosts that put() and then end with _exit() or a
  // signal without flush(). Costs a sync per store. Default off.
  // "sync_commit", KCACHE_SYNC_COMMIT.
  bool sync_commit = false;
  // Shared remote tier, slowest and last: "redis://host:port[/db]" or
  // "redis+cluster://host:port[,host:port...]" (see kcache/redis.h for the
  // URL and its options). Empty (the default): none. A remote that cannot be
  // set up is left out, said once in the log. "remote", KCACHE_REMOTE.
  std::string remote_url;
  // File holding the HMAC-SHA256 secret that signs remote values (trailing
  // newlines dropped). Empty (the default): values are not signed. When set
  // but unreadable, the remote tier is left out rather than used unsigned.
  // "remote_secret_file", KCACHE_REMOTE_SECRET_FILE.
  std::string remote_secret_file;
  // Read-only bundles of shipped entries, mounted after the memory tier and
  // before the disk store, and the keys they must be signed with
  // (kcache/bundle.h). "bundles" (KCACHE_BUNDLES) and "bundle_trust"
  // (KCACHE_BUNDLE_TRUST), each a ':'-separated list of files.
  BundleOptions bundles;
  // Why did it miss? Every counted miss of a key with a manifest is
  // appended to the store's miss journal (`kcache misses`), except a
  // get_or_compile or begin that waited for another thread's or process's
  // compile of the key and got its entry. The journal keeps the
  // last `miss_journal` misses (default 1000; 0: no journal). Not written
  // under read_only, nor without a disk store. "miss_journal",
  // KCACHE_MISS_JOURNAL.
  size_t miss_journal = 1000;
  // Also log one line (warn) per such miss when the store holds entries of
  // its namespace: the label, the nearest stored entry and each component
  // that differs, with values where kept. Costs a walk of the store's index
  // per miss; for finding out, not for production. "explain",
  // KCACHE_EXPLAIN.
  bool explain = false;
  // What the cache asks of the system: file operations, clocks and sleeps
  // (kcache/env.h). Null (the default): the real one. Reaches the disk
  // store (unless disk.env names its own), its leases, the waits for other
  // processes and the committer, so a test injects full disks or moves the
  // clock for all of them at once. Not settable by name.
  std::shared_ptr<Env> env;
  // Log level (default warn) and destination (empty: stderr). "log"
  // (level[:file], level one of off, error, warn, info, debug), KCACHE_LOG;
  // "log_file".
  LogLevel log_level = LogLevel::warn;
  std::string log_file;

  // Sets the option called `name` from its text form: the one parser of
  // option values, used by the environment, the C ABI, Python and the
  // `kcache` tool. invalid_argument naming the option and what it takes
  // (an unknown name lists the known ones); the options are then unchanged.
  Status set(std::string_view name, std::string_view value);
  // The option's current value in its text form (what set() takes back);
  // not_found for an unknown name.
  Expected<std::string> get(std::string_view name) const;
  // Applies every KCACHE_* variable that is set (step 3 above). A bad value
  // leaves its option as it was. Returns the problems: bad values
  // (invalid_argument, "KCACHE_X: 'v' is not ..."), and KCACHE_* variables
  // that name no option (not_found; a misspelling such as KCACHE_READ_ONLY
  // would otherwise be ignored without a word).
  std::vector<Status> apply_env();
  // `base` with the environment applied; each problem is logged (warn).
  static Options from_env(Options base);
  static Options from_env() { return from_env(Options()); }
  // The default folder for this user (see `dir`).
  static std::string default_dir();
};

// One option: its name for Options::set, its variable (empty when it has
// none) and what it takes, for help texts and tools that list options.
struct OptionInfo {
  std::string_view name;
  std::string_view env;
  std::string_view help;
};
const std::vector<OptionInfo>& option_table() noexcept;

// Where a get_or_compile result came from.
enum class Source : uint8_t { compiled = 0, memory = 1, disk = 2, remote = 3, other = 4, waited = 5, bundle = 6 };
std::string_view source_name(Source s) noexcept;

struct CacheStats {
  struct PerTier {
    std::string name;
    TierStats stats;
  };
  std::vector<PerTier> tiers;  // fastest first
  uint64_t hits = 0;           // lookups answered by any tier
  uint64_t misses = 0;         // lookups no tier answered
  uint64_t compiles = 0;       // compile functions run
  uint64_t compile_failures = 0;
  uint64_t waits = 0;             // get_or_compile calls that waited for another thread
  uint64_t faults = 0;            // cache faults turned into misses
  uint64_t compile_us = 0;        // time spent in compile functions
  uint64_t lease_waits = 0;       // misses that waited for another process's compile
  uint64_t lease_timeouts = 0;    // waits that reached wait_bound_ms and compiled
  uint64_t lease_takeovers = 0;   // leases taken from dead or expired holders
  std::string to_string() const;  // human table
  std::string to_json() const;
};

using CompileFn = std::function<Expected<std::vector<Artifact>>()>;

// One request of a batch.
struct BatchItem {
  KeyInfo key;
  CompileFn compile;
};

struct BatchOptions {
  // Worker threads compiling misses (default, 0: $KCACHE_JOBS, else the
  // number of CPUs).
  unsigned threads = 0;
  // Called (from worker threads, one call at a time) after each item is
  // resolved: items done so far, total, the item's index and source.
  std::function<void(size_t done, size_t total, size_t index, Source source)> progress;
};

struct Assembly;  // how Cache::open puts the tiers together; not installed
class Cache;

// A request for a key whose compile the caller runs itself, between two
// calls to the cache (hosts such as Triton that own their compile loop):
//
//   Flight f = cache->begin(key);
//   if (f.hit()) use(f.entry());
//   else if (auto e = f.commit(compile_it())) use(*e);   // or f.abandon()
//
// begin() answers with a hit, or makes the caller the owner: the one thread
// of this process (and, through the leases, the one process) that compiles
// the key, while the others that begin() it wait. A key another thread or
// process is compiling is waited for (bounded, as get_or_compile does) and
// its entry returned as a hit. The owner holds the key's lease, renewed
// while held, until commit() or abandon(); a Flight destroyed without
// either abandons, and the waiting callers try again (one of them becomes
// the owner). A process that dies holding the lease is taken over, as for
// get_or_compile.
//
// A Flight must not outlive its Cache. Not thread-safe: one thread uses it.
class Flight {
 public:
  Flight(Flight&& o) noexcept;
  Flight& operator=(Flight&& o) noexcept;
  ~Flight();

  // entry() holds the stored entry (found, or stored by another caller).
  bool hit() const noexcept;
  // The caller compiles: commit() or abandon().
  bool owner() const noexcept;
  // Whether entry() is valid: hit(), or a successful commit().
  bool has_entry() const noexcept;
  // REQUIRES: has_entry().
  const Entry& entry() const;
  // Where entry() came from (Source::compiled after commit()).
  Source source() const noexcept;
  // Why begin() gave neither an entry nor the ownership: invalid_argument
  // when the calling thread is compiling this key itself (it owns an
  // uncommitted Flight of the key, or begin() was called from the key's
  // compile function). OK otherwise.
  const Status& error() const noexcept;
  // Only from Cache::try_begin: another live process holds the key's lease
  // (it is compiling it). Neither hit() nor owner(); nothing was waited
  // for. begin() the key later to wait for that process's entry.
  bool busy() const noexcept;
  // Builds the entry from the caller's artifacts, stores it in every
  // writable tier (in the disk tier before it returns, as get_or_compile
  // does), hands it to the waiting callers and gives the lease up.
  // Errors: invalid_argument when this Flight is not the owner (or was
  // already committed or abandoned), or when the artifacts are invalid
  // (empty or duplicate names); the flight is then abandoned.
  Expected<Entry> commit(std::vector<Artifact> artifacts, uint64_t compile_cost_us = 0);
  // Gives the key up without an entry: waiting callers try again.
  void abandon() noexcept;

 private:
  friend class Cache;
  struct State;
  explicit Flight(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// True for the status of a request refused as re-entrant (see Re-entry
// above), never for any other error.
bool is_reentry(const Status& st) noexcept;

class Cache {
 public:
  // Never fails: a part that cannot be set up (a disk folder that cannot be
  // used, a remote that cannot be reached) is left out, said once in the
  // log. The tiers, fastest first: the memory tier, the bundles, the disk
  // store with its leases, the remote (see Options).
  static std::unique_ptr<Cache> open(const Options& options);
  // The same from tiers already put together, for kcache's own front ends
  // (the `kcache` tool looks into them first); Assembly is not installed.
  static std::unique_ptr<Cache> open(Assembly assembly, const Options& options);
  // Only the given tiers, fastest first (for tests and custom set-ups).
  static std::unique_ptr<Cache> with_tiers(std::vector<std::shared_ptr<Tier>> tiers, const Options& options = {});
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  std::optional<Entry> get(const Key& key, Source* source = nullptr);
  // The same; a miss also goes to the miss journal (Options::miss_journal,
  // Options::explain), as the misses of get_or_compile do.
  std::optional<Entry> get(const KeyInfo& key, Source* source = nullptr);
  // Stores into every writable tier: the memory tier at once, the disk tier
  // with the committer's next group (group commit; see Exit above and
  // Options::sync_commit). Faults are counted and logged. The result: ok
  // when a tier took it; with sync_commit, ok only when the disk tier has
  // it too (else why not: no_space, read_only, io_error, ...); read_only
  // when the cache stores nothing. Without sync_commit a later disk
  // failure is reported by flush().
  Status put(const Entry& entry);
  // Builds the entry (with metadata and manifest) and puts it. nullopt when
  // the artifacts are invalid (logged) or the cache stores nothing (read-only
  // or disabled). The slower tiers are written later, off the caller's
  // path, so their faults are counted there, not returned here.
  std::optional<Entry> put(const KeyInfo& key, std::vector<Artifact> artifacts, uint64_t compile_cost_us = 0);

  // The artifacts for `key`: from a tier, or from `compile` (run at most once
  // at a time per key in this process) and then stored: in the disk tier
  // before this returns (see Exit above), then the key's lease goes and
  // the threads waiting for it get the entry. invalid_argument,
  // at once, when the calling thread is compiling `key` itself (a compile
  // function asking for its own key; see Re-entry above).
  Expected<Entry> get_or_compile(const KeyInfo& key, const CompileFn& compile, Source* source = nullptr);
  Expected<Entry> get_or_compile(const Key& key, const CompileFn& compile, Source* source = nullptr);

  // The key's entry, or ownership of its compile (see Flight). May block
  // while another thread or process compiles the key; never for a compile
  // the calling thread runs itself (Flight::error() then says so).
  Flight begin(const KeyInfo& key);
  // begin() without waiting for another process: the key's entry (hit()),
  // the ownership of its compile (owner(); a lease whose holder died or
  // expired is taken over, as begin() does), or, while another live
  // process holds the key's lease, a Flight that is busy() and neither,
  // returned at once. Another thread of this process that leads the key's
  // flight is still waited for, as begin() waits: its entry; busy() when
  // that thread gave the key up because another process holds it (a thread
  // inside begin() that waits for another process makes this wait too).
  // What a batch uses to compile what nobody holds first and wait only for
  // the rest.
  Flight try_begin(const KeyInfo& key);

  // Looks up every key in one pass, then compiles the misses on a pool of
  // worker threads, single-flighted across threads and processes: a key
  // another process is compiling is set aside and awaited after the rest.
  // Results are in request order; a compile error stays in its slot.
  std::vector<Expected<Entry>> get_or_compile_batch(const std::vector<BatchItem>& items,
                                                    const BatchOptions& options = {},
                                                    std::vector<Source>* sources = nullptr);

  // A position in the disk store's recency records that any process can use
  // later: bundle_since(mark) selects what was created or used after it
  // (kcache/bundle.h). Flushes this process's recency first. Unavailable
  // without a disk store.
  Expected<uint64_t> mark();

  // Uses `leases` for cross-process single-flight (Cache::open sets up the
  // disk tier's own; nullptr turns it off).
  void set_leases(std::shared_ptr<Leases> leases);

  // Adds a slower tier after the existing ones (e.g. a remote tier); a
  // bundle tier (TierKind::bundle) goes after the memory tier and the
  // bundles already there, before the disk store.
  // Under Options::read_only a writable tier added here is wrapped
  // (make_read_only): the Cache writes nothing to it. What the tier writes
  // on its own (recency, counters) is decided where it was opened: open a
  // disk tier with DiskTierOptions::read_only for a store nothing may
  // change; the stores Cache::open opens are opened so.
  void add_tier(std::shared_ptr<Tier> tier);
  const std::vector<std::shared_ptr<Tier>>& tiers() const noexcept;
  CacheStats stats() const;
  // Waits until every entry stored so far is in the slower tiers: on disk,
  // as durable as Options::disk's durability makes a commit, so a process
  // may then end by _exit() or SIGKILL without losing it (compiled entries
  // are there already: this waits for put()s and the remote tier's queue). Also waits until every miss so far is in the
  // miss journal (or was dropped: the journal is a diagnostic, and a journal whose lock another process held for over a
  // second drops what it had).
  // The result: ok, or why entries stored since the last flush() are not
  // on disk (the first reason, and how many), or the disk tier's failure
  // to flush its records.
  Status flush();
  // The same, waiting at most `bound` for the disk (a store whose lock
  // another process holds, or a hung file system, can take longer); false
  // when the bound ran out with entries still on their way. The exit
  // handler flushes each open Cache this way, with a bound of 10 s, so a
  // stuck store never keeps a process from ending (one log line says what
  // was left unwritten).
  bool flush(std::chrono::milliseconds bound);
  const Options& options() const noexcept;

 private:
  friend class Flight;
  struct Impl;
  Flight begin(const KeyInfo& key, bool wait);
  explicit Cache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kcache

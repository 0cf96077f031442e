// kcache tool — what the command groups share: the exit codes, the parsed
// command line, the tiers a command opened, and the output helpers.
//
// Each command builds its Options as the library does (settings():
// apply_settings, config files and KCACHE_* then --dir and --engine) and
// opens its tiers with assemble(), so it honours every setting (docs/cli.md
// says which tiers each command reads and writes).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/assembly.h"
#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/manifest.h"
#include "kcache/options.h"
#include "kcache/remote.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache::cli {

enum ExitCode : int { kExitOk = 0, kExitMiss = 1, kExitUsage = 2, kExitError = 3 };

struct FlagSpec {
  const char* name;  // "--key"
  bool takes_value;
  bool repeats = false;  // may be given more than once (a list)
};

struct Args {
  std::string command;
  std::map<std::string, std::string> flags;                    // "--key" -> value ("" for switches)
  std::vector<std::pair<std::string, std::string>> all_flags;  // every occurrence, in order
  std::vector<std::string> positional;
  std::vector<std::string> after_dashes;  // words after "--"
  bool saw_dashes = false;
  bool has(const char* f) const { return flags.count(f) != 0; }
  const std::string* get(const char* f) const {
    auto it = flags.find(f);
    return it == flags.end() ? nullptr : &it->second;
  }
};

// Which tiers a command opens (docs/cli.md, "Tiers per command").
struct Reach {
  bool create = false;          // create a missing cache folder and store
  bool remote = true;           // include the remote tier (KCACHE_REMOTE)
  bool honour_disable = false;  // KCACHE_DISABLE leaves every tier out
  // Only look: the disk store is opened read-only (DiskTierOptions::
  // read_only: no recency, counters, repairs or temp collection) and
  // without leases, so a diagnostic leaves the store as it found it.
  bool inspect = false;
  // The command needs the disk store: one that exists but cannot be opened
  // (another user's, a folder others may write, damaged) fails the command
  // (exit 3, the reason on stderr) instead of reading as an empty store.
  // Off: the command goes on with the other tiers and one warning line.
  bool needs_disk = true;
  // The command names a store it could not open itself (put in its
  // failure line; get and show through lookup()): no warning line here.
  bool reports_disk = false;
  // Open the store's leases (cross-process single-flight). Off for a
  // command that compiles nothing; verify checks the lease table itself.
  bool leases = true;
  // The command reports every part itself, one line each (doctor): the
  // library's log and the warnings of settings() stay quiet.
  bool reports_all = false;
  // The command names a remote that could not be set up itself (stats): no
  // warning line here.
  bool reports_remote = false;
};

// The tiers a command opened, as the library assembled them.
struct Opened {
  Options options;
  DiskStore where;               // the disk store's folder, engine and path
  std::unique_ptr<Cache> cache;  // every tier, fastest first (read-only wrapped under KCACHE_READONLY)
  std::shared_ptr<Tier> disk;    // the disk tier in cache; null when the store does not exist or failed
  StoreAdmin* admin = nullptr;   // disk->admin(): ls, verify, trim, clear, mark; null without a disk tier
  std::shared_ptr<Tier> remote;  // the remote tier in cache; null when none
  // Why the disk store was left out although it exists or was to be
  // created ("cannot open the store PATH: why"); empty when it opened or
  // does not exist.
  std::string disk_refused;
  Status remote_error;  // why the remote of KCACHE_REMOTE was left out
  // What settings() said and went on past: lines of a config file that set
  // nothing (not_found), variables that name no option (not_found), and,
  // for config and doctor only, config files not read (unavailable).
  std::vector<Status> setting_problems;
};

struct Ctx {
  Args args;
  bool json = false;
  Opened store;

  // Prints "kcache: COMMAND: msg" on stderr (one line) and returns code.
  int fail(int code, const std::string& msg) const;
  int fail(const Status& st) const;
  // Writes s to stdout; kExitOk, or kExitError (said on stderr) when stdout
  // refused it or was closed when the tool started (hold_standard_fds).
  // The report of a command whose work is done (put): a closed or failing
  // stdout is one line on stderr, and the exit stays 0.
  int report(std::string_view s) const;
  int out(std::string_view s) const;
};

// Run first: a closed stdin, stdout or stderr gets /dev/null in its place,
// so no file the tool opens (a store, an output) lands on fd 0-2 and
// receives what was meant for the terminal. Remembers a closed stdout:
// Ctx::out then writes nothing and fails (exit 3).
void hold_standard_fds();

// printf into a std::string.
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string format_time(uint64_t unix_ms);
// "90s", "30m", "12h", "7d", "2w" (a whole number and its unit) in ms;
// nullopt for anything else.
std::optional<uint64_t> parse_duration_ms(std::string_view s);
// "1 entry" / "3 entries".
std::string entries_word(uint64_t n);
int exit_for(const Status& st);
// "kcache: COMMAND: msg (see kcache --help)" on stderr; returns kExitUsage.
int usage_error(const std::string& command, const std::string& msg);

// Parses --key; on failure has printed the usage line and returns nullopt.
std::optional<Key> key_flag(const Ctx& c);

// The settings in effect (kcache/options.h: defaults, config files,
// environment, --dir and --engine), and where each came from. Returns
// kExitOk, or kExitUsage after saying which value is bad.
int settings(Ctx& c, Options* o, AppliedSettings* applied);
// Builds the Options and opens the tiers `reach` asks for. Returns kExitOk,
// or the exit code after saying why on stderr (bad --engine, no folder).
int open_tiers(Ctx& c, const Reach& reach);
// Why the disk store of c.store could not be opened (for a command that
// needs it), from a second attempt.
std::string disk_failure(const Ctx& c);

// A lookup through every tier of c.store, fastest first. Diagnostics (show,
// explain) pass Access::peek: they count nothing and refresh no recency.
struct Lookup {
  std::optional<Entry> entry;
  std::string tier;                 // the tier that answered
  std::string corrupt;              // a tier held a corrupt entry for the key (why)
  std::vector<std::string> faults;  // "tier: error" of tiers that could not answer
  size_t missed = 0;                // tiers that answered "not here"
  bool local_fault = false;         // the disk store could not answer
};
Lookup lookup(const Ctx& c, const Key& k, Access access = Access::counted);
// Prints the failure for a lookup that found nothing; returns the exit code:
// 1 for a miss (a remote that cannot answer is a miss too), 3 when the disk
// store could not answer and no tier said "not here".
int report_miss(const Ctx& c, const Key& k, const Lookup& l);

// Writes data to the file the user named. A regular file or a missing path:
// through a temp file in the same folder and a rename, so a reader never
// sees a partial artifact (mode 0666 & ~umask); a symbolic link is followed
// and its target replaced. A character device or FIFO (/dev/stdout, a
// terminal, a named pipe) is written through, never replaced; /dev/stdout,
// /dev/stderr, /dev/fd/N and /proc/self/fd/N are written to that descriptor
// as it is (offset and append flag kept); anything else
// (a folder, a block device, a link to a missing file) is refused. Errors
// name `path`, never the temp file.
Status write_output(const std::string& path, std::string_view data);
// Removes this user's regular files named NAME + mark + 16 hex digits beside
// `path` (NAME its last component) that were not modified for older_than_s:
// the temp files of runs killed before their rename.
void collect_stale_temps(const std::string& path, std::string_view mark, uint64_t older_than_s);

// The commands, by group.
int cmd_put(Ctx& c);  // store_cmds.cc
int cmd_get(Ctx& c);
int cmd_show(Ctx& c);
int cmd_ls(Ctx& c);  // maintenance_cmds.cc
int cmd_stats(Ctx& c);
int cmd_verify(Ctx& c);
int cmd_trim(Ctx& c);
int cmd_clear(Ctx& c);
int cmd_explain(Ctx& c);  // explain_cmd.cc
int cmd_misses(Ctx& c);   // misses_cmd.cc
int cmd_run(Ctx& c);      // run_cmd.cc
int cmd_mark(Ctx& c);     // bundle_cmds.cc
int cmd_bundle(Ctx& c);
int cmd_config(Ctx& c);  // config_cmds.cc
int cmd_doctor(Ctx& c);  // doctor_cmd.cc

// One lookup of a key nobody stores, as a peek (nothing counted): whether
// the remote answers, and how long it took.
struct RemoteProbe {
  bool ok = false;
  uint64_t rtt_us = 0;
  std::string error;  // why not, when !ok
};
RemoteProbe probe_remote(Tier& remote);

// What `stats --format openmetrics|prometheus` prints (metrics.cc).
struct MetricsTier {
  std::string name, kind;
  TierStats stats;
  bool probed = false;  // a probe lookup was made (the remote)
  bool up = false;
  double latency_s = 0;
  // The counts are every client's, kept by the server (the remote), since
  // counters_since_ms (0: unknown), with their namespaces.
  bool shared = false;
  uint64_t counters_since_ms = 0;
  std::vector<RemoteServerStats::Namespace> namespaces = {};
};
struct MetricsInput {
  std::string store;  // the store's path, the `store` label
  bool store_up = false;
  uint64_t disk_used = 0, max_bytes = 0, max_entries = 0;
  uint64_t counters_since_ms = 0;  // the disk store's counters count from then (0: unknown)
  bool compression = false;        // stats --compression: the two below are known
  uint64_t compressed_entries = 0, payload_bytes = 0;
  std::vector<MetricsTier> tiers;  // fastest first
};
enum class MetricsFormat { openmetrics, prometheus };
std::string metrics_text(const MetricsInput& in, MetricsFormat format);

}  // namespace kcache::cli

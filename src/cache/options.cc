// Options by name: the one table of every option (its name, its KCACHE_*
// variable, how its text is parsed and printed), behind Options::set/get,
// the environment, the C ABI, Python and the `kcache` tool.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cache/defaults.h"
#include "kcache/cache.h"
#include "kcache/options.h"
#include "util/util.h"

extern char** environ;

namespace kcache {

namespace {

// ":"-separated paths; empty parts dropped.
std::vector<std::string> split_paths(std::string_view v) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(':', start);
    if (end == std::string_view::npos) end = v.size();
    if (end > start) out.emplace_back(v.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string join_paths(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& p : v) out += (out.empty() ? "" : ":") + p;
  return out;
}

// Words are read in any case: KCACHE_DURABILITY=FULL means full.
std::string lower(std::string_view v) {
  std::string out(v);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<LogLevel> parse_level(std::string_view text) {
  const std::string s = lower(text);
  if (s == "off" || s == "0") return LogLevel::off;
  if (s == "error") return LogLevel::error;
  if (s == "warn" || s == "warning") return LogLevel::warn;
  if (s == "info" || s == "1") return LogLevel::info;
  if (s == "debug" || s == "2") return LogLevel::debug;
  return std::nullopt;
}

std::string_view level_name(LogLevel l) {
  switch (l) {
    case LogLevel::off:
      return "off";
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "warn";
}

// What a value's parser reports: empty when it took the value, else what
// the option wants ("a size such as 2G").
using Want = std::string_view;
constexpr Want kTaken{};

Want set_bool(std::string_view v, bool* out) {
  auto b = util::parse_bool(v);
  if (!b) return "1 or 0 (also true/false, yes/no, on/off)";
  *out = *b;
  return kTaken;
}

// Numbers by name mean what they mean in the struct: "0" is the same 0
// (kcache/options.h, "Zero and defaults"), never refused.
Want set_u64(std::string_view v, uint64_t* out) {
  uint64_t n = 0;
  if (v.empty() || v.size() > 19) return "a whole number";
  for (char c : v) {
    if (c < '0' || c > '9') return "a whole number";
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = n;
  return kTaken;
}

// Milliseconds up to a bound that keeps every sum and product of them
// (deadlines, microseconds) far from overflowing.
constexpr uint64_t kDayMs = 86'400'000;
Want set_ms(std::string_view v, uint64_t* out, uint64_t max_ms, Want want) {
  uint64_t n = 0;
  if (Want w = set_u64(v, &n); !w.empty() || n > max_ms) return want;
  *out = n;
  return kTaken;
}

Want set_size(std::string_view v, uint64_t* out) {
  auto s = util::parse_size(v);
  if (!s) return "a size such as 500M or 2G";
  *out = *s;
  return kTaken;
}

std::string flag(bool b) { return b ? "1" : "0"; }

// A size in the form set_size reads back exactly: 4G, 256M, 1536K, 1000.
std::string size_text(uint64_t b) {
  for (auto [shift, unit] : {std::pair{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}})
    if (b != 0 && b % (uint64_t(1) << shift) == 0) return std::to_string(b >> shift) + unit;
  return std::to_string(b);
}

// One row of the table. `set` returns kTaken or what the option wants;
// `get` prints the value in the form `set` takes.
struct Row {
  OptionInfo info;
  Want (*set)(Options& o, std::string_view v);
  std::string (*get)(const Options& o);
};

// clang-format off
const std::array kRows = {
  Row{{"dir", "KCACHE_DIR", "cache folder (default $XDG_CACHE_HOME/kcache, else ~/.cache/kcache)"},
      [](Options& o, std::string_view v) -> Want {
        if (v.empty()) return "a folder";
        o.dir = std::string(v);
        return kTaken;
      },
      [](const Options& o) { return o.dir; }},
  Row{{"engine", "KCACHE_ENGINE", "disk engine: lmdb (default) or files (for network file systems)"},
      [](Options& o, std::string_view v) -> Want {
        auto e = parse_engine(v);
        if (!e) return "lmdb or files";
        if (!engine_built(*e)) return "an engine built in (this kcache has no lmdb)";
        o.engine = *e;
        return kTaken;
      },
      [](const Options& o) { return std::string(engine_name(o.engine.value_or(default_engine()))); }},
  Row{{"shared_group", "KCACHE_SHARED", "group whose members share the disk store (name or number)"},
      [](Options& o, std::string_view v) -> Want {
        o.shared_group = std::string(v);
        return kTaken;
      },
      [](const Options& o) { return o.shared_group; }},
  Row{{"create_dir", "", "create a missing cache folder (default 1)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.create_dir); },
      [](const Options& o) { return flag(o.create_dir); }},
  Row{{"max_size", "KCACHE_MAX_SIZE", "disk store size limit (default 4G)"},
      [](Options& o, std::string_view v) { return set_size(v, &o.disk.max_bytes); },
      [](const Options& o) { return size_text(effective_max_bytes(o.disk)); }},
  Row{{"max_entries", "KCACHE_MAX_ENTRIES", "disk store entry limit (default 200000)"},
      [](Options& o, std::string_view v) { return set_u64(v, &o.disk.max_entries); },
      [](const Options& o) { return std::to_string(effective_max_entries(o.disk)); }},
  Row{{"durability", "KCACHE_DURABILITY", "disk syncs: normal (default), full or none"},
      [](Options& o, std::string_view text) -> Want {
        const std::string v = lower(text);
        if (v == "normal") o.disk.durability = Durability::normal;
        else if (v == "full") o.disk.durability = Durability::full;
        else if (v == "none") o.disk.durability = Durability::none;
        else return "normal, full or none";
        return kTaken;
      },
      [](const Options& o) -> std::string {
        switch (o.disk.durability) {
          case Durability::full: return "full";
          case Durability::none: return "none";
          case Durability::normal: break;
        }
        return "normal";
      }},
  Row{{"check_on_open", "", "LMDB: check the store's structure when first opened (default 1)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.disk.check_on_open); },
      [](const Options& o) { return flag(o.disk.check_on_open); }},
  Row{{"verify_every_hit", "", "LMDB: verify the checksum of every hit, not once per entry per process (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.disk.verify_every_hit); },
      [](const Options& o) { return flag(o.disk.verify_every_hit); }},
  Row{{"memory", "", "the in-process memory tier (default 1)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.memory_tier); },
      [](const Options& o) { return flag(o.memory_tier); }},
  // A size never brings back a tier the program left out ("memory" 0).
  Row{{"memory_size", "KCACHE_MEMORY_SIZE", "memory tier size (default 256M; 0 leaves the tier out)"},
      [](Options& o, std::string_view v) { return set_size(v, &o.memory_bytes); },
      [](const Options& o) { return o.memory_tier ? size_text(o.memory_bytes) : std::string("0"); }},
  Row{{"disk", "", "the disk store (default 1)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.disk_tier); },
      [](const Options& o) { return flag(o.disk_tier); }},
  Row{{"disabled", "KCACHE_DISABLE", "no lookups and no stores: every compile runs (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.disabled); },
      [](const Options& o) { return flag(o.disabled); }},
  Row{{"read_only", "KCACHE_READONLY", "look up, never store (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.read_only); },
      [](const Options& o) { return flag(o.read_only); }},
  Row{{"recompile", "KCACHE_RECOMPILE", "skip lookups, compile and overwrite what is stored (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.recompile); },
      [](const Options& o) { return flag(o.recompile); }},
  Row{{"stats", "KCACHE_STATS", "print statistics to stderr when the cache closes (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.print_stats); },
      [](const Options& o) { return flag(o.print_stats); }},
  Row{{"compression", "KCACHE_COMPRESSION", "entries this process stores: none (default), zstd or auto"},
      [](Options& o, std::string_view text) -> Want {
        const std::string v = lower(text);
        if (v == "none") o.compression = Compression::none;
        else if (v == "zstd") o.compression = Compression::zstd;
        else if (v == "auto") o.compression = Compression::automatic;
        else return "none, zstd or auto";
        return kTaken;
      },
      [](const Options& o) -> std::string {
        switch (o.compression) {
          case Compression::zstd: return "zstd";
          case Compression::automatic: return "auto";
          case Compression::none: break;
        }
        return "none";
      }},
  Row{{"producer", "", "text stored in each entry's metadata"},
      [](Options& o, std::string_view v) -> Want {
        o.producer = std::string(v);
        return kTaken;
      },
      [](const Options& o) { return o.producer; }},
  Row{{"process_single_flight", "KCACHE_SINGLE_FLIGHT", "one process compiles a key others wait for (default 1)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.process_single_flight); },
      [](const Options& o) { return flag(o.process_single_flight); }},
  Row{{"lease_ttl_ms", "KCACHE_LEASE_TTL_MS", "lease time-to-live in ms, renewed while compiling (default 10000)"},
      [](Options& o, std::string_view v) {
        return set_ms(v, &o.lease_ttl_ms, kDayMs, "a number of ms up to 86400000 (a day; 0: the default)");
      },
      [](const Options& o) { return std::to_string(with_defaults(o).lease_ttl_ms); }},
  Row{{"wait_bound_ms", "KCACHE_WAIT_BOUND_MS", "longest wait for another process's compile, ms (default 300000)"},
      [](Options& o, std::string_view v) {
        return set_ms(v, &o.wait_bound_ms, 7 * kDayMs, "a number of ms up to 604800000 (a week; 0: never wait)");
      },
      [](const Options& o) { return std::to_string(o.wait_bound_ms); }},
  Row{{"sync_commit", "KCACHE_SYNC_COMMIT", "each store is synced before it returns; puts too wait for their write (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.sync_commit); },
      [](const Options& o) { return flag(o.sync_commit); }},
  Row{{"remote", "KCACHE_REMOTE", "shared remote tier: redis://host:port[/db][?...] or redis+cluster://..."},
      [](Options& o, std::string_view v) -> Want {
        o.remote_url = std::string(v);
        return kTaken;
      },
      [](const Options& o) { return o.remote_url; }},
  Row{{"remote_secret_file", "KCACHE_REMOTE_SECRET_FILE", "file with the HMAC secret that signs remote values"},
      [](Options& o, std::string_view v) -> Want {
        o.remote_secret_file = std::string(v);
        return kTaken;
      },
      [](const Options& o) { return o.remote_secret_file; }},
  Row{{"bundles", "KCACHE_BUNDLES", "read-only bundles to mount, FILE[:FILE...]"},
      [](Options& o, std::string_view v) -> Want {
        o.bundles.files = split_paths(v);
        return kTaken;
      },
      [](const Options& o) { return join_paths(o.bundles.files); }},
  Row{{"bundle_trust", "KCACHE_BUNDLE_TRUST", "public keys a bundle must be signed with, PUB[:PUB...]"},
      [](Options& o, std::string_view v) -> Want {
        o.bundles.trusted_keys = split_paths(v);
        return kTaken;
      },
      [](const Options& o) { return join_paths(o.bundles.trusted_keys); }},
  Row{{"miss_journal", "KCACHE_MISS_JOURNAL", "misses kept in the store's journal (default 1000; 0: none)"},
      [](Options& o, std::string_view v) -> Want {
        uint64_t n = 0;
        if (Want w = set_u64(v, &n); !w.empty()) return w;
        o.miss_journal = static_cast<size_t>(n);
        return kTaken;
      },
      [](const Options& o) { return std::to_string(o.miss_journal); }},
  Row{{"explain", "KCACHE_EXPLAIN", "log why each miss missed (default 0)"},
      [](Options& o, std::string_view v) { return set_bool(v, &o.explain); },
      [](const Options& o) { return flag(o.explain); }},
  Row{{"log", "KCACHE_LOG", "log level[:file]: off, error, warn (default), info or debug"},
      [](Options& o, std::string_view v) -> Want {
        std::string_view level = v, file;
        if (auto c = v.find(':'); c != std::string_view::npos) {
          level = v.substr(0, c);
          file = v.substr(c + 1);
        }
        auto l = parse_level(level);
        if (!l) return "off, error, warn, info or debug, with :FILE to write to a file";
        o.log_level = *l;
        // A level alone keeps the destination the program chose.
        if (v.find(':') != std::string_view::npos) o.log_file = std::string(file);
        return kTaken;
      },
      [](const Options& o) {
        return std::string(level_name(o.log_level)) + (o.log_file.empty() ? "" : ":" + o.log_file);
      }},
  Row{{"log_file", "", "file the log goes to (default stderr)"},
      [](Options& o, std::string_view v) -> Want {
        o.log_file = std::string(v);
        return kTaken;
      },
      [](const Options& o) { return o.log_file; }},
};
// clang-format on

const Row* find_row(std::string_view name) {
  for (const auto& r : kRows)
    if (r.info.name == name) return &r;
  return nullptr;
}

// KCACHE_* variables that are not options (kcache/options.h,
// AppliedSettings::problems): KCACHE_JOBS (threads of a batch, read where
// the batch runs), and the names left to programs that test or measure
// kcache.
bool other_variable(std::string_view var) {
  for (std::string_view prefix : {"KCACHE_TEST_", "KCACHE_BENCH_"})
    if (var.substr(0, prefix.size()) == prefix) return true;
  return var == "KCACHE_JOBS";
}

// Sets option `name` from `value`. A bad value's message names where it
// came from, `subject` ("option max_size", "KCACHE_MAX_SIZE",
// "--engine"): "SUBJECT: 'VALUE' is not WHAT IT TAKES". The options are
// unchanged then.
Status set_option(Options& o, std::string_view name, std::string_view value, std::string_view subject) {
  const Row* r = find_row(name);
  if (!r) {
    std::string known;
    for (const auto& row : kRows) known += (known.empty() ? "" : ", ") + std::string(row.info.name);
    return Status(Errc::invalid_argument, "unknown option '" + std::string(name) + "' (known: " + known + ")");
  }
  Options next = o;
  if (Want w = r->set(next, value); !w.empty())
    return Status(Errc::invalid_argument,
                  std::string(subject) + ": '" + std::string(value) + "' is not " + std::string(w));
  o = std::move(next);
  return Status();
}

}  // namespace

const std::vector<OptionInfo>& option_table() noexcept {
  static const std::vector<OptionInfo> infos = [] {
    std::vector<OptionInfo> v;
    for (const auto& r : kRows) v.push_back(r.info);
    return v;
  }();
  return infos;
}

std::optional<std::string> option_name(std::string_view name) {
  std::string n = lower(name);
  for (auto& c : n)
    if (c == '-') c = '_';
  if (!find_row(n)) return std::nullopt;
  return n;
}

std::string nearest_option(std::string_view unknown, bool variables) {
  // Edit distance (insertions, deletions, substitutions, and a swap of two
  // neighbours), case-insensitive.
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    return d[a.size()][b.size()];
  };
  const std::string u = lower(unknown);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& r : kRows) {
    std::string_view cand = variables ? r.info.env : r.info.name;
    if (cand.empty()) continue;
    size_t dist = distance(u, lower(cand));
    if (dist < best_d) {
      best_d = dist;
      best = std::string(cand);
    }
  }
  // Near: a few edits, and fewer than half the name.
  const size_t stem = variables && u.size() > 7 ? u.size() - 7 : u.size();
  if (best_d > 3 || best_d * 2 > stem) return std::string();
  return best;
}

Status Options::set(std::string_view given, std::string_view value) {
  const std::string name = option_name(given).value_or(std::string(given));
  return set_option(*this, name, value, "option " + name);
}

Options with_defaults(Options o) {
  o.lease_ttl_ms = util::or_default(o.lease_ttl_ms, Options().lease_ttl_ms);
  return o;
}

Expected<std::string> Options::get(std::string_view name) const {
  const Row* r = find_row(name);
  if (!r) return Status(Errc::not_found, "unknown option '" + std::string(name) + "'");
  return r->get(*this);
}

namespace {

// Step 5: every KCACHE_* variable that is set.
void apply_environment(Options& o, AppliedSettings* out) {
  for (const auto& r : kRows) {
    if (r.info.env.empty()) continue;
    std::string var(r.info.env);
    const char* v = std::getenv(var.c_str());
    // An empty variable is unset (as a shell's VAR= prefix is often meant),
    // except KCACHE_DIR: an empty folder is more likely a variable that was
    // meant to be set than a wish for the default store, which the tool's
    // `clear` would then empty; it is refused like --dir "".
    if (!v || (!*v && var != "KCACHE_DIR")) continue;
    if (Status st = set_option(o, r.info.name, v, var); !st.is_ok())
      out->problems.push_back(std::move(st));
    else
      out->origin[std::string(r.info.name)] = "environment " + var;
  }
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (kv.substr(0, 7) != "KCACHE_") continue;
    std::string_view var = kv.substr(0, kv.find('='));
    bool known = other_variable(var);
    for (const auto& r : kRows) known = known || r.info.env == var;
    if (known) continue;
    std::string near = nearest_option(var, true);
    out->problems.push_back(Status(Errc::not_found, std::string(var) + " is not a kcache variable" +
                                                        (near.empty() ? std::string(" (kcache config lists them)")
                                                                      : "; did you mean " + near + "?")));
  }
}

}  // namespace

AppliedSettings apply_settings(Options& o, const std::vector<std::pair<std::string, std::string>>& command_line) {
  AppliedSettings out;
  // 3. the user-wide file.
  if (std::string user = user_config_path(); !user.empty()) apply_config_file(o, user, false, &out);
  // 4. the store folder's, in the folder the later steps name.
  std::string dir = o.dir;
  if (const char* d = std::getenv("KCACHE_DIR"); d && *d) dir = d;
  for (const auto& [name, value] : command_line)
    if (option_name(name).value_or("") == "dir" && !value.empty()) dir = value;
  if (dir.empty()) dir = Options::default_dir();
  if (!dir.empty()) apply_config_file(o, store_config_path(dir), true, &out);
  // 5. the environment.
  apply_environment(o, &out);
  // 6. the command line.
  for (const auto& [name, value] : command_line) {
    const std::string known = option_name(name).value_or(name);
    if (Status st = set_option(o, known, value, "--" + name); !st.is_ok())
      out.problems.push_back(std::move(st));
    else
      out.origin[known] = "command line --" + name;
  }
  return out;
}

std::vector<Status> Options::apply_env() { return apply_settings(*this).problems; }

Options Options::from_env(Options base) {
  // Each problem is said once per process, however many caches it opens.
  static std::mutex mu;
  static std::set<std::string> said;
  for (const auto& p : base.apply_env()) {
    std::lock_guard lk(mu);
    if (said.insert(p.message()).second) KCACHE_LOG(LogLevel::warn, "ignoring %s", p.message().c_str());
  }
  return base;
}

std::string Options::default_dir() {
  std::string xdg = util::getenv_str("XDG_CACHE_HOME");
  if (!xdg.empty() && xdg[0] == '/') return xdg + "/kcache";
  std::string home = util::getenv_str("HOME");
  if (home.empty()) {
    if (struct passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (home.empty()) return std::string();
  return home + "/.cache/kcache";
}

}  // namespace kcache

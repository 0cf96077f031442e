// kcache — the command-line tool: inspect and maintain kcache's stores.
//
// Every command opens its tiers as the library does (config files and the
// environment through apply_settings, --dir and --engine on top,
// assemble()), so KCACHE_REMOTE, KCACHE_READONLY and the rest mean here
// what they mean to a JIT. It is meant for scripts
// as much as for people, so its contract is fixed (docs/cli.md):
//   exit 0 success, 1 a miss or not-found, 2 bad usage, 3 any other error;
//   every failure is one line on stderr, "kcache: <command>: <why>";
//   --json on every command that prints data, tables for people otherwise.
// Only put and run create the cache folder: for the others a folder that
// does not exist reads as an empty store, and one that exists but is
// refused fails the command (exit 3, the reason). A corrupt entry is
// reported, never fatal. `kcache help CMD` and `CMD --help` print one
// command's usage (kHelp).
//
// This file: the usage text, help, version, and the command line. The
// commands live in one file per group (store_cmds.cc, maintenance_cmds.cc,
// explain_cmd.cc, misses_cmd.cc, run_cmd.cc, bundle_cmds.cc,
// config_cmds.cc, doctor_cmd.cc, metrics.cc).
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "util/json.h"

namespace kcache::cli {
namespace {

// The usage of each command: its synopsis and what it does, as the global
// usage lists it and as `kcache help CMD` / `kcache CMD --help` print it.
struct Help {
  const char* name;
  const char* text;
};
const Help kHelp[] = {
    {"put",
     "  put --key HEX NAME=PATH...      store one entry whose artifacts are those files\n"
     "      [--manifest FILE]           (with --manifest, the entry carries that manifest\n"
     "                                   and --key defaults to the manifest's key)\n"},
    {"get",
     "  get --key HEX --artifact NAME [-o PATH]\n"
     "                                  write an artifact's bytes to stdout or to PATH\n"
     "                                  (PATH is replaced atomically)\n"},
    {"ls", "  ls [--json]                     list entries: key, size, last use (newest first)\n"},
    {"show", "  show --key HEX [--json]         one entry: sizes, artifacts, metadata, manifest\n"},
    {"stats",
     "  stats [--json | --format openmetrics|prometheus] [--zero] [--compression]\n"
     "                                  counters and totals of the store, disk used, and\n"
     "                                  each other tier (a remote is probed); --format\n"
     "                                  openmetrics prints them as OpenMetrics 1.0,\n"
     "                                  prometheus in Prometheus's text format 0.0.4\n"
     "                                  (node exporter's textfile collector); --zero sets\n"
     "                                  the store's counters to 0 after printing them;\n"
     "                                  --compression reads every entry for its bytes\n"
     "                                  before and after compression\n"},
    {"verify",
     "  verify [--fix] [--json]         check every entry; list the bad ones;\n"
     "                                  --fix removes them. Exit 1 whenever bad entries\n"
     "                                  were found, even when --fix removed them all\n"},
    {"trim",
     "  trim [--max-size SIZE] [--json] evict least recently used entries down to SIZE\n"
     "                                  (e.g. 500M, 2G; default: the configured limit);\n"
     "                                  SIZE is for this trim only (keep a limit with\n"
     "                                  `kcache config set max_size SIZE`)\n"
     "  trim [--older-than DURATION] [--namespace NS] [--max-size SIZE]\n"
     "                                  evict the entries not used for DURATION (90s,\n"
     "                                  30m, 12h, 7d, 2w) and/or of key namespace NS;\n"
     "                                  then down to SIZE when it is given\n"},
    {"clear", "  clear [--json]                  remove every entry\n"},
    {"explain",
     "  explain [--key HEX] [--manifest FILE] [--json]\n"
     "                                  why does this key miss? Exit 0 if it is stored;\n"
     "                                  else compare FILE with the stored manifests of the\n"
     "                                  same namespace, name the components that differ\n"
     "                                  from the nearest one, and exit 1. Without\n"
     "                                  --manifest: the manifest the miss journal kept\n"},
    {"misses",
     "  misses [--limit N] [--json]     the last N misses of the store (default 1000), each\n"
     "                                  with the nearest entry stored before it and what\n"
     "                                  differs, then grouped by cause\n"},
    {"run",
     "  run --key HEX --artifact NAME=PATH... -- COMMAND [ARGS...]\n"
     "                                  on a hit, write the stored artifacts to their\n"
     "                                  paths and do not run COMMAND; on a miss, run it\n"
     "                                  once across processes (others wait for it), then\n"
     "                                  store the files it left at those paths. Exit:\n"
     "                                  COMMAND's own status when it ran, else 0\n"},
    {"config",
     "  config [--json]                 every setting in effect, its value and where it\n"
     "                                  came from (default, config file, environment,\n"
     "                                  command line)\n"
     "  config get NAME                 one setting's value\n"
     "  config set NAME VALUE [--user]  keep a setting in the store folder's config file\n"
     "                                  (DIR/config), or with --user in the user-wide one\n"
     "                                  ($XDG_CONFIG_HOME/kcache/config)\n"
     "  config unset NAME [--user]      remove a setting from that file\n"},
    {"doctor",
     "  doctor [--json]                 read the config files and open every configured\n"
     "                                  tier and say, one line each, whether it works:\n"
     "                                  the store and its permissions, the remote (round\n"
     "                                  trip), its secret, each bundle. Exit 3 when\n"
     "                                  something configured does not work\n"
     "  doctor --hosts [--json]         the store each host (the library, Triton, JAX,\n"
     "                                  Warp) uses in this environment\n"},
    {"mark",
     "  mark [--json]                   print a mark: a position in the store's recency\n"
     "                                  records (for bundle create --since)\n"},
    {"bundle",
     "  bundle create -o FILE [--since MARK] [--namespace NS]... [--keys FILE]\n"
     "                [--sign KEYFILE] [--json]\n"
     "                                  write the selected entries (default: all) to a\n"
     "                                  bundle file, signed with KEYFILE if given\n"
     "  bundle keygen KEYFILE           write an Ed25519 key pair: KEYFILE, KEYFILE.pub\n"
     "  bundle import FILE [--json]     copy a bundle's entries into the store\n"
     "  bundle ls|show|verify FILE [--json]\n"
     "                                  a bundle's entries, header and signature, or a\n"
     "                                  check of every entry (exit 1 if any is bad)\n"},
    {"help", "  help [COMMAND], --help          this text, or one command's usage\n"},
    {"version", "  version, --version [--json]     version and features built in\n"},
};

const char kUsageHead[] =
    "usage: kcache [--dir DIR] [--engine lmdb|files] COMMAND [OPTIONS]\n"
    "\n"
    "Inspect and maintain kcache's stores: the disk store, and the remote of\n"
    "KCACHE_REMOTE for put, get, show, explain, run, stats and doctor.\n"
    "\n"
    "Commands:\n";

const char kUsageTail[] =
    "\n"
    "Global options (anywhere on the line):\n"
    "  --dir DIR          cache folder (default $KCACHE_DIR, else the library default:\n"
    "                     $XDG_CACHE_HOME/kcache or ~/.cache/kcache)\n"
    "  --engine E         disk engine, lmdb or files (default $KCACHE_ENGINE, else lmdb)\n"
    "\n"
    "Manifest files (--manifest): either JSON, as printed by `kcache show --json`\n"
    "(the whole object or its \"manifest\" member):\n"
    "  {\"namespace\": \"NS\", \"items\": [{\"name\": N, \"type\": T, \"digest\": HEX}, ...]}\n"
    "or text, one component per line, `#` starts a comment:\n"
    "  namespace NS\n"
    "  NAME TYPE HEXDIGEST\n"
    "TYPE is one of bytes string u64 i64 bool map list file digest.\n"
    "\n"
    "Exit status: 0 success, 1 a miss or not-found, 2 bad usage, 3 any other error.\n"
    "Every failure prints one line on stderr.\n"
    "Settings: `kcache config` shows each one and where it came from (defaults,\n"
    "config files, KCACHE_* variables, this command line), among them KCACHE_DIR,\n"
    "KCACHE_ENGINE, KCACHE_MAX_SIZE (the configured limit), KCACHE_REMOTE,\n"
    "KCACHE_REMOTE_SECRET_FILE, KCACHE_READONLY, KCACHE_DISABLE, KCACHE_LOG,\n"
    "KCACHE_BUNDLES, KCACHE_BUNDLE_TRUST (docs/cli.md).\n";

std::string full_usage() {
  std::string out = kUsageHead;
  for (const auto& h : kHelp) out += h.text;
  return out + kUsageTail;
}

const Help* find_help(std::string_view name) {
  for (const auto& h : kHelp)
    if (name == h.name) return &h;
  return nullptr;
}

// One command's usage: its lines of the global usage and the global options.
std::string command_usage(const Help& h) {
  return std::string("usage: kcache [--dir DIR] [--engine lmdb|files] ") + h.name + " ...\n\n" + h.text +
         "\nGlobal options: --dir DIR (cache folder), --engine lmdb|files (disk engine).\n"
         "Exit status: 0 success, 1 a miss or not-found, 2 bad usage, 3 any other error.\n";
}

int cmd_help(Ctx& c) {
  if (c.args.positional.empty()) return c.out(full_usage());
  if (c.args.positional.size() > 1) return usage_error("help", "one command at a time");
  const Help* h = find_help(c.args.positional.front());
  if (!h) return usage_error("help", "unknown command '" + c.args.positional.front() + "'");
  return c.out(command_usage(*h));
}

int cmd_version(Ctx& c) {
  auto f = features();
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("version", version_string()).key("features").begin_array();
    for (const auto& x : f) w.value(x);
    return c.out(w.end_array().end_object().take() + "\n");
  }
  std::string out = std::string("kcache ") + version_string() + "\nfeatures:";
  for (const auto& x : f) out += " " + x;
  return c.out(out + "\n");
}

// ---- dispatch ----------------------------------------------------------------

struct Command {
  const char* name;
  int (*run)(Ctx&);
  bool json;  // accepts --json
  std::vector<FlagSpec> flags;
};

const std::vector<Command>& commands() {
  static const std::vector<Command> cmds = {
      {"help", cmd_help, false, {}},
      {"version", cmd_version, true, {}},
      {"put", cmd_put, true, {{"--key", true}, {"--manifest", true}}},
      {"get", cmd_get, false, {{"--key", true}, {"--artifact", true}, {"-o", true}, {"--output", true}}},
      {"ls", cmd_ls, true, {}},
      {"show", cmd_show, true, {{"--key", true}}},
      {"stats", cmd_stats, true, {{"--zero", false}, {"--format", true}, {"--compression", false}}},
      {"verify", cmd_verify, true, {{"--fix", false}}},
      {"trim", cmd_trim, true, {{"--max-size", true}, {"--older-than", true}, {"--namespace", true}}},
      {"clear", cmd_clear, true, {}},
      {"explain", cmd_explain, true, {{"--key", true}, {"--manifest", true}}},
      {"misses", cmd_misses, true, {{"--limit", true}}},
      {"run", cmd_run, false, {{"--key", true}, {"--artifact", true, true}}},
      {"config", cmd_config, true, {{"--user", false}}},
      {"doctor", cmd_doctor, true, {{"--hosts", false}}},
      {"mark", cmd_mark, true, {}},
      {"bundle",
       cmd_bundle,
       true,
       {{"-o", true},
        {"--output", true},
        {"--since", true},
        {"--namespace", true, true},
        {"--keys", true},
        {"--sign", true}}},
  };
  return cmds;
}

const FlagSpec kGlobalFlags[] = {{"--dir", true}, {"--engine", true}};

bool global_takes_value(std::string_view a) {
  for (const auto& f : kGlobalFlags)
    if (a == f.name) return f.takes_value;
  return false;
}

int run(int argc, char** argv) {
  hold_standard_fds();
  std::vector<std::string> args(argv + 1, argv + argc);
  // --help and -h anywhere before "--": the usage of the command on the
  // line, or the whole usage.
  bool want_help = false, want_version = false;
  for (const auto& a : args) {
    if (a == "--") break;
    if (a == "--help" || a == "-h") want_help = true;
  }
  // The command is the first word that is not an option or an option's
  // value. An option before it that is none, or a global option without
  // its value, is named when no command follows.
  size_t cmd_at = args.size();
  std::string stray;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a == "--help" || a == "-h") continue;
    if (a == "--version") {
      want_version = true;
      continue;
    }
    if (global_takes_value(a)) {
      if (i + 1 >= args.size()) return usage_error("", "option " + a + " needs a value");
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') {
      if (stray.empty() && !global_takes_value(a.substr(0, a.find('=')))) stray = a;
      continue;
    }
    cmd_at = i;
    break;
  }
  std::string name = cmd_at < args.size() ? args[cmd_at] : std::string();
  if (name.empty()) {
    if (want_help) {
      Ctx c;
      return c.out(full_usage());
    }
    if (!want_version) {
      if (!stray.empty()) return usage_error("", "unknown option '" + stray + "' (and no command given)");
      return usage_error("", "no command given");
    }
    name = "version";
  }
  const Command* cmd = nullptr;
  for (const auto& c : commands())
    if (name == c.name) cmd = &c;
  if (!cmd) return usage_error("", "unknown command '" + name + "'");
  if (want_help) {
    Ctx c;
    c.args.command = name;
    const Help* h = find_help(name);
    return c.out(h && cmd->run != cmd_help ? command_usage(*h) : full_usage());
  }

  Ctx ctx;
  ctx.args.command = name;
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i == cmd_at) continue;
    std::string a = args[i];
    if (only_positional) {
      ctx.args.after_dashes.push_back(a);
      continue;
    }
    if (a.empty() || a[0] != '-' || a == "-") {
      ctx.args.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      ctx.args.saw_dashes = true;
      continue;
    }
    if (a == "--version" && cmd->run == cmd_version) continue;
    if (a == "--json" && cmd->json) {
      ctx.json = true;
      continue;
    }
    std::optional<std::string> value;
    if (auto eq = a.find('='); eq != std::string::npos && a.starts_with("--")) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    const FlagSpec* spec = nullptr;
    for (const auto& f : kGlobalFlags)
      if (a == f.name) spec = &f;
    for (const auto& f : cmd->flags)
      if (a == f.name) spec = &f;
    if (!spec) return usage_error(name, "unknown option '" + a + "'");
    if (spec->takes_value && !value) {
      if (i + 1 >= args.size() || i + 1 == cmd_at) return usage_error(name, "option " + a + " needs a value");
      value = args[++i];
    }
    if (!spec->takes_value && value) return usage_error(name, "option " + a + " takes no value");
    std::string key = a == "--output" ? "-o" : a;
    // A single-valued option given twice is a mistake, never "the last
    // wins" (--artifact of get, --dir, ...); run's --artifact and bundle's
    // --namespace are lists.
    if (ctx.args.flags.count(key) && !spec->repeats) return usage_error(name, "option " + a + " given more than once");
    ctx.args.flags[key] = value.value_or("");
    ctx.args.all_flags.emplace_back(key, value.value_or(""));
  }
  if (cmd->run == cmd_put) {  // put takes NAME=PATH words, "--" included
    for (auto& w : ctx.args.after_dashes) ctx.args.positional.push_back(std::move(w));
    ctx.args.after_dashes.clear();
  }
  if (!ctx.args.positional.empty() && cmd->run != cmd_put && cmd->run != cmd_bundle && cmd->run != cmd_help &&
      cmd->run != cmd_config)
    return usage_error(name, "unexpected argument '" + ctx.args.positional.front() + "'");
  if (!ctx.args.after_dashes.empty() && cmd->run != cmd_run)
    return usage_error(name, "unexpected argument '" + ctx.args.after_dashes.front() + "'");
  return cmd->run(ctx);
}

}  // namespace
}  // namespace kcache::cli

int main(int argc, char** argv) { return kcache::cli::run(argc, argv); }

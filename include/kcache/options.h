// kcache/options.h — where the settings in effect come from: config
// files, the environment and a command line, on top of the program's
// Options, and which of them set each option.
//
// The settings, later over earlier (docs/design.md, "Options"):
//   1. the defaults (Options' initialisers);
//   2. the program's own settings (fields, kcache_options_set, keyword
//      arguments);
//   3. the user-wide config file, user_config_path():
//      $XDG_CONFIG_HOME/kcache/config, else ~/.config/kcache/config;
//   4. the store folder's config file, store_config_path(dir): DIR/config,
//      DIR being the folder the steps before and KCACHE_DIR / --dir name;
//   5. the KCACHE_* variables of the environment;
//   6. a command line (the `kcache` tool's --dir and --engine).
// Options::apply_env() and Options::from_env() do steps 3 to 5, so the
// library, the C ABI, Python and every `kcache` command read the same
// files.
//
// A config file holds one setting a line, `NAME = VALUE` (the names of
// option_table(), e.g. `max_size = 2G`, `remote = redis://cache:6379`,
// `durability = full`); `#` starts a comment line, blank lines are
// ignored, names are read case-insensitively and `-` is `_`. `kcache config
// set NAME VALUE` writes it. The store folder's file cannot set `dir`.
// A file that another user could have written (owned by someone else than
// this user or root, or writable by others) is not read (a problem says
// so), as a store in such a folder is not opened.
//
// Zero and defaults: one rule for every options struct of kcache (Options
// with the DiskTierOptions in it, MemoryTierOptions, RemoteTierOptions and
// RedisTierOptions, BatchOptions):
//  * a field's initialiser is its default, and nothing else holds one;
//  * a number is never refused for being 0. 0 means unset, and the default
//    applies, unless the field's comment gives 0 a meaning of its own:
//    Options::wait_bound_ms (0: never wait), Options::miss_journal (0: no
//    journal), Options::memory_bytes (0: no memory tier),
//    RemoteTierOptions::ttl_ms (0: no expiry);
//  * a value given by name (Options::set, a config file, a KCACHE_*
//    variable, a command line, a remote URL's query) means what the field
//    means: "0" there is the same 0. Options::get shows the value in effect
//    (max_size 0 reads back as 4G).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/cache.h"
#include "kcache/status.h"

namespace kcache {

// $XDG_CONFIG_HOME/kcache/config (XDG_CONFIG_HOME absolute), else
// $HOME/.config/kcache/config; empty when neither can be named.
std::string user_config_path();
// dir + "/config"; empty when dir is.
std::string store_config_path(const std::string& dir);

// What applying the settings did.
struct AppliedSettings {
  // Bad values (invalid_argument, naming the file and line, the variable
  // or the flag), lines of a file that set nothing (not_found), files that
  // cannot be read or are not trusted (unavailable), and KCACHE_* variables
  // that name no option (not_found, with the nearest known name). Not
  // options, and never reported: KCACHE_JOBS (BatchOptions::threads) and
  // the names that begin with KCACHE_TEST_ or KCACHE_BENCH_, left to the
  // programs that test or measure kcache.
  std::vector<Status> problems;
  // Where each option set by steps 3 to 6 came from: option name ->
  // "config file PATH", "environment KCACHE_X" or "command line --flag".
  // Options not in it hold the program's value or the default.
  std::map<std::string, std::string, std::less<>> origin;
  // The config files read (those that exist), in order.
  std::vector<std::string> files;
};

// Steps 3 to 6 on `options`: config files, environment, then
// `command_line` (option name -> value, e.g. {"dir", "/x"}), whose dir
// also picks the store folder's config file. A bad value leaves its option
// as it was.
AppliedSettings apply_settings(Options& options,
                               const std::vector<std::pair<std::string, std::string>>& command_line = {});

// Reads one config file into `options` (step 3 or 4). `store_file`: the
// store folder's, which cannot set dir. A missing file is no problem.
void apply_config_file(Options& options, const std::string& path, bool store_file, AppliedSettings* out);

// Sets (value given) or removes (nullopt) NAME in the config file at
// `path`, creating it and its folder (0700) when missing; the file is
// replaced atomically, other lines kept as they were. invalid_argument for
// an unknown name or a bad value (checked by Options::set), for `dir` in a
// store folder's file (`store_file`).
Status write_config_setting(const std::string& path, std::string_view name, std::optional<std::string_view> value,
                            bool store_file);

// The option name `name` stands for: lower case, `-` as `_`; nullopt when
// it names no option.
std::optional<std::string> option_name(std::string_view name);
// The known name nearest to `unknown` (edit distance), for "did you mean";
// empty when none is near. `variables`: compare with the KCACHE_* names.
std::string nearest_option(std::string_view unknown, bool variables);

}  // namespace kcache

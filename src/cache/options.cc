// Options from the environment.
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

static bool env_flag(const std::string& v, bool* out) {
  if (v.empty()) return false;
  if (auto b = util::parse_bool(v)) {
    *out = *b;
    return true;
  }
  KCACHE_LOG(LogLevel::warn, "ignoring unparsable boolean '%s'", v.c_str());
  return false;
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

// "a:b::c" -> {"a", "b", "c"}: a list of paths (empty parts dropped).
static std::vector<std::string> split_paths(const std::string& v) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(':', start);
    if (end == std::string::npos) end = v.size();
    if (end > start) out.push_back(v.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

static std::optional<LogLevel> parse_level(const std::string& s) {
  if (s == "off" || s == "0") return LogLevel::off;
  if (s == "error") return LogLevel::error;
  if (s == "warn" || s == "warning") return LogLevel::warn;
  if (s == "info" || s == "1") return LogLevel::info;
  if (s == "debug" || s == "2") return LogLevel::debug;
  return std::nullopt;
}

Options Options::from_env(Options o) {
  std::string v;
  // KCACHE_LOG=level[:file] first, so the rest can warn where asked.
  if (!(v = util::getenv_str("KCACHE_LOG")).empty()) {
    std::string level = v, file;
    if (auto c = v.find(':'); c != std::string::npos) {
      level = v.substr(0, c);
      file = v.substr(c + 1);
    }
    if (auto l = parse_level(level)) {
      o.log_level = *l;
      o.log_file = file;
    } else {
      KCACHE_LOG(LogLevel::warn, "ignoring KCACHE_LOG='%s' (want off|error|warn|info|debug[:file])", v.c_str());
    }
  }
  if (!(v = util::getenv_str("KCACHE_DIR")).empty()) o.dir = v;
  env_flag(util::getenv_str("KCACHE_DISABLE"), &o.disabled);
  env_flag(util::getenv_str("KCACHE_READONLY"), &o.read_only);
  env_flag(util::getenv_str("KCACHE_RECOMPILE"), &o.recompile);
  env_flag(util::getenv_str("KCACHE_STATS"), &o.print_stats);
  env_flag(util::getenv_str("KCACHE_EXPLAIN"), &o.explain);
  if (!(v = util::getenv_str("KCACHE_MAX_SIZE")).empty()) {
    if (auto s = util::parse_size(v); s && *s > 0)
      o.disk.max_bytes = *s;
    else
      KCACHE_LOG(LogLevel::warn, "ignoring KCACHE_MAX_SIZE='%s' (want e.g. 2G, 500M)", v.c_str());
  }
  if (!(v = util::getenv_str("KCACHE_SHARED")).empty()) o.shared_group = v;
  if (!(v = util::getenv_str("KCACHE_REMOTE")).empty()) o.remote_url = v;
  if (!(v = util::getenv_str("KCACHE_REMOTE_SECRET_FILE")).empty()) o.remote_secret_file = v;
  if (!(v = util::getenv_str("KCACHE_BUNDLES")).empty()) o.bundles.files = split_paths(v);
  if (!(v = util::getenv_str("KCACHE_BUNDLE_TRUST")).empty()) o.bundles.trusted_keys = split_paths(v);
  if (!(v = util::getenv_str("KCACHE_DURABILITY")).empty()) {
    if (v == "normal")
      o.disk.durability = Durability::normal;
    else if (v == "full")
      o.disk.durability = Durability::full;
    else if (v == "none")
      o.disk.durability = Durability::none;
    else
      KCACHE_LOG(LogLevel::warn, "ignoring KCACHE_DURABILITY='%s' (want normal|full|none)", v.c_str());
  }
  if (!(v = util::getenv_str("KCACHE_ENGINE")).empty()) {
    if (auto e = parse_engine(v))
      o.engine = *e;
    else
      KCACHE_LOG(LogLevel::warn, "ignoring KCACHE_ENGINE='%s' (want lmdb|files)", v.c_str());
  }
  return o;
}

}  // namespace kcache

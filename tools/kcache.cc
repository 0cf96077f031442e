// kcache — the command-line tool: inspect and maintain a kcache disk store.
//
// The tool works on the disk tier directly (the same folder layout that
// Cache::open uses: <dir>/lmdb or <dir>/files), never through a memory tier:
// what it prints is what is stored. It is meant for scripts as much as for
// people, so its contract is fixed (docs/cli.md):
//   exit 0 success, 1 a miss or not-found, 2 bad usage, 3 any other error;
//   every failure is exactly one line on stderr, "kcache: <command>: <why>";
//   --json on every command that prints data, tables for people otherwise.
// Commands that only look (ls, show, stats, get, verify, explain, trim,
// clear) never create the cache folder: a folder that does not exist reads
// as an empty store. A corrupt entry is reported, never fatal.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/lease.h"
#include "kcache/status.h"
#include "kcache/tier.h"
#include "util/util.h"

namespace {

using namespace kcache;

enum ExitCode : int { kExitOk = 0, kExitMiss = 1, kExitUsage = 2, kExitError = 3 };

const char kUsage[] =
    "usage: kcache [--dir DIR] [--engine lmdb|files] COMMAND [OPTIONS]\n"
    "\n"
    "Inspect and maintain a kcache disk store.\n"
    "\n"
    "Commands:\n"
    "  put --key HEX NAME=PATH...      store one entry whose artifacts are those files\n"
    "      [--manifest FILE]           (with --manifest, the entry carries that manifest\n"
    "                                   and --key defaults to the manifest's key)\n"
    "  get --key HEX --artifact NAME [-o PATH]\n"
    "                                  write an artifact's bytes to stdout or to PATH\n"
    "                                  (PATH is replaced atomically)\n"
    "  ls [--json]                     list entries: key, size, last use (newest first)\n"
    "  show --key HEX [--json]         one entry: sizes, artifacts, metadata, manifest\n"
    "  stats [--json]                  counters and totals of the store\n"
    "  verify [--fix] [--json]         check every entry; list the bad ones;\n"
    "                                  --fix removes them. Exit 1 whenever bad entries\n"
    "                                  were found, even when --fix removed them all\n"
    "  trim [--max-size SIZE] [--json] evict least recently used entries down to SIZE\n"
    "                                  (e.g. 500M, 2G; default: the configured limit)\n"
    "  clear [--json]                  remove every entry\n"
    "  explain [--key HEX] [--manifest FILE] [--json]\n"
    "                                  why does this key miss? Exit 0 if it is stored;\n"
    "                                  else compare FILE with the stored manifests of the\n"
    "                                  same namespace, name the components that differ\n"
    "                                  from the nearest one, and exit 1\n"
    "  run --key HEX --artifact NAME=PATH... -- COMMAND [ARGS...]\n"
    "                                  on a hit, write the stored artifacts to their\n"
    "                                  paths and do not run COMMAND; on a miss, run it\n"
    "                                  once across processes (others wait for it), then\n"
    "                                  store the files it left at those paths. Exit:\n"
    "                                  COMMAND's own status when it ran, else 0\n"
    "  help, --help                    this text\n"
    "  version, --version [--json]     version and features built in\n"
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
    "Environment: KCACHE_DIR, KCACHE_ENGINE, KCACHE_MAX_SIZE (the configured limit),\n"
    "KCACHE_LOG.\n";

// ---- small output helpers --------------------------------------------------

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  int n = std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  if (n < 0) return std::string();
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string out(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, f);
  std::vsnprintf(out.data(), out.size(), f, ap);
  va_end(ap);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string jstr(std::string_view s) { return "\"" + util::json_escape(s) + "\""; }
std::string u64s(uint64_t v) { return std::to_string(v); }

std::string format_time(uint64_t unix_ms) {
  if (unix_ms == 0) return "-";
  time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  if (!::localtime_r(&t, &tm)) return u64s(unix_ms);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// Prints `s` to stdout completely; false when stdout refused it.
bool emit(std::string_view s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) return false;
  return std::fflush(stdout) == 0;
}

int exit_for(const Status& st) {
  switch (st.code()) {
    case Errc::ok: return kExitOk;
    case Errc::not_found: return kExitMiss;
    case Errc::invalid_argument: return kExitUsage;
    default: return kExitError;
  }
}

// ---- a small JSON reader, enough for manifests ------------------------------

struct Json {
  enum Type { null_v, bool_v, num_v, str_v, arr_v, obj_v } type = null_v;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;

  const Json* member(std::string_view name) const {
    if (type != obj_v) return nullptr;
    for (const auto& [k, v] : obj)
      if (k == name) return &v;
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view s) : s_(s) {}

  // Parses one complete document; false with error() set otherwise.
  bool parse(Json* out) {
    if (!value(out, 0)) return false;
    ws();
    if (i_ != s_.size()) return fail("trailing characters");
    return true;
  }
  const std::string& error() const { return err_; }

 private:
  bool fail(const char* what) {
    if (err_.empty()) err_ = fmt("%s at offset %zu", what, i_);
    return false;
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return fail("bad literal");
    i_ += w.size();
    return true;
  }
  bool value(Json* v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    ws();
    if (i_ >= s_.size()) return fail("unexpected end");
    char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->type = Json::str_v;
      return string(&v->str);
    }
    if (c == 't') {
      v->type = Json::bool_v;
      v->b = true;
      return lit("true");
    }
    if (c == 'f') {
      v->type = Json::bool_v;
      return lit("false");
    }
    if (c == 'n') return lit("null");
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i_;
      while (j < s_.size() && std::strchr("+-.eE0123456789", s_[j])) ++j;
      std::string num(s_.substr(i_, j - i_));
      char* end = nullptr;
      v->num = std::strtod(num.c_str(), &end);
      if (end != num.c_str() + num.size()) return fail("bad number");
      v->type = Json::num_v;
      i_ = j;
      return true;
    }
    return fail("unexpected character");
  }
  bool object(Json* v, int depth) {
    v->type = Json::obj_v;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      ws();
      std::string k;
      if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a member name");
      if (!string(&k)) return false;
      ws();
      if (i_ >= s_.size() || s_[i_] != ':') return fail("expected ':'");
      ++i_;
      Json m;
      if (!value(&m, depth + 1)) return false;
      v->obj.emplace_back(std::move(k), std::move(m));
      ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }
  bool array(Json* v, int depth) {
    v->type = Json::arr_v;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      Json e;
      if (!value(&e, depth + 1)) return false;
      v->arr.push_back(std::move(e));
      ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }
  static void utf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xc0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xe0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      *out += static_cast<char>(0xf0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  bool hex4(uint32_t* out) {
    if (i_ + 4 > s_.size()) return fail("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else return fail("bad \\u escape");
    }
    *out = v;
    return true;
  }
  bool string(std::string* out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      char e = s_[i_++];
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00 && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            uint32_t lo;
            if (!hex4(&lo)) return false;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          utf8(out, cp);
          break;
        }
        default: return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string err_;
};

// ---- manifests: read from a file, print as JSON -----------------------------

std::optional<ComponentType> component_type_from(std::string_view name) {
  for (int t = 1; t <= 9; ++t) {
    auto ct = static_cast<ComponentType>(t);
    if (component_type_name(ct) == name) return ct;
  }
  return std::nullopt;
}

Expected<ManifestItem> make_item(std::string name, std::string_view type, std::string_view hex) {
  auto t = component_type_from(type);
  if (!t) return Status(Errc::invalid_argument, "component '" + name + "': unknown type '" + std::string(type) + "'");
  auto d = Digest::from_hex(hex);
  if (!d) return Status(Errc::invalid_argument, "component '" + name + "': digest is not 32 hex digits");
  if (name.empty()) return Status(Errc::invalid_argument, "a component has an empty name");
  return ManifestItem{std::move(name), *t, *d};
}

Expected<Manifest> manifest_from_json(std::string_view text) {
  Json doc;
  JsonReader r(text);
  if (!r.parse(&doc)) return Status(Errc::invalid_argument, "not valid JSON: " + r.error());
  const Json* m = doc.member("manifest");
  if (!m) m = &doc;
  if (m->type != Json::obj_v) return Status(Errc::invalid_argument, "no manifest object");
  Manifest out;
  const Json* ns = m->member("namespace");
  if (!ns || ns->type != Json::str_v) return Status(Errc::invalid_argument, "manifest has no \"namespace\" string");
  out.ns = ns->str;
  const Json* items = m->member("items");
  if (!items || items->type != Json::arr_v) return Status(Errc::invalid_argument, "manifest has no \"items\" array");
  for (const Json& it : items->arr) {
    const Json* n = it.member("name");
    const Json* t = it.member("type");
    const Json* d = it.member("digest");
    if (!n || !t || !d || n->type != Json::str_v || t->type != Json::str_v || d->type != Json::str_v)
      return Status(Errc::invalid_argument, "each item needs string \"name\", \"type\" and \"digest\"");
    KCACHE_TRY(ManifestItem mi, make_item(n->str, t->str, d->str));
    out.items.push_back(std::move(mi));
  }
  return out;
}

Expected<Manifest> manifest_from_text(std::string_view text) {
  Manifest out;
  size_t lineno = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++lineno;
    if (auto h = line.find('#'); h != std::string_view::npos) line = line.substr(0, h);
    std::vector<std::string> tok;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
      if (j > i) tok.emplace_back(line.substr(i, j - i));
      i = j;
    }
    if (tok.empty()) continue;
    if (tok.size() == 2 && tok[0] == "namespace") {
      out.ns = tok[1];
    } else if (tok.size() == 3) {
      auto mi = make_item(tok[0], tok[1], tok[2]);
      if (!mi) return Status(Errc::invalid_argument, "line " + std::to_string(lineno) + ": " + mi.error().message());
      out.items.push_back(std::move(mi).value());
    } else {
      return Status(Errc::invalid_argument,
                    "line " + std::to_string(lineno) + ": want `namespace NS` or `NAME TYPE HEXDIGEST`");
    }
  }
  return out;
}

// Reads a manifest file in either format; items come back sorted by name,
// as KeyBuilder orders them, so the manifest hashes to the key it describes.
Expected<Manifest> read_manifest(const std::string& path) {
  auto text = util::read_file(path, 64 << 20);
  if (!text) return text.error();
  std::string_view t = *text;
  size_t first = t.find_first_not_of(" \t\r\n");
  Expected<Manifest> m = first != std::string_view::npos && t[first] == '{' ? manifest_from_json(t)
                                                                            : manifest_from_text(t);
  if (!m) return Status(m.error().code(), path + ": " + m.error().message());
  std::sort(m->items.begin(), m->items.end(), [](const ManifestItem& a, const ManifestItem& b) { return a.name < b.name; });
  for (size_t i = 1; i < m->items.size(); ++i)
    if (m->items[i].name == m->items[i - 1].name)
      return Status(Errc::invalid_argument, path + ": component '" + m->items[i].name + "' appears twice");
  return m;
}

std::string manifest_json(const Manifest& m) {
  std::string out = "{\"namespace\":" + jstr(m.ns) + ",\"items\":[";
  for (size_t i = 0; i < m.items.size(); ++i) {
    const auto& it = m.items[i];
    if (i) out += ",";
    out += "{\"name\":" + jstr(it.name) + ",\"type\":" + jstr(component_type_name(it.type)) +
           ",\"digest\":" + jstr(it.digest.hex()) + "}";
  }
  return out + "]}";
}

// ---- command line ----------------------------------------------------------

struct FlagSpec {
  const char* name;  // "--key"
  bool takes_value;
};

struct Args {
  std::string command;
  std::map<std::string, std::string> flags;  // "--key" -> value ("" for switches)
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

// The open store. `tier` is null when the folder does not exist and the
// command does not create it: such a store reads as empty.
struct Store {
  std::string dir;     // the cache folder (--dir, KCACHE_DIR or default)
  std::string engine;  // "lmdb" or "files"
  std::string path;    // dir + "/" + engine
  DiskTierOptions disk;
  std::shared_ptr<Tier> tier;
};

struct Ctx {
  Args args;
  bool json = false;
  Store store;

  int fail(int code, const std::string& msg) const {
    std::string line = "kcache: " + (args.command.empty() ? std::string() : args.command + ": ") + msg;
    std::replace(line.begin(), line.end(), '\n', ' ');
    std::fprintf(stderr, "%s\n", line.c_str());
    return code;
  }
  int fail(const Status& st) const { return fail(exit_for(st), st.message()); }
  int out(std::string_view s) const {
    if (!emit(s)) return fail(kExitError, std::string("writing to stdout: ") + std::strerror(errno));
    return kExitOk;
  }
};

int usage_error(const std::string& command, const std::string& msg) {
  std::fprintf(stderr, "kcache: %s%s (see kcache --help)\n", command.empty() ? "" : (command + ": ").c_str(),
               msg.c_str());
  return kExitUsage;
}

// Parses --key; on failure has printed the usage line and returns nullopt.
std::optional<Key> key_flag(const Ctx& c, bool required = true) {
  const std::string* v = c.args.get("--key");
  if (!v) {
    if (required) usage_error(c.args.command, "--key HEX is required");
    return std::nullopt;
  }
  auto k = Digest::from_hex(*v);
  if (!k) usage_error(c.args.command, "--key '" + *v + "' is not a 32-digit hex key");
  return k;
}

bool path_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Resolves folder and engine, then opens the tier. Returns an exit code
// (kExitOk when the store is usable).
int open_store(Ctx& c, bool create) {
  Store& s = c.store;
  std::string from = "--engine";
  if (const std::string* e = c.args.get("--engine")) {
    s.engine = *e;
  } else {
    s.engine = util::getenv_str("KCACHE_ENGINE");
    from = "KCACHE_ENGINE";
  }
#if KCACHE_HAVE_LMDB
  if (s.engine.empty()) s.engine = "lmdb";
#else
  if (s.engine.empty()) s.engine = "files";
  if (s.engine == "lmdb") return usage_error(c.args.command, "this kcache was built without the lmdb engine");
#endif
  if (s.engine != "lmdb" && s.engine != "files")
    return usage_error(c.args.command, from + " '" + s.engine + "' is not lmdb or files");
  // The engine is settled (and checked) here; the library need not warn
  // about the variable once more.
  ::unsetenv("KCACHE_ENGINE");
  Options opt = Options::from_env();
  util::set_log(opt.log_level, opt.log_file);
  s.disk = opt.disk;
  if (const std::string* d = c.args.get("--dir")) s.dir = *d;
  else s.dir = util::getenv_str("KCACHE_DIR");
  if (s.dir.empty()) s.dir = Options::default_dir();
  if (s.dir.empty()) return c.fail(kExitError, "no cache folder: pass --dir (HOME and XDG_CACHE_HOME are unset)");
  s.path = s.dir + "/" + s.engine;
  if (!create && !path_exists(s.path)) return kExitOk;
  if (create) {
    Status st = util::make_dirs(s.dir, 0700);
    if (!st.is_ok()) return c.fail(kExitError, "cannot create " + s.dir + ": " + st.message());
  }
  Expected<std::shared_ptr<Tier>> t = s.engine == "files" ? open_files_tier(s.path, s.disk)
#if KCACHE_HAVE_LMDB
                                                          : open_lmdb_tier(s.path, s.disk);
#else
                                                          : Expected<std::shared_ptr<Tier>>(Status(Errc::unavailable, "no lmdb"));
#endif
  if (!t) return c.fail(kExitError, "cannot open " + s.path + ": " + t.error().to_string());
  s.tier = std::move(t).value();
  return kExitOk;
}

// Looks a key up in the store. A corrupt entry comes back as Errc::corrupt.
Expected<std::optional<Entry>> lookup(const Ctx& c, const Key& k) {
  if (!c.store.tier) return std::optional<Entry>();
  return c.store.tier->get(k);
}

// Prints the failure for a lookup that found nothing usable; returns the code.
int report_lookup_failure(const Ctx& c, const Key& k, const Expected<std::optional<Entry>>& r) {
  if (!r) {
    if (r.error().code() == Errc::corrupt)
      return c.fail(kExitMiss, "entry " + k.hex() + " is corrupt (" + r.error().message() + ")");
    return c.fail(kExitError, "looking up " + k.hex() + ": " + r.error().to_string());
  }
  return c.fail(kExitMiss, "no entry for key " + k.hex());
}

// ---- commands --------------------------------------------------------------

int cmd_help(Ctx& c) { return c.out(kUsage); }

int cmd_version(Ctx& c) {
  auto f = features();
  if (c.json) {
    std::string out = "{\"version\":" + jstr(version_string()) + ",\"features\":[";
    for (size_t i = 0; i < f.size(); ++i) out += (i ? "," : "") + jstr(f[i]);
    return c.out(out + "]}\n");
  }
  std::string out = std::string("kcache ") + version_string() + "\nfeatures:";
  for (const auto& x : f) out += " " + x;
  return c.out(out + "\n");
}

int cmd_put(Ctx& c) {
  std::optional<Manifest> manifest;
  if (const std::string* mf = c.args.get("--manifest")) {
    auto m = read_manifest(*mf);
    if (!m) return m.error().code() == Errc::invalid_argument ? usage_error("put", m.error().message()) : c.fail(m.error());
    manifest = std::move(m).value();
  }
  std::optional<Key> key;
  if (c.args.has("--key")) {
    key = key_flag(c);
    if (!key) return kExitUsage;
  } else if (manifest) {
    key = manifest->key();
  } else {
    return usage_error("put", "--key HEX (or --manifest FILE) is required");
  }
  if (c.args.positional.empty()) return usage_error("put", "name at least one artifact as NAME=PATH");
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& p : c.args.positional) {
    size_t eq = p.find('=');
    if (eq == std::string::npos) return usage_error("put", "'" + p + "' is not NAME=PATH");
    if (eq == 0) return usage_error("put", "'" + p + "' has an empty artifact name");
    if (eq + 1 == p.size()) return usage_error("put", "'" + p + "' has an empty path");
    files.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  EntryBuilder b(*key);
  for (auto& [name, path] : files) {
    auto data = util::read_file(path);
    if (!data) return c.fail(exit_for(data.error()), "artifact '" + name + "': " + data.error().message());
    b.add(name, std::move(data).value());
  }
  EntryMeta meta;
  meta.created_unix_ms = util::now_unix_ms();
  meta.producer = "kcache-cli";
  b.meta(meta);
  if (manifest) b.manifest(*manifest);
  auto e = b.build();
  if (!e) {
    if (e.error().code() == Errc::invalid_argument) return usage_error("put", e.error().message());
    return c.fail(e.error());
  }
  if (int rc = open_store(c, /*create=*/true)) return rc;
  Status st = c.store.tier->put(*e);
  if (!st.is_ok()) return c.fail(kExitError, "storing " + key->hex() + ": " + st.to_string());
  st = c.store.tier->flush();
  if (!st.is_ok()) return c.fail(kExitError, "flush: " + st.to_string());
  if (c.json)
    return c.out("{\"key\":" + jstr(key->hex()) + ",\"artifacts\":" + u64s(e->artifacts().size()) +
                 ",\"payload_bytes\":" + u64s(e->payload_size()) + ",\"size\":" + u64s(e->encoded().size()) + "}\n");
  return c.out("stored " + key->hex() + ": " + u64s(e->artifacts().size()) + " artifact" +
               (e->artifacts().size() == 1 ? "" : "s") + ", " + util::format_size(e->payload_size()) + "\n");
}

// Writes `data` to `path` through a temp file in the same folder and a
// rename, so a reader of `path` never sees a partial artifact. The file gets
// the usual 0666 & ~umask permissions (it is the user's output, not cache
// data).
Status write_output(const std::string& path, std::string_view data) {
  return util::write_file_atomic_via(path + ".kcache-tmp", path, data, /*sync=*/false, 0666);
}

int cmd_get(Ctx& c) {
  auto key = key_flag(c);
  if (!key) return kExitUsage;
  const std::string* name = c.args.get("--artifact");
  if (!name) return usage_error("get", "--artifact NAME is required");
  if (int rc = open_store(c, false)) return rc;
  auto r = lookup(c, *key);
  if (!r || !r->has_value()) return report_lookup_failure(c, *key, r);
  const Entry& e = **r;
  auto data = e.artifact(*name);
  if (!data) {
    std::string have;
    for (const auto& a : e.artifacts()) have += (have.empty() ? "" : ", ") + a.name;
    return c.fail(kExitMiss, "entry " + key->hex() + " has no artifact '" + *name + "' (it has: " + have + ")");
  }
  if (const std::string* o = c.args.get("-o")) {
    Status st = write_output(*o, *data);
    if (!st.is_ok()) return c.fail(st.code() == Errc::not_found ? kExitError : exit_for(st), st.message());
    return kExitOk;
  }
  return c.out(*data);
}

int cmd_ls(Ctx& c) {
  if (int rc = open_store(c, false)) return rc;
  std::vector<ListItem> items;
  if (c.store.tier) {
    Status st = c.store.tier->list([&](const ListItem& it) {
      items.push_back(it);
      return true;
    });
    if (!st.is_ok()) return c.fail(kExitError, "listing " + c.store.path + ": " + st.to_string());
  }
  std::sort(items.begin(), items.end(), [](const ListItem& a, const ListItem& b) {
    return a.last_use_ms != b.last_use_ms ? a.last_use_ms > b.last_use_ms : a.key < b.key;
  });
  uint64_t total = 0;
  for (const auto& it : items) total += it.size;
  std::string out;
  if (c.json) {
    out = "{\"count\":" + u64s(items.size()) + ",\"bytes\":" + u64s(total) + ",\"entries\":[";
    for (size_t i = 0; i < items.size(); ++i) {
      out += (i ? "," : "") + std::string("{\"key\":") + jstr(items[i].key.hex()) + ",\"size\":" + u64s(items[i].size) +
             ",\"last_use_ms\":" + u64s(items[i].last_use_ms) + "}";
    }
    return c.out(out + "]}\n");
  }
  out = fmt("%-32s  %10s  %s\n", "KEY", "SIZE", "LAST USE");
  for (const auto& it : items)
    out += fmt("%-32s  %10s  %s\n", it.key.hex().c_str(), util::format_size(it.size).c_str(),
               format_time(it.last_use_ms).c_str());
  out += fmt("%zu entr%s, %s\n", items.size(), items.size() == 1 ? "y" : "ies", util::format_size(total).c_str());
  return c.out(out);
}

int cmd_show(Ctx& c) {
  auto key = key_flag(c);
  if (!key) return kExitUsage;
  if (int rc = open_store(c, false)) return rc;
  auto r = lookup(c, *key);
  if (!r || !r->has_value()) return report_lookup_failure(c, *key, r);
  const Entry& e = **r;
  const EntryMeta& m = e.meta();
  if (c.json) {
    std::string out = "{\"key\":" + jstr(e.key().hex()) + ",\"size\":" + u64s(e.encoded().size()) +
                      ",\"payload_bytes\":" + u64s(e.payload_size()) +
                      ",\"compressed\":" + (e.compressed() ? "true" : "false") +
                      ",\"meta\":{\"created_unix_ms\":" + u64s(m.created_unix_ms) +
                      ",\"compile_cost_us\":" + u64s(m.compile_cost_us) + ",\"producer\":" + jstr(m.producer) +
                      "},\"artifacts\":[";
    for (size_t i = 0; i < e.artifacts().size(); ++i) {
      const auto& a = e.artifacts()[i];
      out += (i ? "," : "") + std::string("{\"name\":") + jstr(a.name) + ",\"size\":" + u64s(a.data.size()) + "}";
    }
    return c.out(out + "],\"manifest\":" + manifest_json(e.manifest()) + "}\n");
  }
  std::string out;
  out += fmt("key           %s\n", e.key().hex().c_str());
  out += fmt("size          %s stored, %s of artifacts%s\n", util::format_size(e.encoded().size()).c_str(),
             util::format_size(e.payload_size()).c_str(), e.compressed() ? " (compressed)" : "");
  out += fmt("created       %s\n", format_time(m.created_unix_ms).c_str());
  out += fmt("compile cost  %.3f ms\n", m.compile_cost_us / 1000.0);
  out += fmt("producer      %s\n", m.producer.empty() ? "-" : m.producer.c_str());
  out += fmt("artifacts     %zu\n", e.artifacts().size());
  for (const auto& a : e.artifacts())
    out += fmt("  %-20s %10s\n", a.name.c_str(), util::format_size(a.data.size()).c_str());
  const Manifest& man = e.manifest();
  if (man.ns.empty() && man.items.empty()) {
    out += "manifest      none\n";
  } else {
    out += fmt("manifest      namespace \"%s\", %zu component%s\n", man.ns.c_str(), man.items.size(),
               man.items.size() == 1 ? "" : "s");
    for (const auto& it : man.items)
      out += fmt("  %-20s %-7s %s\n", it.name.c_str(), std::string(component_type_name(it.type)).c_str(),
                 it.digest.hex().c_str());
  }
  return c.out(out);
}

int cmd_stats(Ctx& c) {
  if (int rc = open_store(c, false)) return rc;
  const Store& s = c.store;
  TierStats t;
  if (s.tier) t = s.tier->stats();
  uint64_t max_bytes = effective_max_bytes(s.disk), max_entries = effective_max_entries(s.disk);
  uint64_t lookups = t.hits + t.misses;
  double rate = lookups ? static_cast<double>(t.hits) / static_cast<double>(lookups) : 0.0;
  if (c.json) {
    std::string out = "{\"entries\":" + u64s(t.entries) + ",\"bytes\":" + u64s(t.bytes) + ",\"hits\":" + u64s(t.hits) +
                      ",\"misses\":" + u64s(t.misses) + ",\"evictions\":" + u64s(t.evictions) +
                      ",\"corrupt\":" + u64s(t.corrupt) + ",\"puts\":" + u64s(t.puts) + ",\"errors\":" + u64s(t.errors) +
                      ",\"rejected\":" + u64s(t.rejected) + fmt(",\"hit_rate\":%.4f", rate) +
                      ",\"max_bytes\":" + u64s(max_bytes) + ",\"max_entries\":" + u64s(max_entries) +
                      ",\"tier\":" + jstr(s.tier ? s.tier->name() : s.engine) + ",\"engine\":" + jstr(s.engine) +
                      ",\"dir\":" + jstr(s.dir) + ",\"path\":" + jstr(s.path) +
                      ",\"exists\":" + (s.tier ? "true" : "false") + "}\n";
    return c.out(out);
  }
  std::string out;
  out += fmt("store       %s (%s engine)%s\n", s.path.c_str(), s.engine.c_str(), s.tier ? "" : ", not created yet");
  out += fmt("entries     %" PRIu64 " of %" PRIu64 " allowed\n", t.entries, max_entries);
  out += fmt("size        %s of %s (%.1f%%)\n", util::format_size(t.bytes).c_str(), util::format_size(max_bytes).c_str(),
             100.0 * static_cast<double>(t.bytes) / static_cast<double>(max_bytes));
  out += fmt("hits        %" PRIu64 "\n", t.hits);
  out += fmt("misses      %" PRIu64 "\n", t.misses);
  out += fmt("hit rate    %.1f%%\n", 100.0 * rate);
  out += fmt("puts        %" PRIu64 "\n", t.puts);
  out += fmt("evictions   %" PRIu64 "\n", t.evictions);
  out += fmt("corrupt     %" PRIu64 "\n", t.corrupt);
  out += fmt("errors      %" PRIu64 "\n", t.errors);
  out += fmt("rejected    %" PRIu64 "\n", t.rejected);
  return c.out(out);
}

int cmd_verify(Ctx& c) {
  bool fix = c.args.has("--fix");
  if (int rc = open_store(c, false)) return rc;
  VerifyReport rep;
  if (c.store.tier) {
    auto r = c.store.tier->verify(fix);
    if (!r) return c.fail(kExitError, "verifying " + c.store.path + ": " + r.error().to_string());
    rep = std::move(r).value();
  }
  std::string out;
  if (c.json) {
    out = "{\"checked\":" + u64s(rep.checked) + ",\"bad_count\":" + u64s(rep.bad.size()) + ",\"removed\":" +
          u64s(rep.removed) + ",\"fix\":" + (fix ? "true" : "false") + ",\"bad\":[";
    for (size_t i = 0; i < rep.bad.size(); ++i)
      out += (i ? "," : "") + std::string("{\"key\":") + jstr(rep.bad[i].first.hex()) +
             ",\"reason\":" + jstr(rep.bad[i].second) + "}";
    out += "]}\n";
  } else {
    for (const auto& [k, why] : rep.bad) out += "bad " + k.hex() + "  " + why + "\n";
    out += "checked " + u64s(rep.checked) + " entr" + (rep.checked == 1 ? "y" : "ies") + ": " +
           (rep.bad.empty() ? "all good" : u64s(rep.bad.size()) + " bad");
    if (fix && !rep.bad.empty()) out += ", " + u64s(rep.removed) + " removed";
    out += "\n";
  }
  if (int rc = c.out(out)) return rc;
  if (fix && rep.removed < rep.bad.size())
    return c.fail(kExitError, u64s(rep.bad.size() - rep.removed) + " bad entries could not be removed");
  // Bad entries found is exit 1 even when all were removed: scripts notice.
  return rep.bad.empty() ? kExitOk : kExitMiss;
}

int cmd_trim(Ctx& c) {
  if (int rc = open_store(c, false)) return rc;
  uint64_t limit = effective_max_bytes(c.store.disk);
  if (const std::string* v = c.args.get("--max-size")) {
    auto s = util::parse_size(*v);
    if (!s) return usage_error("trim", "--max-size '" + *v + "' is not a size (e.g. 500M, 2G)");
    limit = *s;
  }
  uint64_t evicted = 0;
  TierStats t;
  if (c.store.tier) {
    auto r = c.store.tier->trim(limit);
    if (!r) return c.fail(kExitError, "trimming " + c.store.path + ": " + r.error().to_string());
    evicted = *r;
    t = c.store.tier->stats();
  }
  if (c.json)
    return c.out("{\"evicted\":" + u64s(evicted) + ",\"entries\":" + u64s(t.entries) + ",\"bytes\":" + u64s(t.bytes) +
                 ",\"max_bytes\":" + u64s(limit) + "}\n");
  return c.out("evicted " + u64s(evicted) + " entr" + (evicted == 1 ? "y" : "ies") + "; now " +
               util::format_size(t.bytes) + " in " + u64s(t.entries) + (t.entries == 1 ? " entry" : " entries") + " (limit " + util::format_size(limit) +
               ")\n");
}

int cmd_clear(Ctx& c) {
  if (int rc = open_store(c, false)) return rc;
  uint64_t n = 0;
  if (c.store.tier) {
    Status st = c.store.tier->list([&](const ListItem&) {
      ++n;
      return true;
    });
    if (st.is_ok()) st = c.store.tier->clear();
    if (!st.is_ok()) return c.fail(kExitError, "clearing " + c.store.path + ": " + st.to_string());
  }
  if (c.json) return c.out("{\"removed\":" + u64s(n) + "}\n");
  return c.out("removed " + u64s(n) + " entr" + (n == 1 ? "y" : "ies") + "\n");
}

struct Difference {
  std::string name;
  const char* change;  // "changed", "added" (only in the lookup), "missing" (only stored)
  std::string stored, lookup;
};

// Differences between a stored manifest and the looked-up one; both sorted.
std::vector<Difference> diff_manifests(const Manifest& stored, const Manifest& lookup) {
  std::vector<Difference> out;
  size_t i = 0, j = 0;
  while (i < stored.items.size() || j < lookup.items.size()) {
    const ManifestItem* a = i < stored.items.size() ? &stored.items[i] : nullptr;
    const ManifestItem* b = j < lookup.items.size() ? &lookup.items[j] : nullptr;
    if (a && (!b || a->name < b->name)) {
      out.push_back({a->name, "missing", a->digest.hex(), ""});
      ++i;
    } else if (b && (!a || b->name < a->name)) {
      out.push_back({b->name, "added", "", b->digest.hex()});
      ++j;
    } else {
      if (a->digest != b->digest || a->type != b->type) out.push_back({a->name, "changed", a->digest.hex(), b->digest.hex()});
      ++i;
      ++j;
    }
  }
  return out;
}

int cmd_explain(Ctx& c) {
  std::optional<Manifest> want;
  if (const std::string* mf = c.args.get("--manifest")) {
    auto m = read_manifest(*mf);
    if (!m) return m.error().code() == Errc::invalid_argument ? usage_error("explain", m.error().message()) : c.fail(m.error());
    want = std::move(m).value();
    if (want->ns.empty() && want->items.empty())
      return usage_error("explain", *mf + " holds no namespace and no component");
  }
  std::optional<Key> key;
  if (c.args.has("--key")) {
    key = key_flag(c);
    if (!key) return kExitUsage;
  } else if (want) {
    key = want->key();
  } else {
    return usage_error("explain", "--key HEX or --manifest FILE is required");
  }
  if (int rc = open_store(c, false)) return rc;

  auto r = lookup(c, *key);
  bool stored = r && r->has_value();
  std::string corrupt = !r && r.error().code() == Errc::corrupt ? r.error().message() : std::string();
  if (!r && corrupt.empty()) return c.fail(kExitError, "looking up " + key->hex() + ": " + r.error().to_string());
  std::string note;
  if (want && want->key() != *key) note = "the manifest hashes to " + want->key().hex() + ", not to --key";

  if (stored || !want) {
    std::string why = stored ? "stored" : !corrupt.empty() ? "corrupt (" + corrupt + ")" : "not stored";
    if (c.json) {
      std::string out = "{\"key\":" + jstr(key->hex()) + ",\"stored\":" + (stored ? "true" : "false");
      if (!corrupt.empty()) out += ",\"corrupt\":" + jstr(corrupt);
      if (!note.empty()) out += ",\"note\":" + jstr(note);
      if (int rc = c.out(out + "}\n")) return rc;
    } else {
      std::string out = "key " + key->hex() + " is " + why + "\n";
      if (!note.empty()) out += "note: " + note + "\n";
      if (!stored) out += "pass --manifest FILE (the lookup's manifest) to compare it with what is stored\n";
      if (int rc = c.out(out)) return rc;
    }
    return stored ? kExitOk : kExitMiss;
  }

  // Not stored: find the stored entry of the same namespace whose manifest
  // differs in the fewest components (ties: the most recently used).
  std::vector<ListItem> items;
  if (c.store.tier) {
    Status st = c.store.tier->list([&](const ListItem& it) {
      items.push_back(it);
      return true;
    });
    if (!st.is_ok()) return c.fail(kExitError, "listing " + c.store.path + ": " + st.to_string());
  }
  std::sort(items.begin(), items.end(), [](const ListItem& a, const ListItem& b) { return a.last_use_ms > b.last_use_ms; });
  uint64_t compared = 0, unreadable = 0;
  std::map<std::string, uint64_t> other_ns;
  std::optional<Key> best;
  std::vector<Difference> best_diff;
  for (const auto& it : items) {
    auto e = lookup(c, it.key);
    if (!e || !e->has_value()) {
      ++unreadable;  // corrupt or removed meanwhile: nothing to compare
      continue;
    }
    Manifest m = (**e).manifest();
    if (m.ns.empty() && m.items.empty()) continue;  // stored without a manifest: nothing to compare
    if (m.ns != want->ns) {
      ++other_ns[m.ns];
      continue;
    }
    ++compared;
    std::sort(m.items.begin(), m.items.end(), [](const ManifestItem& a, const ManifestItem& b) { return a.name < b.name; });
    auto d = diff_manifests(m, *want);
    if (!best || d.size() < best_diff.size()) {
      best = it.key;
      best_diff = std::move(d);
    }
  }

  if (c.json) {
    std::string out = "{\"key\":" + jstr(key->hex()) + ",\"stored\":false";
    if (!corrupt.empty()) out += ",\"corrupt\":" + jstr(corrupt);
    if (!note.empty()) out += ",\"note\":" + jstr(note);
    out += ",\"namespace\":" + jstr(want->ns) + ",\"compared\":" + u64s(compared) + ",\"unreadable\":" + u64s(unreadable) +
           ",\"nearest\":";
    if (best) {
      out += "{\"key\":" + jstr(best->hex()) + ",\"components\":" + u64s(want->items.size()) + ",\"differences\":[";
      for (size_t i = 0; i < best_diff.size(); ++i) {
        const auto& d = best_diff[i];
        out += (i ? "," : "") + std::string("{\"name\":") + jstr(d.name) + ",\"change\":" + jstr(d.change) +
               ",\"stored\":" + (d.stored.empty() ? "null" : jstr(d.stored)) +
               ",\"lookup\":" + (d.lookup.empty() ? "null" : jstr(d.lookup)) + "}";
      }
      out += "]}";
    } else {
      out += "null";
    }
    out += ",\"other_namespaces\":{";
    bool first = true;
    for (const auto& [ns, n] : other_ns) {
      out += (first ? "" : ",") + jstr(ns) + ":" + u64s(n);
      first = false;
    }
    if (int rc = c.out(out + "}}\n")) return rc;
    return kExitMiss;
  }

  std::string out = "key " + key->hex() + " is " + (corrupt.empty() ? "not stored" : "corrupt (" + corrupt + ")") + "\n";
  if (!note.empty()) out += "note: " + note + "\n";
  if (!best) {
    out += "no stored entry has namespace \"" + want->ns + "\"";
    if (!other_ns.empty()) {
      out += " (stored namespaces:";
      for (const auto& [ns, n] : other_ns) out += " \"" + ns + "\" x" + u64s(n);
      out += ")";
    }
    out += "\n";
  } else {
    out += "compared with " + u64s(compared) + " stored entr" + (compared == 1 ? "y" : "ies") + " of namespace \"" +
           want->ns + "\"\n";
    out += "nearest " + best->hex() + ": " + u64s(best_diff.size()) + " of " + u64s(want->items.size()) +
           " components differ\n";
    for (const auto& d : best_diff) {
      if (std::string_view(d.change) == "changed")
        out += fmt("  %-20s changed  stored %s, lookup %s\n", d.name.c_str(), d.stored.c_str(), d.lookup.c_str());
      else if (std::string_view(d.change) == "added")
        out += fmt("  %-20s added    only in the lookup\n", d.name.c_str());
      else
        out += fmt("  %-20s missing  only in the stored entry\n", d.name.c_str());
    }
    if (best_diff.empty()) out += "  (same manifest: the entry is stored under another key)\n";
  }
  if (int rc = c.out(out)) return rc;
  return kExitMiss;
}

// ---- run -------------------------------------------------------------------

// Runs argv with the tool's stdin/stdout/stderr; returns its exit status
// (128 + signal when killed), or -1 with errno set when it could not start.
int run_child(const std::vector<std::string>& argv) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::execvp(av[0], av.data());
    std::fprintf(stderr, "kcache: run: cannot execute '%s': %s\n", av[0], std::strerror(errno));
    ::_exit(127);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// kcache run --key HEX --artifact NAME=PATH... -- COMMAND...
// A hit writes the stored artifacts to their paths and runs nothing; a miss
// runs COMMAND once across processes (the others wait for its entry), then
// stores the files it left at those paths.
int cmd_run(Ctx& c) {
  auto key = key_flag(c);
  if (!key) return kExitUsage;
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& [flag, v] : c.args.all_flags) {
    if (flag != "--artifact") continue;
    size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
      return usage_error("run", "--artifact '" + v + "' is not NAME=PATH");
    files.emplace_back(v.substr(0, eq), v.substr(eq + 1));
  }
  if (files.empty()) return usage_error("run", "name at least one --artifact NAME=PATH");
  if (!c.args.saw_dashes || c.args.after_dashes.empty()) return usage_error("run", "give the command after '--'");
  if (int rc = open_store(c, /*create=*/true)) return rc;

  Options o = Options::from_env();
  o.memory_tier = false;
  o.log_level = std::min(o.log_level, LogLevel::warn);
  auto cache = Cache::with_tiers({c.store.tier}, o);
  if (o.process_single_flight && !o.read_only) {
    if (auto l = open_leases(*parse_engine(c.store.engine), c.store.path)) cache->set_leases(std::move(l).value());
  }

  int command_status = -2;  // -2: COMMAND did not run here
  auto compile = [&]() -> Expected<std::vector<Artifact>> {
    command_status = run_child(c.args.after_dashes);
    if (command_status == -1) return util::errno_status(errno, "run " + c.args.after_dashes[0]);
    if (command_status != 0)
      return Status(Errc::compile_failed, "command exited with status " + std::to_string(command_status));
    std::vector<Artifact> arts;
    for (const auto& [name, path] : files) {
      auto data = util::read_file(path);
      if (!data) return Status(Errc::not_found, "artifact '" + name + "': " + data.error().message());
      arts.push_back({name, std::move(data).value()});
    }
    return arts;
  };
  Source src = Source::compiled;
  auto e = cache->get_or_compile(*key, compile, &src);
  if (command_status != -2) {  // COMMAND ran here: its status is ours
    if (command_status == -1) return c.fail(kExitError, e.error().message());
    if (command_status == 0 && !e)
      std::fprintf(stderr, "kcache: run: not stored: %s\n", e.error().message().c_str());
    return command_status;
  }
  if (!e) return c.fail(e.error());
  // A hit, or another process's result: write the artifacts out. An entry
  // lacking one of them cannot stand for this command: run it.
  for (const auto& [name, path] : files)
    if (!e->artifact(name)) {
      auto arts = compile();  // runs COMMAND once and reads its outputs
      if (command_status == -1) return c.fail(kExitError, arts.error().message());
      if (arts) cache->put(KeyInfo{*key, {}}, std::move(arts).value());
      return command_status;
    }
  for (const auto& [name, path] : files) {
    Status st = write_output(path, *e->artifact(name));
    if (!st.is_ok()) return c.fail(kExitError, "artifact '" + name + "': " + st.message());
  }
  return kExitOk;
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
      {"stats", cmd_stats, true, {}},
      {"verify", cmd_verify, true, {{"--fix", false}}},
      {"trim", cmd_trim, true, {{"--max-size", true}}},
      {"clear", cmd_clear, true, {}},
      {"explain", cmd_explain, true, {{"--key", true}, {"--manifest", true}}},
      {"run", cmd_run, false, {{"--key", true}, {"--artifact", true}}},
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
  std::vector<std::string> args(argv + 1, argv + argc);
  // The command is the first word that is not an option or an option's value.
  size_t cmd_at = args.size();
  bool want_help = false, want_version = false;
  for (const auto& a : args) {
    if (a == "--") break;
    if (a == "--help" || a == "-h") want_help = true;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a == "--version") want_version = true;
    if (global_takes_value(a)) {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    cmd_at = i;
    break;
  }
  std::string name = cmd_at < args.size() ? args[cmd_at] : std::string();
  if (want_help) name = "help";
  else if (name.empty() && want_version) name = "version";
  if (name.empty()) return usage_error("", "no command given");
  const Command* cmd = nullptr;
  for (const auto& c : commands())
    if (name == c.name) cmd = &c;
  if (!cmd) return usage_error("", "unknown command '" + name + "'");

  Ctx ctx;
  ctx.args.command = name;
  if (cmd->run == cmd_help) return cmd_help(ctx);
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
    ctx.args.flags[key] = value.value_or("");
    ctx.args.all_flags.emplace_back(key, value.value_or(""));
  }
  if (cmd->run == cmd_put) {  // put takes NAME=PATH words, "--" included
    for (auto& w : ctx.args.after_dashes) ctx.args.positional.push_back(std::move(w));
    ctx.args.after_dashes.clear();
  }
  if (!ctx.args.positional.empty() && cmd->run != cmd_put)
    return usage_error(name, "unexpected argument '" + ctx.args.positional.front() + "'");
  if (!ctx.args.after_dashes.empty() && cmd->run != cmd_run)
    return usage_error(name, "unexpected argument '" + ctx.args.after_dashes.front() + "'");
  return cmd->run(ctx);
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }

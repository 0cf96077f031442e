// kcache tool — `config`: the settings in effect and where each came from,
// and `config get|set|unset` on the config files (kcache/options.h).
#include <string>
#include <vector>

#include "cli.h"
#include "kcache/options.h"
#include "util/json.h"

namespace kcache::cli {

namespace {

// A URL with its password left out (redis://user:secret@host ->
// redis://user:***@host): config output is shown and pasted around.
std::string without_password(const std::string& url) {
  size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  size_t at = url.find('@', scheme + 3);
  if (at == std::string::npos) return url;
  size_t colon = url.find(':', scheme + 3);
  if (colon != std::string::npos && colon < at) return url.substr(0, colon + 1) + "***" + url.substr(at);
  return url.substr(0, scheme + 3) + "***" + url.substr(at);
}

std::string shown(const Options& o, std::string_view name) {
  auto got = o.get(name);
  std::string v = got ? *got : std::string();
  if (name == "dir" && v.empty()) v = Options::default_dir();
  if (name == "remote") v = without_password(v);
  return v;
}

int show_all(Ctx& c, const Options& o, const AppliedSettings& applied, const std::string& user_file,
             const std::string& store_file) {
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().key("settings").begin_array();
    for (const auto& info : option_table()) {
      auto it = applied.origin.find(info.name);
      w.begin_object()
          .field("name", info.name)
          .field("value", shown(o, info.name))
          .field("origin", it == applied.origin.end() ? std::string("default") : it->second)
          .field("variable", info.env)
          .end_object();
    }
    w.end_array().key("files").begin_object().field("user", user_file).field("store", store_file).end_object();
    w.key("read").begin_array();
    for (const auto& f : applied.files) w.value(f);
    return c.out(w.end_array().end_object().take() + "\n");
  }
  std::string out;
  for (const auto& info : option_table()) {
    auto it = applied.origin.find(info.name);
    std::string v = shown(o, info.name);
    out += fmt("%-21s %-32s %s\n", std::string(info.name).c_str(), v.empty() ? "-" : v.c_str(),
               it == applied.origin.end() ? "(default)" : ("(" + it->second + ")").c_str());
  }
  out +=
      "\nconfig files: " + (user_file.empty() ? std::string("-") : user_file) + " (user), " + store_file + " (store)\n";
  return c.out(out);
}

}  // namespace

int cmd_config(Ctx& c) {
  Options o;
  AppliedSettings applied;
  const auto& pos = c.args.positional;
  const std::string verb = pos.empty() ? std::string() : pos[0];
  // A broken file must not lock `config set` out of repairing it: the
  // settings are read for the folder only when writing.
  if (int rc = settings(c, &o, &applied); rc && (verb != "set" && verb != "unset")) return rc;
  const std::string dir = o.dir.empty() ? Options::default_dir() : o.dir;
  const std::string user_file = user_config_path();
  const std::string store_file = store_config_path(dir);
  const bool user = c.args.has("--user");
  if (verb.empty()) {
    if (user) return usage_error("config", "--user goes with set or unset");
    return show_all(c, o, applied, user_file, store_file);
  }
  if (verb == "get") {
    if (pos.size() != 2) return usage_error("config", "config get NAME");
    auto name = option_name(pos[1]);
    if (!name) return usage_error("config", "'" + pos[1] + "' is not a kcache setting");
    return c.out(shown(o, *name) + "\n");
  }
  if (verb == "set" || verb == "unset") {
    if (verb == "set" && pos.size() != 3) return usage_error("config", "config set NAME VALUE [--user]");
    if (verb == "unset" && pos.size() != 2) return usage_error("config", "config unset NAME [--user]");
    if (dir.empty() && !user)
      return c.fail(kExitError, "no cache folder: pass --dir (HOME and XDG_CACHE_HOME are unset)");
    const std::string& path = user ? user_file : store_file;
    std::optional<std::string_view> value;
    if (verb == "set") value = pos[2];
    Status st = write_config_setting(path, pos[1], value, !user);
    if (!st.is_ok()) {
      if (st.code() == Errc::invalid_argument) return usage_error("config", st.message());
      return c.fail(kExitError, "writing " + path + ": " + st.message());
    }
    std::string name = option_name(pos[1]).value_or(pos[1]);
    if (c.json) {
      util::JsonWriter w;
      w.begin_object().field("file", path).field("name", name);
      if (value) w.field("value", std::string(*value));
      return c.out(w.end_object().take() + "\n");
    }
    return c.out(value ? fmt("%s = %s in %s\n", name.c_str(), std::string(*value).c_str(), path.c_str())
                       : fmt("%s removed from %s\n", name.c_str(), path.c_str()));
  }
  return usage_error("config", "unknown config command '" + verb + "' (get, set or unset)");
}

}  // namespace kcache::cli

// Config files (kcache/options.h): where they are, reading one into
// Options through Options::set, and changing one setting in one. A line
// that sets nothing kcache knows (an unknown name, no `=`) is a warning
// (not_found) naming PATH:LINE and the nearest name, and the rest of the
// file still applies; a bad value of a known setting is an error
// (invalid_argument); a file that exists but is not read (not trusted, not
// a regular file) is unavailable.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "kcache/env.h"
#include "kcache/options.h"
#include "util/fd.h"
#include "util/util.h"

namespace kcache {

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return std::string(s);
}

// The name of a `NAME = VALUE` line; empty for a comment or blank line.
std::string line_name(std::string_view line) {
  std::string t = trim(line);
  if (t.empty() || t[0] == '#') return std::string();
  size_t eq = t.find('=');
  return trim(std::string_view(t).substr(0, eq == std::string::npos ? t.size() : eq));
}

// "; did you mean NAME?" when a known setting is near `name`, else "".
std::string did_you_mean(std::string_view name) {
  std::string near = nearest_option(name, false);
  return near.empty() ? std::string() : "; did you mean " + near + "?";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

}  // namespace

std::string user_config_path() {
  std::string xdg = util::getenv_str("XDG_CONFIG_HOME");
  if (!xdg.empty() && xdg[0] == '/') return xdg + "/kcache/config";
  std::string home = util::getenv_str("HOME");
  if (home.empty()) return std::string();
  return home + "/.config/kcache/config";
}

std::string store_config_path(const std::string& dir) { return dir.empty() ? std::string() : dir + "/config"; }

void apply_config_file(Options& options, const std::string& path, bool store_file, AppliedSettings* out) {
  // One descriptor for the checks and the read: no link is followed, and
  // the file read is the file checked. Both through the options' Env.
  Env& env = Env::or_posix(options.env);
  util::Fd fd(env.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), env);
  if (!fd) {
    if (errno == ENOENT || errno == ENOTDIR) return;  // none: nothing to apply
    std::string why = errno == ELOOP ? std::string("it is a symbolic link") : std::string(std::strerror(errno));
    out->problems.push_back(Status(Errc::unavailable, "config file " + path + " is not read: " + why));
    return;
  }
  struct stat st;
  if (env.fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    out->problems.push_back(
        Status(Errc::unavailable, "config file " + path + " is not read: it is not a regular file"));
    return;
  }
  // Settings decide where entries are read from and written to: a file
  // another user could have written is not taken, as such a store is not.
  if (std::string why = util::untrusted_reason(st, util::StoreTrust{}); !why.empty()) {
    out->problems.push_back(Status(Errc::unavailable, "config file " + path + " is not read, as another user could " +
                                                          "have written it: it is " + why + " (chmod go-w " + path +
                                                          " if its settings are yours)"));
    return;
  }
  constexpr size_t kMaxConfig = 1 << 20;
  std::string data;
  char buf[8192];
  for (;;) {
    ssize_t n = env.pread(fd.get(), buf, sizeof buf, static_cast<off_t>(data.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      out->problems.push_back(Status(Errc::unavailable, "config file " + path + ": " + std::strerror(errno)));
      return;
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > kMaxConfig) {
      out->problems.push_back(Status(Errc::unavailable, "config file " + path + ": larger than 1 MiB"));
      return;
    }
  }
  const std::string* text = &data;
  out->files.push_back(path);
  const auto lines = split_lines(*text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = "config file " + path + ":" + std::to_string(i + 1);
    std::string name = line_name(lines[i]);
    if (name.empty()) continue;
    size_t eq = lines[i].find('=');
    if (eq == std::string::npos) {
      out->problems.push_back(Status(
          Errc::not_found,
          where + ": '" + trim(lines[i]) + "' is not a NAME = VALUE line, so it sets nothing" + did_you_mean(name)));
      continue;
    }
    auto known = option_name(name);
    if (!known) {
      out->problems.push_back(
          Status(Errc::not_found,
                 where + ": '" + name + "' is not a kcache setting, so it sets nothing" + did_you_mean(name)));
      continue;
    }
    if (store_file && known && *known == "dir") {
      out->problems.push_back(Status(Errc::invalid_argument, where +
                                                                 ": the store folder's config cannot move the store "
                                                                 "(set dir in the user-wide config or KCACHE_DIR)"));
      continue;
    }
    Status s = options.set(*known, trim(std::string_view(lines[i]).substr(eq + 1)));
    if (!s.is_ok()) {
      out->problems.push_back(Status(Errc::invalid_argument, where + s.message().substr(s.message().find(':'))));
      continue;
    }
    out->origin[*known] = "config file " + path;
  }
}

Status write_config_setting(const std::string& path, std::string_view name, std::optional<std::string_view> value,
                            bool store_file) {
  if (path.empty()) return Status(Errc::invalid_argument, "no config file can be named (HOME is unset)");
  auto known = option_name(name);
  // Removing takes any name, so a line kcache does not know can go too.
  if (!known && value)
    return Status(Errc::invalid_argument, "'" + std::string(name) + "' is not a kcache setting" + did_you_mean(name));
  if (store_file && known && *known == "dir")
    return Status(Errc::invalid_argument, "the store folder's config cannot move the store (use --user)");
  if (value && value->find_first_of("\r\n") != std::string_view::npos)
    return Status(Errc::invalid_argument,
                  "a setting's value is one line: '" + std::string(name) + "' has a line break");
  if (value && known) {
    Options check;
    if (Status s = check.set(*known, *value); !s.is_ok()) return s;
  }
  std::string text;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    auto t = util::read_file(path, 1 << 20);
    if (!t) return t.error();
    text = std::move(t).value();
  }
  // Every line of the setting goes; the new one takes the first one's place
  // (or comes last), so comments and the order of the rest are kept.
  // A name kcache does not know matches its lines as written (any case).
  auto same = [&](const std::string& n) {
    if (known) return option_name(n) == known;
    std::string a(n), b(trim(name));
    for (auto* s : {&a, &b})
      for (auto& ch : *s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return a == b;
  };
  std::string next;
  bool placed = false;
  for (const auto& line : split_lines(text)) {
    std::string n = line_name(line);
    if (!n.empty() && same(n)) {
      if (value && !placed) next += *known + " = " + std::string(*value) + "\n";
      placed = true;
      continue;
    }
    next += line + "\n";
  }
  if (!known && !placed)
    return Status(Errc::invalid_argument, "'" + std::string(name) + "' is not a kcache setting and no line of " + path +
                                              " sets it" + did_you_mean(name));
  if (value && !placed) next += *known + " = " + std::string(*value) + "\n";
  size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (Status s = util::make_dirs(path.substr(0, slash), 0700); !s.is_ok()) return s;
  }
  return util::write_file_atomic(path, next);
}

}  // namespace kcache

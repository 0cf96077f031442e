// kcache tool — the shared part: output helpers, Options and tiers for a
// command, lookups through every tier.
#include "cli.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>

#include "kcache/options.h"
#include "util/util.h"

namespace kcache::cli {

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

std::string format_time(uint64_t unix_ms) {
  if (unix_ms == 0) return "-";
  time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  if (!::localtime_r(&t, &tm)) return std::to_string(unix_ms);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string entries_word(uint64_t n) { return std::to_string(n) + (n == 1 ? " entry" : " entries"); }

int exit_for(const Status& st) {
  switch (st.code()) {
    case Errc::ok:
      return kExitOk;
    case Errc::not_found:
      return kExitMiss;
    case Errc::invalid_argument:
      return kExitUsage;
    default:
      return kExitError;
  }
}

int Ctx::fail(int code, const std::string& msg) const {
  std::string line = "kcache: " + (args.command.empty() ? std::string() : args.command + ": ") + msg;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::fprintf(stderr, "%s\n", line.c_str());
  return code;
}

int Ctx::fail(const Status& st) const { return fail(exit_for(st), st.message()); }

namespace {
bool g_stdout_closed = false;
}  // namespace

void hold_standard_fds() {
  g_stdout_closed = ::fcntl(1, F_GETFD) == -1 && errno == EBADF;
  util::reserve_std_fds();
}

int Ctx::out(std::string_view s) const {
  if (g_stdout_closed) return fail(kExitError, "stdout is closed: nothing written (redirect it, or pass -o FILE)");
  bool ok = s.empty() || std::fwrite(s.data(), 1, s.size(), stdout) == s.size();
  if (std::fflush(stdout) != 0) ok = false;
  if (!ok) return fail(kExitError, std::string("writing to stdout: ") + std::strerror(errno));
  return kExitOk;
}

int Ctx::report(std::string_view s) const {
  if (g_stdout_closed) return kExitOk;  // nothing to say it to, and nothing failed
  bool ok = s.empty() || std::fwrite(s.data(), 1, s.size(), stdout) == s.size();
  if (std::fflush(stdout) != 0) ok = false;
  if (!ok) std::fprintf(stderr, "kcache: warn: the report could not be written to stdout: %s\n", std::strerror(errno));
  return kExitOk;
}

int usage_error(const std::string& command, const std::string& msg) {
  std::fprintf(stderr, "kcache: %s%s (see kcache --help)\n", command.empty() ? "" : (command + ": ").c_str(),
               msg.c_str());
  return kExitUsage;
}

std::optional<Key> key_flag(const Ctx& c) {
  const std::string* v = c.args.get("--key");
  if (!v) {
    usage_error(c.args.command, "--key HEX is required");
    return std::nullopt;
  }
  auto k = Digest::from_hex(*v);
  if (!k) usage_error(c.args.command, "--key '" + *v + "' is not a 32-digit hex key");
  return k;
}

int settings(Ctx& c, Options* o, AppliedSettings* applied) {
  // The library's pipeline (kcache/options.h): defaults, config files, the
  // environment, then this command line's flags. A bad value is bad usage
  // here (exit 2), where a JIT would only warn and go on; a variable that
  // names no option, or a config file that is not read, is said and
  // ignored.
  std::vector<std::pair<std::string, std::string>> flags;
  for (const char* flag : {"--dir", "--engine"})
    if (const std::string* v = c.args.get(flag)) flags.emplace_back(flag + 2, *v);
  *applied = apply_settings(*o, flags);
  for (const auto& p : applied->problems) {
    if (p.code() == Errc::invalid_argument) return usage_error(c.args.command, p.message());
    static std::set<std::string> said;
    if (said.insert(p.message()).second) std::fprintf(stderr, "kcache: ignoring %s\n", p.message().c_str());
  }
  return kExitOk;
}

int open_tiers(Ctx& c, const Reach& reach) {
  Options o;
  AppliedSettings applied;
  if (int rc = settings(c, &o, &applied)) return rc;
  o.memory_tier = false;  // one process, one lookup: what is printed is what is stored
  o.create_dir = reach.create;
  if (!reach.remote) o.remote_url.clear();
  if (!reach.honour_disable) o.disabled = false;
  if (reach.inspect) o.disk.read_only = true;
  if (reach.inspect || !reach.leases) o.process_single_flight = false;
  util::set_log(o.log_level, o.log_file);

  Opened& s = c.store;
  s.where = disk_store_location(o);
  if (s.where.dir.empty()) return c.fail(kExitError, "no cache folder: pass --dir (HOME and XDG_CACHE_HOME are unset)");
  s.options = o;
  // The parts left out are said here, once, as this command sees them: a
  // store the command needs fails it (one line, exit 3), the rest are
  // warnings.
  util::set_log(std::min(o.log_level, LogLevel::error), o.log_file);
  Assembly a = assemble(o);
  util::set_log(o.log_level, o.log_file);
  if (!a.disk_error.is_ok() && !(a.disk_error.code() == Errc::not_found && !o.create_dir))
    s.disk_refused = "cannot open the store " + s.where.path + ": " + a.disk_error.to_string();
  s.remote_error = a.remote_error;
  if (!s.disk_refused.empty() && reach.needs_disk) return c.fail(kExitError, s.disk_refused);
  if (!s.disk_refused.empty() && !reach.reports_disk)
    KCACHE_LOG(LogLevel::warn, "running without a disk tier: %s", s.disk_refused.c_str());
  for (const auto& b : a.bundle_errors) KCACHE_LOG(LogLevel::warn, "%s (left out)", b.to_string().c_str());
  if (!a.remote_error.is_ok())
    KCACHE_LOG(LogLevel::warn, "running without the remote tier: %s", a.remote_error.to_string().c_str());
  s.cache = Cache::open(std::move(a), o);
  for (const auto& t : s.cache->tiers()) {
    if (t->kind() == TierKind::disk && !s.disk) {
      s.disk = t;
      s.admin = t->admin();
    }
    if (t->kind() == TierKind::remote && !s.remote) s.remote = t;
  }
  return kExitOk;
}

std::string disk_failure(const Ctx& c) {
  const Opened& s = c.store;
  if (s.options.disabled) return "caching is disabled (KCACHE_DISABLE)";
  if (!s.disk_refused.empty()) return s.disk_refused;
  // The same store as the first attempt (shared group and all), without
  // its leases.
  DiskStoreSpec spec = DiskStoreSpec::from(s.options);
  spec.leases = false;
  auto d = open_disk_store(spec);
  if (d) return "the store at " + s.where.path + " opened only on a second attempt";
  return "cannot open " + s.where.path + ": " + d.error().to_string();
}

Lookup lookup(const Ctx& c, const Key& k, Access access) {
  Lookup l;
  if (!c.store.disk_refused.empty()) {
    l.faults.push_back(c.store.disk_refused);
    l.local_fault = true;
  }
  if (!c.store.cache) return l;
  for (const auto& t : c.store.cache->tiers()) {
    auto r = t->get(k, access);
    if (r && r->has_value()) {
      l.entry = std::move(*r);
      l.tier = std::string(t->name());
      // Found elsewhere: the store that could not be opened is still said.
      if (!c.store.disk_refused.empty())
        KCACHE_LOG(LogLevel::warn, "running without a disk tier: %s", c.store.disk_refused.c_str());
      return l;
    }
    if (r) {
      ++l.missed;
    } else {
      if (r.error().code() == Errc::corrupt) {
        if (l.corrupt.empty()) l.corrupt = r.error().message();
      } else {
        l.faults.push_back(std::string(t->name()) + ": " + r.error().to_string());
        if (t->kind() == TierKind::disk) l.local_fault = true;
      }
    }
  }
  return l;
}

int report_miss(const Ctx& c, const Key& k, const Lookup& l) {
  if (!l.corrupt.empty()) return c.fail(kExitMiss, "entry " + k.hex() + " is corrupt (" + l.corrupt + ")");
  std::string faults;
  for (const auto& f : l.faults) faults += (faults.empty() ? "" : "; ") + f;
  if (l.local_fault && l.missed == 0) return c.fail(kExitError, "looking up " + k.hex() + ": " + faults);
  std::string msg = "no entry for key " + k.hex();
  if (c.store.options.disabled) msg += " (caching is disabled: KCACHE_DISABLE)";
  if (!faults.empty()) msg += " (" + faults + ")";
  return c.fail(kExitMiss, msg);
}

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

Status write_all(int fd, std::string_view data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return util::errno_status(errno, "writing " + path);
    off += static_cast<size_t>(n);
  }
  return Status();
}

// The temp files of write_output: "NAME.kcache-tmp.<16 hex>" beside NAME.
constexpr std::string_view kTempMark = ".kcache-tmp.";

}  // namespace

void collect_stale_temps(const std::string& path, std::string_view mark, uint64_t older_than_s) {
  size_t slash = path.rfind('/');
  std::string folder = slash == std::string::npos ? std::string(".") : path.substr(0, slash ? slash : 1);
  std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + std::string(mark);
  DIR* d = ::opendir(folder.c_str());
  if (!d) return;
  const time_t now = ::time(nullptr);
  while (struct dirent* de = ::readdir(d)) {
    std::string_view name(de->d_name);
    if (name.size() != prefix.size() + 16 || name.substr(0, prefix.size()) != prefix) continue;
    std::string_view hex = name.substr(prefix.size());
    if (!std::all_of(hex.begin(), hex.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)); }))
      continue;
    struct stat st;
    // Only this user's plain files, untouched for older_than_s: a run
    // still writing one keeps its mtime fresh.
    if (::fstatat(::dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid() || now - st.st_mtime < static_cast<time_t>(older_than_s))
      continue;
    ::unlinkat(::dirfd(d), de->d_name, 0);
  }
  ::closedir(d);
}

namespace {

// The descriptor a path names by itself: /dev/stdout, /dev/stderr,
// /dev/fd/N, /proc/self/fd/N; -1 for any other path.
int named_fd(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  for (std::string_view dir : {"/dev/fd/", "/proc/self/fd/"}) {
    if (!path.starts_with(dir) || path.size() == dir.size() || path.size() > dir.size() + 6) continue;
    std::string_view n = std::string_view(path).substr(dir.size());
    if (!std::all_of(n.begin(), n.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) continue;
    return std::atoi(std::string(n).c_str());
  }
  return -1;
}

}  // namespace

Status write_output(const std::string& path, std::string_view data) {
  // A descriptor named by path (`-o /dev/stdout > out.o`, `-o /dev/fd/3`):
  // written where it points, with its own offset and flags, as a shell
  // redirection expects; never reopened or replaced.
  if (int fd = named_fd(path); fd >= 0) {
    if ((fd == 1 && g_stdout_closed) || ::fcntl(fd, F_GETFD) == -1)
      return Status(Errc::io_error, path + " is not open; nothing written");
    return write_all(fd, data, path);
  }
  struct stat st;
  std::string target = path;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      // A terminal, /dev/null, /dev/stdout on a pipe, a named pipe: written
      // through, never replaced (O_NONBLOCK is not used: a FIFO waits for
      // its reader, as it does for any writer).
      int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd < 0) return util::errno_status(errno, "opening " + path);
      Status w = write_all(fd, data, path);
      if (::close(fd) != 0 && w.is_ok()) w = util::errno_status(errno, "writing " + path);
      return w;
    }
    if (!S_ISREG(st.st_mode)) return Status(Errc::io_error, path + " is " + kind_of(st.st_mode) + "; not replaced");
    // A symbolic link is followed: its target is replaced, the link stays.
    char* real = ::realpath(path.c_str(), nullptr);
    if (!real) return util::errno_status(errno, "resolving " + path);
    target = real;
    std::free(real);
  } else if (errno != ENOENT) {
    return util::errno_status(errno, path);
  } else if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return Status(Errc::io_error, path + " is a symbolic link to a missing file; not replaced");
  }
  // Temp files of runs killed before their rename, an hour old or more.
  collect_stale_temps(target, kTempMark, 3600);
  std::string tmp =
      target + std::string(kTempMark) + fmt("%016llx", static_cast<unsigned long long>(util::random_u64()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return util::errno_status(errno, "writing " + path);
  Status w = write_all(fd, data, path);
  if (::close(fd) != 0 && w.is_ok()) w = util::errno_status(errno, "writing " + path);
  if (w.is_ok() && ::rename(tmp.c_str(), target.c_str()) != 0) w = util::errno_status(errno, "writing " + path);
  if (!w.is_ok()) ::unlink(tmp.c_str());
  return w;
}

}  // namespace kcache::cli

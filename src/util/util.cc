// The private helpers every component shares (util.h): the text of a
// Status, logging, the descriptors 0 to 2 kept off store files, reads of
// maps another process can shrink, time, sizes, errno as Status, whole-file
// reads and atomic writes, and the trust check of files another user could
// have written.
//
// One concept, the leaf library (kcache_util) below every component: each
// section is a few helpers that the layers above share, and none depends
// on a kcache type beyond Status and Env.
#include "util/util.h"

#include "util/fd.h"

#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace kcache {

std::string_view errc_name(Errc e) noexcept {
  switch (e) {
    case Errc::ok:
      return "ok";
    case Errc::not_found:
      return "not found";
    case Errc::invalid_argument:
      return "invalid argument";
    case Errc::corrupt:
      return "corrupt";
    case Errc::io_error:
      return "I/O error";
    case Errc::no_space:
      return "no space";
    case Errc::read_only:
      return "read-only";
    case Errc::unavailable:
      return "unavailable";
    case Errc::timeout:
      return "timeout";
    case Errc::too_large:
      return "too large";
    case Errc::compile_failed:
      return "compile failed";
    case Errc::internal:
      return "internal error";
    case Errc::stale_format:
      return "other format version";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string s(errc_name(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

namespace util {

// ---- descriptors 0, 1 and 2 ------------------------------------------------

namespace {

// A descriptor for a standard slot: /dev/null read-only (else the root
// folder). Reads give end of file and writes fail with EBADF, as they did
// while the slot was closed, so a program still learns that its output
// goes nowhere.
int open_placeholder() noexcept {
  int fd = ::open("/dev/null", O_RDONLY);
  if (fd < 0) fd = ::open("/", O_RDONLY | O_DIRECTORY);
  return fd;
}

bool fd_closed(int fd) noexcept { return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

std::mutex g_store_files_mu;
std::vector<std::pair<dev_t, ino_t>>* g_store_files = nullptr;  // GUARDED_BY(g_store_files_mu); leaked

bool is_store_file(const struct stat& st) {
  std::lock_guard lk(g_store_files_mu);
  if (!g_store_files) return false;
  for (const auto& [dev, ino] : *g_store_files)
    if (dev == st.st_dev && ino == st.st_ino) return true;
  return false;
}

}  // namespace

void reserve_std_fds() noexcept {
  const int saved = errno;
  for (int i = 0; i < 3; ++i) {
    if (!fd_closed(i)) continue;
    // The lowest free descriptor: this one, or a lower one another thread
    // freed meanwhile (which needs it as much).
    int fd = open_placeholder();
    if (fd > 2) {
      ::close(fd);
      break;
    }
    if (fd < 0) break;
  }
  errno = saved;
}

int open_above_std(const char* path, int flags, unsigned mode) noexcept {
  return above_std(::open(path, flags, static_cast<mode_t>(mode)), flags);
}

int above_std(int fd, int flags) noexcept {
  if (fd < 0 || fd > 2) return fd;
  int high = ::fcntl(fd, (flags & O_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 3);
  const int err = errno;
  // The slot keeps a harmless file, never this one.
  int nul = open_placeholder();
  if (nul >= 0 && nul != fd) {
    ::dup2(nul, fd);
    if (nul > 2) ::close(nul);
  } else if (nul < 0) {
    ::close(fd);
  }
  reserve_std_fds();
  if (high < 0) errno = err;
  return high;
}

void note_store_file(int fd) noexcept {
  struct stat st;
  if (::fstat(fd, &st) != 0) return;
  std::lock_guard lk(g_store_files_mu);
  if (!g_store_files) g_store_files = new std::vector<std::pair<dev_t, ino_t>>();
  for (const auto& [dev, ino] : *g_store_files)
    if (dev == st.st_dev && ino == st.st_ino) return;
  g_store_files->emplace_back(st.st_dev, st.st_ino);
}

void note_store_file(const std::string& path) noexcept {
  int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return;
  note_store_file(fd);
  ::close(fd);
}

// ---- maps that other processes can shrink ----------------------------------

namespace {

// Set inside run_guarded. (Not initial-exec: a module loaded by dlopen,
// Python's extension, may find no static TLS left for it.)
thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_prev_bus;  // the handler before ours
std::once_flag g_bus_once;

void on_sigbus(int sig, siginfo_t* info, void* uc) {
  // Only a fault of this thread's guarded read jumps back; a SIGBUS sent by
  // kill() or sigqueue() (si_code <= 0) is not one.
  sigjmp_buf* jb = info && info->si_code > 0 ? t_guard : nullptr;
  if (jb) {
    t_guard = nullptr;
    siglongjmp(*jb, 1);
  }
  // Not a guarded read: what the handler before ours would have done.
  if (g_prev_bus.sa_flags & SA_SIGINFO) {
    if (g_prev_bus.sa_sigaction) g_prev_bus.sa_sigaction(sig, info, uc);
    return;
  }
  if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN) {
    g_prev_bus.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);
  ::raise(SIGBUS);
}

void install_sigbus_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  // SIGBUS stays unblocked in the handler, so the jump back (which does
  // not restore the signal mask) leaves it unblocked.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_prev_bus);
}

}  // namespace

bool run_guarded(void (*fn)(void*), void* arg) noexcept {
  std::call_once(g_bus_once, install_sigbus_handler);
  sigjmp_buf jb;
  sigjmp_buf* volatile outer = t_guard;
  if (sigsetjmp(jb, 0) != 0) {
    t_guard = outer;
    return false;
  }
  t_guard = &jb;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn(arg);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = outer;
  return true;
}

thread_local int CopiedHits::depth_ = 0;

bool copy_guarded(void* dst, const void* src, size_t n) noexcept {
  struct Copy {
    void* dst;
    const void* src;
    size_t n;
  } c{dst, src, n};
  return run_guarded(
      +[](void* a) {
        auto* c = static_cast<Copy*>(a);
        std::memcpy(c->dst, c->src, c->n);
      },
      &c);
}

// ---- logging ----------------------------------------------------------------

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};
std::mutex g_log_mu;
FILE* g_log_file = nullptr;  // GUARDED_BY(g_log_mu); null means descriptor 2
// Descriptor 2 when the log first wrote to it (GUARDED_BY(g_log_mu)).
bool g_err_seen = false, g_err_open = false;
dev_t g_err_dev = 0;
ino_t g_err_ino = 0;

// Whether a line may be written to descriptor 2 now (see util.h).
bool stderr_writable() {
  struct stat st;
  const bool open = ::fstat(2, &st) == 0;
  if (!g_err_seen) {
    g_err_seen = true;
    g_err_open = open;
    if (open) {
      g_err_dev = st.st_dev;
      g_err_ino = st.st_ino;
    }
  }
  if (!open || is_store_file(st)) return false;
  if (g_err_open && st.st_dev == g_err_dev && st.st_ino == g_err_ino) return true;
  const int fl = ::fcntl(2, F_GETFL);
  return !S_ISREG(st.st_mode) || (fl >= 0 && (fl & O_ACCMODE) == O_WRONLY);
}
}  // namespace

void set_log(LogLevel level, const std::string& file) {
  g_level.store(static_cast<int>(level));
  std::lock_guard lk(g_log_mu);
  if (g_log_file) {
    std::fclose(g_log_file);
    g_log_file = nullptr;
  }
  if (file.empty()) return;
  int fd = open_above_std(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd >= 0 && !(g_log_file = ::fdopen(fd, "a"))) ::close(fd);
}

LogLevel log_level() noexcept { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void log(LogLevel level, const char* fmt, ...) {
  static const char* names[] = {"off", "error", "warning", "info", "debug"};
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard lk(g_log_mu);
  if (g_log_file) {
    // A file gathers the lines of many processes over days: each line
    // says when (UTC, ms) and which process.
    uint64_t ms = now_unix_ms();
    time_t secs = static_cast<time_t>(ms / 1000);
    struct tm tm;
    char when[32] = "-";
    if (::gmtime_r(&secs, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    std::fprintf(g_log_file, "%s.%03uZ [%ld] kcache: %s: %s\n", when, static_cast<unsigned>(ms % 1000),
                 static_cast<long>(::getpid()), names[static_cast<int>(level)], buf);
    std::fflush(g_log_file);
    return;
  }
  if (!stderr_writable()) return;
  std::fprintf(stderr, "kcache: %s: %s\n", names[static_cast<int>(level)], buf);
}

uint64_t now_unix_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}
uint64_t now_mono_us() noexcept {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

std::optional<uint64_t> parse_size(std::string_view s) noexcept {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  if (s.empty()) return std::nullopt;
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  std::string num(s.substr(0, i));
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  std::string_view unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  double mult = 1;
  if (!unit.empty()) {
    char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
    std::string_view rest = unit.substr(1);
    switch (u) {
      case 'B':
        mult = 1;
        if (!rest.empty()) return std::nullopt;
        rest = {};
        break;
      case 'K':
        mult = 1024.0;
        break;
      case 'M':
        mult = 1024.0 * 1024;
        break;
      case 'G':
        mult = 1024.0 * 1024 * 1024;
        break;
      case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        break;
      default:
        return std::nullopt;
    }
    if (!(rest.empty() || rest == "B" || rest == "b" || rest == "iB" || rest == "ib" || rest == "IB"))
      return std::nullopt;
  }
  double r = v * mult;
  if (r > 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(r);
}

std::string format_size(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

Status errno_status(int err, std::string_view what) {
  Errc c = Errc::io_error;
  if (err == ENOSPC || err == EDQUOT || err == EFBIG)
    c = Errc::no_space;
  else if (err == EROFS || err == EACCES || err == EPERM)
    c = Errc::read_only;
  else if (err == ENOENT)
    c = Errc::not_found;
  return Status(c, std::string(what) + ": " + std::strerror(err));
}

int flock_within(int fd, int op, uint64_t bound_ms, Env& env) noexcept {
  const uint64_t now = env.now_mono_us();
  const uint64_t deadline = bound_ms > (UINT64_MAX - now) / 1000 ? UINT64_MAX : now + bound_ms * 1000;
  for (uint64_t nap_us = 100;; nap_us = std::min<uint64_t>(nap_us * 2, 2000)) {
    if (env.flock(fd, op | LOCK_NB) == 0) return 0;
    if (errno != EWOULDBLOCK && errno != EINTR) return errno;
    if (env.now_mono_us() >= deadline) return ETIMEDOUT;
    env.sleep_us(nap_us);
  }
}

Status make_dirs(const std::string& path, unsigned mode, Env& env) {
  if (path.empty()) return Status(Errc::invalid_argument, "empty folder name");
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (env.mkdir(cur, mode) != 0 && errno != EEXIST) return errno_status(errno, "mkdir " + cur);
  }
  struct stat st;
  if (env.stat(path, &st) != 0) return errno_status(errno, "stat " + path);
  if (!S_ISDIR(st.st_mode)) return Status(Errc::io_error, path + " is not a folder");
  return Status();
}

Expected<std::string> read_file(const std::string& path, uint64_t max_bytes, Env& env) {
  Fd fd(env.open(path, O_RDONLY | O_CLOEXEC), env);
  if (!fd) return errno_status(errno, "open " + path);
  struct stat st;
  if (env.fstat(fd.get(), &st) != 0) return errno_status(errno, "stat " + path);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return Status(Errc::too_large, path);
  // Read to the end, not to the size fstat gave: a file may grow while it
  // is read, and /proc files say 0.
  std::string out(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) return Status(Errc::too_large, path);
      out.resize(std::max<size_t>(out.size() * 2, 65536));
    }
    ssize_t n = env.pread(fd.get(), out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "read " + path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) return Status(Errc::too_large, path);
  out.resize(got);
  return out;
}

int pwrite_all(Env& env, int fd, std::string_view data, off_t at) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = env.pwrite(fd, data.data() + off, data.size() - off, at + static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    off += static_cast<size_t>(n);
  }
  return 0;
}

namespace {
std::atomic<uint64_t> g_fork_generation{0};
void on_fork_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }
// Registered once, before main (static initialisation of this library).
const int g_fork_handler = ::pthread_atfork(nullptr, nullptr, on_fork_child);
}  // namespace

uint64_t fork_generation() noexcept {
  (void)g_fork_handler;
  return g_fork_generation.load(std::memory_order_relaxed);
}

uint64_t random_u64() {
  // Re-seeded after fork(): a child must not repeat its parent's sequence
  // (lease tokens and temp names would collide across processes).
  static thread_local std::mt19937_64 rng;
  static thread_local pid_t seeded_for = 0;
  pid_t pid = ::getpid();
  if (seeded_for != pid) {
    std::random_device rd;
    rng.seed((uint64_t(rd()) << 32) ^ rd() ^ (uint64_t(pid) << 16) ^ now_mono_us());
    seeded_for = pid;
  }
  return rng();
}

static std::string random_suffix() {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(random_u64()));
  return buf;
}

Status write_file_atomic(const std::string& path, std::string_view data, bool sync, Env& env) {
  return write_file_atomic_via(path + ".tmp", path, data, sync, 0600, env);
}

std::optional<bool> parse_bool(std::string_view v) noexcept {
  std::string s(v.substr(0, 8));
  if (v.size() > 8) return std::nullopt;
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

Status write_file_atomic_via(const std::string& tmp_prefix, const std::string& path, std::string_view data, bool sync,
                             unsigned mode, Env& env) {
  std::string tmp = tmp_prefix + "." + random_suffix();
  Fd fd(env.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode), env);
  if (!fd) return errno_status(errno, "create " + tmp);
  std::string_view step = "write ";
  int e = pwrite_all(env, fd.get(), data);
  if (e == 0 && sync && env.fdatasync(fd.get()) != 0) std::tie(e, step) = std::pair(errno, "fsync ");
  if (fd.close() != 0 && e == 0) std::tie(e, step) = std::pair(errno, "close ");
  if (e == 0 && env.rename(tmp, path) != 0) std::tie(e, step) = std::pair(errno, "rename ");
  if (e == 0) return Status();
  env.unlink(tmp);
  return errno_status(e, std::string(step) + tmp);
}

Status write_file_atomic_at(int dir, const std::string& name, std::string_view data, unsigned mode, Env& env) {
  std::string tmp = name + ".tmp." + random_suffix();
  Fd fd(env.openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode), env);
  if (!fd) return errno_status(errno, "create " + tmp);
  int e = pwrite_all(env, fd.get(), data);
  if (e == 0) (void)env.fchmod(fd.get(), mode);  // the mode itself, whatever the umask
  if (fd.close() != 0 && e == 0) e = errno;
  if (e == 0 && env.renameat(dir, tmp, name) != 0) e = errno;
  if (e != 0) {
    env.unlinkat(dir, tmp);
    return errno_status(e, "write " + name);
  }
  return Status();
}

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// ---- trust ------------------------------------------------------------------

namespace {

bool process_in_group(gid_t g) {
  if (::geteuid() == 0 || ::getegid() == g) return true;
  int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  n = ::getgroups(n, groups.data());
  for (int i = 0; i < n; ++i)
    if (groups[static_cast<size_t>(i)] == g) return true;
  return false;
}

// Whether user `uid` belongs to group `g` (primary or listed member).
bool user_in_group(uid_t uid, gid_t g) {
  std::vector<char> buf(16384);
  struct passwd pw, *pwp = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &pwp) != 0 || !pwp) return false;
  if (pw.pw_gid == g) return true;
  std::vector<char> gbuf(65536);
  struct group gr, *grp = nullptr;
  if (::getgrgid_r(g, &gr, gbuf.data(), gbuf.size(), &grp) != 0 || !grp) return false;
  for (char** m = gr.gr_mem; m && *m; ++m)
    if (std::strcmp(*m, pw.pw_name) == 0) return true;
  return false;
}

std::string mode_string(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

}  // namespace

Expected<StoreTrust> shared_group_trust(const std::string& group) {
  if (group.empty()) return StoreTrust{};
  std::vector<char> buf(65536);
  struct group gr, *grp = nullptr;
  gid_t gid = 0;
  if (group.find_first_not_of("0123456789") == std::string::npos) {
    gid = static_cast<gid_t>(std::strtoul(group.c_str(), nullptr, 10));
  } else if (::getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &grp) == 0 && grp) {
    gid = grp->gr_gid;
  } else {
    return Status(Errc::invalid_argument, "shared group '" + group + "' does not exist");
  }
  if (!process_in_group(gid))
    return Status(Errc::invalid_argument, "this process is not a member of the shared group '" + group + "'");
  return StoreTrust{true, static_cast<unsigned>(gid)};
}

std::string user_label(uint32_t uid) {
  std::string out = "uid " + std::to_string(uid);
  struct passwd pw, *res = nullptr;
  char buf[4096];
  if (::getpwuid_r(static_cast<uid_t>(uid), &pw, buf, sizeof buf, &res) == 0 && res && res->pw_name)
    out += " (" + std::string(res->pw_name) + ")";
  return out;
}

std::string group_label(uint32_t gid) {
  std::string out = std::to_string(gid);
  struct group gr, *res = nullptr;
  char buf[4096];
  if (::getgrgid_r(static_cast<gid_t>(gid), &gr, buf, sizeof buf, &res) == 0 && res && res->gr_name)
    out += " (" + std::string(res->gr_name) + ")";
  return out;
}

std::string untrusted_reason(const struct stat& st, const StoreTrust& trust) {
  const bool in_group = trust.shared && st.st_gid == static_cast<gid_t>(trust.group);
  const uid_t me = ::geteuid();
  std::string why;
  if (st.st_uid != me && st.st_uid != 0 && !(in_group && user_in_group(st.st_uid, st.st_gid))) {
    why = "owned by " + user_label(st.st_uid);
    if (!trust.shared)
      why += ", not by this user, " + user_label(me);
    else if (!in_group)
      why += " in group " + group_label(st.st_gid) + ", not the shared group";
    else
      why += ", who is not a member of the shared group";
  } else if (st.st_mode & S_IWOTH) {
    why = "writable by every user (mode " + mode_string(st.st_mode) + ")";
  } else if ((st.st_mode & S_IWGRP) && !in_group) {
    why = "writable by group " + group_label(st.st_gid) + ", mode " + mode_string(st.st_mode) +
          (trust.shared ? ", not the shared group" : "");
  }
  return why;
}

Status check_trusted(const std::string& path, const StoreTrust& trust, Env& env) {
  struct stat st;
  if (env.stat(path, &st) != 0) {
    if (errno == ENOENT) return Status(Errc::not_found, path + " does not exist");
    return errno_status(errno, "stat " + path);
  }
  std::string why = untrusted_reason(st, trust);
  if (why.empty()) return Status();
  return Status(Errc::unavailable, "refusing " + path + ": " + why +
                                       (trust.shared ? std::string()
                                                     : "; another user could have written it (KCACHE_SHARED=GROUP "
                                                       "shares a store within a group)"));
}

bool folder_is_shared(const std::string& dir, Env& env) {
  struct stat st;
  return env.stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_ISGID) && (st.st_mode & S_IWGRP);
}

void share_with_group(const std::string& path, const StoreTrust& trust) {
  if (!trust.shared) return;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid()) return;
  if (st.st_gid != static_cast<gid_t>(trust.group) &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(trust.group)) != 0)
    return;
  mode_t want = (st.st_mode & 07777) | (S_ISDIR(st.st_mode) ? (S_ISGID | S_IRWXG) : (S_IRGRP | S_IWGRP));
  want &= ~static_cast<mode_t>(S_IWOTH);
  if ((st.st_mode & 07777) != want) (void)::chmod(path.c_str(), want);
}

}  // namespace util
}  // namespace kcache

// Manifests of NVRTC compiles (manifest.h): built from what the recorder saw
// NVRTC read, checked by file identity, watched with inotify in a process.
#include "integrations/nvrtc/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "util/util.h"

namespace kcache::nvrtc::detail {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

int64_t now_real_ns() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return std::string();
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

std::string current_dir() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string("?");
}

// ---- timestamp granularity ---------------------------------------------------

// File systems whose inotify events cover every change (local ones). On
// others (NFS, FUSE, ...) a change made elsewhere raises no event.
bool local_fs(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53:      // ext2/3/4
    case 0x01021994:  // tmpfs
    case 0x58465342:  // xfs
    case 0x9123683E:  // btrfs
    case 0x794C7630:  // overlayfs
    case 0x2FC12FC1:  // zfs
    case 0xF2F52010:  // f2fs
      return true;
    default:
      return false;
  }
}

// The local file systems above have nanosecond timestamps taken from the
// kernel's coarse clock (a tick of at most 10 ms); elsewhere a timestamp may
// be as coarse as 2 s (FAT) or set by a server (NFS).
int64_t granularity_of(const std::string& path) { return local_fs(path) ? 50'000'000 : 2'000'000'000; }

std::mutex g_gran_mu;
std::unordered_map<dev_t, int64_t> g_gran;  // GUARDED_BY(g_gran_mu)

int64_t granularity(const std::string& path, dev_t dev) {
  {
    std::lock_guard lk(g_gran_mu);
    if (auto it = g_gran.find(dev); it != g_gran.end()) return it->second;
  }
  int64_t g = granularity_of(path);
  std::lock_guard lk(g_gran_mu);
  g_gran[dev] = g;
  return g;
}

// Whether the file system of `path` (device `dev`) makes its files' bytes
// as they are read (/proc, /sys, ...): identities there vouch for nothing.
std::unordered_map<dev_t, bool> g_pseudo;  // GUARDED_BY(g_gran_mu)

bool pseudo_fs(const std::string& path, dev_t dev) {
  {
    std::lock_guard lk(g_gran_mu);
    if (auto it = g_pseudo.find(dev); it != g_pseudo.end()) return it->second;
  }
  struct statfs fs;
  bool pseudo = true;  // unknown: not vouched for
  if (::statfs(path.c_str(), &fs) == 0) {
    switch (static_cast<unsigned long>(fs.f_type)) {
      case 0x9FA0:      // proc
      case 0x62656572:  // sysfs
      case 0x64626720:  // debugfs
      case 0x74726163:  // tracefs
      case 0x63677270:  // cgroup2
      case 0x27E0EB:    // cgroup
      case 0x73636673:  // securityfs
      case 0x1CD1:      // devpts
      case 0x42494E4D:  // binfmt_misc
        break;
      default:
        pseudo = false;
    }
  }
  std::lock_guard lk(g_gran_mu);
  g_pseudo[dev] = pseudo;
  return pseudo;
}

// Changed so recently that it could change again within the same tick
// without its identity changing (ccache's "file too new").
bool young(const std::string& path, const FileId& id, int64_t now) {
  int64_t g = granularity(path, id.dev);
  return now - id.mtime_ns < g || now - id.ctime_ns < g;
}

// ---- the digest memo ---------------------------------------------------------

struct Digested {
  FileId id;
  Digest digest;
  bool dated = false;  // holds __TIME__, __DATE__ or __TIMESTAMP__
};

std::mutex g_memo_mu;
std::unordered_map<std::string, Digested> g_memo;  // GUARDED_BY(g_memo_mu); path -> last read
std::atomic<uint64_t> g_reads{0};
constexpr size_t kMemoCap = 100000;

bool dated(std::string_view text) {
  for (size_t at = text.find("__"); at != std::string_view::npos; at = text.find("__", at + 2)) {
    std::string_view rest = text.substr(at + 2);
    if (starts_with(rest, "TIME__") || starts_with(rest, "DATE__") || starts_with(rest, "TIMESTAMP__")) return true;
  }
  return false;
}

// The digest of the file at `path` whose stat is `st`, read only when its
// identity is new; nullopt when it cannot be read or changed while read.
std::optional<Digested> digest_file(const std::string& path, const struct stat& st, int64_t now) {
  FileId id = id_of(st);
  {
    std::lock_guard lk(g_memo_mu);
    auto it = g_memo.find(path);
    if (it != g_memo.end() && it->second.id == id) return it->second;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  Digested d;
  struct stat st1;
  bool ok = ::fstat(fd, &st1) == 0 && id_of(st1) == id;
  if (ok && st1.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st1.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ok = false;
    } else {
      // A file truncated under the map raises SIGBUS: read guarded.
      struct Args {
        const char* p;
        size_t n;
        Digested* d;
      } args{static_cast<const char*>(p), static_cast<size_t>(st1.st_size), &d};
      ok = util::run_guarded(
          [](void* a) {
            auto* x = static_cast<Args*>(a);
            std::string_view text(x->p, x->n);
            x->d->digest = hash_bytes(text);
            x->d->dated = dated(text);
          },
          &args);
      ::munmap(p, static_cast<size_t>(st1.st_size));
    }
  } else if (ok) {
    d.digest = hash_bytes({});
  }
  struct stat st2;
  ok = ok && ::fstat(fd, &st2) == 0 && id_of(st2) == id;
  ::close(fd);
  if (!ok) return std::nullopt;
  g_reads.fetch_add(1, std::memory_order_relaxed);
  d.id = id;
  if (!young(path, id, now)) {
    std::lock_guard lk(g_memo_mu);
    if (g_memo.size() >= kMemoCap) g_memo.clear();
    g_memo[path] = d;
  }
  return d;
}

std::optional<Digest> listing_digest(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return std::nullopt;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::string all;
  for (const auto& n : names) all += n + '\0';
  return hash_bytes(all);
}

std::optional<std::string> link_of(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  if (n < 0) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

std::optional<std::string> resolved_of(const std::string& path) {
  char buf[PATH_MAX];
  if (!::realpath(path.c_str(), buf)) return std::nullopt;
  return std::string(buf);
}

// The type and permission bits of a file.
uint32_t mode_of(const struct stat& st) { return static_cast<uint32_t>(st.st_mode & (S_IFMT | 07777)); }

// Whether the environment variable `a.path` is as recorded.
bool env_holds(const DepManifest::Answer& a) {
  const char* v = std::getenv(a.path.c_str());
  return (v != nullptr) == a.found && (!v || a.value == v);
}

bool absent_now(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

// stat() of paths given in runs of the same folder, through a descriptor of
// the folder (O_PATH) kept while the folder repeats.
class FolderStat {
 public:
  FolderStat() = default;
  FolderStat(const FolderStat&) = delete;
  FolderStat& operator=(const FolderStat&) = delete;
  ~FolderStat() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool stat(const std::string& path, struct stat* st) {
    size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0) return ::stat(path.c_str(), st) == 0;
    std::string_view dir(path.data(), slash);
    if (fd_ < 0 || dir != dir_) {
      if (fd_ >= 0) ::close(fd_);
      dir_.assign(dir);
      fd_ = ::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (fd_ < 0) return ::stat(path.c_str(), st) == 0;
    return ::fstatat(fd_, path.c_str() + slash + 1, st, 0) == 0;
  }

 private:
  int fd_ = -1;
  std::string dir_;
};

std::string skip_blanks(std::string_view v) {
  size_t i = 0;
  while (i < v.size() && is_space(v[i])) ++i;
  return std::string(v.substr(i));
}

// Paths of `m` checked in order of their folder: each folder looked up once.
bool files_hold(const std::vector<DepManifest::File>& files, int64_t now) {
  FolderStat fs;
  struct stat st;
  for (const auto& f : files) {
    if (!fs.stat(f.path, &st)) return false;
    FileId id = id_of(st);
    if (id == f.id && !young(f.path, id, now)) continue;
    // Touched or copied, perhaps not changed: the bytes decide.
    auto d = digest_file(f.path, st, now);
    if (!d || d->digest != f.digest) return false;
  }
  return true;
}

}  // namespace

ParsedOptions parse_options(const std::vector<std::string>& options) {
  ParsedOptions p;
  // name -> the last macro operation on it ("-DNAME=VALUE" or "-UNAME").
  std::map<std::string, std::string> macro_ops;
  auto value = [&](size_t* i, std::string_view short_form, std::string_view long_form,
                   bool glued) -> std::optional<std::string> {
    const std::string& o = options[*i];
    if (o == short_form || o == long_form) {
      if (*i + 1 >= options.size()) return std::nullopt;
      return skip_blanks(options[++*i]);
    }
    if (starts_with(o, std::string(long_form) + "=")) return o.substr(long_form.size() + 1);
    if (starts_with(o, std::string(short_form) + "=")) return o.substr(short_form.size() + 1);
    if (glued && starts_with(o, short_form)) {
      std::string v = skip_blanks(std::string_view(o).substr(short_form.size()));
      if (!v.empty() && v[0] == '=') v.erase(0, 1);
      return v;
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string& o = options[i];
    if (auto d = value(&i, "-D", "--define-macro", true)) {
      std::string def = *d;
      size_t end = std::min(def.find('='), def.find('('));
      std::string name = def.substr(0, end);
      if (def.find('=') == std::string::npos) def += "=1";
      macro_ops[name] = "-D" + def;
    } else if (auto u = value(&i, "-U", "--undefine-macro", true)) {
      macro_ops[*u] = "-U" + *u;
    } else if (auto inc = value(&i, "-I", "--include-path", true)) {
      p.include_dirs.push_back(*inc);
    } else if (auto pre = value(&i, "-include", "--pre-include", false)) {
      p.pre_includes.push_back(*pre);
    } else {
      p.other.push_back(o);
    }
  }
  for (auto& [name, op] : macro_ops) p.macros.push_back(std::move(op));
  return p;
}

int64_t timestamp_granularity_ns(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return granularity_of(path);
  return granularity(path, st.st_dev);
}

Built build_manifest(const Recording& rec, const std::vector<std::string_view>& outputs,
                     const std::vector<std::string_view>& in_memory) {
  Built out;
  DepManifest& m = out.manifest;
  auto refuse = [&](std::string why) {
    if (out.uncacheable.empty()) out.uncacheable = std::move(why);
  };
  if (rec.hooks_lost)
    refuse("a libnvrtc import slot was rebound while compiling (lazy binding on another thread); patched again");
  if (!rec.unreadable.empty())
    refuse(rec.unreadable + " could not be opened or stat'ed, other than absent (permissions, a loop, ...)");
  if (rec.escaped) refuse(std::string(rec.escaped) + ": what it read there is not seen");
  if (rec.wrote) refuse("NVRTC wrote: opened a file for writing, made a folder or removed a name");
  if (rec.cwd_changed) refuse("NVRTC changed the working folder");
  if (current_dir() != rec.cwd) refuse("the working folder changed while compiling");
  for (std::string_view t : in_memory)
    if (dated(t)) refuse("the program uses __TIME__, __DATE__ or __TIMESTAMP__");

  struct Seen {
    bool opened = false, found = false, missing = false;
    bool has_id = false;
    FileId id;  // the identity NVRTC opened
  };
  std::map<std::string, Seen> seen;
  std::map<std::string, DepManifest::Answer> links, resolved, listings, env;
  for (const Access& a : rec.accesses) {
    switch (a.kind) {
      case Access::Kind::opened:
      case Access::Kind::stated:
      case Access::Kind::probed: {
        Seen& s = seen[a.path];
        if (!a.found) {
          s.missing = true;
          break;
        }
        s.found = true;
        if (a.kind == Access::Kind::opened) s.opened = true;
        if (a.has_id) {
          // A stat and an open of one path that saw two identities: the
          // file changed while NVRTC read it.
          if (s.has_id && !(s.id == a.id) && a.kind == Access::Kind::opened)
            refuse(a.path + " changed while compiling");
          if (a.kind == Access::Kind::opened || !s.has_id) {
            s.has_id = true;
            s.id = a.id;
          }
        }
        break;
      }
      case Access::Kind::linked:
      case Access::Kind::resolved: {
        auto& map = a.kind == Access::Kind::linked ? links : resolved;
        auto [it, fresh] = map.emplace(a.path, DepManifest::Answer{a.path, a.found, a.target});
        if (!fresh && (it->second.found != a.found || it->second.value != a.target))
          refuse(a.path + " changed while compiling");
        break;
      }
      case Access::Kind::env: {
        auto [it, fresh] = env.emplace(a.path, DepManifest::Answer{a.path, a.found, a.target});
        if (!fresh && (it->second.found != a.found || it->second.value != a.target))
          refuse("$" + a.path + " changed while compiling");
        break;
      }
      case Access::Kind::listed:
        listings.emplace(a.path, DepManifest::Answer{a.path, a.found, std::string()});
        break;
    }
  }
  const int64_t now = now_real_ns();
  // A file changed within one timestamp tick before the compile began (or
  // after) could have been rewritten, after NVRTC read it, without its
  // identity changing: too new to vouch for what NVRTC read.
  const int64_t began = rec.start_ns ? std::min(rec.start_ns, now) : now;
  std::set<std::string> absent_dirs;
  struct stat st;
  for (auto& [path, s] : seen) {
    if (s.found && s.missing) {
      refuse(path + " appeared or went while compiling");
      continue;
    }
    if (s.missing) {
      if (!absent_now(path)) refuse(path + " appeared while compiling");
      m.absent.push_back(path);
      absent_dirs.insert(dir_of(path));
      continue;
    }
    if (!s.opened) {
      if (::stat(path.c_str(), &st) != 0) {
        refuse(path + " went while compiling");
        continue;
      }
      m.present.push_back({path, mode_of(st)});
      continue;
    }
    if (::stat(path.c_str(), &st) != 0) {
      refuse(path + " went while compiling");
      continue;
    }
    if (S_ISDIR(st.st_mode)) {  // opened as a folder: existence only
      m.present.push_back({path, mode_of(st)});
      continue;
    }
    // /proc, a device, a FIFO: its bytes have no identity (and a FIFO
    // blocks a read).
    if (!S_ISREG(st.st_mode) || pseudo_fs(path, st.st_dev)) {
      refuse(path + " is not a regular file");
      continue;
    }
    FileId id = id_of(st);
    if (s.has_id && !(id == s.id)) {
      refuse(path + " changed while compiling");
      continue;
    }
    if (young(path, id, began)) {
      refuse(path + " is too new (changed within the file system's timestamp granularity of the compile)");
      continue;
    }
    auto d = digest_file(path, st, now);
    if (!d) {
      refuse(path + " changed while it was read");
      continue;
    }
    if (d->dated) refuse(path + " uses __TIME__, __DATE__ or __TIMESTAMP__");
    m.files.push_back({path, id, d->digest});
  }
  for (const auto& dir : absent_dirs) {
    DepManifest::Dir d;
    d.path = dir;
    d.exists = ::stat(dir.empty() ? "/" : dir.c_str(), &st) == 0;
    if (d.exists) {
      FileId id = id_of(st);
      if (!young(dir, id, now)) d.id = id;  // else zero: its absent names are stat'ed every check
    }
    m.dirs.push_back(std::move(d));
  }
  for (auto& [path, a] : links) {
    auto now_target = link_of(path);
    if (now_target.has_value() != a.found || (a.found && *now_target != a.value))
      refuse(path + " changed while compiling");
    m.links.push_back(a);
  }
  for (auto& [path, a] : resolved) {
    auto now_target = resolved_of(path);
    if (now_target.has_value() != a.found || (a.found && *now_target != a.value))
      refuse(path + " changed while compiling");
    m.resolved.push_back(a);
  }
  for (auto& [path, a] : listings) {
    // The names are taken now, not when NVRTC read them: a folder changed
    // since the compile began (or within a tick before) may have listed
    // otherwise for NVRTC.
    if (a.found && ::stat(path.c_str(), &st) == 0 && young(path, id_of(st), began))
      refuse(path + " is too new (a folder NVRTC listed changed within the timestamp granularity of the compile)");
    auto d = listing_digest(path);
    if (d.has_value() != a.found) refuse(path + " changed while compiling");
    if (d) a.value = d->hex();
    m.listings.push_back(a);
  }
  // Variables NVRTC asked for in an earlier compile of this process only
  // (once per process): their values now.
  for (const auto& name : nvrtc_env_names()) {
    if (env.count(name)) continue;
    const char* v = std::getenv(name.c_str());
    env.emplace(name, DepManifest::Answer{name, v != nullptr, v ? std::string(v) : std::string()});
  }
  for (auto& [name, a] : env) {
    // PWD names the working folder, which is keyed when NVRTC uses it;
    // kept only when an output names its value (a shell that did not
    // follow a chdir leaves it stale, and a stale one should not miss).
    if (name == "PWD") {
      bool named = false;
      if (a.found && a.value.size() > 1)
        for (std::string_view o : outputs) named = named || o.find(a.value) != std::string_view::npos;
      if (!named) continue;
    }
    if (!env_holds(a)) refuse("$" + name + " changed while compiling");
    m.env.push_back(a);
  }
  for (const Load& l : nvrtc_loads()) {
    DepManifest::Lib lib{l.name, l.path, {}, {}};
    if (!l.path.empty()) {
      if (::stat(l.path.c_str(), &st) != 0) {
        refuse(l.path + " went while compiling");
        continue;
      }
      auto d = digest_file(l.path, st, now);
      if (!d) {
        refuse(l.path + " changed while it was read");
        continue;
      }
      lib.id = id_of(st);
      lib.digest = d->digest;
    }
    m.libs.push_back(std::move(lib));
  }
  // The working folder, when NVRTC asked for it or resolved a relative
  // path against it, or when an output names it (debug and line info name
  // the folder of the source).
  if (rec.cwd_used) m.cwd = rec.cwd;
  if (!rec.cwd.empty() && rec.cwd != "/") {
    for (std::string_view o : outputs)
      if (o.find(rec.cwd) != std::string_view::npos) m.cwd = rec.cwd;
  }
  return out;
}

bool manifest_holds(const DepManifest& m) {
  if (!m.cwd.empty() && current_dir() != m.cwd) return false;
  for (const auto& a : m.env)
    if (!env_holds(a)) return false;
  const int64_t now = now_real_ns();
  struct stat st;
  for (const auto& l : m.libs) {
    if (resolve_library(l.name, l.path) != l.path) return false;
    if (l.path.empty()) continue;
    if (!files_hold({DepManifest::File{l.path, l.id, l.digest}}, now)) return false;
  }
  // Folders of absent names: one whose identity is as recorded vouches for
  // every absent name in it; the others' names are stat'ed one by one.
  std::set<std::string> unvouched;
  for (const auto& d : m.dirs) {
    bool exists = ::stat(d.path.empty() ? "/" : d.path.c_str(), &st) == 0;
    if (!exists && !d.exists) continue;
    if (exists && d.exists && id_of(st) == d.id && d.id != FileId{} && !young(d.path, d.id, now)) continue;
    unvouched.insert(d.path);
  }
  if (!unvouched.empty()) {
    for (const auto& a : m.absent)
      if (unvouched.count(dir_of(a)) && !absent_now(a)) return false;
  }
  if (!files_hold(m.files, now)) return false;
  FolderStat fs;
  for (const auto& p : m.present)
    if (!fs.stat(p.path, &st) || mode_of(st) != p.mode) return false;
  for (const auto& a : m.links) {
    auto t = link_of(a.path);
    if (t.has_value() != a.found || (a.found && *t != a.value)) return false;
  }
  for (const auto& a : m.resolved) {
    auto t = resolved_of(a.path);
    if (t.has_value() != a.found || (a.found && *t != a.value)) return false;
  }
  for (const auto& a : m.listings) {
    auto d = listing_digest(a.path);
    if (d.has_value() != a.found || (d && d->hex() != a.value)) return false;
  }
  return true;
}

// ---- watched checks ----------------------------------------------------------

namespace {

// One inotify descriptor for the process. Each folder a manifest depends on
// is watched once; each read of the events stamps the folders that had any
// with a new sequence number.
class Watcher {
 public:
  // The process's watcher. A forked child makes its own: reading the
  // parent's descriptor would take events the parent waits for. The fork
  // handlers hold the lock across fork(), so the child never inherits it
  // held, and drop the child's copy of the parent's watcher (its lock may
  // be held by a thread the child does not have: it is left, never used).
  static Watcher& get() {
    std::lock_guard lk(g_mu);
    pid_t pid = ::getpid();
    if (!g_w || g_owner != pid) {
      if (!g_w) {
        static const int registered = ::pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, &in_child);
        (void)registered;
      }
      g_w = new Watcher(++g_generation);  // never destroyed: used until exit
      g_owner = pid;
    }
    return *g_w;
  }
  bool available() const { return fd_ >= 0; }
  uint64_t generation() const { return generation_; }

  // Watches every folder of `dirs`; false when one cannot be watched.
  bool watch(const std::vector<std::string>& dirs, std::vector<int>* wds) {
    std::lock_guard lk(mu_);
    for (const auto& d : dirs) {
      auto it = wd_of_.find(d);
      if (it == wd_of_.end()) {
        if (!local_fs(d)) return false;
        int wd = ::inotify_add_watch(fd_, d.c_str(),
                                     IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM |
                                         IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF);
        if (wd < 0) return false;
        it = wd_of_.emplace(d, wd).first;
        dir_of_[wd] = d;
      }
      wds->push_back(it->second);
    }
    return true;
  }

  // Reads the pending events; the current sequence number.
  uint64_t drain() {
    std::lock_guard lk(mu_);
    alignas(struct inotify_event) char buf[16384];
    bool any = false;
    for (;;) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      if (!any) ++seq_;
      any = true;
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const struct inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        if (e->mask & IN_Q_OVERFLOW) overflow_seq_ = seq_;
        last_event_[e->wd] = seq_;
        if (e->mask & IN_IGNORED) {  // the folder went: watched anew next time
          auto d = dir_of_.find(e->wd);
          if (d != dir_of_.end()) {
            wd_of_.erase(d->second);
            dir_of_.erase(d);
          }
        }
      }
    }
    return seq_;
  }

  // Whether any of `wds` had an event stamped `seq` or later.
  bool changed_since(const std::vector<int>& wds, uint64_t seq) {
    std::lock_guard lk(mu_);
    if (overflow_seq_ >= seq) return true;
    for (int wd : wds) {
      auto it = last_event_.find(wd);
      if (it != last_event_.end() && it->second >= seq) return true;
      if (!dir_of_.count(wd)) return true;  // no longer watched
    }
    return false;
  }

 private:
  explicit Watcher(uint64_t generation) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)), generation_(generation) {}
  static void in_child() {
    if (g_w && g_w->fd_ >= 0) ::close(g_w->fd_);
    g_w = nullptr;
    g_mu.unlock();
  }
  static inline std::mutex g_mu;
  static inline Watcher* g_w = nullptr;  // GUARDED_BY(g_mu)
  static inline pid_t g_owner = 0;       // GUARDED_BY(g_mu)
  static inline uint64_t g_generation = 0;
  const int fd_;
  const uint64_t generation_;
  std::mutex mu_;
  uint64_t seq_ = 1;                              // GUARDED_BY(mu_)
  uint64_t overflow_seq_ = 0;                     // GUARDED_BY(mu_)
  std::unordered_map<int, uint64_t> last_event_;  // GUARDED_BY(mu_)
  std::unordered_map<std::string, int> wd_of_;    // GUARDED_BY(mu_)
  std::unordered_map<int, std::string> dir_of_;   // GUARDED_BY(mu_)
};

// The folders whose events cover every change `m` depends on: the folder
// of each file, probe, link and library (and of a file's target when it is
// a link), each folder of absent names, and for a folder that does not
// exist its nearest existing ancestor (where it would be created).
std::vector<std::string> watch_dirs(const DepManifest& m) {
  std::set<std::string> dirs;
  auto folder = [](const std::string& path) {
    std::string d = dir_of(path);
    return d.empty() ? std::string("/") : d;
  };
  auto file = [&](const std::string& path) {
    dirs.insert(folder(path));
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      if (auto r = resolved_of(path)) dirs.insert(folder(*r));
  };
  for (const auto& f : m.files) file(f.path);
  for (const auto& l : m.libs)
    if (!l.path.empty()) file(l.path);
  for (const auto& p : m.present) dirs.insert(folder(p.path));
  for (const auto& a : m.links) dirs.insert(folder(a.path));
  for (const auto& d : m.dirs) {
    std::string at = d.path.empty() ? std::string("/") : d.path;
    struct stat st;
    while (::stat(at.c_str(), &st) != 0) {
      at = folder(at);
      if (at == "/") break;
    }
    dirs.insert(at);
  }
  return {dirs.begin(), dirs.end()};
}

constexpr int64_t kRecheckNs = 1'000'000'000;

}  // namespace

bool manifest_holds(const DepManifest& m, WatchState* w) {
  Watcher& watcher = Watcher::get();
  // Listings and resolved paths are not covered by events in the folders
  // of their paths alone: checked in full every time.
  bool watchable = m.listings.empty() && m.resolved.empty();
  if (!watcher.available() || !watchable) return manifest_holds(m);
  const int64_t now = now_real_ns();
  uint64_t seq = watcher.drain();
  if (w->watched && w->generation == watcher.generation() && w->verified_seq != 0 &&
      now - w->verified_ns < kRecheckNs && !watcher.changed_since(w->wds, w->verified_seq) &&
      (m.cwd.empty() || current_dir() == m.cwd) &&
      std::all_of(m.env.begin(), m.env.end(), [](const DepManifest::Answer& a) { return env_holds(a); })) {
    // Which file the loader maps for each library (the process may have
    // loaded another copy since): asked every time.
    bool libs_hold = true;
    for (const auto& l : m.libs) libs_hold = libs_hold && resolve_library(l.name, l.path) == l.path;
    if (libs_hold) return true;
  }
  // The watches first, then the stats: a change after a stat raises an
  // event that the next check sees.
  if (w->generation != watcher.generation()) *w = WatchState{false, false, {}, 0, 0, watcher.generation()};
  if (!w->watched && !w->unwatchable) {
    w->wds.clear();
    w->watched = watcher.watch(watch_dirs(m), &w->wds);
    w->unwatchable = !w->watched;
    seq = watcher.drain();
  }
  w->verified_seq = 0;
  if (!manifest_holds(m)) return false;
  if (w->watched) {
    w->verified_seq = seq + 1;
    w->verified_ns = now;
  }
  return true;
}

// ---- encoding ------------------------------------------------------------------

namespace {

// Record encoding: a version byte, then counts and fields.
constexpr uint8_t kRecordVersion = 3;

void put_str(std::string& out, std::string_view s) {
  util::put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
void put_id(std::string& out, const FileId& id) {
  util::put_u64(out, static_cast<uint64_t>(id.dev));
  util::put_u64(out, static_cast<uint64_t>(id.ino));
  util::put_u64(out, static_cast<uint64_t>(id.size));
  util::put_u64(out, static_cast<uint64_t>(id.mtime_ns));
  util::put_u64(out, static_cast<uint64_t>(id.ctime_ns));
}

struct Reader {
  std::string_view s;
  bool ok = true;
  uint64_t u64() {
    if (s.size() < 8) return ok = false, 0;
    uint64_t v = util::get_u64(s.data());
    s.remove_prefix(8);
    return v;
  }
  uint32_t u32() {
    if (s.size() < 4) return ok = false, 0;
    uint32_t v = util::get_u32(s.data());
    s.remove_prefix(4);
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    if (!ok || s.size() < n) return ok = false, std::string();
    std::string v(s.substr(0, n));
    s.remove_prefix(n);
    return v;
  }
  FileId id() {
    FileId f;
    f.dev = static_cast<dev_t>(u64());
    f.ino = static_cast<ino_t>(u64());
    f.size = static_cast<off_t>(u64());
    f.mtime_ns = static_cast<int64_t>(u64());
    f.ctime_ns = static_cast<int64_t>(u64());
    return f;
  }
};

void put_answers(std::string& out, const std::vector<DepManifest::Answer>& v) {
  util::put_u32(out, static_cast<uint32_t>(v.size()));
  for (const auto& a : v) {
    put_str(out, a.path);
    out.push_back(a.found ? 1 : 0);
    put_str(out, a.value);
  }
}

void put_digest(std::string& out, const Digest& d) {
  out.append(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
}

bool get_digest(Reader& r, Digest* d) {
  if (r.s.size() < d->bytes.size()) return r.ok = false;
  std::copy(r.s.begin(), r.s.begin() + d->bytes.size(), reinterpret_cast<char*>(d->bytes.data()));
  r.s.remove_prefix(d->bytes.size());
  return true;
}

bool get_byte(Reader& r) {
  if (r.s.empty()) return r.ok = false;
  bool b = r.s[0] != 0;
  r.s.remove_prefix(1);
  return b;
}

// A count no larger than the bytes left (each element takes at least one).
uint32_t get_count(Reader& r) {
  uint32_t n = r.u32();
  if (n > r.s.size()) r.ok = false;
  return r.ok ? n : 0;
}

bool get_answers(Reader& r, std::vector<DepManifest::Answer>* v) {
  v->resize(get_count(r));
  for (auto& a : *v) {
    a.path = r.str();
    a.found = get_byte(r);
    a.value = r.str();
  }
  return r.ok;
}

}  // namespace

std::string encode_manifest(const DepManifest& m) {
  std::string out;
  out.push_back(static_cast<char>(kRecordVersion));
  util::put_u32(out, static_cast<uint32_t>(m.files.size()));
  for (const auto& f : m.files) {
    put_str(out, f.path);
    put_id(out, f.id);
    put_digest(out, f.digest);
  }
  util::put_u32(out, static_cast<uint32_t>(m.present.size()));
  for (const auto& p : m.present) {
    put_str(out, p.path);
    util::put_u32(out, p.mode);
  }
  util::put_u32(out, static_cast<uint32_t>(m.absent.size()));
  for (const auto& s : m.absent) put_str(out, s);
  util::put_u32(out, static_cast<uint32_t>(m.dirs.size()));
  for (const auto& d : m.dirs) {
    put_str(out, d.path);
    out.push_back(d.exists ? 1 : 0);
    put_id(out, d.id);
  }
  put_answers(out, m.links);
  put_answers(out, m.resolved);
  put_answers(out, m.listings);
  util::put_u32(out, static_cast<uint32_t>(m.libs.size()));
  for (const auto& l : m.libs) {
    put_str(out, l.name);
    put_str(out, l.path);
    put_id(out, l.id);
    put_digest(out, l.digest);
  }
  put_answers(out, m.env);
  put_str(out, m.cwd);
  return out;
}

std::optional<DepManifest> decode_manifest(std::string_view bytes) {
  if (bytes.empty() || static_cast<uint8_t>(bytes[0]) != kRecordVersion) return std::nullopt;
  Reader r{bytes.substr(1)};
  DepManifest m;
  m.files.resize(get_count(r));
  for (auto& f : m.files) {
    f.path = r.str();
    f.id = r.id();
    get_digest(r, &f.digest);
  }
  m.present.resize(get_count(r));
  for (auto& p : m.present) {
    p.path = r.str();
    p.mode = r.u32();
  }
  m.absent.resize(get_count(r));
  for (auto& s : m.absent) s = r.str();
  m.dirs.resize(get_count(r));
  for (auto& d : m.dirs) {
    d.path = r.str();
    d.exists = get_byte(r);
    d.id = r.id();
  }
  get_answers(r, &m.links);
  get_answers(r, &m.resolved);
  get_answers(r, &m.listings);
  m.libs.resize(get_count(r));
  for (auto& l : m.libs) {
    l.name = r.str();
    l.path = r.str();
    l.id = r.id();
    get_digest(r, &l.digest);
  }
  get_answers(r, &m.env);
  m.cwd = r.str();
  if (!r.ok || !r.s.empty()) return std::nullopt;
  return m;
}

uint64_t header_reads() noexcept { return g_reads.load(std::memory_order_relaxed); }

}  // namespace kcache::nvrtc::detail

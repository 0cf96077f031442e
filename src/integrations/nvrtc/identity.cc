// What a path answers now, for the manifests of NVRTC compiles
// (identity.h): file identities and timestamp granularity, the digest
// memo, and the answers of folders, links, resolved paths and variables.
#include "integrations/nvrtc/identity.h"

#include <dirent.h>
#include <fcntl.h>
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
#include <mutex>
#include <unordered_map>

#include "util/util.h"

namespace kcache::nvrtc::detail {

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

namespace {

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

std::unordered_map<dev_t, bool> g_pseudo;  // GUARDED_BY(g_gran_mu)

}  // namespace

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

bool young(const std::string& path, const FileId& id, int64_t now) {
  int64_t g = granularity(path, id.dev);
  return now - id.mtime_ns < g || now - id.ctime_ns < g;
}

// ---- the digest memo ---------------------------------------------------------

namespace {

std::mutex g_memo_mu;
std::unordered_map<std::string, Digested> g_memo;  // GUARDED_BY(g_memo_mu); path -> last read
std::atomic<uint64_t> g_reads{0};
constexpr size_t kMemoCap = 100000;

}  // namespace

bool dated(std::string_view text) {
  for (size_t at = text.find("__"); at != std::string_view::npos; at = text.find("__", at + 2)) {
    std::string_view rest = text.substr(at + 2);
    if (rest.starts_with("TIME__") || rest.starts_with("DATE__") || rest.starts_with("TIMESTAMP__")) return true;
  }
  return false;
}

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

bool env_holds(const DepManifest::Answer& a) {
  const char* v = std::getenv(a.path.c_str());
  return (v != nullptr) == a.found && (!v || a.value == v);
}

bool absent_now(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

FolderStat::~FolderStat() {
  if (fd_ >= 0) ::close(fd_);
}

bool FolderStat::stat(const std::string& path, struct stat* st) {
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

int64_t timestamp_granularity_ns(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return granularity_of(path);
  return granularity(path, st.st_dev);
}

uint64_t header_reads() noexcept { return g_reads.load(std::memory_order_relaxed); }

}  // namespace kcache::nvrtc::detail

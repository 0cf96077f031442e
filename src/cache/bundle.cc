// Bundles at the level of a Cache (kcache/bundle.h): the mark of its disk
// store, bundles made from that store (to a regular file only, collecting
// the temp files of killed writers), and bundle bytes mounted in it.
#include "kcache/bundle.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <ctime>

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

namespace {

std::shared_ptr<Tier> disk_tier_of(Cache& c) {
  for (const auto& t : c.tiers())
    if (t->kind() == TierKind::disk) return t;
  return nullptr;
}

// The cache's own disk store: the bundle writer reads it with Access::peek,
// so making a bundle is not a use and leaves every recency record as it
// was. This process's recency is flushed first, so marks see it.
Expected<std::shared_ptr<Tier>> bundle_source(Cache& c) {
  c.flush();
  auto disk = disk_tier_of(c);
  if (!disk || !disk->admin()) return Status(Errc::unavailable, "the cache has no disk store to make a bundle from");
  return disk;
}

// Where a bundle named `path` goes: a regular file or a missing path as
// named, a symbolic link's target (the link stays). Anything else (a device
// such as /dev/full, a FIFO, a folder, a link to a missing file) is refused:
// the writer's rename would replace it with a regular file.
Expected<std::string> bundle_target(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return Status(Errc::io_error, path + " is not a regular file; a bundle is written to a file, not replaced");
    char* real = ::realpath(path.c_str(), nullptr);
    if (!real) return util::errno_status(errno, "resolving " + path);
    std::string t = real;
    std::free(real);
    return t;
  }
  if (errno != ENOENT) return util::errno_status(errno, path);
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    return Status(Errc::io_error, path + " is a symbolic link to a missing file; not replaced");
  return path;
}

// The bundle writer's temp files are "NAME.tmp.<16 hex>" beside NAME.
constexpr std::string_view kBundleTemp = ".tmp.";
constexpr time_t kStaleTempSeconds = 3600;

bool is_bundle_temp(std::string_view name, std::string_view prefix) {
  if (name.size() != prefix.size() + 16 || name.substr(0, prefix.size()) != prefix) return false;
  for (char ch : name.substr(prefix.size()))
    if (!std::isxdigit(static_cast<unsigned char>(ch))) return false;
  return true;
}

// Removes the temp files of writers of `target` that were killed before
// their rename: this user's plain files an hour old or more (a writer that
// is still going keeps its file's mtime fresh).
void collect_stale_temps(const std::string& target) {
  size_t slash = target.rfind('/');
  std::string folder = slash == std::string::npos ? std::string(".") : target.substr(0, slash ? slash : 1);
  std::string prefix = (slash == std::string::npos ? target : target.substr(slash + 1)) + std::string(kBundleTemp);
  DIR* d = ::opendir(folder.c_str());
  if (!d) return;
  const time_t now = ::time(nullptr);
  uint64_t removed = 0;
  while (struct dirent* de = ::readdir(d)) {
    if (!is_bundle_temp(de->d_name, prefix)) continue;
    struct stat st;
    if (::fstatat(::dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid() || now - st.st_mtime < kStaleTempSeconds)
      continue;
    if (::unlinkat(::dirfd(d), de->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  if (removed)
    KCACHE_LOG(LogLevel::info, "removed %llu stale temp files of %s", static_cast<unsigned long long>(removed),
               target.c_str());
}

// The writer's messages name its temp files ("NAME.tmp.<hex>", "temp file
// in FOLDER"); the caller named `path`.
Status naming(Status st, const std::string& target, const std::string& path) {
  std::string m = st.message(), prefix = target + std::string(kBundleTemp);
  size_t slash = target.rfind('/');
  std::string unnamed =
      "temp file in " + (slash == std::string::npos ? std::string(".") : target.substr(0, slash ? slash : 1));
  if (m.starts_with(unnamed) && (m.size() == unnamed.size() || m[unnamed.size()] == ':'))
    m.replace(0, unnamed.size(), path);
  for (size_t at = m.find(prefix); at != std::string::npos; at = m.find(prefix, at + path.size())) {
    size_t end = at + prefix.size();
    while (end < m.size() && std::isxdigit(static_cast<unsigned char>(m[end]))) ++end;
    m.replace(at, end - at, path);
  }
  return Status(st.code(), m);
}

}  // namespace

Expected<uint64_t> Cache::mark() {
  flush();
  auto disk = disk_tier_of(*this);
  if (!disk || !disk->admin()) return Status(Errc::unavailable, "the cache has no disk store to mark");
  return disk->admin()->mark();
}

Expected<BundleInfo> write_bundle(Cache& from, const BundleSelection& selection, const std::string& path,
                                  const BundleWriteOptions& options) {
  KCACHE_TRY(std::string target, bundle_target(path));
  KCACHE_TRY(auto src, bundle_source(from));
  collect_stale_temps(target);
  auto info = write_bundle(*src, selection, target, options);
  if (!info) return naming(std::move(info).error(), target, path);
  return info;
}

Expected<std::string> save_bundle(Cache& from, const BundleSelection& selection, const BundleWriteOptions& options) {
  KCACHE_TRY(auto src, bundle_source(from));
  return save_bundle(*src, selection, options);
}

Status load_bundle(Cache& cache, std::string bytes) {
  auto t = open_bundle_bytes(std::move(bytes), cache.options().bundles.trusted_keys);
  if (!t) {
    KCACHE_LOG(LogLevel::warn, "%s", t.error().to_string().c_str());
    return std::move(t).error();
  }
  cache.add_tier(std::move(t).value());
  return Status();
}

}  // namespace kcache

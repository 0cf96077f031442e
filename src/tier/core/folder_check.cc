// check_store_folders: the StrictModes walk of tier/core/folder_check.h.
#include "tier/core/folder_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "util/fd.h"

namespace kcache {
namespace {

#ifdef O_PATH
// Search permission on the folder below is all "..", opened so, needs.
constexpr int kWalkFlags = O_PATH | O_DIRECTORY | O_CLOEXEC;
#else
constexpr int kWalkFlags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
#endif

std::string parent_name(const std::string& p) {
  size_t s = p.rfind('/');
  return s == 0 || s == std::string::npos ? std::string("/") : p.substr(0, s);
}

}  // namespace

Status check_store_folders(const std::string& folder, const util::StoreTrust& trust, Env& env) {
  char* real = ::realpath(folder.c_str(), nullptr);
  if (!real) {
    if (errno == ENOENT) return Status(Errc::not_found, folder + " does not exist");
    return util::errno_status(errno, "resolve " + folder);
  }
  const std::string store(real);
  std::free(real);
  util::Fd fd(env.open(store, kWalkFlags), env);
  if (!fd) return util::errno_status(errno, "open " + store);
  std::string name = store;
  for (int depth = 0; depth < PATH_MAX; ++depth) {
    struct stat st;
    if (env.fstat(fd.get(), &st) != 0) return util::errno_status(errno, "stat " + name);
    if (depth == 0 && !S_ISDIR(st.st_mode)) return Status(Errc::unavailable, "refusing " + name + ": not a folder");
    const bool sticky = depth > 0 && (st.st_mode & S_ISVTX);
    struct stat judged = st;
    // In a sticky folder nobody renames what is not theirs: only its
    // owner counts, not who may add names to it.
    if (sticky) judged.st_mode &= ~static_cast<mode_t>(S_IWGRP | S_IWOTH);
    std::string why = util::untrusted_reason(judged, trust);
    if (!why.empty()) {
      if (depth == 0)
        return Status(Errc::unavailable,
                      "refusing " + name + ": " + why +
                          (trust.shared ? std::string()
                                        : "; another user could have written it (KCACHE_SHARED=GROUP shares a "
                                          "store within a group)"));
      return Status(Errc::unavailable, "refusing " + name + ", a folder above the store " + store + ": " + why +
                                           "; another user could move the store away and put one of their own "
                                           "in its place");
    }
    if (sticky || (depth > 0 && st.st_uid == 0)) return Status();
    util::Fd up(env.openat(fd.get(), "..", kWalkFlags), env);
    if (!up) return util::errno_status(errno, "open " + parent_name(name));
    struct stat ust;
    if (env.fstat(up.get(), &ust) != 0) return util::errno_status(errno, "stat " + parent_name(name));
    if (ust.st_dev == st.st_dev && ust.st_ino == st.st_ino) return Status();  // the root
    fd = std::move(up);
    name = parent_name(name);
  }
  return Status(Errc::unavailable, "refusing " + store + ": too many folders above it");
}

}  // namespace kcache

// The POSIX Env: each method is the system call of the same name.
#include "kcache/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "util/util.h"

namespace kcache {
namespace {

class PosixEnv final : public Env {
 public:
  int close(int fd) override { return ::close(fd); }
  ssize_t pread(int fd, void* buf, size_t n, off_t off) override { return ::pread(fd, buf, n, off); }
  ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) override { return ::pwrite(fd, buf, n, off); }
  int fdatasync(int fd) override { return ::fdatasync(fd); }
  int fstat(int fd, struct stat* st) override { return ::fstat(fd, st); }
  int fchmod(int fd, unsigned mode) override { return ::fchmod(fd, static_cast<mode_t>(mode)); }
  int flock(int fd, int op) override { return ::flock(fd, op); }

  int openat(int dir, const std::string& path, int flags, unsigned mode) override {
    // Never 0, 1 or 2: the program may have closed them since the store
    // was opened.
    return util::above_std(::openat(dir, path.c_str(), flags, static_cast<mode_t>(mode)), flags);
  }
  int fstatat(int dir, const std::string& path, struct stat* st, int flags) override {
    return ::fstatat(dir, path.c_str(), st, flags);
  }
  int accessat(int dir, const std::string& path, int mode) override { return ::faccessat(dir, path.c_str(), mode, 0); }
  int chmodat(int dir, const std::string& path, unsigned mode) override {
    return ::fchmodat(dir, path.c_str(), static_cast<mode_t>(mode), 0);
  }
  int mkdirat(int dir, const std::string& path, unsigned mode) override {
    return ::mkdirat(dir, path.c_str(), static_cast<mode_t>(mode));
  }
  int renameat(int dir, const std::string& from, const std::string& to) override {
    return ::renameat(dir, from.c_str(), dir, to.c_str());
  }
  int linkat(int dir, const std::string& from, const std::string& to) override {
    return ::linkat(dir, from.c_str(), dir, to.c_str(), 0);
  }
  int unlinkat(int dir, const std::string& path) override { return ::unlinkat(dir, path.c_str(), 0); }
  int set_mtime_ms_at(int dir, const std::string& path, uint64_t ms) override {
    struct timespec ts[2];
    ts[0].tv_sec = 0;
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1].tv_sec = static_cast<time_t>(ms / 1000);
    ts[1].tv_nsec = static_cast<long>((ms % 1000) * 1000000);
    return ::utimensat(dir, path.c_str(), ts, AT_SYMLINK_NOFOLLOW);
  }
  int list_dir_at(int dir, const std::string& path, std::vector<std::string>* names) override {
    int fd = util::above_std(::openat(dir, path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), O_CLOEXEC);
    if (fd < 0) return -1;
    DIR* dp = ::fdopendir(fd);
    if (!dp) {
      int e = errno;
      ::close(fd);
      errno = e;
      return -1;
    }
    while (struct dirent* de = ::readdir(dp)) {
      if (std::strcmp(de->d_name, ".") == 0 || std::strcmp(de->d_name, "..") == 0) continue;
      names->emplace_back(de->d_name);
    }
    ::closedir(dp);
    return 0;
  }

  uint64_t now_mono_us() override {
    using namespace std::chrono;
    return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
  }
  uint64_t now_unix_ms() override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  }
  void sleep_us(uint64_t us) override { std::this_thread::sleep_for(std::chrono::microseconds(us)); }
  void wait_us(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, uint64_t us) override {
    cv.wait_for(lk, std::chrono::microseconds(us));
  }
};

}  // namespace

const std::shared_ptr<Env>& Env::posix() {
  // Leaked on purpose: usable from static destructors in any order.
  static const auto* env = new std::shared_ptr<Env>(std::make_shared<PosixEnv>());
  return *env;
}

}  // namespace kcache

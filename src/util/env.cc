// The POSIX Env: each method is the system call of the same name; the
// folder-relative methods (openat, ...) are the base class's, which call the
// system.
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
  int open(const std::string& path, int flags, unsigned mode) override {
    // Never 0, 1 or 2: a program's standard output must not land in a store file.
    return util::open_above_std(path.c_str(), flags, mode);
  }
  int close(int fd) override { return ::close(fd); }
  ssize_t read(int fd, void* buf, size_t n) override { return ::read(fd, buf, n); }
  ssize_t pread(int fd, void* buf, size_t n, off_t off) override { return ::pread(fd, buf, n, off); }
  ssize_t write(int fd, const void* buf, size_t n) override { return ::write(fd, buf, n); }
  ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) override { return ::pwrite(fd, buf, n, off); }
  int fsync(int fd) override { return ::fsync(fd); }
  int fdatasync(int fd) override { return ::fdatasync(fd); }
  int ftruncate(int fd, off_t size) override { return ::ftruncate(fd, size); }
  int fstat(int fd, struct stat* st) override { return ::fstat(fd, st); }
  int fchmod(int fd, unsigned mode) override { return ::fchmod(fd, static_cast<mode_t>(mode)); }
  int flock(int fd, int op) override { return ::flock(fd, op); }

  int stat(const std::string& path, struct stat* st) override { return ::stat(path.c_str(), st); }
  int access(const std::string& path, int mode) override { return ::access(path.c_str(), mode); }
  int chmod(const std::string& path, unsigned mode) override {
    return ::chmod(path.c_str(), static_cast<mode_t>(mode));
  }
  int mkdir(const std::string& path, unsigned mode) override {
    return ::mkdir(path.c_str(), static_cast<mode_t>(mode));
  }
  int rename(const std::string& from, const std::string& to) override { return ::rename(from.c_str(), to.c_str()); }
  int unlink(const std::string& path) override { return ::unlink(path.c_str()); }
  int link(const std::string& from, const std::string& to) override { return ::link(from.c_str(), to.c_str()); }
  int set_mtime_ms(const std::string& path, uint64_t ms) override {
    struct timespec ts[2];
    ts[0].tv_sec = 0;
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1].tv_sec = static_cast<time_t>(ms / 1000);
    ts[1].tv_nsec = static_cast<long>((ms % 1000) * 1000000);
    return ::utimensat(AT_FDCWD, path.c_str(), ts, 0);
  }
  int list_dir(const std::string& dir, std::vector<std::string>* names) override {
    DIR* dp = ::opendir(dir.c_str());
    if (!dp) return -1;
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

int Env::openat(int dir, const std::string& path, int flags, unsigned mode) {
  // Never 0, 1 or 2, as open: the program may have closed them since the
  // store was opened.
  return util::above_std(::openat(dir, path.c_str(), flags, static_cast<mode_t>(mode)), flags);
}
int Env::statat(int dir, const std::string& path, struct stat* st) {
  return ::fstatat(dir, path.c_str(), st, AT_SYMLINK_NOFOLLOW);
}
int Env::accessat(int dir, const std::string& path, int mode) { return ::faccessat(dir, path.c_str(), mode, 0); }
int Env::chmodat(int dir, const std::string& path, unsigned mode) {
  return ::fchmodat(dir, path.c_str(), static_cast<mode_t>(mode), 0);
}
int Env::mkdirat(int dir, const std::string& path, unsigned mode) {
  return ::mkdirat(dir, path.c_str(), static_cast<mode_t>(mode));
}
int Env::renameat(int dir, const std::string& from, const std::string& to) {
  return ::renameat(dir, from.c_str(), dir, to.c_str());
}
int Env::unlinkat(int dir, const std::string& path) { return ::unlinkat(dir, path.c_str(), 0); }
int Env::set_mtime_ms_at(int dir, const std::string& path, uint64_t ms) {
  struct timespec ts[2];
  ts[0].tv_sec = 0;
  ts[0].tv_nsec = UTIME_OMIT;
  ts[1].tv_sec = static_cast<time_t>(ms / 1000);
  ts[1].tv_nsec = static_cast<long>((ms % 1000) * 1000000);
  return ::utimensat(dir, path.c_str(), ts, AT_SYMLINK_NOFOLLOW);
}
int Env::list_dir_at(int dir, const std::string& path, std::vector<std::string>* names) {
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

const std::shared_ptr<Env>& Env::posix() {
  // Leaked on purpose: usable from static destructors in any order.
  static const auto* env = new std::shared_ptr<Env>(std::make_shared<PosixEnv>());
  return *env;
}

}  // namespace kcache

// kcache/env.h — the operating system as the disk engines see it.
//
// An Env is everything kcache itself asks of the system underneath a store:
// the file operations of the files engine, the lease files and the miss
// journal, the byte-range-free flock(2) that guards their counters and
// records, the clocks, and sleeping (lease waits, the committer's group
// wait). A Cache passes Options::env to all of them. Routing them through one object (LevelDB's idea) lets a test put
// a store on a "full" or "read-only" disk, make reads fail, or move time
// forward by hand, without root, without special mounts and without real
// sleeps. Production code uses Env::posix(), which calls the system directly.
//
// The file methods keep the POSIX convention (a result of -1 with errno
// set, or a descriptor / byte count) rather than returning Status, because
// the callers branch on particular errno values (EEXIST when an O_EXCL
// create loses a race, ENOENT when a folder went away, EINTR) and map the
// rest to Status through util::errno_status. An Env that injects a fault
// sets errno just as the kernel would.
//
// The LMDB engine's own I/O happens inside liblmdb and does not pass
// through here; only kcache's clock reads there do. The LMDB lease table
// (fcntl byte-range locks, a mapped file) and the reader of the miss
// journal use the system directly.
//
// Thread-safety: every Env method may be called from many threads at once,
// and one Env may be shared by many tiers, leases and caches.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kcache {

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX Env; never destroyed, so objects torn down by
  // static destructors may still use it.
  static const std::shared_ptr<Env>& posix();
  // `env` when set, else posix(): options hold a null Env to mean "the system".
  static Env& or_posix(const std::shared_ptr<Env>& env) { return env ? *env : *posix(); }

  // ---- files: as open(2), read(2), ... (-1 and errno on failure) -----------
  virtual int open(const std::string& path, int flags, unsigned mode = 0) = 0;
  virtual int close(int fd) = 0;
  virtual ssize_t read(int fd, void* buf, size_t n) = 0;
  virtual ssize_t pread(int fd, void* buf, size_t n, off_t off) = 0;
  virtual ssize_t write(int fd, const void* buf, size_t n) = 0;
  virtual ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) = 0;
  virtual int fsync(int fd) = 0;
  virtual int fdatasync(int fd) = 0;
  virtual int ftruncate(int fd, off_t size) = 0;
  virtual int fstat(int fd, struct stat* st) = 0;
  virtual int fchmod(int fd, unsigned mode) = 0;
  // flock(2) with LOCK_EX / LOCK_SH / LOCK_UN, optionally | LOCK_NB.
  virtual int flock(int fd, int op) = 0;

  virtual int stat(const std::string& path, struct stat* st) = 0;
  virtual int access(const std::string& path, int mode) = 0;
  virtual int chmod(const std::string& path, unsigned mode) = 0;
  virtual int mkdir(const std::string& path, unsigned mode) = 0;
  virtual int rename(const std::string& from, const std::string& to) = 0;
  virtual int unlink(const std::string& path) = 0;
  // A second name for a file (link(2)).
  virtual int link(const std::string& from, const std::string& to) = 0;
  // Sets the modification time and leaves the access time (utimensat with
  // UTIME_OMIT): the files engine keeps recency in mtimes it sets itself.
  virtual int set_mtime_ms(const std::string& path, uint64_t unix_ms) = 0;
  // The names in folder `dir` (without "." and ".."), in no particular order.
  virtual int list_dir(const std::string& dir, std::vector<std::string>* names) = 0;

  // ---- files relative to a folder held open: as openat(2), ... ----------------
  // `dir` is a descriptor of a folder (or AT_FDCWD) and `path` is resolved
  // from it, so a folder renamed or replaced after `dir` was opened is never
  // reached through its old name (the files engine holds its store folder
  // so). The defaults call the system; an Env that injects faults into the
  // path methods above overrides these too.
  virtual int openat(int dir, const std::string& path, int flags, unsigned mode = 0);
  // fstatat(2) without following a final symbolic link.
  virtual int statat(int dir, const std::string& path, struct stat* st);
  virtual int accessat(int dir, const std::string& path, int mode);
  virtual int chmodat(int dir, const std::string& path, unsigned mode);
  virtual int mkdirat(int dir, const std::string& path, unsigned mode);
  // Both names relative to `dir`.
  virtual int renameat(int dir, const std::string& from, const std::string& to);
  virtual int unlinkat(int dir, const std::string& path);
  virtual int set_mtime_ms_at(int dir, const std::string& path, uint64_t unix_ms);
  virtual int list_dir_at(int dir, const std::string& path, std::vector<std::string>* names);

  // ---- time ------------------------------------------------------------------
  // Monotonic: for timeouts and intervals.
  virtual uint64_t now_mono_us() = 0;
  uint64_t now_mono_ms() { return now_mono_us() / 1000; }
  // Wall clock, unix ms: for what other processes compare (lease expiry,
  // recency records, file ages).
  virtual uint64_t now_unix_ms() = 0;
  virtual void sleep_us(uint64_t us) = 0;
  void sleep_for(uint64_t ms) { sleep_us(ms * 1000); }
  // Waits for the wall clock to pass the current millisecond and returns
  // the next one: what was stamped before the call has a smaller time, what
  // is stamped after it a time at or past the result (the disk engines'
  // StoreAdmin::mark).
  uint64_t next_unix_ms() {
    const uint64_t now = now_unix_ms();
    while (now_unix_ms() <= now) sleep_us(100);
    return now + 1;
  }
  // Waits on `cv` (whose mutex `lk` holds) until notified or about `us`
  // passed on this Env's clock. It may return early: callers re-check
  // their condition and the clock, so an Env whose clock only moves by
  // hand can wake them in short real slices instead.
  virtual void wait_us(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, uint64_t us) = 0;
};

}  // namespace kcache

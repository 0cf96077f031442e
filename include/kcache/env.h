// kcache/env.h — the operating system as kcache's files see it.
//
// An Env is everything kcache itself asks of the system for the files it
// reads and writes: the disk engines' files, the lease files and the lease
// table, the miss journal, bundles, config files, the folder trust checks
// and atomic writes; the byte-range-free flock(2) that guards counters and
// records; the clocks; and sleeping (lease waits, the committer's group
// wait). A Cache passes Options::env to all of them. Routing them through
// one object (LevelDB's idea) lets a test put a store on a "full" or
// "read-only" disk, make reads fail, show a folder as another user's or as
// group-writable, or move time forward by hand, without root, without
// special mounts and without real sleeps. Production code uses
// Env::posix(), which calls the system directly.
//
// The file methods keep the POSIX convention (a result of -1 with errno
// set, or a descriptor / byte count) rather than returning Status, because
// the callers branch on particular errno values (EEXIST when an O_EXCL
// create loses a race, ENOENT when a folder went away, EINTR) and map the
// rest to Status through util::errno_status. An Env that injects a fault
// sets errno just as the kernel would.
//
// Names are resolved from a folder held open (`dir`, as openat(2)) or,
// with AT_FDCWD, as plain paths: one method per operation serves both, so
// an Env that injects a fault overrides it once. A folder renamed or
// replaced after `dir` was opened is never reached through its old name
// (the files engine holds its store folder so). The non-virtual helpers at
// the end name the common plain-path forms.
//
// What stays outside: the LMDB engine's own I/O (inside liblmdb; kcache's
// clock reads there do come here), the lease table's map and its fcntl
// byte-range locks (its file is opened, sized up and written through
// here), the ".." steps and realpath of the folder walk (what it judges,
// each folder's owner and mode, comes from fstat here), and /proc.
//
// Thread-safety: every Env method may be called from many threads at once,
// and one Env may be shared by many tiers, leases and caches.
#pragma once

#include <fcntl.h>
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

  // ---- open files: as pread(2), ... (-1 and errno on failure) -----------------
  virtual int close(int fd) = 0;
  virtual ssize_t pread(int fd, void* buf, size_t n, off_t off) = 0;
  virtual ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) = 0;
  virtual int fdatasync(int fd) = 0;
  virtual int fstat(int fd, struct stat* st) = 0;
  virtual int fchmod(int fd, unsigned mode) = 0;
  // flock(2) with LOCK_EX / LOCK_SH / LOCK_UN, optionally | LOCK_NB.
  virtual int flock(int fd, int op) = 0;

  // ---- names, from folder `dir` or AT_FDCWD: as openat(2), ... ---------------
  // Never returns descriptor 0, 1 or 2 (a program's standard output must
  // not land in a store file).
  virtual int openat(int dir, const std::string& path, int flags, unsigned mode = 0) = 0;
  // As fstatat(2): `flags` 0 follows a final symbolic link,
  // AT_SYMLINK_NOFOLLOW does not.
  virtual int fstatat(int dir, const std::string& path, struct stat* st, int flags) = 0;
  virtual int accessat(int dir, const std::string& path, int mode) = 0;
  virtual int chmodat(int dir, const std::string& path, unsigned mode) = 0;
  virtual int mkdirat(int dir, const std::string& path, unsigned mode) = 0;
  // Both names relative to `dir`.
  virtual int renameat(int dir, const std::string& from, const std::string& to) = 0;
  // A second name for a file (link(2)); both names relative to `dir`.
  virtual int linkat(int dir, const std::string& from, const std::string& to) = 0;
  virtual int unlinkat(int dir, const std::string& path) = 0;
  // Sets the modification time of what `path` names (not following a link)
  // and leaves the access time: the files engine keeps recency in mtimes it
  // sets itself.
  virtual int set_mtime_ms_at(int dir, const std::string& path, uint64_t unix_ms) = 0;
  // The names in folder `path` (without "." and ".."), in no particular order.
  virtual int list_dir_at(int dir, const std::string& path, std::vector<std::string>* names) = 0;

  // ---- time ------------------------------------------------------------------
  // Monotonic: for timeouts and intervals.
  virtual uint64_t now_mono_us() = 0;
  // Wall clock, unix ms: for what other processes compare (lease expiry,
  // recency records, file ages).
  virtual uint64_t now_unix_ms() = 0;
  virtual void sleep_us(uint64_t us) = 0;
  // Waits on `cv` (whose mutex `lk` holds) until notified or about `us`
  // passed on this Env's clock. It may return early: callers re-check
  // their condition and the clock, so an Env whose clock only moves by
  // hand can wake them in short real slices instead.
  virtual void wait_us(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, uint64_t us) = 0;

  // ---- helpers over the methods above ------------------------------------------
  int open(const std::string& path, int flags, unsigned mode = 0) { return openat(AT_FDCWD, path, flags, mode); }
  // stat(2): a final link followed.
  int stat(const std::string& path, struct stat* st) { return fstatat(AT_FDCWD, path, st, 0); }
  // lstat(2) from `dir`: a final link not followed.
  int statat(int dir, const std::string& path, struct stat* st) { return fstatat(dir, path, st, AT_SYMLINK_NOFOLLOW); }
  int mkdir(const std::string& path, unsigned mode) { return mkdirat(AT_FDCWD, path, mode); }
  int rename(const std::string& from, const std::string& to) { return renameat(AT_FDCWD, from, to); }
  int unlink(const std::string& path) { return unlinkat(AT_FDCWD, path); }
  // Waits for the wall clock to pass the current millisecond and returns
  // the next one: what was stamped before the call has a smaller time, what
  // is stamped after it a time at or past the result (the disk engines'
  // StoreAdmin::mark).
  uint64_t next_unix_ms() {
    const uint64_t now = now_unix_ms();
    while (now_unix_ms() <= now) sleep_us(100);
    return now + 1;
  }
};

}  // namespace kcache

// A fault-injecting Env for tests (LevelDB's SpecialEnv): the real file
// system underneath, with switches that make it look full, read-only,
// failing or forbidding, files that look owned by another user or with
// other permission bits, and a clock that moves only when the test (or a
// sleep) moves it.
//
// The switches are atomics, so a test may flip them while other threads use
// the Env. Counters say what was asked of it, for assertions.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kcache/env.h"

namespace kcache::test {

// How a file or folder looks to fstat/fstatat through a FaultEnv: another
// owner, group or permission bits than it has.
struct Look {
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  std::optional<mode_t> mode;  // the permission bits (07777)
};

class FaultEnv final : public Env {
 public:
  FaultEnv() : base_(Env::posix()) {
    mono_us_.store(base_->now_mono_us());
    unix_us_.store(base_->now_unix_ms() * 1000);
  }

  // ---- switches --------------------------------------------------------------
  std::atomic<bool> no_space{false};        // creates, writes, mkdir: ENOSPC
  std::atomic<bool> read_only{false};       // creates, writes, renames, unlinks, mkdir, modes, mtimes: EROFS
  std::atomic<bool> io_error{false};        // reads: EIO
  std::atomic<bool> write_io_error{false};  // writes and syncs: EIO
  std::atomic<bool> denied{false};          // opens, creates, renames, unlinks, mkdir: EACCES
  // Each fsync/fdatasync "takes" this long: the manual clock moves by it.
  std::atomic<uint64_t> fsync_delay_ms{0};
  // Each unlink "takes" this long (a sleep: real or on the manual clock).
  std::atomic<uint64_t> unlink_delay_us{0};
  // Off: the clock is the system's (and sleeps are real).
  std::atomic<bool> manual_clock{true};

  // ---- counters ----------------------------------------------------------------
  std::atomic<uint64_t> opens{0}, creates{0}, reads{0}, writes{0}, fsyncs{0}, renames{0}, unlinks{0}, mtimes{0},
      sleeps{0}, faults{0}, stats{0};
  std::atomic<uint64_t> slept_us{0};  // total asked of sleep_us

  // Moves the manual clock (both the monotonic and the wall clock) forward.
  void advance(uint64_t ms) { advance_us(ms * 1000); }
  void advance_us(uint64_t us) {
    mono_us_.fetch_add(us);
    unix_us_.fetch_add(us);
  }

  // From now on the file or folder at `path` (links followed; the inode it
  // is now, whatever it is renamed to) looks as `look` says to fstat and
  // fstatat. False when there is nothing at `path`.
  bool show_as(const std::string& path, const Look& look) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return false;
    std::lock_guard lk(looks_mu_);
    looks_[{st.st_dev, st.st_ino}] = look;
    return true;
  }
  // Shown as it is again.
  void show_real(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return;
    std::lock_guard lk(looks_mu_);
    looks_.erase({st.st_dev, st.st_ino});
  }

  // ---- open files ---------------------------------------------------------------
  int close(int fd) override { return base_->close(fd); }
  ssize_t pread(int fd, void* buf, size_t n, off_t off) override {
    reads.fetch_add(1);
    if (io_error) return fail(EIO);
    return base_->pread(fd, buf, n, off);
  }
  ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) override {
    writes.fetch_add(1);
    if (int e = write_fault()) return fail(e);
    if (write_io_error) return fail(EIO);
    return base_->pwrite(fd, buf, n, off);
  }
  int fdatasync(int fd) override {
    fsyncs.fetch_add(1);
    if (uint64_t d = fsync_delay_ms.load()) sleep_us(d * 1000);
    if (write_io_error) return fail(EIO);
    return base_->fdatasync(fd);
  }
  int fstat(int fd, struct stat* st) override {
    stats.fetch_add(1);
    if (base_->fstat(fd, st) != 0) return -1;
    apply_look(st);
    return 0;
  }
  int fchmod(int fd, unsigned mode) override {
    if (read_only) return fail(EROFS);
    return base_->fchmod(fd, mode);
  }
  int flock(int fd, int op) override { return base_->flock(fd, op); }

  // ---- names ------------------------------------------------------------------
  int openat(int dir, const std::string& path, int flags, unsigned mode) override {
    opens.fetch_add(1);
    const bool tmpfile = (flags & O_TMPFILE) == O_TMPFILE;  // O_TMPFILE holds O_DIRECTORY's bit
    const bool writing = (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) || tmpfile;
    const bool creating = tmpfile || ((flags & O_CREAT) && ::faccessat(dir, path.c_str(), F_OK, 0) != 0);
    if (creating) creates.fetch_add(1);
    if (denied) return fail(EACCES);
    if (read_only && writing) {
      if ((flags & O_CREAT) && (flags & O_EXCL) && !creating) return fail(EEXIST);
      return fail(EROFS);
    }
    if (no_space && creating) return fail(ENOSPC);
    return base_->openat(dir, path, flags, mode);
  }
  int fstatat(int dir, const std::string& path, struct stat* st, int flags) override {
    stats.fetch_add(1);
    if (base_->fstatat(dir, path, st, flags) != 0) return -1;
    apply_look(st);
    return 0;
  }
  int accessat(int dir, const std::string& path, int mode) override {
    if (denied) return fail(EACCES);
    if (read_only && (mode & W_OK)) return fail(EROFS);
    return base_->accessat(dir, path, mode);
  }
  int chmodat(int dir, const std::string& path, unsigned mode) override {
    if (read_only) return fail(EROFS);
    return base_->chmodat(dir, path, mode);
  }
  int mkdirat(int dir, const std::string& path, unsigned mode) override {
    if ((read_only || no_space || denied) && ::faccessat(dir, path.c_str(), F_OK, 0) == 0) return fail(EEXIST);
    if (denied) return fail(EACCES);
    if (int e = write_fault()) return fail(e);
    return base_->mkdirat(dir, path, mode);
  }
  int renameat(int dir, const std::string& from, const std::string& to) override {
    renames.fetch_add(1);
    if (denied) return fail(EACCES);
    if (read_only) return fail(EROFS);
    return base_->renameat(dir, from, to);
  }
  int linkat(int dir, const std::string& from, const std::string& to) override {
    if (denied) return fail(EACCES);
    if (int e = write_fault()) return fail(e);
    return base_->linkat(dir, from, to);
  }
  int unlinkat(int dir, const std::string& path) override {
    unlinks.fetch_add(1);
    if (uint64_t d = unlink_delay_us.load()) sleep_us(d);
    if (denied) return fail(EACCES);
    if (read_only) return fail(EROFS);
    return base_->unlinkat(dir, path);
  }
  int set_mtime_ms_at(int dir, const std::string& path, uint64_t unix_ms) override {
    mtimes.fetch_add(1);
    if (read_only) return fail(EROFS);
    return base_->set_mtime_ms_at(dir, path, unix_ms);
  }
  int list_dir_at(int dir, const std::string& path, std::vector<std::string>* names) override {
    return base_->list_dir_at(dir, path, names);
  }

  // ---- time ---------------------------------------------------------------------
  uint64_t now_mono_us() override { return manual_clock ? mono_us_.load() : base_->now_mono_us(); }
  uint64_t now_unix_ms() override { return manual_clock ? unix_us_.load() / 1000 : base_->now_unix_ms(); }
  void sleep_us(uint64_t us) override {
    sleeps.fetch_add(1);
    slept_us.fetch_add(us);
    if (manual_clock)
      advance_us(us);
    else
      base_->sleep_us(us);
  }
  // With the manual clock, a wait ends in a short real slice (the caller
  // re-checks its clock), so threads waiting on it follow advance().
  void wait_us(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, uint64_t us) override {
    if (!manual_clock) return base_->wait_us(cv, lk, us);
    cv.wait_for(lk, std::chrono::microseconds(std::min<uint64_t>(us, 1000)));
  }

 private:
  int fail(int e) {
    faults.fetch_add(1);
    errno = e;
    return -1;
  }
  int write_fault() const { return read_only ? EROFS : no_space ? ENOSPC : 0; }
  void apply_look(struct stat* st) {
    std::lock_guard lk(looks_mu_);
    auto it = looks_.find({st->st_dev, st->st_ino});
    if (it == looks_.end()) return;
    const Look& l = it->second;
    if (l.uid) st->st_uid = *l.uid;
    if (l.gid) st->st_gid = *l.gid;
    if (l.mode) st->st_mode = (st->st_mode & S_IFMT) | (*l.mode & 07777);
  }

  std::shared_ptr<Env> base_;
  std::atomic<uint64_t> mono_us_{0}, unix_us_{0};
  std::mutex looks_mu_;
  std::map<std::pair<dev_t, ino_t>, Look> looks_;  // GUARDED_BY(looks_mu_)
};

}  // namespace kcache::test

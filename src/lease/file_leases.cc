// Lease files for the file-per-entry engine: <dir>/leases/<key hex>.lease
// holds a holder record (lease/holder.h).
//
//  * acquire: create the file with O_EXCL and write the record. If it
//    exists and is stale, take over under <hex>.lease.takeover (created
//    with O_EXCL; one taker at a time, collected after 10 s if its taker
//    died): judge again, remove the stale file, create a fresh one.
//  * a file whose record is unreadable (its creator died between create and
//    write) counts as stale once its mtime is older than kPartialGraceMs.
//  * renew: rewrite through a temp file and rename, if the record is ours.
// No flock(2): on network file systems it is not reliable.
// Every lease file is reached through a descriptor of the leases folder
// held from open (a store folder swapped in later is never reached) and
// opened with O_NOFOLLOW | O_NONBLOCK: a symbolic link, FIFO, device or
// folder planted under a lease file's name never blocks or redirects a
// read; it counts as a stale record and is removed by the next taker (a
// folder, which cannot be, leaves its key to compile uncoordinated).
// File operations and clock reads go through an Env (kcache/env.h), so a
// test can expire a holder by moving the clock instead of sleeping.
// In a store folder shared with a group (setgid, group-writable), the
// leases folder is group-writable and lease files group-readable, so every
// member can judge and take over another's lease.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "kcache/env.h"
#include "kcache/lease.h"
#include "lease/holder.h"
#include "util/util.h"

namespace kcache {
namespace {

constexpr uint64_t kPartialGraceMs = 2000;
// A takeover marker older than this was left by a process that died taking over.
constexpr uint64_t kTakeoverStaleMs = 10000;

class FileLeases final : public Leases {
 public:
  FileLeases(std::string dir, std::shared_ptr<Env> env)
      : dir_(std::move(dir)), env_(env ? std::move(env) : Env::posix()) {}
  ~FileLeases() override {
    if (ldfd_ >= 0) env_->close(ldfd_);
  }
  FileLeases(const FileLeases&) = delete;
  FileLeases& operator=(const FileLeases&) = delete;
  std::string_view name() const noexcept override { return "files"; }
  uint64_t takeovers() const noexcept override { return takeovers_.load(); }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    std::string p = path(key);
    LeaseResult r = create(p, me, ttl_ms);
    if (r != LeaseResult::busy) return r;
    lease::Holder h;
    ino_t judged = 0;
    int st = read(p, &h, &judged);
    if (st == 1 && h.token == me) return renew(key, ttl_ms) ? LeaseResult::acquired : LeaseResult::error;
    if (st == 1 && lease::alive(h, env_->now_unix_ms())) return LeaseResult::busy;
    if (st == 0) return LeaseResult::busy;      // being written right now
    if (st == 4) return LeaseResult::error;     // a folder: no lease can be made here
    if (st == 3) return create(p, me, ttl_ms);  // just released

    // Stale: a dead or expired holder, or a partial record that is old.
    // Taking over is serialised by a second file created with O_EXCL; under
    // it the lease is judged again, removed and created anew. A contender
    // that finds the lease gone meanwhile may create it first: then it, not
    // we, holds it. Either way one process holds the lease.
    std::string tk = p + ".takeover";
    int tfd = env_->openat(ldfd_, tk, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, file_mode());
    if (tfd < 0) {
      const int err = errno;
      struct stat ts;
      if (err == EEXIST && env_->statat(ldfd_, tk, &ts) == 0 &&
          static_cast<uint64_t>(ts.st_mtim.tv_sec) * 1000 + kTakeoverStaleMs < env_->now_unix_ms())
        env_->unlinkat(ldfd_, tk);  // its taker died mid-takeover
      return err == EEXIST ? LeaseResult::busy : LeaseResult::error;
    }
    env_->close(tfd);
    ino_t now_ino = 0;
    st = read(p, &h, &now_ino);
    bool stale = st == 3 || (now_ino == judged &&
                             (st == 2 || (st == 1 && h.token != me && !lease::alive(h, env_->now_unix_ms()))));
    if (stale && st != 3) env_->unlinkat(ldfd_, p);
    r = stale ? create(p, me, ttl_ms) : LeaseResult::busy;
    env_->unlinkat(ldfd_, tk);
    if (r == LeaseResult::acquired && st != 3) takeovers_.fetch_add(1);
    return r;
  }

  bool renew(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    std::string p = path(key);
    lease::Holder h;
    ino_t ino;
    if (read(p, &h, &ino) != 1 || h.token != me) return false;
    return util::write_file_atomic_at(ldfd_, p, lease::encode(lease::self(me, ttl_ms, env_->now_unix_ms())),
                                      file_mode(), *env_)
        .is_ok();
  }

  void release(const Key& key) override {
    const uint64_t me = token_.get();
    std::string p = path(key);
    lease::Holder h;
    ino_t ino;
    if (read(p, &h, &ino) == 1 && h.token == me) env_->unlinkat(ldfd_, p);
  }

  Status init() {
    shared_ = util::folder_is_shared(dir_, *env_);
    std::string leases = dir_ + "/leases";
    KCACHE_RETURN_IF_ERROR(util::make_dirs(leases, shared_ ? 02770 : 0700, *env_));
    if (shared_) {
      struct stat st;
      if (env_->stat(leases, &st) == 0 && st.st_uid == ::geteuid()) (void)env_->chmodat(AT_FDCWD, leases, 02770);
    }
    ldfd_ = env_->open(leases, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (ldfd_ < 0) return util::errno_status(errno, "open " + leases);
    return Status();
  }

 private:
  // A lease file's name in the leases folder (ldfd_).
  static std::string path(const Key& k) { return k.hex() + ".lease"; }

  // Creates the lease file exclusively: acquired, busy (it exists) or error.
  LeaseResult create(const std::string& p, uint64_t me, uint64_t ttl_ms) {
    int fd = env_->openat(ldfd_, p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, file_mode());
    if (fd < 0) return errno == EEXIST ? LeaseResult::busy : LeaseResult::error;
    if (shared_) (void)env_->fchmod(fd, file_mode());
    std::string rec = lease::encode(lease::self(me, ttl_ms, env_->now_unix_ms()));
    bool ok = util::pwrite_all(*env_, fd, rec) == 0;
    env_->close(fd);
    if (!ok) {
      env_->unlinkat(ldfd_, p);
      return LeaseResult::error;
    }
    return LeaseResult::acquired;
  }

  // Reads the lease file through one descriptor, so that the record and the
  // inode (*ino) belong to the same file. 1: record read; 0: unreadable but
  // young (being written), or that cannot be opened now (EACCES, ENFILE: a
  // holder's lease is never taken over for that); 2: unreadable and old
  // (stale), or a symbolic link, FIFO or device (never a holder's); 3: no
  // such file; 4: a folder (callers compile uncoordinated).
  int read(const std::string& p, lease::Holder* h, ino_t* ino) {
    struct stat st;
    int fd = env_->openat(ldfd_, p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT || env_->statat(ldfd_, p, &st) != 0) return 3;
      *ino = st.st_ino;
      return err == ELOOP || err == ENXIO ? 2 : 0;  // a link or a FIFO with no writer: stale
    }
    char buf[lease::kHolderSize + 1];
    ssize_t n = -1;
    bool regular = false;
    if (env_->fstat(fd, &st) == 0) {
      regular = S_ISREG(st.st_mode);
      n = regular ? env_->pread(fd, buf, sizeof buf, 0) : 0;
    }
    env_->close(fd);
    if (n < 0) return 3;
    *ino = st.st_ino;
    if (!regular) return S_ISDIR(st.st_mode) ? 4 : 2;
    if (lease::decode(std::string_view(buf, static_cast<size_t>(n)), h)) return 1;
    uint64_t mt = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
    return mt + kPartialGraceMs < env_->now_unix_ms() ? 2 : 0;
  }

  unsigned file_mode() const noexcept { return shared_ ? 0640 : 0600; }

  std::string dir_;
  const std::shared_ptr<Env> env_;  // never null
  int ldfd_ = -1;                   // <dir_>/leases, held from init()
  bool shared_ = false;             // dir_ is shared with its group
  lease::Token token_;
  std::atomic<uint64_t> takeovers_{0};
};

}  // namespace

Expected<std::shared_ptr<Leases>> open_file_leases(const std::string& dir, std::shared_ptr<Env> env) {
  auto l = std::make_shared<FileLeases>(dir, std::move(env));
  KCACHE_RETURN_IF_ERROR(l->init());
  return std::shared_ptr<Leases>(std::move(l));
}

}  // namespace kcache

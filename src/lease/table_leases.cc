// The lease table: leases of a store on a local file system, kept in one
// small file beside it, `<dir>/leases2.tab` (docs/format.md, "Lease table";
// layout in lease/table_layout.h).
//
// Every process that uses the store maps the file (MAP_SHARED). It is a
// header and 256 buckets; a key's bucket is chosen by its first bytes, and
// a bucket is a robust, process-shared mutex and 8 slots, each the key of a
// lease and its holder record (lease/holder.h). A bucket is read and
// written only under its mutex, so processes, threads, and Leases objects
// within one process update it one at a time. Taking or giving up a lease
// is a few loads and stores: no system call while the mutex is free (it is
// a futex; LMDB keeps its reader table's locks the same way).
//
//  * acquire: the key's slot, when its holder is dead or expired, is taken
//    over; a free slot (zeros, or a dead or expired holder of another key)
//    is taken; a bucket full of live leases is an error (the caller compiles
//    uncoordinated: never a wait for an unrelated key).
//  * A process that dies holding a bucket's mutex leaves it to the next
//    locker (EOWNERDEAD), which marks it consistent and goes on. A slot is
//    written expiry first (zero), then the rest, then its expiry: a slot a
//    dying process was writing reads as expired, so it is free.
//  * The mutex is waited for for at most kLockBoundMs: a stopped process
//    cannot hold a bucket for ever.
//  * The file is created, allocated in full (posix_fallocate: on a file
//    system that writes in place, no store into the mapping needs a block)
//    and initialised once, under an open-file-description lock on its
//    header; `ready` in the header says it is done.
//  * Only ext4, XFS and tmpfs are trusted to write in place. On a
//    copy-on-write file system (btrfs, ZFS) a rewritten page needs a new
//    block, and with the disk full a store would be SIGBUS, so there the
//    table is not mapped: a bucket is locked with an open-file-description
//    lock (fcntl) on its slots, read with pread and a slot written with one
//    pwrite, which fails cleanly on a full disk (four system calls a lease;
//    the header says which kind of locks a table uses).
//  * A table made by another layout or C library (the size of its mutexes)
//    is an error: no cross-process leases, compiles go on.
// In a store folder shared with a group, the file is group-writable.
// The file is opened, sized up and read and written (unmapped) through an
// Env (kcache/env.h); its map and its fcntl locks are the system's.
//
// One concept, the table's file, in one file: making it, its buckets'
// locking and repair, the two ways of reaching them (mapped, unmapped) and
// its check (lease::table::check) all read and write the same layout
// (lease/table_layout.h) under the same header lock.
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kcache/env.h"
#include "kcache/lease.h"
#include "lease/holder.h"
#include "lease/table_layout.h"
#include "util/fd.h"
#include "util/util.h"

namespace kcache {
namespace {

using namespace lease::table;

// How long a bucket's lock is waited for. pthread_mutex_timedlock waits on
// the wall clock, so a step of it moves the bound. (pthread_mutex_clocklock
// would not, but ThreadSanitizer does not see the locks it takes.)
constexpr uint64_t kLockBoundMs = 2000;

uint32_t lock_kind() {
#if defined(__GLIBC__)
  return 1;
#else
  return 2;
#endif
}

// File systems that write a file's allocated blocks in place: a store into
// a mapping of a fully allocated file never needs a new block. On
// copy-on-write ones (btrfs, ZFS, bcachefs) every rewrite of a page does,
// and with the disk full the store would be SIGBUS.
bool writes_in_place(int fd) {
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53UL:      // ext2, ext3, ext4
    case 0x58465342UL:  // XFS
    case 0x01021994UL:  // tmpfs
      return true;
    default:
      return false;
  }
}

// One bucket's slots, as read under its mutex.
struct Bucket {
  char bytes[kSlots * kSlotSize];
  std::string_view slot_key(size_t i) const { return {bytes + i * kSlotSize, 16}; }
  bool holder(size_t i, lease::Holder* h) const {
    return lease::decode(std::string_view(bytes + i * kSlotSize + 16, lease::kHolderSize), h);
  }
  bool empty(size_t i) const {
    for (size_t j = 0; j < kSlotSize; ++j)
      if (bytes[i * kSlotSize + j] != 0) return false;
    return true;
  }
};

bool same_key(std::string_view slot, const Key& k) { return std::memcmp(slot.data(), k.bytes.data(), 16) == 0; }

// One open-file-description lock request of `type` on [at, at + len) of fd.
int ofd_setlk(int fd, short type, off_t at, off_t len) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = len;
  return ::fcntl(fd, F_OFD_SETLK, &fl);
}

// An exclusive open-file-description lock on [at, at + len) of fd, tried for
// at most kLockBoundMs; released by ofd_unlock or with the description.
bool ofd_lock(int fd, off_t at, off_t len) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLockBoundMs);
  for (;;) {
    if (ofd_setlk(fd, F_WRLCK, at, len) == 0) return true;
    if (errno != EAGAIN && errno != EACCES && errno != EINTR) return false;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ofd_unlock(int fd, off_t at, off_t len) { (void)ofd_setlk(fd, F_UNLCK, at, len); }

// The kind a bucket's mutex has when make_ready made it (robust,
// process-shared). Garbage in the bucket's lock shows here first. Only
// glibc's layout is known; elsewhere every kind passes.
#if defined(__GLIBC__)
int expected_lock_kind() {
  static const int want = [] {
    pthread_mutexattr_t a;
    pthread_mutex_t m;
    ::pthread_mutexattr_init(&a);
    ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    ::pthread_mutex_init(&m, &a);
    ::pthread_mutexattr_destroy(&a);
    int k = m.__data.__kind;
    ::pthread_mutex_destroy(&m);
    return k;
  }();
  return want;
}
#endif

bool lock_kind_ok(const pthread_mutex_t* mu) {
#if defined(__GLIBC__)
  return __atomic_load_n(&mu->__data.__kind, __ATOMIC_RELAXED) == expected_lock_kind();
#else
  (void)mu;
  return true;
#endif
}

uint32_t max_tid();

// Runs f() with SIGBUS caught (util::run_guarded): false when the mapped
// table's file was truncated under it. f captures by reference only.
template <class F>
bool guarded(F&& f) {
  using Fn = std::remove_reference_t<F>;
  return util::run_guarded(
      +[](void* p) { (*static_cast<Fn*>(p))(); }, &f);
}

// Whether pthread_mutex_trylock's result `rc` on a bucket's lock says it is
// not a lock: not one this C library can use (garbage where the mutex
// should be), or "held" by an owner no process can have (no thread id, or
// one past the largest the kernel gives out), which nobody would release.
bool lock_damaged(const pthread_mutex_t* mu, int rc) {
  if (rc == 0 || rc == EOWNERDEAD || rc == EFAULT) return false;
  if (rc != EBUSY || !lock_kind_ok(mu)) return true;
  const auto* w = reinterpret_cast<const uint32_t*>(mu);
  uint32_t word = __atomic_load_n(w, __ATOMIC_RELAXED);
  uint32_t tid = word & 0x3fffffffu;  // FUTEX_TID_MASK
  if (tid != 0) return tid > max_tid();
  // Busy, yet no owner: the owner may have let go between the trylock and
  // this read (the word is then 0, or changes). Garbage only when the same
  // owner-less word is still there a moment later.
  if (word == 0) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return __atomic_load_n(w, __ATOMIC_RELAXED) == word;
}

// Attributes of a bucket's lock: process-shared and robust.
const pthread_mutexattr_t* robust_shared_attr() {
  static const pthread_mutexattr_t* a = [] {
    auto* attr = new pthread_mutexattr_t;
    ::pthread_mutexattr_init(attr);
    ::pthread_mutexattr_setpshared(attr, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(attr, PTHREAD_MUTEX_ROBUST);
    return attr;
  }();
  return a;
}

constexpr const char kTruncated[] = "is shorter than a lease table (truncated under this process)";

// The largest thread id the kernel hands out (pid_max).
uint32_t max_tid() {
  static const uint32_t v = [] {
    uint32_t n = 4194304;  // PID_MAX_LIMIT on 64-bit Linux
    if (FILE* f = std::fopen("/proc/sys/kernel/pid_max", "re")) {
      unsigned long x = 0;
      if (std::fscanf(f, "%lu", &x) == 1 && x > 0 && x <= 0x3fffffffUL) n = static_cast<uint32_t>(x);
      std::fclose(f);
    }
    return n;
  }();
  return v;
}

// magic | version buckets slots lock_size lock_kind, then zeros (`ready`
// too): a mapped table's locks are this C library's mutexes; an unmapped
// one's are fcntl locks (kind 3).
void fill_header(bool mapped, char h[kHeaderSize]) {
  const uint32_t fields[5] = {kVersion, static_cast<uint32_t>(kBuckets), static_cast<uint32_t>(kSlots),
                              mapped ? static_cast<uint32_t>(sizeof(pthread_mutex_t)) : 0u, mapped ? lock_kind() : 3u};
  std::memset(h, 0, kHeaderSize);
  std::memcpy(h, kMagic, 8);
  std::memcpy(h + 8, fields, sizeof fields);
}

class TableLeases final : public Leases {
 public:
  TableLeases(std::string path, bool may_map, std::shared_ptr<Env> env)
      : path_(std::move(path)), may_map_(may_map), env_(env ? std::move(env) : Env::posix()) {}
  ~TableLeases() override {
    if (map_) ::munmap(map_, kTableSize);
    if (map_fd_ >= 0) env_->close(map_fd_);
    if (state_->fd >= 0) env_->close(state_->fd);
  }
  std::string_view name() const noexcept override { return "table"; }
  uint64_t takeovers() const noexcept override { return takeovers_.load(); }

  Status init() {
    // Made here, not first inside a guarded touch of the map.
    (void)max_tid();
    (void)robust_shared_attr();
#if defined(__GLIBC__)
    (void)expected_lock_kind();
#endif
    shared_ = util::folder_is_shared(path_.substr(0, path_.rfind('/')), *env_);
    return open_file();
  }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    // Made before the bucket is locked; its expiry counts from when it is.
    lease::Holder ours = lease::self(me, ttl_ms);
    Locked lk(*this, bucket_of(key));
    Bucket b;
    if (!lk.ok() || !lk.read(&b)) return LeaseResult::error;
    const uint64_t now = util::now_unix_ms();
    ours.expiry_ms = now + ttl_ms;
    int free_slot = -1;
    for (size_t i = 0; i < kSlots; ++i) {
      lease::Holder h;
      bool readable = b.holder(i, &h);
      if (same_key(b.slot_key(i), key) && readable) {
        if (h.token != me && live(h, now)) return LeaseResult::busy;
        if (!lk.write_slot(i, key, ours)) return LeaseResult::error;
        if (h.token != me) takeovers_.fetch_add(1);
        return LeaseResult::acquired;
      }
      if (free_slot < 0 && b.empty(i)) free_slot = static_cast<int>(i);
    }
    // No lease of this key: a free slot, else one whose holder is gone.
    for (size_t i = 0; free_slot < 0 && i < kSlots; ++i) {
      lease::Holder h;
      if (!b.holder(i, &h) || !live(h, now)) free_slot = static_cast<int>(i);
    }
    if (free_slot < 0) return LeaseResult::error;  // kSlots live leases in this bucket
    return lk.write_slot(static_cast<size_t>(free_slot), key, ours) ? LeaseResult::acquired : LeaseResult::error;
  }

  bool renew(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    lease::Holder renewed = lease::self(me, ttl_ms);
    Locked lk(*this, bucket_of(key));
    Bucket b;
    if (!lk.ok() || !lk.read(&b)) return false;
    renewed.expiry_ms = util::now_unix_ms() + ttl_ms;
    int i = mine(b, key, me);
    return i >= 0 && lk.write_slot(static_cast<size_t>(i), key, renewed);
  }

  void release(const Key& key) override {
    const uint64_t me = token_.get();
    Locked lk(*this, bucket_of(key));
    Bucket b;
    if (!lk.ok() || !lk.read(&b)) return;
    int i = mine(b, key, me);
    if (i >= 0) (void)lk.clear_slot(static_cast<size_t>(i));
  }

 private:
  // The descriptor of an unmapped table and the mutexes that serialise this
  // object's threads on a bucket (an open-file-description lock does not:
  // they share the description). A child of fork() opens its own
  // description: sharing its parent's, its locks would not exclude the
  // parent's. The inherited state is left as it is (its mutexes may be held
  // by parent threads that are gone).
  struct State {
    int fd = -1;
    std::mutex mu[kBuckets];
  };

  // A bucket, held: its robust mutex in the mapping, or (unmapped) this
  // object's mutex and an open-file-description lock on its slots.
  class Locked {
   public:
    Locked(TableLeases& t, size_t bucket) : t_(t), at_(static_cast<off_t>(bucket_at(bucket))) {
      if (t.map_) {
        if (!t.map_intact()) return;
        base_ = t.map_ + bucket_at(bucket);
        mu_ = reinterpret_cast<pthread_mutex_t*>(base_);
        ok_ = lock(t);
        return;
      }
      State& s = t.state();
      fd_ = s.fd;
      guard_ = std::unique_lock<std::mutex>(s.mu[bucket]);
      ok_ = fd_ >= 0 && ofd_lock(fd_, slots_at(), static_cast<off_t>(kSlots * kSlotSize));
      if (!ok_ && fd_ >= 0)
        KCACHE_LOG(LogLevel::warn, "lease table: a bucket stayed locked for %llu ms; compiling uncoordinated",
                   static_cast<unsigned long long>(kLockBoundMs));
    }
    ~Locked() {
      if (!ok_) return;
      if (mu_) {
        if (!guarded([&] { ::pthread_mutex_unlock(mu_); })) t_.give_up(kTruncated);
        return;
      }
      ofd_unlock(fd_, slots_at(), static_cast<off_t>(kSlots * kSlotSize));
    }
    bool ok() const noexcept { return ok_; }
    bool read(Bucket* b) const {
      if (mu_) {
        if (util::copy_guarded(b->bytes, base_ + kLockSize, sizeof b->bytes)) return true;
        t_.give_up(kTruncated);
        return false;
      }
      return t_.env_->pread(fd_, b->bytes, sizeof b->bytes, slots_at()) == static_cast<ssize_t>(sizeof b->bytes);
    }
    bool write_slot(size_t i, const Key& key, const lease::Holder& h) {
      char slot[kSlotSize];
      std::memcpy(slot, key.bytes.data(), 16);
      std::string rec = lease::encode(h);
      std::memcpy(slot + 16, rec.data(), lease::kHolderSize);
      return store(i, slot);
    }
    bool clear_slot(size_t i) {
      const char zeros[kSlotSize] = {};
      return store(i, zeros);
    }

   private:
    off_t slots_at() const { return at_ + static_cast<off_t>(kLockSize); }
    // Mapped: expiry zeroed first and stored last, so a writer that dies in
    // between leaves an expired slot, never a torn live one. Unmapped: one
    // pwrite (a slot torn by a crash of the machine holds a holder that is
    // not alive after the reboot).
    bool store(size_t i, const char* slot) {
      if (!mu_)
        return t_.env_->pwrite(fd_, slot, kSlotSize, slots_at() + static_cast<off_t>(i * kSlotSize)) ==
               static_cast<ssize_t>(kSlotSize);
      char* s = base_ + kLockSize + i * kSlotSize;
      auto* expiry = reinterpret_cast<uint64_t*>(s + kExpiryAt);
      uint64_t e;
      std::memcpy(&e, slot + kExpiryAt, 8);
      const bool stored = guarded([&] {
        __atomic_store_n(expiry, uint64_t{0}, __ATOMIC_SEQ_CST);
        // The rest is never stored before it. What matters is the order of
        // the writer's own instructions (it may die between any two), so a
        // compiler barrier is enough: what it stored before it died is all
        // seen by the next locker.
        std::atomic_signal_fence(std::memory_order_seq_cst);
        std::memcpy(s, slot, kExpiryAt);
        std::memcpy(s + kExpiryAt + 8, slot + kExpiryAt + 8, kSlotSize - kExpiryAt - 8);
        __atomic_store_n(expiry, e, __ATOMIC_RELEASE);
      });
      if (!stored) t_.give_up(kTruncated);
      return stored;
    }
    // Every touch of the mapped lock is guarded: a file truncated between
    // map_intact and here gives up the table (said once), never a SIGBUS.
    bool lock(TableLeases& t) {
      // Garbage where the mutex should be is made afresh before the C
      // library sees it (which may abort on a lock of an unknown kind).
      bool kind_ok = true;
      if (!guarded([&] { kind_ok = lock_kind_ok(mu_); })) {
        t.give_up(kTruncated);
        return false;
      }
      if (!kind_ok) t.repair(mu_);
      int rc = trylock();
      if (damaged(rc)) {
        t.repair(mu_);
        rc = trylock();
      }
      if (rc == EBUSY) {
        struct timespec until;
        ::clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += static_cast<time_t>(kLockBoundMs / 1000);
        until.tv_nsec += static_cast<long>(kLockBoundMs % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
          until.tv_sec += 1;
          until.tv_nsec -= 1000000000L;
        }
        if (!guarded([&] { rc = ::pthread_mutex_timedlock(mu_, &until); })) rc = EFAULT;
      }
      if (rc == EOWNERDEAD) {
        // Its holder died with it: a slot it was writing reads as expired.
        if (guarded([&] { ::pthread_mutex_consistent(mu_); })) return true;
        rc = EFAULT;
      }
      if (rc == 0) return true;
      if (rc == EFAULT)
        t.give_up(kTruncated);
      else if (rc == ETIMEDOUT)
        KCACHE_LOG(LogLevel::warn, "lease table: a bucket stayed locked for %llu ms; compiling uncoordinated",
                   static_cast<unsigned long long>(kLockBoundMs));
      else
        KCACHE_LOG(LogLevel::warn, "lease table: locking a bucket: %s; compiling uncoordinated", std::strerror(rc));
      return false;
    }
    // pthread_mutex_trylock, or EFAULT when the page is gone.
    int trylock() {
      int rc = EFAULT;
      if (!guarded([&] { rc = ::pthread_mutex_trylock(mu_); })) return EFAULT;
      return rc;
    }
    bool damaged(int rc) const { return lock_damaged(mu_, rc); }

    TableLeases& t_;
    off_t at_;
    char* base_ = nullptr;
    pthread_mutex_t* mu_ = nullptr;  // mapped
    int fd_ = -1;                    // unmapped
    std::unique_lock<std::mutex> guard_;
    bool ok_ = false;
  };

  // Whether a slot's holder must not be taken over: alive (lease::alive),
  // and a record a process could have written. An expiry further ahead
  // than the longest lease (a day: Options::lease_ttl_ms) and an hour of
  // clock difference is garbage: without this, a bucket of such slots
  // would refuse every lease for ever, and a foreign host's holder is
  // judged by its expiry alone. Said once.
  bool live(const lease::Holder& h, uint64_t now) {
    constexpr uint64_t kLongestAheadMs = (24 + 1) * 3600 * 1000ull;
    if (h.expiry_ms > now && h.expiry_ms - now > kLongestAheadMs) {
      if (!garbage_logged_.exchange(true))
        KCACHE_LOG(LogLevel::warn,
                   "lease table %s: a slot held garbage (a lease ending %llu s from now); taken over "
                   "(said once)",
                   path_.c_str(), static_cast<unsigned long long>((h.expiry_ms - now) / 1000));
      return false;
    }
    return lease::alive(h, now);
  }

  // Whether the mapped file still holds the whole table. A file truncated
  // under the map would make every touch of a bucket past its new end
  // SIGBUS: the table is then given up for this process (said once), and
  // leases are errors (compiles go on uncoordinated).
  bool map_intact() {
    if (broken_.load(std::memory_order_relaxed)) return false;
    struct stat st;
    if (env_->fstat(map_fd_, &st) == 0 && st.st_size >= static_cast<off_t>(kTableSize)) return true;
    give_up(kTruncated);
    return false;
  }
  void give_up(const char* why) {
    if (!broken_.exchange(true))
      KCACHE_LOG(LogLevel::warn, "lease table %s %s; no cross-process single-flight until the store is opened again",
                 path_.c_str(), why);
  }

  // Makes a bucket's lock afresh when it holds garbage (Locked::damaged),
  // under the header's lock so that processes that find it at once make it
  // once. A lock of no known kind takes its slots with it (no process
  // could have taken a lease there); a lock "held" by an impossible owner
  // keeps them. Said once.
  void repair(pthread_mutex_t* mu) {
    // The header's lock is an open file description's, which every thread
    // of this process shares: it keeps other processes out, this mutex the
    // other threads.
    std::lock_guard threads(repair_mu_);
    if (!ofd_lock(map_fd_, 0, static_cast<off_t>(kHeaderSize))) return;
    int rc = EFAULT;
    bool made = false;
    (void)guarded([&] {
      if (!lock_kind_ok(mu)) {
        // No process could lock it, so no lease in its slots is real.
        std::memset(static_cast<void*>(mu), 0, kBucketSize);
        made = ::pthread_mutex_init(mu, robust_shared_attr()) == 0;
        return;
      }
      rc = ::pthread_mutex_trylock(mu);
      if (rc == 0 || rc == EOWNERDEAD) {
        // Another process made it afresh first.
        if (rc == EOWNERDEAD) ::pthread_mutex_consistent(mu);
        ::pthread_mutex_unlock(mu);
      } else if (lock_damaged(mu, rc)) {
        std::memset(static_cast<void*>(mu), 0, kLockSize);
        made = ::pthread_mutex_init(mu, robust_shared_attr()) == 0;
      }
    });
    if (made) {
      if (!garbage_logged_.exchange(true))
        KCACHE_LOG(LogLevel::warn, "lease table %s: a bucket's lock held garbage; made afresh (said once)",
                   path_.c_str());
    }
    ofd_unlock(map_fd_, 0, static_cast<off_t>(kHeaderSize));
  }

  // The unmapped table's state, opened again in a child of fork().
  State& state() {
    uint64_t g = util::fork_generation();
    if (g != gen_.load(std::memory_order_acquire)) {
      std::lock_guard lk(fork_mu_);
      if (g != gen_.load()) {
        State* old = state_.release();
        if (old->fd >= 0) env_->close(old->fd);  // leaves the parent's locks alone
        state_ = std::make_unique<State>();
        state_->fd = env_->open(path_, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        gen_.store(g, std::memory_order_release);
      }
    }
    return *state_;
  }

  static size_t bucket_of(const Key& k) {
    uint64_t h;
    std::memcpy(&h, k.bytes.data(), 8);
    return static_cast<size_t>(h % kBuckets);
  }

  // The slot of `key` held by token `me`, or -1.
  static int mine(const Bucket& b, const Key& key, uint64_t me) {
    for (size_t i = 0; i < kSlots; ++i) {
      lease::Holder h;
      if (same_key(b.slot_key(i), key) && b.holder(i, &h) && h.token == me) return static_cast<int>(i);
    }
    return -1;
  }

  // Opens and maps the table, making it ready first if no process has.
  Status open_file() {
    const unsigned mode = shared_ ? 0660 : 0600;
    util::Fd file(env_->open(path_, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode), *env_);
    if (!file) return util::errno_status(errno, path_);
    const int fd = file.get();
    struct stat st;
    if (env_->fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
      return Status(Errc::io_error, path_ + " is not a regular file");
    util::note_store_file(fd);
    if (shared_ && st.st_uid == ::geteuid()) (void)env_->fchmod(fd, mode);
    const bool mapped = may_map_ && writes_in_place(fd);
    if (!ofd_lock(fd, 0, static_cast<off_t>(kHeaderSize)))
      return Status(Errc::timeout, path_ + ": could not lock the header to open the lease table");
    // The mapping outlives the descriptor. It also keeps the open file
    // description, and with it any lock on it, so the header lock is
    // given up by hand (before `file` closes).
    struct HeaderLock {
      int fd;
      ~HeaderLock() { ofd_unlock(fd, 0, static_cast<off_t>(kHeaderSize)); }
    } header_lock{fd};
    if (env_->fstat(fd, &st) != 0) return util::errno_status(errno, path_);
    // Allocated in full before it is used: on a file system that writes in
    // place a store into the mapping never needs a block (a full disk would
    // make it SIGBUS), and it never lies past the end of the file.
    if (st.st_size < static_cast<off_t>(kTableSize)) {
      if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(kTableSize)); rc != 0)
        return util::errno_status(rc, path_);
    }
    char* m = nullptr;
    char header[kHeaderSize];
    if (mapped) {
      void* p = ::mmap(nullptr, kTableSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return util::errno_status(errno, path_);
      m = static_cast<char*>(p);
      std::memcpy(header, m, kHeaderSize);
    } else if (env_->pread(fd, header, kHeaderSize, 0) != static_cast<ssize_t>(kHeaderSize)) {
      return util::errno_status(errno ? errno : EIO, path_);
    }
    uint32_t ready;
    std::memcpy(&ready, header + kReadyAt, 4);
    // Made afresh only when no process finished making it: all zeros (new),
    // or this layout with `ready` still 0 (its maker died). Anything else
    // may be in use by others.
    bool fresh = true;
    for (size_t i = 0; i < kHeaderSize && fresh; ++i) fresh = header[i] == 0;
    const bool ours = check_header(header, mapped).is_ok();
    // A header that is no lease table's of any version (its magic without
    // the version digit is missing) is damage, not another layout. Only the
    // header is written afresh, under the header lock: processes that mapped
    // the table before the damage still use its buckets, and a bucket whose
    // lock holds garbage is made afresh when it is next locked.
    const bool garbage = !fresh && std::memcmp(header, kMagic, sizeof kMagic - 1) != 0;
    Status made;
    if (garbage) {
      KCACHE_LOG(LogLevel::warn, "lease table %s had a damaged header; its header was written afresh", path_.c_str());
      made = mapped ? rewrite_header(m) : rewrite_header_unmapped(fd);
    } else if (ready == 1 || !(fresh || (ours && ready == 0))) {
      made = check_header(header, mapped);
    } else {
      made = mapped ? make_ready(m) : make_ready_unmapped(fd);
    }
    if (!made.is_ok()) {
      if (m) ::munmap(m, kTableSize);
      return made;
    }
    if (mapped) {
      // Kept to look at the file's size before a bucket is touched, and to
      // lock the header while a damaged bucket is made afresh.
      map_fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (map_fd_ < 0) {
        Status st = util::errno_status(errno, path_);
        ::munmap(m, kTableSize);
        return st;
      }
      map_ = m;
    } else {
      state_->fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (state_->fd < 0) return util::errno_status(errno, path_);
    }
    return Status();
  }

  Status check_header(const char* h, bool mapped) const {
    char want[kHeaderSize];
    fill_header(mapped, want);
    if (std::memcmp(h, want, kReadyAt) != 0)
      return Status(Errc::io_error, path_ + " is a lease table of another layout or C library");
    return Status();
  }

  // Under the header lock: the header, `ready` set (alone for a damaged
  // header; last when the table is made).
  static Status rewrite_header(char* m) {
    fill_header(true, m);
    __atomic_store_n(reinterpret_cast<uint32_t*>(m + kReadyAt), uint32_t{1}, __ATOMIC_RELEASE);
    return Status();
  }
  Status rewrite_header_unmapped(int fd) {
    char h[kHeaderSize];
    fill_header(false, h);
    const uint32_t one = 1;
    std::memcpy(h + kReadyAt, &one, 4);
    if (int e = util::pwrite_all(*env_, fd, std::string_view(h, kHeaderSize))) return util::errno_status(e, path_);
    return Status();
  }

  // Under the header lock: no process uses the table before `ready`, so
  // whatever an earlier maker that died left is made afresh.
  Status make_ready(char* m) {
    pthread_mutexattr_t a;
    ::pthread_mutexattr_init(&a);
    int rc = ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (rc == 0) rc = ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    for (size_t b = 0; rc == 0 && b < kBuckets; ++b) {
      std::memset(m + bucket_at(b), 0, kBucketSize);
      rc = ::pthread_mutex_init(reinterpret_cast<pthread_mutex_t*>(m + bucket_at(b)), &a);
    }
    ::pthread_mutexattr_destroy(&a);
    if (rc != 0) return util::errno_status(rc, path_ + ": process-shared robust mutexes");
    return rewrite_header(m);
  }

  // The same for a table read and written with pread/pwrite: buckets
  // zeroed, then the header with `ready` set.
  Status make_ready_unmapped(int fd) {
    std::string zeros(kTableSize - kHeaderSize, '\0');
    if (int e = util::pwrite_all(*env_, fd, zeros, static_cast<off_t>(kHeaderSize)))
      return util::errno_status(e, path_);
    return rewrite_header_unmapped(fd);
  }

  const std::string path_;
  const bool may_map_;
  const std::shared_ptr<Env> env_;  // never null
  bool shared_ = false;
  char* map_ = nullptr;                                       // a mapped table
  int map_fd_ = -1;                                           // and its file
  std::atomic<bool> broken_{false};                           // the mapped file shrank
  std::mutex repair_mu_;                                      // one thread of this process repairs at a time
  std::atomic<bool> garbage_logged_{false};                   // a garbage lock or slot was said
  std::unique_ptr<State> state_ = std::make_unique<State>();  // an unmapped one
  std::mutex fork_mu_;                                        // only taken when a fork was seen
  std::atomic<uint64_t> gen_{util::fork_generation()};
  lease::Token token_;
  std::atomic<uint64_t> takeovers_{0};
};

}  // namespace

Expected<std::shared_ptr<Leases>> open_table_leases(const std::string& dir, std::shared_ptr<Env> env) {
  auto l = std::make_shared<TableLeases>(dir + "/" + lease::table::kFileName, true, std::move(env));
  KCACHE_RETURN_IF_ERROR(l->init());
  return std::shared_ptr<Leases>(std::move(l));
}

namespace lease::table {

namespace {
Status check_once(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return errno == ENOENT ? Status() : util::errno_status(errno, path);
  char h[kHeaderSize] = {};
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const ssize_t n = regular ? ::pread(fd, h, kHeaderSize, 0) : -1;
  ::close(fd);
  if (!regular) return Status(Errc::corrupt, path + " is not a regular file");
  if (st.st_size < static_cast<off_t>(kTableSize))
    return Status(Errc::corrupt, path + " is cut short (" + std::to_string(st.st_size) + " of " +
                                     std::to_string(kTableSize) + " bytes)");
  if (n != static_cast<ssize_t>(kHeaderSize)) return util::errno_status(errno ? errno : EIO, path);
  bool zeros = true;
  for (size_t i = 0; i < kHeaderSize && zeros; ++i) zeros = h[i] == 0;
  if (zeros) return Status(Errc::corrupt, path + " was never finished (its maker died)");
  if (std::memcmp(h, kMagic, sizeof kMagic - 1) != 0) return Status(Errc::corrupt, path + " has a damaged header");
  char mapped[kHeaderSize], unmapped[kHeaderSize];
  fill_header(true, mapped);
  fill_header(false, unmapped);
  if (std::memcmp(h, mapped, kReadyAt) != 0 && std::memcmp(h, unmapped, kReadyAt) != 0)
    return Status(Errc::stale_format, path + " is a lease table of another layout or C library");
  uint32_t ready;
  std::memcpy(&ready, h + kReadyAt, 4);
  if (ready != 1) return Status(Errc::corrupt, path + " was never finished (its maker died)");
  return Status();
}
}  // namespace

Status check(const std::string& dir, bool fix) {
  const std::string path = dir + "/" + kFileName;
  Status st = check_once(path);
  if (st.is_ok() || !fix || st.code() != Errc::corrupt) return st;
  auto repaired = open_table_leases(dir);
  if (!repaired) return repaired.error();
  return check_once(path);
}

Expected<std::shared_ptr<Leases>> open_unmapped(const std::string& dir, std::shared_ptr<Env> env) {
  auto l = std::make_shared<TableLeases>(dir + "/" + kFileName, false, std::move(env));
  KCACHE_RETURN_IF_ERROR(l->init());
  return std::shared_ptr<Leases>(std::move(l));
}
}  // namespace lease::table

}  // namespace kcache

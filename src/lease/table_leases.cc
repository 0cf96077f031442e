// The lease table: leases of a store on a local file system, kept in one
// small file beside it, `<dir>/leases.tab` (docs/format.md, "Lease table").
//
// The file is an array of buckets; a key's bucket is chosen by its first
// bytes, and a bucket holds up to kSlots leases, each a slot of the key and
// its holder record (lease/holder.h). A bucket is read and written only
// under an exclusive open-file-description lock (fcntl F_OFD_SETLK) on its
// byte range, so processes, and Leases objects within one process, update
// it one at a time, and the kernel drops the lock of a process that dies.
// Under the lock the bucket is read (pread, 512 bytes) and one slot written
// (pwrite, 64 bytes): a lease costs four system calls, no sync and no
// database writer lock, so taking one never queues behind the store's own
// commits. (The file is not mapped: a write to a mapped page that the file
// system cannot back, on a full copy-on-write file system or a file cut
// short, is SIGBUS; a failed pwrite is an error.)
//
//  * acquire: the key's slot, when its holder is dead or expired, is taken
//    over; a free slot (zeros, or a dead or expired holder of another key)
//    is taken; a bucket full of live leases is an error (the caller compiles
//    uncoordinated: never a wait for an unrelated key).
//  * a slot torn by a writer killed mid-write is the slot of a dead process:
//    it is free.
//  * the lock is tried without blocking and retried for up to kLockBoundMs;
//    a stopped process cannot hold a bucket for ever.
// In a store folder shared with a group, the file is group-writable.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "kcache/lease.h"
#include "lease/holder.h"
#include "util/util.h"

namespace kcache {
namespace {

constexpr size_t kSlotSize = 16 + lease::kHolderSize;  // key | holder record
constexpr size_t kSlots = 8;                           // per bucket
constexpr size_t kBucketSize = kSlots * kSlotSize;     // 512 bytes
constexpr size_t kBuckets = 256;
constexpr size_t kTableSize = kBuckets * kBucketSize;  // 128 KiB
constexpr uint64_t kLockBoundMs = 2000;
static_assert(kSlotSize == 64);

// One bucket, as read under its lock.
struct Bucket {
  char bytes[kBucketSize];
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

class TableLeases final : public Leases {
 public:
  explicit TableLeases(std::string path) : path_(std::move(path)) {}
  ~TableLeases() override {
    if (state_->fd >= 0) ::close(state_->fd);
  }
  std::string_view name() const noexcept override { return "table"; }
  uint64_t takeovers() const noexcept override { return takeovers_.load(); }

  Status init() {
    shared_ = util::folder_is_shared(path_.substr(0, path_.rfind('/')));
    return open_file();
  }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    State& s = state();
    Locked lk(s, bucket_of(key));
    Bucket b;
    if (!lk.ok() || !lk.read(&b)) return LeaseResult::error;
    const uint64_t now = util::now_unix_ms();
    int free_slot = -1;
    for (size_t i = 0; i < kSlots; ++i) {
      lease::Holder h;
      bool readable = b.holder(i, &h);
      if (same_key(b.slot_key(i), key) && readable) {
        if (h.token != me && lease::alive(h, now)) return LeaseResult::busy;
        if (!lk.write_slot(i, key, lease::self(me, ttl_ms))) return LeaseResult::error;
        if (h.token != me) takeovers_.fetch_add(1);
        return LeaseResult::acquired;
      }
      if (free_slot < 0 && b.empty(i)) free_slot = static_cast<int>(i);
    }
    // No lease of this key: a free slot, else one whose holder is gone.
    for (size_t i = 0; free_slot < 0 && i < kSlots; ++i) {
      lease::Holder h;
      if (!b.holder(i, &h) || !lease::alive(h, now)) free_slot = static_cast<int>(i);
    }
    if (free_slot < 0) return LeaseResult::error;  // kSlots live leases in this bucket
    return lk.write_slot(static_cast<size_t>(free_slot), key, lease::self(me, ttl_ms)) ? LeaseResult::acquired
                                                                                       : LeaseResult::error;
  }

  bool renew(const Key& key, uint64_t ttl_ms) override {
    const uint64_t me = token_.get();
    State& s = state();
    Locked lk(s, bucket_of(key));
    Bucket b;
    if (!lk.ok() || !lk.read(&b)) return false;
    int i = mine(b, key, me);
    return i >= 0 && lk.write_slot(static_cast<size_t>(i), key, lease::self(me, ttl_ms));
  }

  void release(const Key& key) override {
    const uint64_t me = token_.get();
    State& s = state();
    Locked lk(s, bucket_of(key));
    Bucket b;
    if (!lk.ok() || !lk.read(&b)) return;
    int i = mine(b, key, me);
    if (i >= 0) (void)lk.write_bytes(i, std::string(kSlotSize, '\0').data());
  }

 private:
  // The descriptor and the mutexes that serialise this object's threads on
  // a bucket (an open-file-description lock does not: they share the
  // description). A child of fork() opens its own description: sharing its
  // parent's, its locks would not exclude the parent's. The inherited state
  // is left as it is (its mutexes may be held by parent threads that are
  // gone).
  struct State {
    int fd = -1;
    std::mutex mu[kBuckets];  // one a bucket: a stuck bucket holds up only its own keys
  };

  class Locked {
   public:
    Locked(State& s, size_t bucket) : s_(s), at_(static_cast<off_t>(bucket * kBucketSize)), g_(s.mu[bucket]) {
      ok_ = s.fd >= 0 && lock(F_WRLCK);
    }
    ~Locked() {
      if (ok_) (void)lock(F_UNLCK);
    }
    bool ok() const noexcept { return ok_; }
    bool read(Bucket* b) const {
      return ::pread(s_.fd, b->bytes, kBucketSize, at_) == static_cast<ssize_t>(kBucketSize);
    }
    // Writes slot i in one pwrite (a slot torn by a crash of the machine
    // holds a holder that is not alive after the reboot: stale).
    bool write_slot(size_t i, const Key& key, const lease::Holder& h) const {
      char slot[kSlotSize];
      std::memcpy(slot, key.bytes.data(), 16);
      std::string rec = lease::encode(h);
      std::memcpy(slot + 16, rec.data(), lease::kHolderSize);
      return write_bytes(static_cast<int>(i), slot);
    }
    bool write_bytes(int i, const char* slot) const {
      return ::pwrite(s_.fd, slot, kSlotSize, at_ + static_cast<off_t>(i) * static_cast<off_t>(kSlotSize)) ==
             static_cast<ssize_t>(kSlotSize);
    }

   private:
    bool lock(short type) {
      struct flock fl {};
      fl.l_type = type;
      fl.l_whence = SEEK_SET;
      fl.l_start = at_;
      fl.l_len = static_cast<off_t>(kBucketSize);
      if (type == F_UNLCK) return ::fcntl(s_.fd, F_OFD_SETLK, &fl) == 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLockBoundMs);
      for (int spin = 0;; ++spin) {
        if (::fcntl(s_.fd, F_OFD_SETLK, &fl) == 0) return true;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) return false;
        if (std::chrono::steady_clock::now() > deadline) {
          KCACHE_LOG(LogLevel::warn, "lease table: a bucket stayed locked for %llu ms; compiling uncoordinated",
                     static_cast<unsigned long long>(kLockBoundMs));
          return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(spin < 10 ? 20 : 1000));
      }
    }
    State& s_;
    off_t at_;
    std::lock_guard<std::mutex> g_;
    bool ok_ = false;
  };

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

  State& state() {
    uint64_t g = util::fork_generation();
    if (g != gen_.load(std::memory_order_acquire)) {
      std::lock_guard lk(fork_mu_);
      if (g != gen_.load()) {
        // Inherited: its mutex may be held by a thread that is gone. Its
        // descriptor is closed, which leaves the parent's locks alone (they
        // go with the parent's last descriptor of that description).
        State* old = state_.release();
        if (old->fd >= 0) ::close(old->fd);
        state_ = std::make_unique<State>();
        (void)open_file();
        gen_.store(g, std::memory_order_release);
      }
    }
    return *state_;
  }

  Status open_file() {
    const unsigned mode = shared_ ? 0660 : 0600;
    // No access times: every read of a bucket after a write would otherwise
    // be an inode update (relatime), a journal entry on each lease. Only the
    // file's owner (or root) may ask for that; others open it as it is.
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOATIME, mode);
    if (fd < 0 && errno == EPERM) fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) return util::errno_status(errno, path_);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status(Errc::io_error, path_ + " is not a regular file");
    }
    if (shared_ && st.st_uid == ::geteuid()) (void)::fchmod(fd, mode);
    // Allocated in full once, so that a lease on a full disk does not fail
    // for want of a block.
    if (st.st_size < static_cast<off_t>(kTableSize)) {
      if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(kTableSize)); rc != 0) {
        Status e = util::errno_status(rc, path_);
        ::close(fd);
        return e;
      }
    }
    state_->fd = fd;
    return Status();
  }

  const std::string path_;
  bool shared_ = false;
  std::unique_ptr<State> state_ = std::make_unique<State>();
  std::mutex fork_mu_;  // only taken when a fork was seen
  std::atomic<uint64_t> gen_{util::fork_generation()};
  lease::Token token_;
  std::atomic<uint64_t> takeovers_{0};
};

}  // namespace

Expected<std::shared_ptr<Leases>> open_table_leases(const std::string& dir) {
  auto l = std::make_shared<TableLeases>(dir + "/leases.tab");
  KCACHE_RETURN_IF_ERROR(l->init());
  return std::shared_ptr<Leases>(std::move(l));
}

}  // namespace kcache

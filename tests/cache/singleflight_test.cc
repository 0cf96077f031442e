// Cross-process single-flight: leases in the LMDB store and lease files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <thread>
#include <vector>

#include "cache/assembly.h"
#include "fault_env.h"
#include "kcache/cache.h"
#include "kcache/lease.h"
#include "lease/holder.h"
#include "lease/table_layout.h"
#include "process_sync.h"
#include "test_util.h"
#include "util/util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

Options opts(const std::string& dir, const std::string& engine) {
  Options o;
  o.dir = dir;
  o.engine = parse_engine(engine);
  o.log_level = LogLevel::error;
  return o;
}

// A deterministic CPU-bound "compile": a few ms of hashing.
std::string compile_bytes(uint64_t i, int rounds) {
  std::string s = bytes_for(i, 4096);
  for (int r = 0; r < rounds; ++r) {
    Digest d = hash_bytes(s);
    std::memcpy(s.data() + (r % 4000), d.bytes.data(), 16);
  }
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn in a child process; returns its pid. The child exits with fn's result.
template <class F>
pid_t spawn(F fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = fn();
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Starts a process that leads the compile of `k` in a cache in `dir`: its
// compile function returns `value` once `release` is posted (or after two
// minutes). Returns once the compile has begun (the holder has the lease).
pid_t spawn_holder(const std::string& dir, const std::string& engine, const KeyInfo& k, const Signal& release,
                   const std::string& value) {
  Signal ready;
  pid_t pid = spawn([&] {
    auto c = Cache::open(opts(dir, engine));
    auto e = c->get_or_compile(k, [&]() -> Expected<std::vector<Artifact>> {
      ready.post();
      release.wait(120000);
      return std::vector<Artifact>{{"obj", value}};
    });
    return e ? 0 : 1;
  });
  return pid > 0 && ready.wait() ? pid : -1;
}

// The library's leases for an engine's folder (engine_info(e).open_leases).
// "table_unmapped": the lease table as it runs on a copy-on-write file
// system (fcntl locks, pread and pwrite).
std::shared_ptr<Leases> leases_for(const std::string& engine, const std::string& dir) {
  if (engine == "table_unmapped") return *lease::table::open_unmapped(dir);
  return *engine_info(*parse_engine(engine)).open_leases(dir, DiskTierOptions{});
}

std::vector<std::string> lease_engines() {
#if KCACHE_HAVE_LMDB
  return {"lmdb", "files"};
#else
  return {"files"};
#endif
}

class SingleFlight : public ::testing::TestWithParam<std::string> {
 protected:
  TempDir dir_;
};

}  // namespace

// The leases alone, of each kind.
class LeaseKinds : public ::testing::TestWithParam<std::string> {
 protected:
  TempDir dir_;
};

TEST_P(LeaseKinds, LeaseBasics) {
  auto a = leases_for(GetParam(), dir_.path());
  auto b = leases_for(GetParam(), dir_.path());
  Key k = key_of(1);
  EXPECT_EQ(a->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_EQ(b->acquire(k, 60000), LeaseResult::busy);
  EXPECT_EQ(a->acquire(k, 60000), LeaseResult::acquired);  // re-acquire = renew
  EXPECT_TRUE(a->renew(k, 60000));
  EXPECT_FALSE(b->renew(k, 60000));
  b->release(k);  // not b's: no effect
  EXPECT_EQ(b->acquire(k, 60000), LeaseResult::busy);
  a->release(k);
  EXPECT_EQ(b->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_EQ(b->takeovers(), 0u);
}

TEST_P(LeaseKinds, ExpiredLeaseIsTakenOver) {
  // Lease files take their clock from an Env: move it past the TTL instead
  // of sleeping. The lease table reads the system clock.
  auto env = std::make_shared<test::FaultEnv>();
  const bool files = GetParam() == "files";
  auto a = files ? *open_file_leases(dir_.path(), env) : leases_for(GetParam(), dir_.path());
  auto b = files ? *open_file_leases(dir_.path(), env) : leases_for(GetParam(), dir_.path());
  // The TTL is long enough that b's first try comes before it runs out
  // on a loaded machine too.
  constexpr uint64_t kTtlMs = 1000;
  Key k = key_of(2);
  EXPECT_EQ(a->acquire(k, kTtlMs), LeaseResult::acquired);
  EXPECT_EQ(b->acquire(k, 60000), LeaseResult::busy);
  if (files)
    env->advance(kTtlMs + 100);
  else
    std::this_thread::sleep_for(std::chrono::milliseconds(kTtlMs + 100));
  EXPECT_EQ(b->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_EQ(b->takeovers(), 1u);
  EXPECT_FALSE(a->renew(k, 60000));  // a lost it
}

TEST_P(LeaseKinds, DeadHolderIsTakenOverAtOnce) {
  Key k = key_of(3);
  pid_t pid = spawn([&] {
    auto l = leases_for(GetParam(), dir_.path());
    return l->acquire(k, 600000) == LeaseResult::acquired ? 0 : 1;  // exits holding it
  });
  ASSERT_EQ(wait_exit(pid), 0);
  auto b = leases_for(GetParam(), dir_.path());
  EXPECT_EQ(b->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_EQ(b->takeovers(), 1u);
}

// Field 22 of /proc/self/stat (start time in clock ticks), read here rather
// than through the library.
uint64_t own_start_ticks() {
  auto s = util::read_file("/proc/self/stat", 1 << 16);
  if (!s) return 0;
  size_t p = s->rfind(')');
  if (p == std::string::npos) return 0;
  size_t i = p + 2;  // field 3
  for (int field = 3; field < 22 && i < s->size(); ++field) i = s->find(' ', i) + 1;
  return std::strtoull(s->c_str() + i, nullptr, 10);
}

// A holder record of this very process is alive without asking /proc; one
// with this PID but another start time (an earlier process the PID was
// reused from) is dead, and so is an expired one. A child of fork() sees
// its parent's record as alive and its own too.
TEST(LeaseHolder, ThisProcessIsAliveAnEarlierOneWithItsPidIsNot) {
  const uint64_t now = util::now_unix_ms();
  lease::Holder me = lease::self(lease::new_token(), 60000);
  EXPECT_EQ(me.pid, static_cast<uint32_t>(::getpid()));
  ASSERT_NE(me.start_ticks, 0u);
  EXPECT_EQ(me.start_ticks, own_start_ticks());
  EXPECT_TRUE(lease::alive(me, now));
  lease::Holder earlier = me;
  earlier.start_ticks = me.start_ticks - 1;
  EXPECT_FALSE(lease::alive(earlier, now));
  lease::Holder expired = me;
  expired.expiry_ms = now - 1;
  EXPECT_FALSE(lease::alive(expired, now));

  pid_t pid = spawn([&] {
    lease::Holder child = lease::self(lease::new_token(), 60000);
    if (child.pid != static_cast<uint32_t>(::getpid()) || child.start_ticks == 0 ||
        !lease::alive(child, util::now_unix_ms()))
      return 1;
    if (child.start_ticks != own_start_ticks()) return 5;  // its own, not its parent's
    // The child's own start time, read once: the same in its next record,
    // and a record with its PID but another start time is not its own.
    if (lease::self(lease::new_token(), 60000).start_ticks != child.start_ticks) return 3;
    lease::Holder child_earlier = child;
    child_earlier.start_ticks = child.start_ticks - 1;
    if (lease::alive(child_earlier, util::now_unix_ms())) return 4;
    return lease::alive(me, util::now_unix_ms()) ? 0 : 2;
  });
  EXPECT_EQ(wait_exit(pid), 0);
}

// The token a remote lease records names its process: a waiter of the same
// host tells a holder that died (or whose PID was reused) from a live one,
// this very process, another host and a token of another form.
TEST(LeaseHolder, ProcessTokenSaysWhenItsHolderDied) {
  const std::string mine = lease::process_token(42);
  EXPECT_FALSE(lease::token_holder_dead(mine));
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = spawn([&] {
    std::string t = lease::process_token(7);
    return ::write(fds[1], t.data(), t.size()) == static_cast<ssize_t>(t.size()) ? 0 : 1;
  });
  ::close(fds[1]);
  char buf[512];
  ssize_t n = ::read(fds[0], buf, sizeof buf);
  ::close(fds[0]);
  ASSERT_GT(n, 0);
  const std::string child(buf, static_cast<size_t>(n));
  EXPECT_EQ(wait_exit(pid), 0);
  EXPECT_TRUE(lease::token_holder_dead(child));  // exited and reaped
  // Its PID with another start time: this process's PID reused.
  const size_t host = mine.rfind(':');
  const size_t ticks = mine.rfind(':', host - 1);
  std::string reused = mine.substr(0, ticks + 1) + "1" + mine.substr(host);
  EXPECT_TRUE(lease::token_holder_dead(reused));
  // Another host (another digest), an old-form token, garbage: not dead.
  std::string other = child.substr(0, child.rfind(':') + 1) + std::string(32, '0');
  EXPECT_FALSE(lease::token_holder_dead(other));
  EXPECT_FALSE(lease::token_holder_dead("host:123:456"));
  EXPECT_FALSE(lease::token_holder_dead(""));
  EXPECT_FALSE(lease::token_holder_dead(":::::"));
}

// The PID of a token is read strictly: digits only, no more than 19 (no
// wrap), above 0 and below 2^22; anything else is "not dead".
TEST(LeaseHolder, TokenPidsOutOfRangeAreNeverDead) {
  const std::string mine = lease::process_token(42);
  const size_t host = mine.rfind(':');
  const size_t ticks = mine.rfind(':', host - 1);
  const size_t random = mine.rfind(':', ticks - 1);
  const size_t pid = mine.rfind(':', random - 1);
  auto with_pid = [&](const std::string& p) { return mine.substr(0, pid + 1) + p + mine.substr(random); };
  // No process has these PIDs: a PID past 2^22, and one past 2^64 that
  // would wrap to a small free one.
  EXPECT_FALSE(lease::token_holder_dead(with_pid("5000000")));
  EXPECT_FALSE(lease::token_holder_dead(with_pid("4194304")));
  EXPECT_FALSE(lease::token_holder_dead(with_pid("18446744073709581616")));  // 2^64 + 30000
  EXPECT_FALSE(lease::token_holder_dead(with_pid("0")));
  EXPECT_FALSE(lease::token_holder_dead(with_pid("")));
  EXPECT_FALSE(lease::token_holder_dead(with_pid("-1")));
  EXPECT_FALSE(lease::token_holder_dead(with_pid("0000000000000000000001")));
}

// A live holder in another PID namespace (a container sharing the host's
// network and name) is never judged dead by a PID of this namespace.
TEST(LeaseHolder, AHolderInAnotherPidNamespaceIsNotDead) {
  int tok[2], hold[2];
  ASSERT_EQ(::pipe(tok), 0);
  ASSERT_EQ(::pipe(hold), 0);
  pid_t outer = ::fork();
  ASSERT_GE(outer, 0);
  if (outer == 0) {
    ::close(tok[0]);
    ::close(hold[1]);
    if (::unshare(CLONE_NEWPID) != 0) ::_exit(77);
    // The namespace's first process (its PID 1) forks until a process has
    // a PID free in the outer one (/proc is still the outer one's); that
    // one writes its token and waits.
    pid_t init = ::fork();
    if (init < 0) ::_exit(1);
    if (init > 0) {
      int st = 0;
      ::waitpid(init, &st, 0);
      ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
    }
    for (int i = 0; i < 200; ++i) {
      pid_t c = ::fork();
      if (c < 0) ::_exit(1);
      if (c == 0) {
        if (::access(("/proc/" + std::to_string(::getpid())).c_str(), F_OK) == 0) ::_exit(3);
        std::string t = lease::process_token(9);
        if (::write(tok[1], t.data(), t.size()) != static_cast<ssize_t>(t.size())) ::_exit(1);
        char b;
        (void)::read(hold[0], &b, 1);
        ::_exit(0);
      }
      int st = 0;
      ::waitpid(c, &st, 0);
      if (WIFEXITED(st) && WEXITSTATUS(st) != 3) ::_exit(WEXITSTATUS(st));
    }
    ::_exit(2);
  }
  ::close(tok[1]);
  ::close(hold[0]);
  char buf[512];
  ssize_t n = ::read(tok[0], buf, sizeof buf);
  ::close(tok[0]);
  if (n <= 0) {
    ::close(hold[1]);
    int st = 0;
    ::waitpid(outer, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) GTEST_SKIP() << "no new PID namespace here";
    FAIL() << "no token from the other namespace";
  }
  const std::string token(buf, static_cast<size_t>(n));
  EXPECT_FALSE(lease::token_holder_dead(token)) << token;
  ::close(hold[1]);
  int st = 0;
  ASSERT_EQ(::waitpid(outer, &st, 0), outer);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(FileLeases, PartialLeaseFileFromACrashIsCollected) {
  TempDir d;
  auto l = *open_file_leases(d.path());
  Key k = key_of(4);
  std::string p = d.path() + "/leases/" + k.hex() + ".lease";
  ASSERT_TRUE(util::write_file_atomic(p, "").is_ok());  // creator died before writing
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::busy);   // young: maybe being written
  struct timespec old[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(util::now_unix_ms() / 1000 - 10), 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), old, 0), 0);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
}

// ---- the lease table (the LMDB engine's leases) -------------------------

// A key whose first 8 bytes are `lead` (which picks its bucket) and whose
// other bytes are `tail`.
Key table_key(uint64_t lead, uint64_t tail) {
  Key k;
  std::memcpy(k.bytes.data(), &lead, 8);
  std::memcpy(k.bytes.data() + 8, &tail, 8);
  return k;
}

// Eight slots a bucket: a ninth live lease in one bucket is an error (the
// caller compiles uncoordinated), never a wait on an unrelated key; a
// released slot is reused, and so is one whose holder died.
TEST(TableLeases, BucketFullOfLiveLeasesIsAnErrorNotAWait) {
  TempDir d;
  auto a = *open_table_leases(d.path());
  auto b = *open_table_leases(d.path());
  for (uint64_t i = 0; i < 8; ++i) ASSERT_EQ(a->acquire(table_key(7, i), 60000), LeaseResult::acquired) << i;
  EXPECT_EQ(b->acquire(table_key(7, 100), 60000), LeaseResult::error);
  EXPECT_EQ(b->acquire(table_key(7 + 256, 101), 60000), LeaseResult::error) << "same bucket";
  EXPECT_EQ(b->acquire(table_key(8, 100), 60000), LeaseResult::acquired) << "another bucket";
  a->release(table_key(7, 3));
  EXPECT_EQ(b->acquire(table_key(7, 100), 60000), LeaseResult::acquired);
  EXPECT_EQ(b->takeovers(), 0u);

  // A process that dies holding every slot of a bucket frees them all.
  pid_t pid = spawn([&] {
    auto l = *open_table_leases(d.path());
    for (uint64_t i = 0; i < 8; ++i)
      if (l->acquire(table_key(9, i), 600000) != LeaseResult::acquired) return 1;
    return 0;
  });
  ASSERT_EQ(wait_exit(pid), 0);
  EXPECT_EQ(b->acquire(table_key(9, 100), 60000), LeaseResult::acquired) << "a dead holder's slot of another key";
  EXPECT_EQ(b->acquire(table_key(9, 5), 60000), LeaseResult::acquired) << "the dead holder's own key";
  EXPECT_EQ(b->takeovers(), 1u);
}

// The mapped lease table of `dir` and bucket b's mutex in it, as another
// process of this or another version would use them.
struct MappedTable {
  explicit MappedTable(const std::string& dir) {
    int fd = ::open((dir + "/" + lease::table::kFileName).c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void* p = ::mmap(nullptr, lease::table::kTableSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p != MAP_FAILED) m = static_cast<char*>(p);
  }
  ~MappedTable() {
    if (m) ::munmap(m, lease::table::kTableSize);
  }
  pthread_mutex_t* mutex(size_t b) const { return reinterpret_cast<pthread_mutex_t*>(m + lease::table::bucket_at(b)); }
  char* m = nullptr;
};

// Starts a process that takes bucket b's mutex and, before it exits
// (holding it, as a process that is killed would), runs `then` on the
// mapping. Returns once it holds the mutex; it exits when its stdin pipe
// (the returned fd) is written to or closed.
pid_t hold_bucket(const std::string& dir, size_t b, int* go, const std::function<void(char*)>& then = {}) {
  int ready[2], wait[2];
  if (::pipe(ready) != 0 || ::pipe(wait) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(wait[1]);
    ::close(ready[0]);
    MappedTable t(dir);
    if (!t.m || ::pthread_mutex_lock(t.mutex(b)) != 0) ::_exit(1);
    char x = 1;
    (void)!::write(ready[1], &x, 1);
    (void)!::read(wait[0], &x, 1);
    if (then) then(t.m);
    ::_exit(0);  // the mutex still held
  }
  ::close(ready[1]);  // a child that fails exits: the read ends
  ::close(wait[0]);
  char x;
  bool held = pid > 0 && ::read(ready[0], &x, 1) == 1;
  ::close(ready[0]);
  *go = wait[1];
  return held ? pid : -1;
}

// A process stopped while it holds a bucket's mutex blocks nobody for
// long: acquire gives up within its bound and answers error, and other
// buckets are free. Once that process is gone, the next locker recovers the
// mutex (its owner died) and the bucket works again.
TEST(TableLeases, ABucketHeldByAStuckProcessIsAnErrorWithinTheBoundAndRecoveredWhenItDies) {
  TempDir d;
  auto l = *open_table_leases(d.path());
  Key k = table_key(3, 1);
  int go = -1;
  pid_t pid = hold_bucket(d.path(), 3, &go);
  ASSERT_GT(pid, 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::error);
  EXPECT_GE(seconds_since(t0), 1.5);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_EQ(l->acquire(table_key(4, 1), 60000), LeaseResult::acquired) << "other buckets are free";
  ::close(go);
  EXPECT_EQ(wait_exit(pid), 0);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired) << "the dead owner's mutex is recovered";
  EXPECT_EQ(l->acquire(table_key(3, 2), 60000), LeaseResult::acquired);
  l->release(k);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
}

// A process that dies while it writes a slot (its mutex held, the slot's
// expiry zeroed first, the rest half written) leaves an expired slot, never
// a torn live one: the next process takes the lease at once.
TEST(TableLeases, ASlotTornByAWriterThatDiedIsFree) {
  TempDir d;
  auto holder = *open_table_leases(d.path());
  auto l = *open_table_leases(d.path());
  Key k = table_key(6, 1);
  ASSERT_EQ(holder->acquire(k, 600000), LeaseResult::acquired);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::busy);
  int go = -1;
  pid_t pid = hold_bucket(d.path(), 6, &go, [&](char* m) {
    for (size_t i = 0; i < lease::table::kSlots; ++i) {
      char* s = m + lease::table::slot_at(6, i);
      if (std::memcmp(s, k.bytes.data(), 16) != 0) continue;
      std::memset(s + lease::table::kExpiryAt, 0, 8);  // as a writer does first
      std::memset(s + 16, 0xab, 12);                   // token and pid, half written
    }
  });
  ASSERT_GT(pid, 0);
  ::close(go);
  EXPECT_EQ(wait_exit(pid), 0);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_EQ(l->takeovers(), 1u);
  EXPECT_FALSE(holder->renew(k, 60000)) << "the lease moved on";
}

// Processes killed at random moments while they take and give up leases
// in one bucket (each after a random number of them) leave it usable: whether the process died holding the
// bucket's mutex, mid-way through writing a slot or between leases, the next
// process takes every key of the bucket at once (the mutex recovered, the
// dead process's leases taken over), never waits, and never gets an error.
TEST(TableLeases, ProcessesKilledAtRandomMomentsLeaveTheirBucketUsable) {
  TempDir d;
  ASSERT_TRUE(open_table_leases(d.path()).has_value());
  constexpr size_t kBucket = 7;
  constexpr uint64_t kKeys = 6;
  // How many leases the child has taken and given up so far: it is killed
  // only once it has run its loop a while, whatever the scheduler did.
  void* shared =
      ::mmap(nullptr, sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* progress = new (shared) std::atomic<uint64_t>(0);
  int died_holding = 0;
  std::srand(12345);
  for (int round = 0; round < 60; ++round) {
    progress->store(0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto l = open_table_leases(d.path());
      if (!l) ::_exit(1);
      for (uint64_t r = 0;; ++r) {
        Key k = table_key(kBucket, r % kKeys);
        if ((*l)->acquire(k, 600000) == LeaseResult::acquired && r % 3 != 0) (*l)->release(k);
        progress->fetch_add(1, std::memory_order_relaxed);
      }
    }
    const uint64_t target = 50 + static_cast<uint64_t>(std::rand() % 2000);
    auto started = std::chrono::steady_clock::now();
    while (progress->load(std::memory_order_relaxed) < target && seconds_since(started) < 30.0)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    EXPECT_GE(progress->load(), target) << "round " << round << ": the child did not run";
    // Then a moment later: the parent's wake-up above tends to preempt the
    // child where it makes a system call, which it does outside the lock.
    std::this_thread::sleep_for(std::chrono::microseconds(std::rand() % 1000));
    ::kill(pid, SIGKILL);
    EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
#ifdef __GLIBC__
    {
      // glibc's robust mutex word: the kernel sets FUTEX_OWNER_DIED in it
      // when its owner dies holding it; the next locker clears it.
      MappedTable t(d.path());
      ASSERT_TRUE(t.m);
      died_holding += (t.mutex(kBucket)->__data.__lock & FUTEX_OWNER_DIED) != 0;
    }
#endif
    auto l = *open_table_leases(d.path());
    for (uint64_t i = 0; i < kKeys; ++i) {
      Key k = table_key(kBucket, i);
      auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired) << "round " << round << ", key " << i;
      EXPECT_LT(seconds_since(t0), 1.0);
      l->release(k);
    }
  }
  // How many children died holding the mutex depends on where each was
  // when the kill came, which a loaded machine decides (none to a third of
  // the rounds here); a stuck holder's death is tested exactly above.
  std::printf("%d of 60 children died holding the bucket's mutex\n", died_holding);
  ::munmap(shared, sizeof(std::atomic<uint64_t>));
}

// A table of another layout (here: made by a C library whose mutexes
// differ in size) is never used: no leases, and the caller is told why.
TEST(TableLeases, ATableOfAnotherLayoutIsAnError) {
  TempDir d;
  ASSERT_TRUE(open_table_leases(d.path()).has_value());
  {
    MappedTable t(d.path());
    ASSERT_TRUE(t.m);
    t.m[8 + 12] ^= 0x7f;  // lock_size
  }
  auto l = open_table_leases(d.path());
  ASSERT_FALSE(l.has_value());
  EXPECT_NE(l.error().to_string().find("another layout"), std::string::npos) << l.error().to_string();
}

namespace {

// 8 threads on 2 objects, each with a key of its own in one bucket, take and
// give up their leases; the observer checks each held lease is seen as held.
void threads_keep_their_leases(const std::shared_ptr<Leases> (&objs)[2], Leases& observer) {
  std::atomic<int> lost{0}, held{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      Leases& l = *objs[t % 2];
      Key k = table_key(5, static_cast<uint64_t>(t));
      for (int r = 0; r < 3000; ++r) {
        if (l.acquire(k, 60000) != LeaseResult::acquired) continue;
        held.fetch_add(1);
        if (observer.acquire(k, 60000) == LeaseResult::acquired) {
          lost.fetch_add(1);
          observer.release(k);
        }
        l.release(k);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(held.load(), 8 * 3000);
}

}  // namespace

// Threads of one process lose no lease to each other: in the mapped table
// each bucket's mutex keeps them apart; in the unmapped one, whose fcntl
// locks do not keep apart threads that share a descriptor, the object's
// per-bucket mutexes must (or two threads can take one free slot).
TEST(TableLeases, ThreadsOfOneObjectDoNotLoseEachOthersLeases) {
  for (const char* kind : {"lmdb", "table_unmapped"}) {
    SCOPED_TRACE(kind);
    TempDir d;
    const std::shared_ptr<Leases> objs[2] = {leases_for(kind, d.path()), leases_for(kind, d.path())};
    auto observer = leases_for(kind, d.path());
    threads_keep_their_leases(objs, *observer);
  }
}

// An unmapped table's bucket locked by hand (as a stopped process of that
// kind would hold it) is an error within the bound; other buckets work.
TEST(TableLeases, AnUnmappedBucketLockedForeverIsAnErrorWithinTheBound) {
  TempDir d;
  auto l = *lease::table::open_unmapped(d.path());
  int fd = ::open((d.path() + "/" + lease::table::kFileName).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(lease::table::slot_at(3, 0));
  fl.l_len = static_cast<off_t>(lease::table::kSlots * lease::table::kSlotSize);
  ASSERT_EQ(::fcntl(fd, F_OFD_SETLK, &fl), 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(l->acquire(table_key(3, 1), 60000), LeaseResult::error);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_EQ(l->acquire(table_key(4, 1), 60000), LeaseResult::acquired) << "other buckets are free";
  fl.l_type = F_UNLCK;
  ASSERT_EQ(::fcntl(fd, F_OFD_SETLK, &fl), 0);
  ::close(fd);
  EXPECT_EQ(l->acquire(table_key(3, 1), 60000), LeaseResult::acquired);
}

// 8 processes x 200 shared keys on an empty cache: exactly 200 compiles.
TEST_P(SingleFlight, EightProcessesCompileEachKeyOnce) {
  const int procs = 8, keys = kSanitized ? 60 : 200;
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pids.push_back(spawn([&, p] {
      ::close(pipefd[0]);
      auto c = Cache::open(opts(dir_.path(), GetParam()));
      std::vector<BatchItem> items;
      for (int j = 0; j < keys; ++j) {
        uint64_t i = static_cast<uint64_t>((j + p * keys / procs) % keys);
        items.push_back({*KeyBuilder("sf").add_u64("i", i).finish(), [i]() -> Expected<std::vector<Artifact>> {
                           return std::vector<Artifact>{{"obj", compile_bytes(i, 300)}};
                         }});
      }
      BatchOptions bo;
      bo.threads = 2;
      auto res = c->get_or_compile_batch(items, bo);
      int bad = 0;
      for (int j = 0; j < keys; ++j) {
        uint64_t i = static_cast<uint64_t>((j + p * keys / procs) % keys);
        if (!res[j] || *res[j]->artifact("obj") != compile_bytes(i, 300)) ++bad;
      }
      const CacheStats st = c->stats();
      const uint64_t report[4] = {st.compiles, st.lease_waits, st.lease_timeouts, st.lease_takeovers};
      (void)!::write(pipefd[1], report, sizeof report);
      return bad == 0 ? 0 : 1;
    }));
  }
  ::close(pipefd[1]);
  for (pid_t pid : pids) EXPECT_EQ(wait_exit(pid), 0);
  uint64_t total = 0, waits = 0, timeouts = 0, takeovers = 0, v[4];
  while (::read(pipefd[0], v, sizeof v) == sizeof v) {
    total += v[0];
    waits += v[1];
    timeouts += v[2];
    takeovers += v[3];
  }
  ::close(pipefd[0]);
  EXPECT_EQ(total, static_cast<uint64_t>(keys)) << "compiles summed over processes (lease waits " << waits
                                                << ", timeouts " << timeouts << ", takeovers " << takeovers << ")";
  auto c = Cache::open(opts(dir_.path(), GetParam()));
  auto s = c->tiers().back()->stats();
  EXPECT_EQ(s.puts, static_cast<uint64_t>(keys)) << "puts counted by the store";
  EXPECT_EQ(s.entries, static_cast<uint64_t>(keys));
}

// The holder is SIGKILLed mid-compile: the waiter takes over promptly.
TEST_P(SingleFlight, HolderKilledMidCompileIsTakenOver) {
  KeyInfo k = *KeyBuilder("sf").add_string("what", "killed").finish();
  Signal never, waiting;
  pid_t holder = spawn_holder(dir_.path(), GetParam(), k, never, "holder");
  ASSERT_GT(holder, 0);
  int result[2];
  ASSERT_EQ(::pipe(result), 0);
  pid_t waiter = spawn([&] {
    auto c = Cache::open(opts(dir_.path(), GetParam()));
    auto e = [&] {
      OnLeaseWait on_wait(*c, [&] { waiting.post(); });
      return c->get_or_compile(k, []() -> Expected<std::vector<Artifact>> {
        return std::vector<Artifact>{{"obj", "waiter"}};
      });
    }();
    auto s = c->stats();
    uint64_t out[3] = {s.lease_waits, s.compiles, s.lease_takeovers};
    (void)!::write(result[1], out, sizeof out);
    return e && *e->artifact("obj") == "waiter" ? 0 : 1;
  });
  // The kill comes once the waiter waits on the holder's lease.
  EXPECT_TRUE(waiting.wait()) << "the waiter never waited for the holder";
  auto t0 = std::chrono::steady_clock::now();
  ::kill(holder, SIGKILL);
  EXPECT_EQ(wait_exit(waiter), 0);
  double waited = seconds_since(t0);
  wait_exit(holder);
  uint64_t out[3] = {};
  ASSERT_EQ(::read(result[0], out, sizeof out), static_cast<ssize_t>(sizeof out));
  EXPECT_EQ(out[0], 1u) << "the waiter waited";
  EXPECT_EQ(out[1], 1u) << "then compiled once";
  EXPECT_EQ(out[2], 1u) << "taking over the dead holder's lease";
  // The death is noticed by the next poll (at most 50 ms apart), far below
  // the lease TTL (10 s) and the wait bound (300 s).
  EXPECT_LT(waited, 5.0) << "seconds from the kill to the waiter's end";
}

// A waiter whose bound runs out compiles on its own; the live holder is
// left alone.
TEST_P(SingleFlight, WaiterWithShortBoundCompilesItself) {
  KeyInfo k = *KeyBuilder("sf").add_string("what", "slow").finish();
  Signal release;  // the holder compiles until the waiter has given up
  pid_t holder = spawn_holder(dir_.path(), GetParam(), k, release, "same");
  ASSERT_GT(holder, 0);
  Options o = opts(dir_.path(), GetParam());
  o.wait_bound_ms = 200;
  auto c = Cache::open(o);
  auto t0 = std::chrono::steady_clock::now();
  auto e = c->get_or_compile(k, []() -> Expected<std::vector<Artifact>> {
    return std::vector<Artifact>{{"obj", "same"}};
  });
  double took = seconds_since(t0);
  release.post();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(c->stats().lease_timeouts, 1u);
  EXPECT_EQ(c->stats().compiles, 1u);
  EXPECT_LT(took, 2.5);
  EXPECT_EQ(wait_exit(holder), 0);
}

// A crash while holding a lease leaves nothing that blocks the next run.
TEST_P(SingleFlight, CrashWhileHoldingBlocksNothing) {
  KeyInfo k = *KeyBuilder("sf").add_string("what", "crash").finish();
  pid_t holder = spawn([&] {
    auto c = Cache::open(opts(dir_.path(), GetParam()));
    (void)c->get_or_compile(k, []() -> Expected<std::vector<Artifact>> {
      ::raise(SIGKILL);
      return std::vector<Artifact>{};
    });
    return 0;
  });
  EXPECT_EQ(wait_exit(holder), 128 + SIGKILL);
  auto c = Cache::open(opts(dir_.path(), GetParam()));
  auto e = c->get_or_compile(k, []() -> Expected<std::vector<Artifact>> {
    return std::vector<Artifact>{{"obj", "next"}};
  });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(c->stats().lease_waits, 0u);
  EXPECT_EQ(c->stats().lease_takeovers, 1u);
}

// Three processes compile one key at the same time: each compile waits at a
// barrier until all three are in theirs, which one process waiting on
// another's compile would never reach.
TEST_P(SingleFlight, OffMeansEveryProcessCompiles) {
  KeyInfo k = *KeyBuilder("sf").add_string("what", "off").finish();
  int result[2];
  ASSERT_EQ(::pipe(result), 0);
  Signal entered, go;
  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p)
    pids.push_back(spawn([&] {
      Options o = opts(dir_.path(), GetParam());
      o.process_single_flight = false;
      auto c = Cache::open(o);
      auto e = c->get_or_compile(k, [&]() -> Expected<std::vector<Artifact>> {
        entered.post();
        go.wait();
        return std::vector<Artifact>{{"obj", "x"}};
      });
      uint64_t n = c->stats().compiles;
      (void)!::write(result[1], &n, sizeof n);
      return e ? 0 : 1;
    }));
  int in_compile = 0;
  while (in_compile < 3 && entered.wait()) ++in_compile;
  EXPECT_EQ(in_compile, 3) << "compiles running at once";
  for (int p = 0; p < 3; ++p) go.post();
  for (pid_t pid : pids) EXPECT_EQ(wait_exit(pid), 0);
  ::close(result[1]);
  uint64_t total = 0, v;
  while (::read(result[0], &v, sizeof v) == sizeof v) total += v;
  EXPECT_EQ(total, 3u);
}

INSTANTIATE_TEST_SUITE_P(Engines, SingleFlight, ::testing::ValuesIn(lease_engines()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Kinds, LeaseKinds, ::testing::ValuesIn([] {
                           auto e = lease_engines();
#if KCACHE_HAVE_LMDB
                           e.push_back("table_unmapped");
#endif
                           return e;
                         }()),
                         [](const auto& info) { return info.param; });

// Regression: children forked from a process that had already drawn a
// random number inherited its generator, so every child got the same lease
// token and each believed it held every lease.
TEST(SingleFlightRegression, ForkedChildrenGetDistinctTokens) {
  TempDir d;
  auto parent = *open_file_leases(d.path());  // draws a token in the parent
  Key k = key_of(99);
  int result[2];
  ASSERT_EQ(::pipe(result), 0);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  std::vector<pid_t> pids;
  for (int p = 0; p < 4; ++p)
    pids.push_back(spawn([&] {
      auto l = *open_file_leases(d.path());
      char x;
      (void)!::read(go[0], &x, 1);
      int got = l->acquire(k, 60000) == LeaseResult::acquired ? 1 : 0;
      (void)!::write(result[1], &got, sizeof got);
      (void)!::read(done[0], &x, 1);  // hold until every child has tried
      return 0;
    }));
  for (int p = 0; p < 4; ++p) (void)!::write(go[1], "x", 1);
  int total = 0, v, answers = 0;
  while (answers < 4 && ::read(result[0], &v, sizeof v) == sizeof v) {
    total += v;
    ++answers;
  }
  for (int p = 0; p < 4; ++p) (void)!::write(done[1], "x", 1);
  for (pid_t pid : pids) wait_exit(pid);
  ::close(result[1]);
  EXPECT_EQ(answers, 4);
  EXPECT_EQ(total, 1);
}

// Regression: a lease taken over from a stale holder could end up held by
// two processes: a contender that judged the stale file renamed away the
// fresh lease another contender had just created in its place.
TEST(SingleFlightRegression, StaleFileLeaseTakeoverHasOneWinner) {
  TempDir d;
  const int rounds = kSanitized ? 100 : 600, contenders = 6;
  int doubles = 0;
  for (int r = 0; r < rounds; ++r) {
    Key k = key_of(1000 + r);
    auto env = std::make_shared<test::FaultEnv>();
    auto old = *open_file_leases(d.path(), env);
    ASSERT_EQ(old->acquire(k, 1), LeaseResult::acquired);  // expires at once
    env->advance(2);
    std::vector<std::shared_ptr<Leases>> ls;
    for (int c = 0; c < contenders; ++c) ls.push_back(*open_file_leases(d.path(), env));
    std::atomic<int> winners{0}, go{0};
    std::vector<std::thread> th;
    for (int c = 0; c < contenders; ++c)
      th.emplace_back([&, c] {
        while (!go.load()) {}
        if (ls[c]->acquire(k, 60000) == LeaseResult::acquired) ++winners;
      });
    go = 1;
    for (auto& t : th) t.join();
    if (winners.load() > 1) ++doubles;
  }
  EXPECT_EQ(doubles, 0) << "rounds with two holders of one lease";
}

// Regression: a forked child counted as the holder of its parent's lease
// (same Leases object, same token).
TEST_P(SingleFlight, ForkedChildDoesNotInheritLeases) {
  auto l = leases_for(GetParam(), dir_.path());
  Key k = key_of(77);
  ASSERT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
  pid_t pid = spawn([&] {
    if (GetParam() == "lmdb") return 0;  // an LMDB handle may not be used after fork at all
    return l->acquire(k, 60000) == LeaseResult::busy ? 0 : 1;
  });
  EXPECT_EQ(wait_exit(pid), 0);
}

// Regression: while waiting for another process's compile, every poll was
// a counted lookup (hundreds of misses for one request).
TEST_P(SingleFlight, WaitingCountsOneMiss) {
  KeyInfo k = *KeyBuilder("sf").add_string("what", "miss-count").finish();
  Signal release;
  pid_t holder = spawn_holder(dir_.path(), GetParam(), k, release, "held");
  ASSERT_GT(holder, 0);
  auto c = Cache::open(opts(dir_.path(), GetParam()));
  Source s;
  auto e = [&] {
    // The holder finishes once this cache waits on its lease.
    OnLeaseWait on_wait(*c, [&] { release.post(); });
    return c->get_or_compile(
        k,
        []() -> Expected<std::vector<Artifact>> {
          return std::vector<Artifact>{{"obj", "waiter"}};
        },
        &s);
  }();
  release.post();  // had the wait never come
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e->artifact("obj"), "held");
  EXPECT_EQ(s, Source::waited);
  auto st = c->stats();
  EXPECT_EQ(st.compiles, 0u);
  EXPECT_EQ(st.lease_waits, 1u);
  EXPECT_LE(st.misses, 2u);  // the first lookup and the re-check in the flight
  EXPECT_EQ(wait_exit(holder), 0);
}

// Several processes put past the size limit of one store at once. Afterwards
// the store is within its limit, verifies clean, and its counters agree with
// a fresh walk of what is stored. While they put (8 processes x 4 threads),
// no writer ever sees an LMDB store over its limit, nor a files store over
// it by more than one group per process; a put never waits for the
// whole of another process's eviction; an evictor killed with SIGKILL in
// the middle of its work is taken over by the next writer at once.
// KCACHE_TEST_TRIALS sets the puts per thread of the
// 8 x 4 run (default 32, rounded up to whole groups of 4):
//   KCACHE_TEST_TRIALS=200 build/tests/tier/disk_eviction_multiprocess_test
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>

#include <atomic>
#include <thread>

#include "fault_env.h"
#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr int kProcs = 6;

DiskTierOptions options() {
  DiskTierOptions o;
  o.max_bytes = 4 << 20;
  o.max_entry_bytes = 256 << 10;
  o.durability = Durability::none;
  return o;
}

size_t size_for(uint64_t k) { return 20000 + (k * 7919) % 40000; }

class DiskEvictionMultiProcess : public ::testing::TestWithParam<DiskEngine> {
 protected:
  TempDir dir_;
};

}  // namespace

TEST_P(DiskEvictionMultiProcess, ConcurrentPutsPastTheLimitStayWithinItAndCountersAgree) {
  const DiskEngine& eng = GetParam();
  std::string dir = dir_.path() + "/store";
  const int per_proc = trials(150, 40);
  std::vector<pid_t> pids;
  fflush(nullptr);
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto t = eng.open(dir, options());
      if (!t) _exit(2);
      for (int i = 0; i < per_proc; ++i) {
        uint64_t k = uint64_t(p) * 100000 + i;
        if (!(*t)->put(make_entry(k, size_for(k))).is_ok()) _exit(3);
        // Reads move recency while others evict.
        auto g = (*t)->get(key_of(uint64_t(p) * 100000 + i / 2));
        if (g && g->has_value() && !entry_ok(**g, uint64_t(p) * 100000 + i / 2, size_for(uint64_t(p) * 100000 + i / 2)))
          _exit(4);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int ws = 0;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  }
  auto t = eng.open(dir, options());
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  Tier& tier = **t;
  auto s = tier.stats();
  Walk w = walk(tier);
  printf("[ %s ] %d processes x %d puts of 20-60 KB into 4 MiB: %llu entries, %llu bytes, %llu evictions\n",
         eng.name.c_str(), kProcs, per_proc, (unsigned long long)w.entries, (unsigned long long)w.bytes,
         (unsigned long long)s.evictions);
  EXPECT_LE(s.bytes, options().max_bytes);
  EXPECT_LE(w.bytes, options().max_bytes);
  EXPECT_EQ(s.entries, w.entries);
  EXPECT_EQ(s.bytes, w.bytes);
  EXPECT_GE(s.evictions, uint64_t(kProcs) * per_proc - w.entries) << "entries vanished without being counted";
  EXPECT_GT(w.entries, 0u);
  EXPECT_EQ(s.puts, uint64_t(kProcs) * per_proc);
  auto v = tier.admin()->verify(false);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->checked, w.entries);
  EXPECT_TRUE(v->bad.empty());
}

// The files engine's one evictor at a time is an exclusive flock(2) of
// `evict.lock`: while a live process holds it, others do not evict to the
// low-water mark but do not wait for it either (each put makes its own
// room, so the store stays within its limit); when the holder dies, even
// by SIGKILL, the kernel drops the lock and the next writer evicts at once.
TEST(FilesEvictorLock, ALiveHolderBlocksEvictionADeadOneIsFollowedAtOnce) {
  TempDir td;
  const std::string dir = td.path() + "/store";
  DiskTierOptions o = options();
  o.max_bytes = 1 << 20;
  auto t = open_files_tier(dir, o);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  // Another process takes the evictor's lock and keeps it until killed.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = ::open((dir + "/evict.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) _exit(2);
    (void)!::write(ready[1], "x", 1);
    for (;;) ::pause();
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  uint64_t k = 0;
  for (; k < 40; ++k) ASSERT_TRUE((*t)->put(make_entry(k, 50000)).is_ok());
  // Only the room each put needed: just under the limit, not at 80% of it.
  EXPECT_LE((*t)->stats().bytes, uint64_t(1) << 20);
  EXPECT_GT((*t)->stats().bytes, (uint64_t(1) << 20) - 2 * 51000) << "evicted to the low-water mark without the lock";
  auto trimmed = (*t)->admin()->trim(0);
  ASSERT_TRUE(trimmed.has_value());
  EXPECT_EQ(*trimmed, 0u) << "trimmed while another process held the evictor's lock";

  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int ws = 0;
  ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
  ::close(ready[0]);
  ::close(ready[1]);
  trimmed = (*t)->admin()->trim(0);
  ASSERT_TRUE(trimmed.has_value());
  EXPECT_GT(*trimmed, 0u) << "a killed evictor's lock kept others from evicting";
  EXPECT_EQ(walk(**t).entries, 0u);
  auto v = (*t)->admin()->verify(false);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_TRUE(v->bad.empty());
}

int env_trials(int dflt) {
  const char* v = std::getenv("KCACHE_TEST_TRIALS");
  int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : dflt;
}

// 8 processes of 4 threads put 20-60 KB entries into an 8 MiB store, each
// reading the store's size after every put of its own. The largest size any
// of them saw stays within the limit (LMDB) or the limit plus one group per
// process (the files engine; a group here is 4 entries of at most 60 KB,
// put with put_many as the committer does): writers make their own room,
// and none goes on putting while another process is left to catch up.
TEST_P(DiskEvictionMultiProcess, EightProcessesOfFourThreadsNeverSeeTheStoreOverItsLimitByMoreThanOneGroup) {
  const DiskEngine& eng = GetParam();
  constexpr int kP = 8, kT = 4, kGroupEntries = 4;
  std::string dir = dir_.path() + "/store";
  DiskTierOptions o = options();
  o.max_bytes = 8 << 20;
  const int per_thread = (env_trials(test::trials(32, 8)) + kGroupEntries - 1) / kGroupEntries * kGroupEntries;
  // The largest size seen, shared by the forked writers.
  auto* seen = static_cast<std::atomic<uint64_t>*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(seen, MAP_FAILED);
  new (seen) std::atomic<uint64_t>(0);
  {
    auto t = eng.open(dir, o);  // made once, before the writers race to make it
    ASSERT_TRUE(t.has_value()) << t.error().to_string();
  }
  std::vector<pid_t> pids;
  fflush(nullptr);
  for (int p = 0; p < kP; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto t = eng.open(dir, o);
      if (!t) _exit(2);
      std::atomic<int> bad{0};
      std::vector<std::thread> threads;
      for (int th = 0; th < kT; ++th)
        threads.emplace_back([&, th] {
          for (int i = 0; i < per_thread; i += kGroupEntries) {
            // A group, as the committer hands one over (Tier::put_many).
            std::vector<Entry> group;
            for (int j = i; j < i + kGroupEntries; ++j) {
              uint64_t k = uint64_t(p) * 1'000'000 + uint64_t(th) * 10'000 + j;
              group.push_back(make_entry(k, size_for(k)));
            }
            for (const Status& st : (*t)->put_many(group))
              if (!st.is_ok() && bad.fetch_add(1) == 0) fprintf(stderr, "put: %s\n", st.to_string().c_str());
            uint64_t b = (*t)->stats().bytes, cur = seen->load();
            while (b > cur && !seen->compare_exchange_weak(cur, b)) {}
          }
        });
      for (auto& th : threads) th.join();
      _exit(bad.load() ? 3 : 0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int ws = 0;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  }
  const uint64_t max_seen = seen->load();
  ::munmap(seen, 4096);
  constexpr uint64_t kGroup = kGroupEntries * (60'000 + 4096);  // the largest group, encoded
  auto t = eng.open(dir, o);
  ASSERT_TRUE(t.has_value());
  Walk w = walk(**t);
  printf(
      "[ %s ] %d x %d writers, %d puts each in groups of 4, limit %llu bytes: largest size seen %llu, at the end "
      "%llu\n",
      eng.name.c_str(), kP, kT, per_thread, (unsigned long long)o.max_bytes, (unsigned long long)max_seen,
      (unsigned long long)w.bytes);
  // LMDB evicts inside the group's own transaction: no commit leaves the
  // store over its limit at all (a group smaller than the limit). A
  // files-engine writer makes its room in the same hold of the counters'
  // lock as it publishes, from candidates of its own last walk; when another
  // process removed all of those meanwhile it publishes first and walks
  // after: one group per writing process at most.
  const uint64_t bound = o.max_bytes + (eng.name == "lmdb" ? 0 : kP * kGroup);
  EXPECT_LE(max_seen, bound) << "the store went over its limit by more than it may";
  EXPECT_LE(w.bytes, o.max_bytes);
  EXPECT_EQ((*t)->stats().bytes, w.bytes);
}

// Puts `n` entries of `bytes` into a files store in `dir`, then forks a
// process that trims the store to nothing with each unlink taking
// `unlink_us`; it exits 0 when it removed them all. Its pid, or -1.
pid_t fill_then_trim_slowly(const std::string& dir, const DiskTierOptions& o, int n, size_t bytes, unsigned unlink_us) {
  {
    auto t = open_files_tier(dir, o);
    if (!t) return -1;
    for (int k = 0; k < n; ++k)
      if (!(*t)->put(make_entry(static_cast<uint64_t>(k), bytes)).is_ok()) return -1;
  }
  fflush(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  auto env = std::make_shared<FaultEnv>();
  env->manual_clock = false;
  env->unlink_delay_us = unlink_us;
  DiskTierOptions eo = o;
  eo.env = env;
  auto t = open_files_tier(dir, eo);
  if (!t) _exit(2);
  auto r = (*t)->admin()->trim(0);
  _exit(r && *r >= static_cast<uint64_t>(n) ? 0 : 3);
}

// The files engine's evictor gives the counters' lock back between batches:
// while another process removes hundreds of files (each unlink made slow),
// puts go in between its batches instead of waiting for all of them.
TEST(FilesEviction, NoPutWaitsForAnotherProcesssWholeEviction) {
  TempDir td;
  const std::string dir = td.path() + "/store";
  DiskTierOptions o = options();
  o.max_bytes = 1ull << 30;
  constexpr int kFiles = 800;
  // 800 files, each unlink 2 ms: 1.6 s of eviction.
  pid_t pid = fill_then_trim_slowly(dir, o, kFiles, 200, 2000);
  ASSERT_GT(pid, 0);
  auto t = open_files_tier(dir, o);
  ASSERT_TRUE(t.has_value());
  // Until the evictor's first batch is stored.
  for (int i = 0; i < 10'000 && (*t)->stats().evictions == 0; ++i) ::usleep(1000);
  ASSERT_GT((*t)->stats().evictions, 0u) << "the evictor never started";
  std::vector<uint64_t> evicted_at_return;
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE((*t)->put(make_entry(100'000 + k, 200)).is_ok());
    evicted_at_return.push_back((*t)->stats().evictions);
  }
  int ws = 0;
  ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  const uint64_t total = (*t)->stats().evictions;
  for (size_t i = 0; i < evicted_at_return.size(); ++i)
    EXPECT_LT(evicted_at_return[i], uint64_t(kFiles))
        << "put " << i << " returned only after the other process's whole eviction (" << total << " files)";
}

// An evictor killed (SIGKILL) in the middle of its removals holds the
// evictor's lock when it dies; the kernel drops it, and the next writer
// over the limit evicts at once.
TEST(FilesEviction, AnEvictorKilledMidEvictionIsTakenOverByTheNextWriterAtOnce) {
  TempDir td;
  const std::string dir = td.path() + "/store";
  DiskTierOptions o = options();
  o.max_bytes = 1ull << 30;
  constexpr int kFiles = 400;
  // Each unlink 20 ms, 8 s for all: it is killed long before.
  pid_t pid = fill_then_trim_slowly(dir, o, kFiles, 2000, 20'000);
  ASSERT_GT(pid, 0);
  DiskTierOptions small = o;
  small.max_bytes = 200'000;
  auto t = open_files_tier(dir, small);
  ASSERT_TRUE(t.has_value());
  for (int i = 0; i < 10'000 && (*t)->stats().evictions == 0; ++i) ::usleep(1000);
  ASSERT_GT((*t)->stats().evictions, 0u) << "the evictor never started";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int ws = 0;
  ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(ws)) << describe_wait(ws);
  const uint64_t before = (*t)->stats().evictions;
  ASSERT_LT(before, uint64_t(kFiles) / 2) << "the evictor got too far before it was killed";
  ASSERT_TRUE((*t)->put(make_entry(100'000, 2000)).is_ok());
  EXPECT_GT((*t)->stats().evictions, before) << "the dead evictor's lock kept the next writer from evicting";
  EXPECT_LE((*t)->stats().bytes, small.max_bytes);
}

// Writers killed over and over, often in the middle of an eviction (each
// unlink made slow, a trim every 5 puts): the store never grows past its
// limit by more than a few entries, and the evictor's lock a killed writer
// held is free at once (a last trim to nothing empties the store).
// KCACHE_TEST_TRIALS sets the number of kills (default 20).
TEST(FilesEviction, RepeatedlyKilledWritersLeaveTheStoreWithinItsLimit) {
  TempDir td;
  const std::string dir = td.path() + "/store";
  DiskTierOptions o = options();
  o.max_bytes = 300'000;
  constexpr size_t kSize = 10'000;
  const int kills = env_trials(test::trials(20, 5));
  uint64_t most = 0, killed_evicting = 0;
  for (int trial = 0; trial < kills; ++trial) {
    fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto env = std::make_shared<FaultEnv>();
      env->manual_clock = false;
      env->unlink_delay_us = 1000;
      DiskTierOptions eo = o;
      eo.env = env;
      auto t = open_files_tier(dir, eo);
      if (!t) _exit(2);
      for (uint64_t k = uint64_t(trial) * 100'000;; ++k) {
        (void)(*t)->put(make_entry(k, kSize));
        if (k % 5 == 4) (void)(*t)->admin()->trim(o.max_bytes / 2);  // takes the evictor's lock
      }
    }
    ::usleep(static_cast<useconds_t>(20'000 + (trial * 7919) % 60'000));
    // Killed while evicting when the evictor's lock is taken.
    bool evicting = false;
    if (int fd = ::open((dir + "/evict.lock").c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      evicting = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
      ::close(fd);
    }
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int ws = 0;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    killed_evicting += evicting;
    auto t = open_files_tier(dir, o);
    ASSERT_TRUE(t.has_value());
    most = std::max(most, walk(**t).bytes);
  }
  auto t = open_files_tier(dir, o);
  ASSERT_TRUE(t.has_value());
  ASSERT_TRUE((*t)->put(make_entry(999'999'999, kSize)).is_ok());
  Walk w = walk(**t);
  // No dead holder keeps the evictor's lock: a trim to nothing empties it.
  auto trimmed = (*t)->admin()->trim(0);
  ASSERT_TRUE(trimmed.has_value()) << trimmed.error().to_string();
  EXPECT_EQ(walk(**t).entries, 0u) << "the evictor's lock of a killed writer was not dropped";
  printf(
      "[ files ] %d writers killed (%llu holding the evictor's lock): largest store %llu bytes, after one "
      "more put %llu (limit %llu)\n",
      kills, (unsigned long long)killed_evicting, (unsigned long long)most, (unsigned long long)w.bytes,
      (unsigned long long)o.max_bytes);
  EXPECT_LE(most, o.max_bytes + 4 * (kSize + 4096)) << "the store grew past its limit under repeated kills";
  EXPECT_LE(w.bytes, o.max_bytes);
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskEvictionMultiProcess, ::testing::ValuesIn(disk_engines()), disk_engine_name);

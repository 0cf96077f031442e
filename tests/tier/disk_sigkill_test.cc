// SIGKILL a writer at random instants, hundreds of times, on one store.
//
// Each trial forks one child that opens the store and puts entries of random
// sizes (some 1-4 MiB, so kills land inside long copies and commits); after
// every put that returned OK it reports the key through a pipe before going
// on. The parent kills it after a random number of microseconds, then opens
// the store: verify(false) must find nothing bad, and every reported entry
// must read back identical. The folder is reused across trials, so the store
// grows and kills hit a store with history (dead readers, dead lock holders,
// orphan temp files).
//
// A second suite kills three writers and a reader at random instants, then
// opens the store in a new process under a watchdog: the open, a read and a
// put must end in bounded time, whatever lock a dead process held.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "cache/assembly.h"
#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

struct Record {
  uint64_t id;
  uint64_t size;
};

size_t random_size(std::mt19937_64& rng) {
  if (rng() % 8 == 0) return (1u << 20) + rng() % (3u << 20);  // 1-4 MiB
  return 64 + rng() % 16384;
}

DiskTierOptions options(bool sync) {
  DiskTierOptions o;
  o.max_bytes = uint64_t(2) << 30;  // no eviction: every committed entry must stay
  o.max_entry_bytes = uint64_t(8) << 20;
  // A process kill loses nothing whether or not commits are synced; most
  // stores skip fsync so that a trial takes a few milliseconds.
  o.durability = sync ? Durability::normal : Durability::none;
  return o;
}

// The child: put entries until killed, reporting each committed one.
[[noreturn]] void writer(const DiskEngine& eng, const std::string& dir, bool sync, uint64_t base, uint64_t seed,
                         int fd) {
  auto t = eng.open(dir, options(sync));
  if (!t) _exit(3);
  std::mt19937_64 rng(seed);
  std::vector<Record> mine;
  for (uint64_t j = 0;; ++j) {
    Record r{base + j, random_size(rng)};
    if (!mine.empty() && rng() % 8 == 0) r = mine[rng() % mine.size()];  // replace an entry: same bytes again
    Status st = (*t)->put(make_entry(r.id, r.size));
    if (!st.is_ok()) _exit(4);
    mine.push_back(r);
    if (!write_all(fd, &r, sizeof r)) _exit(5);
    if (j > 200) _exit(0);  // never reached in practice; bounds a child the parent forgot
  }
}

class DiskSigkill : public ::testing::TestWithParam<DiskEngine> {
 protected:
  TempDir dir_;
};

}  // namespace

TEST_P(DiskSigkill, KilledWriterLeavesNoTornEntryAndLosesNothingCommitted) {
  const DiskEngine& eng = GetParam();
  const int kTrials = trials(400, 40);
  const int kWindow = 40;  // trials that share one store before it is started afresh
  std::mt19937_64 rng(20240601);
  std::map<uint64_t, uint64_t> committed;  // id -> size, in the current store
  int store_no = 0;
  std::string dir;
  bool sync = false;
  uint64_t total_committed = 0, killed_mid_run = 0, child_exits = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    if (trial % kWindow == 0) {
      sync = store_no % 3 == 2;
      dir = dir_.path() + "/store" + std::to_string(store_no++);
      committed.clear();
    }
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    uint64_t base = uint64_t(trial) * 1000;
    fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(p[0]);
      writer(eng, dir, sync, base, rng(), p[1]);
    }
    ::close(p[1]);
    // Kills land from before the store is open to well inside large puts.
    // Sanitized builds start and write about ten times slower: give the
    // writer ten times as long, or it is killed before its first commit.
    ::usleep(static_cast<useconds_t>(rng() % static_cast<uint64_t>(trials(12000, 120000))));
    ::kill(pid, SIGKILL);
    int ws = 0;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL) {
      ++killed_mid_run;
    } else {
      ++child_exits;
      ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
          << "trial " << trial << ": writer failed, " << describe_wait(ws);
    }
    Record r;
    ssize_t n;
    std::vector<Record> got;
    while ((n = ::read(p[0], &r, sizeof r)) == sizeof r) got.push_back(r);
    ASSERT_EQ(n, 0) << "short record in the pipe";
    ::close(p[0]);
    for (const auto& x : got) committed[x.id] = x.size;
    total_committed += got.size();

    auto t = eng.open(dir, options(sync));
    ASSERT_TRUE(t.has_value()) << "trial " << trial << ": store does not open: " << t.error().to_string();
    Tier& tier = **t;
    auto v = tier.admin()->verify(false);
    ASSERT_TRUE(v.has_value()) << v.error().to_string();
    ASSERT_TRUE(v->bad.empty()) << "trial " << trial << ": torn entry: " << v->bad.front().second;
    EXPECT_GE(v->checked, committed.size());
    // Reading back everything each trial costs O(store); new entries every
    // trial, the whole store at the end of each window.
    bool all = trial % kWindow == kWindow - 1 || trial == kTrials - 1;
    for (const auto& [id, size] : committed) {
      if (!all && id < base) continue;
      auto g = tier.get(key_of(id));
      ASSERT_TRUE(g.has_value()) << "trial " << trial << ": " << g.error().to_string();
      ASSERT_TRUE(g->has_value()) << "trial " << trial << ": committed entry " << id << " lost";
      ASSERT_TRUE(entry_ok(**g, id, size)) << "trial " << trial << ": entry " << id << " differs";
    }
    // An entry being written when the kill came is either absent or whole
    // (verify above); at most one such entry per kill may appear unreported.
    Walk w = walk(tier);
    EXPECT_GE(w.entries, committed.size());
    EXPECT_LE(w.entries, committed.size() + static_cast<uint64_t>(trial % kWindow + 1))
        << "more than one in-flight put per kill appeared";
    if (eng.name == "lmdb") {
      // LMDB commits counters with the entry, so they are exact after a kill.
      auto s = tier.stats();
      EXPECT_EQ(s.entries, w.entries) << "trial " << trial;
      EXPECT_EQ(s.bytes, w.bytes) << "trial " << trial;
    }
    ASSERT_FALSE(HasFatalFailure());
  }
  printf("[ %s ] %d SIGKILL trials (%llu killed mid-run, %llu writers finished), %llu committed puts checked\n",
         eng.name.c_str(), kTrials, (unsigned long long)killed_mid_run, (unsigned long long)child_exits,
         (unsigned long long)total_committed);
  EXPECT_GE(killed_mid_run, static_cast<uint64_t>(kTrials) * 9 / 10);
  EXPECT_GT(total_committed, static_cast<uint64_t>(kTrials));
}

namespace {

Engine engine_of(const DiskEngine& e) { return e.name == "lmdb" ? Engine::lmdb : Engine::files; }

// The store in `dir` with its leases, as Cache::open opens it.
Expected<DiskStore> open_store(Engine engine, const std::string& dir, bool sync) {
  DiskStoreSpec spec;
  spec.dir = dir;
  spec.engine = engine;
  spec.tier = options(sync);
  return open_disk_store(spec);
}

// A writer (puts under a lease, as a compile would) or a reader (gets),
// through the same assembly as Cache::open, until killed.
[[noreturn]] void worker(Engine engine, const std::string& dir, bool sync, bool reader, uint64_t base, uint64_t seed) {
  allow_tracing();
  auto store = open_store(engine, dir, sync);
  if (!store) _exit(3);
  std::mt19937_64 rng(seed);
  for (uint64_t j = 0; j < 100000; ++j) {
    if (reader) {
      (void)store->tier->get(key_of(rng() % (base + 1)));
      continue;
    }
    Key k = key_of(base + j);
    bool held = store->leases && store->leases->acquire(k, 5000) == LeaseResult::acquired;
    (void)store->tier->put(make_entry(base + j, 64 + rng() % 16384));
    if (held) store->leases->release(k);
  }
  _exit(0);
}

// Opens the store as a new process would, reads, puts and reads back.
// Exit status: 0 done, 2 open failed, 3 put failed, 4 read back wrong,
// 5 the leases failed.
int open_after_kills(Engine engine, const std::string& dir, bool sync, uint64_t probe) {
  auto store = open_store(engine, dir, sync);
  if (!store) return 2;
  (void)store->tier->get(key_of(1));
  if (store->leases && store->leases->acquire(key_of(probe), 5000) == LeaseResult::error) return 5;
  if (!store->tier->put(make_entry(probe, 3000)).is_ok()) return 3;
  if (store->leases) store->leases->release(key_of(probe));
  auto g = store->tier->get(key_of(probe));
  if (!g || !g->has_value() || !entry_ok(**g, probe, 3000)) return 4;
  return 0;
}

}  // namespace

TEST_P(DiskSigkill, OpenAfterKillingEveryWriterAndReaderNeverWaits) {
  const DiskEngine& eng = GetParam();
  const Engine engine = engine_of(eng);
  const int kTrials = trials(1000, 100);
  const int kWindow = 50;  // trials that share one store
  const uint64_t kMaxKillUs = static_cast<uint64_t>(trials(25000, 250000));
  const int kLimitMs = trials(15000, 120000);
  std::mt19937_64 rng(20261123);
  std::string dir;
  bool sync = false;
  pid_t bystander = -1;
  int hangs = 0, failed = 0, with_bystander = 0, store_no = 0;
  std::map<std::string, int> failures;
  std::vector<double> open_ms;  // wall time of each opening process
  auto stop_bystander = [&] {
    if (bystander > 0) {
      ::kill(bystander, SIGKILL);
      ::waitpid(bystander, nullptr, 0);
      bystander = -1;
    }
  };
  for (int trial = 0; trial < kTrials; ++trial) {
    if (trial % kWindow == 0) {
      stop_bystander();
      sync = store_no % 4 == 3;
      dir = dir_.path() + "/kill" + std::to_string(store_no++);
      if (store_no % 2 == 0) {
        // A process that keeps the store open and idle: the lock file is
        // then never set up afresh by the next opener, so locks the killed
        // processes held must be got back from the dead, not re-created.
        fflush(nullptr);
        bystander = ::fork();
        ASSERT_GE(bystander, 0);
        if (bystander == 0) {
          auto store = open_store(engine, dir, false);
          if (!store) _exit(3);
          for (;;) ::pause();
        }
      }
    }
    with_bystander += bystander > 0;
    pid_t pids[4];
    uint64_t base = uint64_t(trial + 1) * 100000;
    fflush(nullptr);
    for (int w = 0; w < 4; ++w) {
      uint64_t seed = rng();
      pids[w] = ::fork();
      ASSERT_GE(pids[w], 0);
      if (pids[w] == 0) worker(engine, dir, sync, /*reader=*/w == 3, base + uint64_t(w) * 10000, seed);
    }
    // Each process dies at its own instant, from before its store is open
    // to the middle of puts and commits.
    uint64_t at[4];
    for (auto& a : at) a = 1000 + rng() % kMaxKillUs;
    std::vector<std::pair<uint64_t, int>> order;
    for (int w = 0; w < 4; ++w) order.emplace_back(at[w], w);
    std::sort(order.begin(), order.end());
    uint64_t slept = 0;
    for (const auto& [t, w] : order) {
      ::usleep(static_cast<useconds_t>(t - slept));
      slept = t;
      ::kill(pids[w], SIGKILL);
    }
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
    uint64_t probe = base + 90000;
    auto t0 = std::chrono::steady_clock::now();
    int ws = run_child_bounded([&] { return open_after_kills(engine, dir, sync, probe); }, kLimitMs,
                               eng.name + " open after SIGKILL, trial " + std::to_string(trial));
    open_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (ws == -1) {
      ++hangs;
    } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
      ++failed;
      ++failures[describe_wait(ws)];
    }
    if (hangs + failed > 5) break;  // enough to see what goes wrong
  }
  stop_bystander();
  printf("[ %s ] %d open-after-SIGKILL trials (%d with a process keeping the store open): %d hangs, %d failed\n",
         eng.name.c_str(), kTrials, with_bystander, hangs, failed);
  for (const auto& [why, n] : failures) printf("    %d x %s\n", n, why.c_str());
  std::sort(open_ms.begin(), open_ms.end());
  if (!open_ms.empty())
    printf("    opening process (fork, open, get, put, get, exit): median %.1f ms, max %.1f ms\n",
           open_ms[open_ms.size() / 2], open_ms.back());
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(failed, 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskSigkill, ::testing::ValuesIn(disk_engines()), disk_engine_name);

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
#include <gtest/gtest.h>
#include <fcntl.h>

#include <map>
#include <random>

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
      ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << "trial " << trial << ": writer failed, " << describe_wait(ws);
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
    auto v = tier.verify(false);
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

INSTANTIATE_TEST_SUITE_P(Engines, DiskSigkill, ::testing::ValuesIn(disk_engines()), disk_engine_name);

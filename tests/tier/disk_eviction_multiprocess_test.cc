// Several processes put past the size limit of one store at once. Afterwards
// the store is within its limit, verifies clean, and its counters agree with
// a fresh walk of what is stored.
#include <gtest/gtest.h>

#include "kcache/lease.h"
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

// The files engine's one evictor at a time is a lease of the store's leases
// (lease/file_leases.cc) on a fixed key: a live holder keeps others from
// evicting, and one that died holding it is taken over at once, judged by
// its PID and start time, not by the age of a file.
TEST(FilesEvictorLease, ALiveHolderBlocksEvictionADeadOneIsTakenOver) {
  TempDir td;
  const std::string dir = td.path() + "/store";
  DiskTierOptions o = options();
  o.max_bytes = 1 << 20;
  const Key evictor = KeyBuilder("kcache/files-evictor").finish()->key;
  auto t = open_files_tier(dir, o);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  auto holder = open_file_leases(dir);
  ASSERT_TRUE(holder.has_value()) << holder.error().to_string();
  ASSERT_EQ((*holder)->acquire(evictor, 600'000), LeaseResult::acquired);
  uint64_t k = 0;
  for (; k < 40; ++k) ASSERT_TRUE((*t)->put(make_entry(k, 50000)).is_ok());
  EXPECT_GT((*t)->stats().bytes, uint64_t(1) << 20) << "evicted while another held the evictor lease";
  EXPECT_EQ((*t)->stats().evictions, 0u);
  (*holder)->release(evictor);
  ASSERT_TRUE((*t)->put(make_entry(k++, 50000)).is_ok());
  EXPECT_LE((*t)->stats().bytes, uint64_t(1) << 20);
  const uint64_t evicted = (*t)->stats().evictions;
  EXPECT_GT(evicted, 0u);

  // A holder that dies with the lease (a long TTL, never released).
  int ws = run_child([&] {
    auto l = open_file_leases(dir);
    return l && (*l)->acquire(evictor, 600'000) == LeaseResult::acquired ? 0 : 1;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE((*t)->put(make_entry(k++, 50000)).is_ok());
  EXPECT_LE((*t)->stats().bytes, uint64_t(1) << 20) << "a dead evictor's lease was not taken over";
  EXPECT_GT((*t)->stats().evictions, evicted);
  auto v = (*t)->admin()->verify(false);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_TRUE(v->bad.empty());
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskEvictionMultiProcess, ::testing::ValuesIn(disk_engines()), disk_engine_name);

// Eight processes write and read the same keys of one disk store at once.
// Every read must be a miss or the complete, correct entry, and at the end
// the store holds exactly one entry per key, with counters that agree.
#include <gtest/gtest.h>

#include <random>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr int kProcs = 8;
constexpr uint64_t kKeys = 64;

size_t size_for(uint64_t k) {
  if (k % 16 == 5) return (1u << 20) + k;  // a few entries past LMDB's page-sized values
  return 100 + (k * 7919) % 40000;
}

class DiskMultiProcess : public ::testing::TestWithParam<DiskEngine> {
 protected:
  TempDir dir_;
};

// Child body: puts and gets in a random order; returns 0 when every read was
// a miss or the right bytes, 1 on wrong bytes, 2 on a fault.
int child(const DiskEngine& eng, const std::string& dir, int id, int rounds) {
  auto t = eng.open(dir, {});
  if (!t) {
    fprintf(stderr, "child %d: open: %s\n", id, t.error().to_string().c_str());
    return 2;
  }
  std::mt19937_64 rng(id * 977 + 1);
  std::vector<uint64_t> order(kKeys);
  for (uint64_t i = 0; i < kKeys; ++i) order[i] = i;
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (uint64_t k : order) {
      if (rng() % 2 == 0 || r == 0) {
        Status st = (*t)->put(make_entry(k, size_for(k)));
        if (!st.is_ok()) {
          fprintf(stderr, "child %d: put %llu: %s\n", id, (unsigned long long)k, st.to_string().c_str());
          return 2;
        }
      }
      auto g = (*t)->get(key_of(rng() % kKeys));
      if (!g) {
        fprintf(stderr, "child %d: get: %s\n", id, g.error().to_string().c_str());
        return 2;
      }
      if (g->has_value()) {
        const Entry& e = **g;
        uint64_t want = kKeys;
        for (uint64_t i = 0; i < kKeys; ++i)
          if (e.key() == key_of(i)) want = i;
        if (want == kKeys || !entry_ok(e, want, size_for(want))) {
          fprintf(stderr, "child %d: wrong bytes\n", id);
          return 1;
        }
      }
    }
  }
  return 0;
}

}  // namespace

TEST_P(DiskMultiProcess, SameKeysFromEightProcesses) {
  const DiskEngine& eng = GetParam();
  std::string dir = dir_.path() + "/store";
  const int rounds = trials(6, 2);
  std::vector<pid_t> pids;
  fflush(nullptr);
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(child(eng, dir, p, rounds));
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int ws = 0;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << "child " << pid << ": " << describe_wait(ws);
  }

  auto t = eng.open(dir, {});
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  Tier& tier = **t;
  for (uint64_t k = 0; k < kKeys; ++k) {
    auto g = tier.get(key_of(k));
    ASSERT_TRUE(g.has_value()) << g.error().to_string();
    ASSERT_TRUE(g->has_value()) << "key " << k << " missing";
    EXPECT_TRUE(entry_ok(**g, k, size_for(k))) << "key " << k;
  }
  Walk w = walk(tier);
  EXPECT_EQ(w.entries, kKeys);
  auto s = tier.stats();
  EXPECT_EQ(s.entries, kKeys) << "entry counter drifted from the store";
  EXPECT_EQ(s.bytes, w.bytes) << "byte counter drifted from the store";
  EXPECT_EQ(s.corrupt, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_GE(s.puts, kProcs * kKeys);
  auto v = tier.admin()->verify(false);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->checked, kKeys);
  EXPECT_TRUE(v->bad.empty()) << v->bad.front().second;
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskMultiProcess, ::testing::ValuesIn(disk_engines()), disk_engine_name);

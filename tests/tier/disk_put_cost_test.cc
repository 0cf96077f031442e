// With 20,000 entries stored, a put touches its own records, not the store:
// no walk runs on a put below the limit; past the limit an LMDB put removes
// its own room in its transaction (visiting its victims only), and the
// files engine walks once and makes the room of many puts from that walk.
// Asserted on the engines' visit counters, not on time.
#include <gtest/gtest.h>

#include <filesystem>

#include "robust_util.h"
#include "tier/files/files_probe.h"
#if KCACHE_HAVE_LMDB
#include "tier/lmdb/lmdb_env.h"
#endif

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr uint64_t kStored = 20000;

uint64_t visited(const std::string& engine) {
#if KCACHE_HAVE_LMDB
  if (engine == "lmdb") return lmdb_records_visited();
#endif
  return files_entries_visited();
}

class DiskPutCost : public ::testing::TestWithParam<DiskEngine> {
 protected:
  void SetUp() override {
    // 20,000 small files cost seconds to create on a busy disk and
    // milliseconds on tmpfs; the put path does not depend on which.
    char t[] = "/dev/shm/kcache-putcost-XXXXXX";
    dir_ = ::mkdtemp(t) ? std::string(t) : fallback_.path();
  }
  void TearDown() override {
    std::error_code ec;
    if (dir_.rfind("/dev/shm/", 0) == 0) std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
  TempDir fallback_;
};

}  // namespace

TEST_P(DiskPutCost, PutDoesNotScanTheStore) {
  const DiskEngine& eng = GetParam();
  DiskTierOptions o;
  o.max_entries = kStored;
  o.durability = Durability::none;
  auto t = eng.open(dir_ + "/store", o);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  Tier& tier = **t;
  for (uint64_t i = 0; i < kStored; ++i) ASSERT_TRUE(tier.put(make_entry(i, 64)).is_ok());
  ASSERT_EQ(tier.stats().entries, kStored);

  // Below the limit (replacing stored keys): no walk at all.
  uint64_t before = visited(eng.name);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_TRUE(tier.put(make_entry(i * 7, 64)).is_ok());
  EXPECT_EQ(visited(eng.name) - before, 0u) << "a put below the limit walked the store";

  // Past the limit: 4,000 new keys.
  const uint64_t kNew = 4000;
  uint64_t walking_puts = 0, most = 0;
  before = visited(eng.name);
  for (uint64_t i = 0; i < kNew; ++i) {
    uint64_t v0 = visited(eng.name);
    ASSERT_TRUE(tier.put(make_entry(kStored + i, 64)).is_ok());
    uint64_t d = visited(eng.name) - v0;
    walking_puts += d > 0;
    most = std::max(most, d);
  }
  uint64_t total = visited(eng.name) - before;
  printf("[ %s ] %llu puts past a %llu-entry limit: %llu walked (largest walk %llu records), %llu records in all\n",
         eng.name.c_str(), (unsigned long long)kNew, (unsigned long long)kStored, (unsigned long long)walking_puts,
         (unsigned long long)most, (unsigned long long)total);
  // LMDB evicts each put's room in the put's transaction, visiting only its
  // victims; the files engine walks once, then makes room from that walk.
  if (eng.name != "lmdb") {
    EXPECT_LE(walking_puts, 1u) << "eviction walked more than once in 4,000 puts";
  } else {
    EXPECT_LE(total, 4 * kNew) << "puts past the limit visited more than their victims";
  }
  EXPECT_GE(tier.stats().evictions, kStored / 5);
  EXPECT_LE(tier.stats().entries, kStored);
  // LMDB walks only its victims in recency order; the files engine has no
  // index and walks the store once per eviction pass.
  if (eng.name == "lmdb") {
    EXPECT_LE(most, kStored / 5 + 600);
  } else {
    EXPECT_LE(most, kStored + 1000);
  }
  EXPECT_LE(total / kNew, 6u) << "records walked per put, amortised";
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskPutCost, ::testing::ValuesIn(disk_engines()), disk_engine_name);

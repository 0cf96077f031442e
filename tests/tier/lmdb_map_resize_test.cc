// MDB_MAP_RESIZED: a process whose map is smaller than the store's data
// file used to re-map (mdb_env_set_mapsize) while its hits still pointed
// into the old map (SIGSEGV or changed bytes). Every process now maps the
// same size whatever its limit, and a handle whose map is outgrown reports
// a miss instead of re-mapping.
#include <gtest/gtest.h>
#include <unistd.h>

#include "kcache/cache.h"
#include "robust_util.h"
#include "tier/lmdb/lmdb_env.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;

}  // namespace

TEST(LmdbMapSize, SameForEveryLimitUpTo32GiB) {
  const uint64_t floor = 64 * kGiB;
  EXPECT_EQ(lmdb_map_size(0), floor);
  EXPECT_EQ(lmdb_map_size(64 * kMiB), floor);
  EXPECT_EQ(lmdb_map_size(4 * kGiB), floor);
  EXPECT_EQ(lmdb_map_size(32 * kGiB - 32 * kMiB), floor);
  EXPECT_EQ(lmdb_map_size(100 * kGiB), 200 * kGiB + 64 * kMiB);
  long ps = ::sysconf(_SC_PAGESIZE);
  EXPECT_EQ(lmdb_map_size(100 * kGiB + 1) % static_cast<uint64_t>(ps), 0u);
  EXPECT_GE(lmdb_map_size(100 * kGiB + 1), 200 * kGiB + 64 * kMiB + 2);
  // Absurd limits stay mappable.
  EXPECT_LE(lmdb_map_size(~uint64_t(0)), uint64_t(1) << 47);
}

// The reviewed failure: a reader with a 64 MiB limit holds a zero-copy hit
// while a writer with the default 4 GiB limit stores 280 MiB. With limits
// deciding the map, the writer's file outgrew the reader's map.
TEST(LmdbMapSize, WriterWithALargerLimitDoesNotMoveASmallerLimitReadersMap) {
  TempDir td;
  std::string dir = td.path() + "/store";
  DiskTierOptions small;
  small.max_bytes = 64 * kMiB;
  small.durability = Durability::none;
  auto t = open_lmdb_tier(dir, small);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  ASSERT_TRUE((*t)->put(make_entry(1, 100000)).is_ok());
  auto held = (*t)->get(key_of(1));
  ASSERT_TRUE(held && held->has_value());
  ASSERT_TRUE((**held).pinned());
  const char* at = (**held).artifact("obj")->data();

  int ws = run_child([&] {
    DiskTierOptions big;  // the default limit
    big.durability = Durability::none;
    auto w = open_lmdb_tier(dir, big);
    if (!w) return 40;
    for (uint64_t i = 0; i < 70; ++i)
      if (!(*w)->put(make_entry(1000 + i, 4 * kMiB)).is_ok()) return 41;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);

  auto other = (*t)->get(key_of(1005));
  ASSERT_TRUE(other.has_value()) << other.error().to_string();
  ASSERT_TRUE(other->has_value());
  EXPECT_TRUE(entry_ok(**other, 1005, 4 * kMiB));
  EXPECT_EQ((**held).artifact("obj")->data(), at);
  EXPECT_TRUE(entry_ok(**held, 1, 100000));
}

// A handle whose map is smaller than the file (here forced by opening the
// environment with a small map first; in use, a process with a limit above
// 32 GiB growing the store) reports Errc::unavailable, keeps its hits
// valid, is a miss to the Cache, and a reopened handle reads the store.
TEST(LmdbMapSize, OutgrownMapIsAMissNotARemap) {
  // It once hung under AddressSanitizer: the fork below came while the
  // tier's background thread, just started, was inside the sanitizer's
  // allocator, which does not lock itself around fork(). run_child now
  // waits for every other thread to be asleep first (settle_threads).
  TempDir td;
  std::string dir = td.path() + "/store";
  DiskTierOptions o;
  o.durability = Durability::none;
  auto env = LmdbEnv::open(dir, 8 * kMiB, false, false);
  ASSERT_TRUE(env.has_value()) << env.error().to_string();
  auto t = open_lmdb_tier(dir, o);  // shares this process's handle
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  ASSERT_EQ((*env)->map_size(), 8 * kMiB);
  ASSERT_TRUE((*t)->put(make_entry(1, 100000)).is_ok());
  auto held = (*t)->get(key_of(1));
  ASSERT_TRUE(held && held->has_value());
  ASSERT_TRUE((**held).pinned());
  const char* at = (**held).artifact("obj")->data();

  int ws = run_child([&] {
    auto w = open_lmdb_tier(dir, o);  // a handle of its own, with the full map
    if (!w) return 50;
    for (uint64_t i = 0; i < 16; ++i)
      if (!(*w)->put(make_entry(100 + i, kMiB)).is_ok()) return 51;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);

  for (int i = 0; i < 2; ++i) {  // a fresh transaction, then a pooled one
    auto r = (*t)->get(key_of(100));
    ASSERT_FALSE(r.has_value()) << "read past this handle's map";
    EXPECT_EQ(r.error().code(), Errc::unavailable);
    EXPECT_NE(r.error().message().find("reopen"), std::string::npos) << r.error().message();
  }
  EXPECT_FALSE((*t)->put(make_entry(2, 100)).is_ok());
  EXPECT_EQ((**held).artifact("obj")->data(), at);
  EXPECT_TRUE(entry_ok(**held, 1, 100000));

  // The Cache sees a miss and compiles.
  Options co;
  co.log_level = LogLevel::error;
  auto cache = Cache::with_tiers({*t}, co);
  int compiles = 0;
  auto e = cache->get_or_compile(key_of(101), [&]() -> Expected<std::vector<Artifact>> {
    ++compiles;
    return std::vector<Artifact>{{"obj", "fresh"}};
  });
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(*e->artifact("obj"), "fresh");
  cache.reset();

  // Reopened, the store is readable again.
  held = Status(Errc::internal, "dropped");
  t = Status(Errc::internal, "dropped");
  env = Status(Errc::internal, "dropped");
  auto re = open_lmdb_tier(dir, o);
  ASSERT_TRUE(re.has_value()) << re.error().to_string();
  auto r = (*re)->get(key_of(115));
  ASSERT_TRUE(r && r->has_value());
  EXPECT_TRUE(entry_ok(**r, 115, kMiB));
}

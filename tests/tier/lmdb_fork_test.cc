// An LMDB tier used in a child of fork(): LMDB forbids using an environment
// across fork(), and the child's copy of a pinned read transaction names
// the parent's reader slot. The child must get misses (no crash, no hang),
// leave the parent's reader slots alone when it drops what it inherited, and
// be able to open the store afresh; the parent keeps its pinned hit intact
// and keeps working.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr size_t kBig = 64 << 10;  // overflow pages: a pinned hit points into them

DiskTierOptions options() {
  DiskTierOptions o;
  o.durability = Durability::none;
  return o;
}

}  // namespace

TEST(LmdbFork, InheritedTierIsAMissInTheChildAndTheParentsPinnedHitSurvives) {
  TempDir td;
  std::string dir = td.path() + "/store";
  auto t = open_lmdb_tier(dir, options());
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  std::shared_ptr<Tier> tier = *t;
  ASSERT_TRUE(tier->put(make_entry(1, kBig)).is_ok());
  auto got = tier->get(key_of(1));
  ASSERT_TRUE(got && got->has_value());
  std::optional<Entry> held = std::move(**got);
  ASSERT_TRUE(held->pinned()) << "the hit must point into the map for this test";
  const char* held_at = held->artifact("obj")->data();

  int ws = run_child([&] {
    ::alarm(20);  // a hang (joining the parent's flusher thread) becomes SIGALRM
    auto r = tier->get(key_of(1));
    if (r) return 10;  // must not read through the parent's environment
    if (r.error().code() != Errc::unavailable) return 11;
    if (tier->put(make_entry(2, 100)).is_ok()) return 12;
    if (tier->remove(key_of(1)).is_ok()) return 13;
    if (tier->admin()->list([](const ListItem&) { return true; }).is_ok()) return 14;
    (void)tier->stats();
    (void)tier->flush();
    // Dropping the inherited hit and tier must not release the parent's
    // reader slots (nor wait for the parent's threads).
    held.reset();
    got = Status(Errc::internal, "dropped");
    tier.reset();
    t = Status(Errc::internal, "dropped");
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);

  // The parent's snapshot is still pinned: rewrite the store so that every
  // page a reader does not hold gets reused, then read the held bytes.
  ASSERT_EQ(held->artifact("obj")->data(), held_at);
  ASSERT_TRUE(tier->remove(key_of(1)).is_ok());
  for (uint64_t round = 0; round < 3; ++round) {
    for (uint64_t i = 100; i < 140; ++i) ASSERT_TRUE(tier->put(make_entry(i + round * 1000, kBig)).is_ok());
    for (uint64_t i = 100; i < 140; ++i) ASSERT_TRUE(tier->remove(key_of(i + round * 1000)).is_ok());
  }
  ASSERT_TRUE(tier->put(make_entry(1, kBig / 2)).is_ok());
  EXPECT_TRUE(entry_ok(*held, 1, kBig)) << "the parent's pinned entry changed under it";

  // And the parent keeps working.
  auto again = tier->get(key_of(1));
  ASSERT_TRUE(again && again->has_value());
  EXPECT_TRUE(entry_ok(**again, 1, kBig / 2));
  EXPECT_TRUE(tier->flush().is_ok());
}

TEST(LmdbFork, ChildOpensTheStoreAfreshAndUsesIt) {
  SKIP_UNDER_TSAN();
  TempDir td;
  std::string dir = td.path() + "/store";
  auto t = open_lmdb_tier(dir, options());
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  std::shared_ptr<Tier> tier = *t;
  ASSERT_TRUE(tier->put(make_entry(1, kBig)).is_ok());
  auto held = tier->get(key_of(1));
  ASSERT_TRUE(held && held->has_value());

  int ws = run_child([&] {
    ::alarm(20);
    auto fresh = open_lmdb_tier(dir, options());
    if (!fresh) return 20;
    auto r = (*fresh)->get(key_of(1));  // the parent's entry, through the child's own handle
    if (!r || !r->has_value() || !entry_ok(**r, 1, kBig)) return 21;
    if (!(*fresh)->put(make_entry(3, kBig)).is_ok()) return 22;
    // Dropping what was inherited leaves the child's own handle working.
    held = Status(Errc::internal, "dropped");
    tier.reset();
    t = Status(Errc::internal, "dropped");
    auto r3 = (*fresh)->get(key_of(3));
    if (!r3 || !r3->has_value() || !entry_ok(**r3, 3, kBig)) return 23;
    if ((*fresh)->stats().entries != 2) return 24;
    if (!(*fresh)->flush().is_ok()) return 25;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);

  // The parent sees the child's entry and keeps writing.
  auto r3 = tier->get(key_of(3));
  ASSERT_TRUE(r3 && r3->has_value()) << (r3 ? "miss" : r3.error().to_string());
  EXPECT_TRUE(entry_ok(**r3, 3, kBig));
  EXPECT_TRUE(entry_ok(**held, 1, kBig));
  EXPECT_TRUE(tier->put(make_entry(4, 100)).is_ok());
  EXPECT_EQ(tier->stats().entries, 3u);
}

TEST(LmdbFork, GrandchildOfAForkedChildAlsoSeesAnInheritedStore) {
  SKIP_UNDER_TSAN();
  TempDir td;
  std::string dir = td.path() + "/store";
  auto t = open_lmdb_tier(dir, options());
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  ASSERT_TRUE((*t)->put(make_entry(1, 100)).is_ok());
  int ws = run_child([&] {
    ::alarm(20);
    // The child's own handle, inherited in turn by a grandchild.
    auto mine = open_lmdb_tier(dir, options());
    if (!mine) return 30;
    if (!(*mine)->get(key_of(1))) return 31;
    int inner = run_child([&] {
      auto r = (*mine)->get(key_of(1));
      if (r || r.error().code() != Errc::unavailable) return 32;
      mine = Status(Errc::internal, "dropped");
      return 0;
    });
    if (!WIFEXITED(inner)) return 33;
    if (WEXITSTATUS(inner) != 0) return WEXITSTATUS(inner);
    auto r = (*mine)->get(key_of(1));
    return r && r->has_value() && entry_ok(**r, 1, 100) ? 0 : 34;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
}

// Where no thread can be started (a user at its process limit), a hit that
// would start the recency flusher is still a hit: the records wait for the
// flush. A second user (nobody) is needed: root is not held to the limit.
TEST(LmdbFlusher, AHitWhereNoThreadCanStartIsStillAHit) {
  TempDir td;
  ASSERT_EQ(::chmod(td.path().c_str(), 0755), 0);
  const std::string dir = td.path() + "/nobody";
  ASSERT_EQ(::mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  int ws = run_child([&] {
    ::alarm(20);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 20;
    struct rlimit none = {0, 0};
    if (::setrlimit(RLIMIT_NPROC, &none) != 0) return 21;
    DiskTierOptions o = options();
    o.recency_batch = 2;
    auto t = open_lmdb_tier(dir + "/store", o);
    if (!t) return 22;
    for (int i = 1; i <= 4; ++i)
      if (!(*t)->put(make_entry(i, 100)).is_ok()) return 23;
    for (int round = 0; round < 3; ++round)
      for (int i = 1; i <= 4; ++i) {
        auto r = (*t)->get(key_of(i));
        if (!r || !r->has_value()) return 24;
      }
    if (!(*t)->flush().is_ok()) return 25;
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
}

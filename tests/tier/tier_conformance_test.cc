// One behavioural suite, run against every tier.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <unistd.h>

#include "kcache/tier.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

struct TierConfig {
  std::string name;
  // Opens the tier in `dir` with the given options.
  std::function<std::shared_ptr<Tier>(const std::string& dir, const DiskTierOptions&)> open;
  bool persistent;
};
void PrintTo(const TierConfig& c, std::ostream* os) { *os << c.name; }

std::vector<TierConfig> configs() {
  std::vector<TierConfig> c;
  c.push_back({"memory",
               [](const std::string&, const DiskTierOptions& o) {
                 MemoryTierOptions m;
                 m.max_bytes = o.max_bytes ? o.max_bytes : (64u << 20);
                 m.shards = o.max_bytes ? 1 : 0;  // one shard: exact LRU for the eviction test
                 m.max_entry_bytes = o.max_entry_bytes;
                 return make_memory_tier(m);
               },
               false});
#if KCACHE_HAVE_LMDB
  c.push_back({"lmdb", [](const std::string& d, const DiskTierOptions& o) { return *open_lmdb_tier(d, o); }, true});
#endif
  c.push_back({"files", [](const std::string& d, const DiskTierOptions& o) { return *open_files_tier(d, o); }, true});
  return c;
}

class Conformance : public ::testing::TestWithParam<TierConfig> {
 protected:
  std::shared_ptr<Tier> open(const DiskTierOptions& o = {}) { return GetParam().open(dir_.path() + "/t", o); }
  TempDir dir_;
};

}  // namespace

TEST_P(Conformance, EmptyIsAMiss) {
  auto t = open();
  auto r = t->get(key_of(1));
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(t->stats().misses, 1u);
}

TEST_P(Conformance, PutThenGetReturnsIdenticalBytes) {
  auto t = open();
  for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE(t->put(make_entry(i, 100 + i * 997)).is_ok());
  for (uint64_t i = 0; i < 50; ++i) {
    auto r = t->get(key_of(i));
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    ASSERT_TRUE(r->has_value());
    EXPECT_TRUE(entry_ok(**r, i, 100 + i * 997));
    EXPECT_EQ((*r)->meta().compile_cost_us, 1234u);
    EXPECT_EQ((*r)->meta().producer, "test");
  }
  auto s = t->stats();
  EXPECT_EQ(s.hits, 50u);
  EXPECT_EQ(s.puts, 50u);
  EXPECT_EQ(s.entries, 50u);
  EXPECT_GT(s.bytes, 50u * 100);
}

TEST_P(Conformance, PutReplaces) {
  auto t = open();
  ASSERT_TRUE(t->put(make_entry(1, 100)).is_ok());
  auto e2 = EntryBuilder(key_of(1)).add("obj", "second").build();
  ASSERT_TRUE(t->put(*e2).is_ok());
  auto r = t->get(key_of(1));
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ(*(*r)->artifact("obj"), "second");
  EXPECT_EQ(t->stats().entries, 1u);
  EXPECT_EQ(t->stats().bytes, e2->encoded().size());
}

TEST_P(Conformance, RemoveAndClear) {
  auto t = open();
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  ASSERT_TRUE(t->remove(key_of(3)).is_ok());
  ASSERT_TRUE(t->remove(key_of(1000)).is_ok());  // absent: fine
  EXPECT_FALSE(t->get(key_of(3))->has_value());
  EXPECT_TRUE(t->get(key_of(4))->has_value());
  EXPECT_EQ(t->stats().entries, 9u);
  ASSERT_TRUE(t->admin()->clear().is_ok());
  EXPECT_FALSE(t->get(key_of(4))->has_value());
  EXPECT_EQ(t->stats().entries, 0u);
  EXPECT_EQ(t->stats().bytes, 0u);
}

TEST_P(Conformance, ListSeesEveryEntry) {
  auto t = open();
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  std::set<Key> keys;
  ASSERT_TRUE(t->admin()
                  ->list([&](const ListItem& it) {
                    keys.insert(it.key);
                    EXPECT_GT(it.size, 1000u);
                    return true;
                  })
                  .is_ok());
  EXPECT_EQ(keys.size(), 20u);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(keys.count(key_of(i)));
}

TEST_P(Conformance, VerifyPassesOnAHealthyStore) {
  auto t = open();
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  auto rep = t->admin()->verify(false);
  ASSERT_TRUE(rep.has_value()) << rep.error().to_string();
  EXPECT_EQ(rep->checked, 20u);
  EXPECT_TRUE(rep->bad.empty());
}

TEST_P(Conformance, EvictionKeepsSizeUnderLimitAndRecentEntriesAlive) {
  DiskTierOptions o;
  o.max_bytes = 256 * 1024;
  o.max_entry_bytes = 64 * 1024;
  o.recency_batch = 8;
  auto t = open(o);
  const size_t n = 4000;  // ~5 KiB entries: 2x the limit is ~100 entries
  uint64_t written = 0;
  uint64_t i = 0;
  std::set<uint64_t> hot = {0, 1, 2};
  for (; written < 2 * o.max_bytes; ++i) {
    Entry e = make_entry(i, n);
    written += e.encoded().size();
    ASSERT_TRUE(t->put(e).is_ok());
    // Keep the first three entries hot.
    for (uint64_t h : hot) {
      if (h > i) continue;
      auto r = t->get(key_of(h));
      ASSERT_TRUE(r.has_value());
      ASSERT_TRUE(r->has_value()) << "hot entry " << h << " evicted after " << i << " puts";
    }
    ASSERT_TRUE(t->flush().is_ok());
    EXPECT_LE(t->stats().bytes, o.max_bytes);
  }
  auto s = t->stats();
  EXPECT_LE(s.bytes, o.max_bytes);
  EXPECT_GT(s.evictions, 0u);
  // The most recent puts survive.
  for (uint64_t j = i - 5; j < i; ++j) EXPECT_TRUE(t->get(key_of(j))->has_value()) << j;
  // Something old and cold was evicted.
  EXPECT_FALSE(t->get(key_of(10))->has_value());
}

TEST_P(Conformance, ManyThreadsReadAndWrite) {
  auto t = open();
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int w = 0; w < 8; ++w) {
    th.emplace_back([&, w] {
      for (uint64_t i = 0; i < 100; ++i) {
        uint64_t k = (i * 7 + w) % 60;
        if (i % 3 == 0) {
          if (!t->put(make_entry(k, 2000)).is_ok()) ++bad;
        } else {
          auto r = t->get(key_of(k));
          if (!r.has_value())
            ++bad;
          else if (r->has_value() && !entry_ok(**r, k, 2000))
            ++bad;
        }
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(Conformance, PersistsAcrossReopen) {
  if (!GetParam().persistent) GTEST_SKIP() << "memory tier is not persistent";
  {
    auto t = open();
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
    ASSERT_TRUE(t->get(key_of(1))->has_value());
  }
  auto t = open();
  for (uint64_t i = 0; i < 10; ++i) {
    auto r = t->get(key_of(i));
    ASSERT_TRUE(r.has_value() && r->has_value());
    EXPECT_TRUE(entry_ok(**r, i));
  }
  // Statistics live in the store.
  auto s = t->stats();
  EXPECT_EQ(s.puts, 10u);
  EXPECT_EQ(s.entries, 10u);
  EXPECT_GE(s.hits, 11u);
}

// A peek (Access::peek) is a diagnostic: it counts nothing and refreshes no
// recency record, so the store reports the same before and after it.
TEST_P(Conformance, PeekCountsNothingAndRefreshesNoRecency) {
  auto t = open();
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  auto last_use = [&] {
    std::map<Key, uint64_t> m;
    EXPECT_TRUE(t->admin()
                    ->list([&](const ListItem& it) {
                      m[it.key] = it.last_use_ms;
                      return true;
                    })
                    .is_ok());
    return m;
  };
  const auto used_before = last_use();
  const TierStats before = t->stats();
  ::usleep(20 * 1000);  // a use now would record a later time
  for (int round = 0; round < 3; ++round) {
    auto hit = t->get(key_of(0), Access::peek);
    ASSERT_TRUE(hit && hit->has_value());
    EXPECT_TRUE(entry_ok(**hit, 0));
    auto miss = t->get(key_of(99), Access::peek);
    ASSERT_TRUE(miss && !miss->has_value());
  }
  ASSERT_TRUE(t->flush().is_ok());
  const TierStats after = t->stats();
  for (const auto& f : TierStats::kFields) EXPECT_EQ(after.*f.member, before.*f.member) << f.name;
  EXPECT_EQ(last_use(), used_before);
  // The same lookup as a use changes both, so the checks above can fail.
  ASSERT_TRUE(t->get(key_of(0))->has_value());
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_EQ(t->stats().hits, before.hits + 1);
  if (GetParam().persistent) {
    EXPECT_GT(last_use()[key_of(0)], used_before.at(key_of(0)));
  }
}

// The memory tier's recency is its LRU order: a peek does not move an
// entry to the front, a use does.
TEST(MemoryPeek, PeekDoesNotSaveAnEntryFromEviction) {
  const uint64_t size = make_entry(0).memory_size();
  MemoryTierOptions m;
  m.shards = 1;
  m.max_bytes = 3 * size + size / 2;  // room for three entries
  auto t = make_memory_tier(m);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  ASSERT_TRUE(t->get(key_of(0), Access::peek)->has_value());
  ASSERT_TRUE(t->put(make_entry(3)).is_ok());  // evicts the least recently used
  EXPECT_FALSE(t->get(key_of(0), Access::peek)->has_value()) << "a peek moved entry 0 up the LRU";
  ASSERT_TRUE(t->get(key_of(1))->has_value());  // a use
  ASSERT_TRUE(t->put(make_entry(4)).is_ok());
  EXPECT_TRUE(t->get(key_of(1), Access::peek)->has_value());
  EXPECT_FALSE(t->get(key_of(2), Access::peek)->has_value());
}

TEST_P(Conformance, ReadOnlyWrapperRefusesWritesAndPassesReads) {
  auto t = open();
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  auto ro = make_read_only(t);
  EXPECT_FALSE(ro->writable());
  EXPECT_EQ(ro->put(make_entry(2)).code(), Errc::read_only);
  EXPECT_EQ(ro->remove(key_of(1)).code(), Errc::read_only);
  EXPECT_EQ(ro->admin()->clear().code(), Errc::read_only);
  EXPECT_TRUE(ro->get(key_of(1))->has_value());
  EXPECT_FALSE(t->get(key_of(2))->has_value());
  EXPECT_EQ(ro->stats().rejected, 3u);
}

TEST_P(Conformance, OversizedEntryIsRefusedNotFatal) {
  DiskTierOptions o;
  o.max_bytes = 1 << 20;
  o.max_entry_bytes = 10000;
  auto t = open(o);
  Status st = t->put(make_entry(1, 200000));
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), Errc::too_large);
  EXPECT_FALSE(t->get(key_of(1))->has_value());
  EXPECT_TRUE(t->put(make_entry(2, 100)).is_ok());
}

INSTANTIATE_TEST_SUITE_P(AllTiers, Conformance, ::testing::ValuesIn(configs()),
                         [](const auto& info) { return info.param.name; });

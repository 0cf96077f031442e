// The Redis tier on a real 3-node Redis Cluster (loopback ports, started by
// the test): routing by hash slot, ASK during a slot migration, MOVED after
// it, and the slot map refresh.
#include <gtest/gtest.h>

#include "kcache/redis.h"
#include "redis_server.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (find_program("redis-server").empty() || find_program("redis-cli").empty()) {
      std::fprintf(stderr, "*** SKIPPED: redis-server or redis-cli is not installed\n");
      GTEST_SKIP() << "redis-server or redis-cli is not installed";
    }
    cluster_ = std::make_unique<RedisCluster>(dir_.path());
    ASSERT_TRUE(cluster_->ok()) << cluster_->error();
  }
  std::shared_ptr<RedisTier> tier(RedisTierOptions o = {}) { return remote(o).tier; }
  // The tier and its leases.
  Remote remote(RedisTierOptions o = {}) {
    auto r = make_redis_remote(cluster_->url(), o);
    EXPECT_TRUE(r.has_value()) << r.status().to_string();
    return r ? *r : Remote{};
  }
  static std::string rkey(const Key& k) { return "kcache:{" + k.hex() + "}"; }

  TempDir dir_;
  std::unique_ptr<RedisCluster> cluster_;
};

}  // namespace

TEST_F(RedisClusterTest, SlotsMatchTheServer) {
  RedisClient c("127.0.0.1", cluster_->node(0).port());
  for (uint64_t i = 0; i < 64; ++i) {
    std::string k = i % 2 ? rkey(key_of(i)) : "plain-key-" + std::to_string(i * 7919);
    EXPECT_EQ(std::to_string(redis_key_slot(k)), c.str({"CLUSTER", "KEYSLOT", k})) << k;
  }
}

TEST_F(RedisClusterTest, RoutesByHashSlotAcrossNodes) {
  RedisTierOptions o;
  o.write_queue_depth = 1000;
  o.secret = "cluster-secret";
  Remote r = remote(o);
  auto t = r.tier;
  auto leases = r.leases;
  ASSERT_TRUE(t && leases);
  EXPECT_EQ(t->counters().slot_refreshes, 1u);  // loaded at start
  std::vector<Key> keys;
  for (uint64_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(t->put(make_entry(i, 300)).is_ok());
    keys.push_back(key_of(i));
  }
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_EQ(t->stats().puts, 200u);
  // Every node got a share, and each key sits on the node owning its slot.
  long long total = 0;
  for (int n = 0; n < cluster_->size(); ++n) {
    RedisClient c("127.0.0.1", cluster_->node(n).port());
    long long size = std::stoll(c.str({"DBSIZE"}));
    EXPECT_GT(size, 20) << "node " << n;
    total += size;
  }
  EXPECT_EQ(total, 200);
  for (uint64_t i = 0; i < 200; ++i) {
    auto g = t->get(key_of(i));
    ASSERT_TRUE(g.has_value() && g->has_value()) << i;
    EXPECT_TRUE(entry_ok(**g, i, 300));
  }
  auto many = t->get_many(keys);
  for (uint64_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(many[i].has_value()) << i;
    EXPECT_TRUE(entry_ok(*many[i], i, 300));
  }
  EXPECT_EQ(t->counters().moved, 0u);  // the slot map was right all along
  // A lease lives in its entry's slot.
  EXPECT_TRUE(*leases->acquire_lease(key_of(1), 5000));
}

TEST_F(RedisClusterTest, FollowsAskAndMovedDuringASlotMigration) {
  auto t = tier();
  ASSERT_TRUE(t);
  Key k = key_of(42);
  ASSERT_TRUE(t->put(make_entry(42)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  ASSERT_TRUE(t->get(k)->has_value());

  int slot = redis_key_slot(rkey(k));
  int from = cluster_->owner(slot);
  ASSERT_GE(from, 0);
  int to = (from + 1) % cluster_->size();
  std::string from_id = cluster_->node_id(from), to_id = cluster_->node_id(to);
  RedisClient src("127.0.0.1", cluster_->node(from).port()), dst("127.0.0.1", cluster_->node(to).port());
  ASSERT_EQ(dst.str({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", from_id}), "OK");
  ASSERT_EQ(src.str({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", to_id}), "OK");
  ASSERT_EQ(src.str({"MIGRATE", "127.0.0.1", std::to_string(cluster_->node(to).port()), rkey(k), "0", "5000"}), "OK");

  // Mid-migration: the old owner answers ASK for a key it no longer has.
  auto g = t->get(k);
  ASSERT_TRUE(g.has_value()) << g.status().to_string();
  ASSERT_TRUE(g->has_value());
  EXPECT_TRUE(entry_ok(**g, 42));
  EXPECT_EQ(t->counters().ask, 1u);
  EXPECT_EQ(t->counters().moved, 0u);

  // Finish: every node learns the new owner; the old one now says MOVED.
  for (int n = 0; n < cluster_->size(); ++n) {
    RedisClient c("127.0.0.1", cluster_->node(n).port());
    ASSERT_EQ(c.str({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", to_id}), "OK") << n;
  }
  uint64_t refreshes = t->counters().slot_refreshes;
  g = t->get(k);
  ASSERT_TRUE(g.has_value()) << g.status().to_string();
  ASSERT_TRUE(g->has_value());
  EXPECT_TRUE(entry_ok(**g, 42));
  EXPECT_EQ(t->counters().moved, 1u);
  EXPECT_EQ(t->counters().slot_refreshes, refreshes + 1);
  // The refreshed map sends the next request straight to the new owner.
  ASSERT_TRUE(t->get(k)->has_value());
  ASSERT_TRUE(t->put(make_entry(42, 2000)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_EQ(t->counters().moved, 1u);
  EXPECT_TRUE(entry_ok(**t->get(k), 42, 2000));
  EXPECT_EQ(dst.str({"EXISTS", rkey(k)}), "1");
  EXPECT_EQ(t->stats().errors, 0u);
}

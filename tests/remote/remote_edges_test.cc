// The remote tier at its edges, over a real redis-server: a value far
// larger than max_entry_bytes, a client configured with another secret, a
// server that refuses writes (out of memory). Each is a miss and a counter,
// never an open breaker, a lost shared value or a log line per call.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "kcache/redis.h"
#include "redis_server.h"
#include "test_util.h"
#include "util/util.h"

namespace kcache::test {
namespace {

std::shared_ptr<RedisTier> redis(const std::string& url, RedisTierOptions o = {}) {
  auto t = make_redis_tier(url, o);
  EXPECT_TRUE(t.has_value()) << t.status().to_string();
  return t ? *t : nullptr;
}

long max_rss_kib() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// Sends the log to `path` for the scope; back to stderr at warn after.
struct LogTo {
  explicit LogTo(const std::string& path) { util::set_log(LogLevel::warn, path); }
  ~LogTo() { util::set_log(LogLevel::warn, ""); }
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += l + "\n";
  return s;
}

// A 40 MB value under a 1 MB bound is a miss, counted as rejected, without
// being read: the process does not grow by the value's size, and the
// breaker stays closed. (The server makes the value itself, SETRANGE, so
// the test process never holds it.)
TEST(RemoteEdges, AnOversizedValueIsAMissWithoutBeingRead) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.max_entry_bytes = 1 << 20;
  auto t = redis(srv.url(), o);
  ASSERT_TRUE(t);
  RedisClient c("127.0.0.1", srv.port());
  const size_t big = 40u << 20;
  for (uint64_t i : {1, 2}) c.str({"SETRANGE", "kcache:{" + key_of(i).hex() + "}", std::to_string(big - 1), "x"});
  ASSERT_TRUE(t->put(make_entry(3)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());

  long before = max_rss_kib();
  auto g = t->get(key_of(1));
  ASSERT_TRUE(g.has_value()) << g.status().to_string();
  EXPECT_FALSE(g->has_value());
  auto many = t->get_many({key_of(2), key_of(3)});
  ASSERT_EQ(many.size(), 2u);
  EXPECT_FALSE(many[0].has_value());
  ASSERT_TRUE(many[1].has_value()) << "a value within the bound is still a hit";
  EXPECT_TRUE(entry_ok(*many[1], 3));
  long grown_kib = max_rss_kib() - before;
  EXPECT_LT(grown_kib, 8 * 1024) << "the process read the oversized values";
  EXPECT_EQ(t->stats().rejected, 2u);
  EXPECT_EQ(t->stats().errors, 0u);
  EXPECT_FALSE(t->breaker_open());
  EXPECT_EQ(t->counters().breaker_opens, 0u);
}

// A client with another secret neither takes nor replaces the values the
// team stored: they survive its lookups and puts, and it says once that its
// secret differs.
TEST(RemoteEdges, AWrongSecretNeitherAcceptsNorOverwritesSharedValues) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions good, bad;
  good.secret = "team-secret";
  bad.secret = "not-the-team-secret";
  auto team = redis(srv.url(), good);
  for (uint64_t i = 1; i <= 5; ++i) ASSERT_TRUE(team->put(make_entry(i)).is_ok());
  ASSERT_TRUE(team->flush().is_ok());

  const std::string log = d.path() + "/bad.log";
  {
    LogTo to(log);
    auto other = redis(srv.url(), bad);
    for (uint64_t i = 1; i <= 5; ++i) {
      auto g = other->get(key_of(i));
      ASSERT_TRUE(g.has_value());
      EXPECT_FALSE(g->has_value()) << "a value under another secret was accepted";
      // What a cache does after a miss: compile and store.
      ASSERT_TRUE(other->put(make_entry(i, 700)).is_ok());
    }
    ASSERT_TRUE(other->flush().is_ok());
  }
  auto lines = log_lines(log);
  EXPECT_EQ(lines.size(), 1u) << joined(lines);
  if (!lines.empty()) {
    EXPECT_NE(lines[0].find("secret"), std::string::npos) << lines[0];
  }

  auto again = redis(srv.url(), good);
  for (uint64_t i = 1; i <= 5; ++i) {
    auto g = again->get(key_of(i));
    ASSERT_TRUE(g.has_value());
    ASSERT_TRUE(g->has_value()) << "the team's value " << i << " was lost";
    EXPECT_TRUE(entry_ok(**g, i));
  }
}

// A server out of memory (noeviction) refuses every SET; reads still work.
// One condition, one log line, however many puts fail; the breaker does not
// switch reads off.
TEST(RemoteEdges, AServerOutOfMemoryIsOneLogLine) {
  TempDir d;
  START_REDIS(srv, d, {"--maxmemory", "1mb", "--maxmemory-policy", "noeviction"});
  auto t = redis(srv.url());
  RedisClient c("127.0.0.1", srv.port());
  // Fill the server past its limit from outside.
  c.str({"SETRANGE", "filler", std::to_string(2u << 20), "x"});
  ASSERT_TRUE(t->put(make_entry(100)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  ASSERT_EQ(t->stats().puts, 0u) << "the server took a write: not out of memory";

  const std::string log = d.path() + "/oom.log";
  {
    LogTo to(log);
    for (uint64_t i = 1; i <= 8; ++i) {
      auto g = t->get(key_of(i));  // a lookup, then the compile's put
      ASSERT_TRUE(g.has_value());
      EXPECT_FALSE(g->has_value());
      ASSERT_TRUE(t->put(make_entry(i, 20000)).is_ok());
      ASSERT_TRUE(t->flush().is_ok());
    }
  }
  auto lines = log_lines(log);
  EXPECT_LE(lines.size(), 1u) << joined(lines);
  EXPECT_EQ(t->stats().puts, 0u);
  EXPECT_FALSE(t->breaker_open()) << "write refusals switched lookups off";
}

}  // namespace
}  // namespace kcache::test

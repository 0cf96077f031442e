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

// A number from the server's INFO `section`, after `field`.
uint64_t info_number(RedisClient& c, const std::string& section, const std::string& field) {
  std::string info = c.str({"INFO", section});
  auto at = info.find(field);
  if (at == std::string::npos) return 0;
  return std::stoull(info.substr(at + field.size()));
}

// The server's count of bytes sent to its clients.
uint64_t net_output_bytes(RedisClient& c) { return info_number(c, "stats", "total_net_output_bytes:"); }

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
  // The script's text went once, to be cached; the lookups after it named
  // it by its SHA-1.
  EXPECT_EQ(info_number(c, "commandstats", "cmdstat_eval:calls="), 1u);
  EXPECT_GE(info_number(c, "commandstats", "cmdstat_evalsha:calls="), 2u);
  // A server that forgot the script (restarted, SCRIPT FLUSH) is sent it
  // again, within the same lookups: no fault, the same answers.
  ASSERT_EQ(c.str({"SCRIPT", "FLUSH"}), "OK");
  auto again = t->get_many({key_of(2), key_of(3)});
  ASSERT_EQ(again.size(), 2u);
  EXPECT_FALSE(again[0].has_value());
  ASSERT_TRUE(again[1].has_value());
  EXPECT_TRUE(entry_ok(*again[1], 3));
  EXPECT_EQ(info_number(c, "commandstats", "cmdstat_eval:calls="), 3u);
  EXPECT_EQ(t->stats().rejected, 3u);
  EXPECT_EQ(t->stats().errors, 0u);
  EXPECT_FALSE(t->breaker_open());
}

// An ACL user without scripting cannot run the lookup script: lookups go
// without it (bounded all the same), the refusal is one log line and no
// fault, and the tier keeps serving. Both ways in are checked: a first
// lookup by get and a first lookup by get_many.
TEST(RemoteEdges, AServerThatRefusesScriptsStillServesBoundedLookups) {
  TempDir d;
  START_REDIS(srv, d);
  RedisClient admin("127.0.0.1", srv.port());
  ASSERT_EQ(admin.str({"ACL", "SETUSER", "nolua", "on", ">pw", "~*", "+@all", "-@scripting"}), "OK");
  const std::string url = "redis://nolua:pw@127.0.0.1:" + std::to_string(srv.port());
  RedisTierOptions o;
  o.max_entry_bytes = 1 << 20;
  const size_t big = 4u << 20;
  for (uint64_t i : {1, 2}) admin.str({"SETRANGE", "kcache:{" + key_of(i).hex() + "}", std::to_string(big - 1), "x"});
  {
    auto w = redis(url, o);
    ASSERT_TRUE(w);
    for (uint64_t i : {3, 4, 5}) ASSERT_TRUE(w->put(make_entry(i, 1000 * i)).is_ok());
    ASSERT_TRUE(w->flush().is_ok());
    ASSERT_EQ(w->stats().puts, 3u) << "the user without scripting could not write";
  }

  for (bool first_many : {false, true}) {
    SCOPED_TRACE(first_many ? "first lookup by get_many" : "first lookup by get");
    const std::string log = d.path() + (first_many ? "/many.log" : "/get.log");
    std::shared_ptr<RedisTier> t;
    uint64_t sent = 0;
    {
      LogTo to(log);
      t = redis(url, o);
      ASSERT_TRUE(t);
      uint64_t before = net_output_bytes(admin);
      if (first_many) {
        auto many = t->get_many({key_of(1), key_of(3), key_of(2), key_of(4)});
        ASSERT_EQ(many.size(), 4u);
        EXPECT_FALSE(many[0].has_value());
        EXPECT_FALSE(many[2].has_value());
        ASSERT_TRUE(many[1].has_value());
        ASSERT_TRUE(many[3].has_value());
        EXPECT_TRUE(entry_ok(*many[1], 3, 3000));
        EXPECT_TRUE(entry_ok(*many[3], 4, 4000));
      } else {
        auto g = t->get(key_of(1));
        ASSERT_TRUE(g.has_value()) << g.status().to_string();
        EXPECT_FALSE(g->has_value());
        auto h = t->get(key_of(3));
        ASSERT_TRUE(h.has_value()) << h.status().to_string();
        ASSERT_TRUE(h->has_value());
        EXPECT_TRUE(entry_ok(**h, 3, 3000));
        auto many = t->get_many({key_of(2), key_of(4)});
        ASSERT_EQ(many.size(), 2u);
        EXPECT_FALSE(many[0].has_value());
        ASSERT_TRUE(many[1].has_value());
        EXPECT_TRUE(entry_ok(*many[1], 4, 4000));
      }
      sent = net_output_bytes(admin) - before;
    }
    // Two 4 MB values looked up: at most the bound (1 MB and the framing)
    // of each may travel, never the values.
    EXPECT_LT(sent, 3u << 20) << "the oversized values were sent";
    EXPECT_EQ(t->stats().rejected, 2u);
    EXPECT_EQ(t->stats().errors, 0u);
    EXPECT_FALSE(t->breaker_open());
    EXPECT_EQ(t->counters().breaker_opens, 0u);
    // Still serving, without another line.
    {
      LogTo to(log);
      for (int n = 0; n < 5; ++n) {
        auto g = t->get(key_of(5));
        ASSERT_TRUE(g.has_value()) << g.status().to_string();
        ASSERT_TRUE(g->has_value()) << "the tier stopped serving";
        EXPECT_TRUE(entry_ok(**g, 5, 5000));
      }
      auto missing = t->get(key_of(6));
      ASSERT_TRUE(missing.has_value());
      EXPECT_FALSE(missing->has_value());
    }
    EXPECT_EQ(t->stats().errors, 0u);
    EXPECT_EQ(t->stats().rejected, 2u);
    // One line for the refusal, one for each oversized key, nothing else.
    auto lines = log_lines(log);
    EXPECT_EQ(lines.size(), 3u) << joined(lines);
    auto refusal = log_lines(log, "script");
    ASSERT_EQ(refusal.size(), 1u) << joined(lines);
    EXPECT_NE(refusal[0].find("NOPERM"), std::string::npos) << refusal[0];
    EXPECT_EQ(log_lines(log, "rejected value").size(), 2u) << joined(lines);
  }
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

// A user the server does not let run scripts cannot take leases (they are
// scripts): every acquire is refused, interleaved with lookups and writes
// that work. One line for the whole episode, no breaker, lookups and writes
// still served; once scripting is allowed again, leases are granted.
TEST(RemoteEdges, AServerThatRefusesLeaseScriptsIsOneLineAndNoBreaker) {
  TempDir d;
  START_REDIS(srv, d);
  RedisClient admin("127.0.0.1", srv.port());
  ASSERT_EQ(admin.str({"ACL", "SETUSER", "nolua", "on", ">pw", "~*", "+@all", "-@scripting"}), "OK");
  const std::string url = "redis://nolua:pw@127.0.0.1:" + std::to_string(srv.port());
  auto remote = make_redis_remote(url);
  ASSERT_TRUE(remote.has_value()) << remote.error().to_string();
  ASSERT_TRUE(remote->leases);
  const std::string log = d.path() + "/leases.log";
  {
    LogTo to(log);
    for (uint64_t i = 1; i <= 20; ++i) {
      EXPECT_EQ(remote->leases->acquire(key_of(i), 10000), LeaseResult::error);
      auto g = remote->tier->get(key_of(i));  // a lookup that works
      ASSERT_TRUE(g.has_value()) << g.error().to_string();
      EXPECT_FALSE(g->has_value());
      ASSERT_TRUE(remote->tier->put(make_entry(i)).is_ok());  // the compile's put
      ASSERT_TRUE(remote->tier->flush().is_ok());
    }
  }
  // One line for the leases, one for the lookup script (bounded lookups go
  // without it), nothing else.
  auto lines = log_lines(log);
  EXPECT_EQ(lines.size(), 2u) << joined(lines);
  EXPECT_EQ(log_lines(log, "refuses leases").size(), 1u) << joined(lines);
  EXPECT_EQ(log_lines(log, "refuses the lookup script").size(), 1u) << joined(lines);
  EXPECT_FALSE(remote->tier->breaker_open()) << "refused leases switched the remote off";
  EXPECT_EQ(remote->tier->counters().breaker_opens, 0u);
  EXPECT_EQ(remote->tier->stats().puts, 20u) << "writes stopped with the leases";
  // Scripting allowed again: the next acquire is granted.
  ASSERT_EQ(admin.str({"ACL", "SETUSER", "nolua", "+@scripting"}), "OK");
  EXPECT_EQ(remote->leases->acquire(key_of(99), 10000), LeaseResult::acquired);
  remote->leases->release(key_of(99));
}

// Statistics every client adds to on the server: a server that refuses
// them (an ACL without HINCRBY) is one line, no breaker, and lookups and
// writes go on; a read-only tier sends none; two clients' counts add up,
// and what is stored is counted on the server (a lease is not a value).
TEST(RemoteEdges, SharedStatisticsAddUpAndARefusalIsOneLine) {
  TempDir d;
  START_REDIS(srv, d);
  RedisClient admin("127.0.0.1", srv.port());
  const std::string url = "redis://127.0.0.1:" + std::to_string(srv.port());
  {
    auto a = make_redis_remote(url), b = make_redis_remote(url);
    ASSERT_TRUE(a.has_value() && b.has_value());
    for (uint64_t i = 1; i <= 4; ++i) ASSERT_TRUE(a->tier->put(make_entry(i)).is_ok());
    ASSERT_TRUE(a->tier->flush().is_ok());
    for (uint64_t i = 1; i <= 6; ++i) {
      auto g = b->tier->get(key_of(i));
      ASSERT_TRUE(g.has_value());
      EXPECT_EQ(g->has_value(), i <= 4);
    }
    ASSERT_EQ(b->leases->acquire(key_of(50), 10000), LeaseResult::acquired);
    auto s = a->tier->server_stats(5000);  // sends a's counts first, not b's
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    EXPECT_EQ(s->entries, 4u);
    EXPECT_TRUE(s->complete);
    EXPECT_EQ(s->counters.puts, 4u);
    uint64_t bytes = 0;
    for (uint64_t i = 1; i <= 4; ++i) bytes += std::stoull(admin.str({"STRLEN", "kcache:{" + key_of(i).hex() + "}"}));
    EXPECT_EQ(s->bytes, bytes);
    s = b->tier->server_stats(5000);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->counters.puts, 4u);
    EXPECT_EQ(s->counters.hits, 4u);
    EXPECT_EQ(s->counters.misses, 2u);
    EXPECT_GT(s->since_unix_ms, 0u);
    b->leases->release(key_of(50));
  }
  // Read-only: nothing sent.
  ASSERT_EQ(admin.str({"DEL", "kcache:stats"}), "1");
  {
    RedisTierOptions ro;
    ro.read_only = true;
    auto r = make_redis_remote(url, ro);
    ASSERT_TRUE(r.has_value());
    for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(r->tier->get(key_of(i)).has_value());
    EXPECT_EQ(r->tier->zero_server_stats().code(), Errc::read_only);
  }
  EXPECT_EQ(admin.str({"EXISTS", "kcache:stats"}), "0") << "a read-only tier wrote statistics";

  // Refused: one line, no breaker, the rest works.
  ASSERT_EQ(admin.str({"ACL", "SETUSER", "nostats", "on", ">pw", "~*", "+@all", "-hincrby"}), "OK");
  const std::string log = d.path() + "/stats.log";
  {
    LogTo to(log);
    auto r = make_redis_remote("redis://nostats:pw@127.0.0.1:" + std::to_string(srv.port()));
    ASSERT_TRUE(r.has_value());
    for (uint64_t i = 1; i <= 10; ++i) {
      ASSERT_TRUE(r->tier->put(make_entry(100 + i)).is_ok());
      ASSERT_TRUE(r->tier->flush().is_ok());
      auto g = r->tier->get(key_of(100 + i));
      ASSERT_TRUE(g.has_value() && g->has_value());
      if (i == 5) (void)r->tier->server_stats(1000);  // a send now, refused
    }
    EXPECT_FALSE(r->tier->breaker_open());
    EXPECT_EQ(r->tier->counters().breaker_opens, 0u);
    EXPECT_EQ(r->tier->stats().puts, 10u);
    EXPECT_EQ(r->tier->stats().hits, 10u);
  }  // closing sends nothing more
  auto lines = log_lines(log);
  EXPECT_EQ(lines.size(), 1u) << joined(lines);
  EXPECT_EQ(log_lines(log, "refuses statistics").size(), 1u) << joined(lines);
}

}  // namespace
}  // namespace kcache::test

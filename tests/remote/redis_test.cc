// The Redis tier against a real redis-server started by each test on a free
// loopback port: round trip, promotion, TTL, authenticity, faults (server
// killed, server paused, full write queue), leases, pipelined multi-get.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "cache/assembly.h"
#include "kcache/cache.h"
#include "kcache/redis.h"
#include "process_sync.h"
#include "redis_server.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;
using Ms = std::chrono::milliseconds;

namespace {

uint64_t now_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::shared_ptr<RedisTier> redis(const std::string& url, RedisTierOptions o = {}) {
  auto t = make_redis_tier(url, o);
  EXPECT_TRUE(t.has_value()) << t.status().to_string();
  return t ? *t : nullptr;
}

// The tier and its leases.
Remote redis_remote(const std::string& url, RedisTierOptions o = {}) {
  auto r = make_redis_remote(url, o);
  EXPECT_TRUE(r.has_value()) << r.status().to_string();
  return r ? *r : Remote{};
}

std::string entry_redis_key(const Key& k) { return "kcache:{" + k.hex() + "}"; }

}  // namespace

TEST(RedisUrl, ParsesAndRejects) {
  for (const char* bad : {"http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h/x", "redis://a:1,b:2",
                          "redis+cluster://h:1/3", "redis://h?nope=1", "redis://h?ttl_ms=abc",
                          "redis://h?read_only=maybe", "redis://[::1"}) {
    auto t = make_redis_tier(bad);
    ASSERT_FALSE(t.has_value()) << bad;
    EXPECT_EQ(t.error().code(), Errc::invalid_argument) << bad;
  }
  // Nothing listens on port 1: a tier is still made (it retries behind its
  // breaker), and it answers misses.
  RedisTierOptions o;
  o.connect_timeout_ms = 100;
  auto t = redis("redis://127.0.0.1:1/2?command_timeout_ms=50&read_only=1&key_prefix=p:", o);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name(), "redis(ro)");
  EXPECT_FALSE(t->writable());
  auto g = t->get(key_of(1));
  EXPECT_FALSE(g.has_value());  // refused connection: a fault the Cache turns into a miss
  EXPECT_EQ(t->stats().errors, 1u);
}

TEST(RemoteOptions, EachNameIsAcceptedAndSetsItsField) {
  RedisTierOptions o;
  struct Case {
    const char* name;
    const char* value;
  };
  for (const Case& c :
       {Case{"connect_timeout_ms", "11"}, Case{"command_timeout_ms", "12"}, Case{"ttl_ms", "13"},
        Case{"read_only", "on"}, Case{"max_entry_bytes", "14"}, Case{"breaker_threshold", "15"},
        Case{"breaker_timeouts", "16"}, Case{"breaker_cooldown_ms", "17"}, Case{"write_queue_depth", "18"},
        Case{"shared_stats", "off"}, Case{"key_prefix", "team:{x}:"}}) {
    Status st = set_remote_option(&o, c.name, c.value);
    EXPECT_TRUE(st.is_ok()) << c.name << ": " << st.to_string();
  }
  EXPECT_EQ(o.connect_timeout_ms, 11u);
  EXPECT_EQ(o.command_timeout_ms, 12u);
  EXPECT_EQ(o.ttl_ms, 13u);
  EXPECT_TRUE(o.read_only);
  EXPECT_EQ(o.max_entry_bytes, 14u);
  EXPECT_EQ(o.breaker_threshold, 15u);
  EXPECT_EQ(o.breaker_timeouts, 16u);
  EXPECT_EQ(o.breaker_cooldown_ms, 17u);
  EXPECT_EQ(o.write_queue_depth, 18u);
  EXPECT_FALSE(o.shared_stats);
  EXPECT_EQ(o.key_prefix, "team:{x}:");
  EXPECT_EQ(remote_option_names().size(), 11u);
  // Every boolean spelling, both ways.
  for (const char* yes : {"1", "true", "yes", "on"}) {
    o.read_only = false;
    ASSERT_TRUE(set_remote_option(&o, "read_only", yes).is_ok()) << yes;
    EXPECT_TRUE(o.read_only) << yes;
  }
  for (const char* no : {"0", "false", "no", "off"}) {
    o.read_only = true;
    ASSERT_TRUE(set_remote_option(&o, "read_only", no).is_ok()) << no;
    EXPECT_FALSE(o.read_only) << no;
  }
  // 0 is no expiry for ttl_ms and the default for every other number
  // (kept as 0, replaced by the policy); the largest counts fit.
  ASSERT_TRUE(set_remote_option(&o, "ttl_ms", "0").is_ok());
  EXPECT_EQ(o.ttl_ms, 0u);
  for (const char* name : {"connect_timeout_ms", "command_timeout_ms", "max_entry_bytes", "breaker_threshold",
                           "breaker_timeouts", "breaker_cooldown_ms", "write_queue_depth"})
    EXPECT_TRUE(set_remote_option(&o, name, "0").is_ok()) << name;
  EXPECT_EQ(o.connect_timeout_ms, 0u);
  EXPECT_EQ(o.write_queue_depth, 0u);
  ASSERT_TRUE(set_remote_option(&o, "write_queue_depth", "4294967295").is_ok());
  EXPECT_EQ(o.write_queue_depth, 4294967295u);
}

TEST(RemoteOptions, BadValuesAndUnknownNamesAreRejectedWithTheExpectedForm) {
  struct Case {
    const char* name;
    const char* value;
    const char* message;
  };
  const std::string ms = "a whole number of milliseconds, e.g. 250 (0: the default)";
  const std::string count = "a whole number up to 4294967295 (0: the default)";
  const Case cases[] = {
      {"connect_timeout_ms", "1s", "remote option connect_timeout_ms wants "},
      {"command_timeout_ms", "-5", "remote option command_timeout_ms wants "},
      {"command_timeout_ms", "", "remote option command_timeout_ms wants "},
      {"breaker_cooldown_ms", "soon", "remote option breaker_cooldown_ms wants "},
      {"ttl_ms", "abc", "remote option ttl_ms wants a whole number of milliseconds (0: no expiry)"},
      {"max_entry_bytes", "64M",
       "remote option max_entry_bytes wants a whole number of bytes, e.g. 67108864 (0: the default)"},
      {"breaker_threshold", "-1", "remote option breaker_threshold wants "},
      {"breaker_timeouts", "4294967296", "remote option breaker_timeouts wants "},
      {"write_queue_depth", "1.5", "remote option write_queue_depth wants "},
      {"read_only", "maybe", "remote option read_only wants 1/0, true/false, yes/no or on/off"},
  };
  for (const Case& c : cases) {
    RedisTierOptions o;
    Status st = set_remote_option(&o, c.name, c.value);
    ASSERT_FALSE(st.is_ok()) << c.name << "=" << c.value;
    EXPECT_EQ(st.code(), Errc::invalid_argument);
    std::string want = c.message;
    if (want.ends_with("wants ")) want += std::string(c.name).ends_with("_ms") ? ms : count;
    EXPECT_EQ(st.message(), want) << c.name << "=" << c.value;
    // A refused value leaves the options as they were.
    RedisTierOptions fresh;
    EXPECT_EQ(o.connect_timeout_ms, fresh.connect_timeout_ms);
    EXPECT_EQ(o.breaker_timeouts, fresh.breaker_timeouts);
    EXPECT_EQ(o.read_only, fresh.read_only);
  }
  RedisTierOptions o;
  Status st = set_remote_option(&o, "timeout", "5");
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), Errc::invalid_argument);
  EXPECT_EQ(st.message(),
            "unknown remote option 'timeout' (known: connect_timeout_ms, command_timeout_ms, ttl_ms, read_only, "
            "max_entry_bytes, breaker_threshold, breaker_timeouts, breaker_cooldown_ms, write_queue_depth, "
            "shared_stats, key_prefix)");
  // The secret is never read from a URL.
  EXPECT_FALSE(set_remote_option(&o, "secret", "s").is_ok());
  EXPECT_TRUE(o.secret.empty());
}

TEST(RedisUrl, ErrorsNameTheOptionNeverTheUrl) {
  struct Case {
    const char* url;
    const char* message;
  };
  for (const Case& c :
       {Case{"redis://:hunter2@h?command_timeout_ms=0.5",
             "redis URL: remote option command_timeout_ms wants a whole number of milliseconds, e.g. 250 (0: the "
             "default)"},
        Case{"redis://user:hunter2@h:6379/1?ttl_ms=10&read_only=perhaps",
             "redis URL: remote option read_only wants 1/0, true/false, yes/no or on/off"},
        Case{"redis+cluster://:hunter2@a:1,b:2?key_prefix",
             "redis URL: option key_prefix has no value (write "
             "key_prefix=value)"}}) {
    auto t = make_redis_tier(c.url);
    ASSERT_FALSE(t.has_value()) << c.url;
    EXPECT_EQ(t.error().code(), Errc::invalid_argument);
    EXPECT_EQ(t.error().message(), c.message);
    EXPECT_EQ(t.error().to_string().find("hunter2"), std::string::npos) << t.error().to_string();
  }
  // A password holding '?': the rest of it would read as an option.
  auto in_query = make_redis_tier("redis://:hun?ter2=x@h");
  ASSERT_FALSE(in_query.has_value());
  EXPECT_EQ(in_query.error().code(), Errc::invalid_argument);
  EXPECT_EQ(in_query.error().to_string().find("ter2"), std::string::npos) << in_query.error().to_string();
  auto unknown = make_redis_remote("redis://:hunter2@h?breaker=1");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_TRUE(unknown.error().message().starts_with("redis URL: unknown remote option 'breaker' (known: "))
      << unknown.error().message();
  EXPECT_EQ(unknown.error().to_string().find("hunter2"), std::string::npos);
  // The query reaches the policy: a timeout of 0 is the default there too,
  // and a good query applies over the options given.
  RedisTierOptions o;
  o.command_timeout_ms = 0;
  auto zero = make_redis_tier("redis://127.0.0.1:1?connect_timeout_ms=0", o);
  ASSERT_TRUE(zero.has_value()) << zero.error().to_string();
  auto fixed = make_redis_remote("redis://127.0.0.1:1?command_timeout_ms=40&read_only=yes", o);
  ASSERT_TRUE(fixed.has_value()) << fixed.error().to_string();
  EXPECT_EQ(fixed->tier->name(), "redis(ro)");
  ASSERT_TRUE(fixed->leases);
}

TEST(RedisSlot, MatchesRedisClusterSpecExamples) {
  // Values given by the CLUSTER KEYSLOT documentation.
  EXPECT_EQ(redis_key_slot("somekey"), 11058);
  EXPECT_EQ(redis_key_slot("foo{hash_tag}"), 2515);
  EXPECT_EQ(redis_key_slot("bar{hash_tag}"), 2515);
  EXPECT_EQ(redis_key_slot("{user1000}.following"), redis_key_slot("{user1000}.followers"));
  // Only the first {...} counts, and only when not empty.
  EXPECT_EQ(redis_key_slot("a{b}{c}"), redis_key_slot("b"));
  EXPECT_NE(redis_key_slot("x{}{y}"), redis_key_slot("y"));
}

TEST(Redis, RoundTripRemoveAndStats) {
  TempDir d;
  START_REDIS(srv, d);
  auto t = redis(srv.url());
  ASSERT_TRUE(t);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(t->put(make_entry(i, 1000 + i * 100000)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  for (uint64_t i = 0; i < 5; ++i) {
    auto g = t->get(key_of(i));
    ASSERT_TRUE(g.has_value()) << g.status().to_string();
    ASSERT_TRUE(g->has_value()) << i;
    EXPECT_TRUE(entry_ok(**g, i, 1000 + i * 100000));
  }
  auto miss = t->get(key_of(99));
  ASSERT_TRUE(miss.has_value());
  EXPECT_FALSE(miss->has_value());
  ASSERT_TRUE(t->remove(key_of(0)).is_ok());
  EXPECT_FALSE(t->get(key_of(0))->has_value());
  TierStats s = t->stats();
  EXPECT_EQ(s.puts, 5u);
  EXPECT_EQ(s.hits, 5u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.rejected, 0u);
  // The value is what docs/format.md says: header, no MAC, the entry bytes.
  RedisClient c("127.0.0.1", srv.port());
  auto r = c.cmd({"GET", entry_redis_key(key_of(1))});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STRING);
  std::string v(r->str, r->len);
  EXPECT_EQ(v.substr(0, 4), "KCRV");
  EXPECT_EQ(v[4], 1);
  EXPECT_EQ(v[5], 0);
  EXPECT_EQ(v.substr(8), std::string(make_entry(1, 101000).encoded()));
}

TEST(Redis, RemoteHitIsPromotedIntoLocalTiers) {
  TempDir d, disk;
  START_REDIS(srv, d);
  auto remote = redis(srv.url());
  ASSERT_TRUE(remote);
  ASSERT_TRUE(remote->put(make_entry(7)).is_ok());
  ASSERT_TRUE(remote->flush().is_ok());

  auto lmdb = open_lmdb_tier(disk.path());
  ASSERT_TRUE(lmdb.has_value());
  auto mem = make_memory_tier();
  auto cache = Cache::with_tiers({mem, *lmdb, remote});
  std::atomic<int> compiles{0};
  Source src;
  auto e = cache->get_or_compile(
      key_of(7),
      [&]() -> Expected<std::vector<Artifact>> {
        ++compiles;
        return std::vector<Artifact>{{"obj", "x"}};
      },
      &src);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(src, Source::remote);
  EXPECT_TRUE(entry_ok(*e, 7));
  EXPECT_EQ(compiles.load(), 0);
  // Now in memory and on disk.
  EXPECT_TRUE(mem->get(key_of(7))->has_value());
  EXPECT_TRUE((*lmdb)->get(key_of(7))->has_value());
  cache->get(key_of(7), &src);
  EXPECT_EQ(src, Source::memory);
  EXPECT_EQ(remote->stats().hits, 1u);
}

TEST(Redis, CompiledEntriesAreSharedThroughTheServer) {
  TempDir d;
  START_REDIS(srv, d);
  std::atomic<int> compiles{0};
  auto fn = [&]() -> Expected<std::vector<Artifact>> {
    ++compiles;
    return std::vector<Artifact>{{"obj", "shared"}};
  };
  KeyInfo k = *KeyBuilder("t").add_string("src", "shared").finish();
  {
    auto c = Cache::with_tiers({make_memory_tier(), redis(srv.url())});
    Source s;
    ASSERT_TRUE(c->get_or_compile(k, fn, &s).has_value());
    EXPECT_EQ(s, Source::compiled);
  }  // destroying the cache flushes the queued write
  auto c = Cache::with_tiers({make_memory_tier(), redis(srv.url())});
  Source s;
  auto e = c->get_or_compile(k, fn, &s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(s, Source::remote);
  EXPECT_EQ(*e->artifact("obj"), "shared");
  EXPECT_EQ(e->manifest(), k.manifest);
  EXPECT_EQ(compiles.load(), 1);
}

TEST(Redis, TtlExpiresValues) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.ttl_ms = 400;
  auto t = redis(srv.url(), o);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  RedisClient c("127.0.0.1", srv.port());
  long long pttl = std::stoll(c.str({"PTTL", entry_redis_key(key_of(1))}));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 400);
  EXPECT_TRUE(t->get(key_of(1))->has_value());
  std::this_thread::sleep_for(Ms(800));
  EXPECT_FALSE(t->get(key_of(1))->has_value());
  // Without a TTL nothing expires.
  auto forever = redis(srv.url());
  ASSERT_TRUE(forever->put(make_entry(2)).is_ok());
  ASSERT_TRUE(forever->flush().is_ok());
  EXPECT_EQ(c.str({"PTTL", entry_redis_key(key_of(2))}), "-1");
}

TEST(Redis, PoisonedValuesAreRejectedBeforeParsing) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions good, other, none;
  good.secret = "team-secret";
  other.secret = "another-secret";
  auto t = redis(srv.url(), good);
  RedisClient c("127.0.0.1", srv.port());

  // 1: a good value reads back.
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  ASSERT_TRUE(t->get(key_of(1))->has_value());
  std::string v1 = c.str({"GET", entry_redis_key(key_of(1))});
  EXPECT_EQ(v1[5], 1);  // HMAC-SHA256
  EXPECT_EQ(v1.size(), 8 + 32 + make_entry(1).encoded().size());

  // 2: a MAC made with another secret.
  auto t2 = redis(srv.url(), other);
  ASSERT_TRUE(t2->put(make_entry(2)).is_ok());
  ASSERT_TRUE(t2->flush().is_ok());
  // 3: a flipped byte in the entry, under the original MAC.
  ASSERT_TRUE(t->put(make_entry(3)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  std::string v3 = c.str({"GET", entry_redis_key(key_of(3))});
  v3[v3.size() - 10] ^= 0x01;
  c.str({"SET", entry_redis_key(key_of(3)), v3});
  // 4: written without a MAC.
  auto t4 = redis(srv.url(), none);
  ASSERT_TRUE(t4->put(make_entry(4)).is_ok());
  ASSERT_TRUE(t4->flush().is_ok());
  // 5: a raw entry (no value header), 6: garbage, 7: a valid value copied
  // under another key.
  c.str({"SET", entry_redis_key(key_of(5)), std::string(make_entry(5).encoded())});
  c.str({"SET", entry_redis_key(key_of(6)), "garbage"});
  c.str({"SET", entry_redis_key(key_of(7)), v1});

  for (uint64_t i = 2; i <= 7; ++i) {
    auto g = t->get(key_of(i));
    ASSERT_TRUE(g.has_value()) << i;
    EXPECT_FALSE(g->has_value()) << "poisoned value " << i << " was accepted";
  }
  TierStats s = t->stats();
  EXPECT_EQ(s.rejected, 6u);
  EXPECT_EQ(s.corrupt, 0u);  // nothing reached Entry::decode
  EXPECT_EQ(s.hits, 1u);

  // Without a secret the flipped byte still never becomes a hit: the entry
  // checksum catches it (as corrupt, after parsing the header).
  auto plain = redis(srv.url(), none);
  EXPECT_FALSE(plain->get(key_of(3))->has_value());
  EXPECT_EQ(plain->stats().corrupt, 1u);
  EXPECT_TRUE(plain->get(key_of(4))->has_value());
}

TEST(Redis, ReadOnlyTierRefusesWrites) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.read_only = true;
  auto ro = redis(srv.url(), o);
  EXPECT_EQ(ro->put(make_entry(1)).code(), Errc::read_only);
  EXPECT_EQ(ro->remove(key_of(1)).code(), Errc::read_only);
  auto rw = redis(srv.url());
  ASSERT_TRUE(rw->put(make_entry(1)).is_ok());
  ASSERT_TRUE(rw->flush().is_ok());
  EXPECT_TRUE(ro->get(key_of(1))->has_value());
  EXPECT_EQ(ro->stats().rejected, 2u);
}

TEST(Redis, OversizedEntriesAreNotSent) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.max_entry_bytes = 4096;
  auto t = redis(srv.url(), o);
  EXPECT_EQ(t->put(make_entry(1, 10000)).code(), Errc::too_large);
  // And a value larger than the bound that someone else stored is a miss.
  auto big = redis(srv.url());
  ASSERT_TRUE(big->put(make_entry(2, 10000)).is_ok());
  ASSERT_TRUE(big->flush().is_ok());
  EXPECT_FALSE(t->get(key_of(2))->has_value());
  EXPECT_EQ(t->stats().rejected, 2u);
}

TEST(Redis, KilledServerNeverFailsACompileAndOpensTheBreaker) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.connect_timeout_ms = 200;
  o.command_timeout_ms = 200;
  o.breaker_threshold = 3;
  o.breaker_cooldown_ms = 60000;
  auto remote = redis(srv.url(), o);
  auto cache = Cache::with_tiers({make_memory_tier(), remote});
  auto fn = [](uint64_t i) {
    return [i]() -> Expected<std::vector<Artifact>> { return std::vector<Artifact>{{"obj", bytes_for(i, 100)}}; };
  };
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(cache->get_or_compile(key_of(i), fn(i)).has_value());
  (void)cache->flush();
  ASSERT_TRUE(remote->flush().is_ok());
  EXPECT_EQ(remote->stats().puts, 5u);

  srv.stop();  // SIGKILL
  const uint64_t bound = 3 * (o.connect_timeout_ms + o.command_timeout_ms);
  uint64_t worst = 0;
  for (uint64_t i = 100; i < 130; ++i) {
    uint64_t t0 = now_ms();
    Source s;
    auto e = cache->get_or_compile(key_of(i), fn(i), &s);
    uint64_t dt = now_ms() - t0;
    worst = std::max(worst, dt);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(s, Source::compiled);
    EXPECT_EQ(*e->artifact("obj"), bytes_for(i, 100));
    EXPECT_LT(dt, bound) << "call " << i;
  }
  TierStats s = remote->stats();
  EXPECT_EQ(remote->counters().breaker_opens, 1u);
  EXPECT_GE(s.errors, 3u);
  EXPECT_LE(s.errors, 6u);    // the breaker stopped the attempts
  EXPECT_GE(s.skipped, 50u);  // 30 gets and 30 puts, less the few that failed
  EXPECT_EQ(cache->stats().compiles, 35u);
  std::printf("killed server: worst call %llu ms (bound %llu ms), %llu errors, %llu skipped\n",
              (unsigned long long)worst, (unsigned long long)bound, (unsigned long long)s.errors,
              (unsigned long long)s.skipped);
}

TEST(Redis, PausedServerTimesOutThenRecovers) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.connect_timeout_ms = 200;
  o.command_timeout_ms = 200;
  o.breaker_threshold = 2;
  o.breaker_timeouts = 2;  // by default the first timeout opens the breaker
  o.breaker_cooldown_ms = 300;
  auto t = redis(srv.url(), o);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  ASSERT_TRUE(t->get(key_of(1))->has_value());

  RedisClient admin("127.0.0.1", srv.port());
  uint64_t paused_at = now_ms();
  ASSERT_EQ(admin.str({"CLIENT", "PAUSE", "2000"}), "OK");
  // Two calls wait out the command timeout, then the breaker skips.
  for (int i = 0; i < 2; ++i) {
    uint64_t t0 = now_ms();
    auto g = t->get(key_of(1));
    uint64_t dt = now_ms() - t0;
    ASSERT_FALSE(g.has_value()) << "a paused server answered";
    EXPECT_EQ(g.error().code(), Errc::timeout) << g.error().to_string();
    EXPECT_GE(dt, 150u);
    EXPECT_LT(dt, 3 * o.command_timeout_ms);
  }
  uint64_t t0 = now_ms();
  auto g = t->get(key_of(1));
  EXPECT_TRUE(g.has_value() && !g->has_value());  // skipped: a miss
  EXPECT_LT(now_ms() - t0, 50u);
  EXPECT_EQ(t->counters().breaker_opens, 1u);
  // put() returns at once: the write is queued.
  t0 = now_ms();
  ASSERT_TRUE(t->put(make_entry(2)).is_ok());
  EXPECT_LT(now_ms() - t0, 50u);

  // After the pause and the cool-down a probe succeeds and closes the breaker.
  std::this_thread::sleep_for(Ms(paused_at + 2300 - now_ms()));
  bool back = false;
  for (int i = 0; i < 50 && !back; ++i) {
    auto r = t->get(key_of(1));
    back = r.has_value() && r->has_value();
    if (!back) std::this_thread::sleep_for(Ms(50));
  }
  EXPECT_TRUE(back);
  EXPECT_GE(t->stats().skipped, 1u);
}

TEST(Redis, FullWriteQueueDropsAndCounts) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.write_queue_depth = 2;
  o.command_timeout_ms = 1000;
  o.breaker_threshold = 100;
  auto t = redis(srv.url(), o);
  RedisClient admin("127.0.0.1", srv.port());
  ASSERT_EQ(admin.str({"CLIENT", "PAUSE", "500"}), "OK");
  uint64_t t0 = now_ms();
  for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  EXPECT_LT(now_ms() - t0, 400u);  // never waits for the server
  ASSERT_TRUE(t->flush().is_ok());
  TierStats s = t->stats();
  EXPECT_GE(s.dropped, 45u);
  EXPECT_EQ(s.dropped + s.puts + s.errors, 50u);
  EXPECT_GE(s.puts, 1u);
}

TEST(Redis, LeasesGiveOneHolderAndExpire) {
  TempDir d;
  START_REDIS(srv, d);
  Remote ra = redis_remote(srv.url()), rb = redis_remote(srv.url());
  auto a = ra.leases, b = rb.leases;
  ASSERT_TRUE(a && b);
  Key k = key_of(1);
  EXPECT_TRUE(*a->acquire_lease(k, 10000));
  EXPECT_FALSE(*b->acquire_lease(k, 10000));
  EXPECT_TRUE(*a->acquire_lease(k, 10000));  // held: renewed
  EXPECT_TRUE(a->renew_lease(k, 10000));
  EXPECT_FALSE(b->renew_lease(k, 10000));

  // While the lease is held and nothing is stored, wait_for waits its bound.
  uint64_t t0 = now_ms();
  EXPECT_FALSE(b->wait_for(k, 200).has_value());
  EXPECT_GE(now_ms() - t0, 190u);

  // The holder stores and releases (queued in that order): the waiter gets it.
  std::thread holder([&] {
    std::this_thread::sleep_for(Ms(100));
    ASSERT_TRUE(ra.tier->put(make_entry(1)).is_ok());
    a->release_lease(k);
  });
  auto got = b->wait_for(k, 5000);
  holder.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(entry_ok(*got, 1));
  ASSERT_TRUE(ra.tier->flush().is_ok());
  RedisClient c("127.0.0.1", srv.port());
  EXPECT_EQ(c.str({"EXISTS", entry_redis_key(k) + ":lease"}), "0");

  // A holder that dies: its lease expires and the next caller takes over.
  Key k2 = key_of(2);
  EXPECT_TRUE(*a->acquire_lease(k2, 200));
  EXPECT_FALSE(*b->acquire_lease(k2, 200));
  t0 = now_ms();
  EXPECT_FALSE(b->wait_for(k2, 5000).has_value());  // returns when the lease is gone
  EXPECT_LT(now_ms() - t0, 1000u);
  EXPECT_TRUE(*b->acquire_lease(k2, 10000));
  b->release_lease(k2);
  a->release_lease(k2);  // not a's any more: must not remove b's next lease
  EXPECT_TRUE(*b->acquire_lease(k2, 10000));
  ASSERT_TRUE(ra.tier->flush().is_ok());
  EXPECT_EQ(c.str({"EXISTS", entry_redis_key(k2) + ":lease"}), "1");
  EXPECT_EQ(b->counters().leases_taken, 2u);
  EXPECT_EQ(b->counters().leases_busy, 2u);
}

TEST(Redis, GetManyPipelines) {
  TempDir d;
  START_REDIS(srv, d);
  RedisTierOptions o;
  o.write_queue_depth = 1000;
  auto t = redis(srv.url(), o);
  std::vector<Key> keys;
  for (uint64_t i = 0; i < 300; ++i) {
    ASSERT_TRUE(t->put(make_entry(i, 500)).is_ok());
    keys.push_back(key_of(i));
  }
  ASSERT_TRUE(t->flush().is_ok());
  for (uint64_t i = 1000; i < 1010; ++i) keys.push_back(key_of(i));
  auto got = t->get_many(keys);
  ASSERT_EQ(got.size(), keys.size());
  for (uint64_t i = 0; i < 300; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_TRUE(entry_ok(*got[i], i, 500));
  }
  for (size_t i = 300; i < keys.size(); ++i) EXPECT_FALSE(got[i].has_value());
}

// ---- two machines: separate processes with separate local folders ---------

namespace {

// Runs this test binary as another "machine": only RedisChild.Run, with the
// given extra environment. Returns its exit status.
pid_t spawn_child(const std::vector<std::string>& env) {
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    ::execl(KCACHE_TEST_BIN, KCACHE_TEST_BIN, "--gtest_filter=RedisChild.Run", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int wait_child(pid_t pid) {
  int st = 0;
  if (::waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string slurp(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return std::string();
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

// The child side: a whole Cache configured from the environment only
// (KCACHE_DIR, KCACHE_REMOTE, KCACHE_REMOTE_SECRET_FILE), as a JIT would be.
// With KCACHE_TEST_CHILD_PEER_WAITS (a path shared by two children), a child
// that waits on the other's lease creates that file, and a child that
// compiles finishes only once it exists: the compile outlasts the other's
// start however slowly the machine runs.
TEST(RedisChild, Run) {
  const char* out = std::getenv("KCACHE_TEST_CHILD_OUT");
  if (!out) GTEST_SKIP() << "runs only as the child process of Redis.TwoMachines*";
  const std::string log = std::getenv("KCACHE_TEST_CHILD_COMPILES");
  const int compile_ms = std::atoi(std::getenv("KCACHE_TEST_CHILD_COMPILE_MS"));
  const char* peer_waits = std::getenv("KCACHE_TEST_CHILD_PEER_WAITS");
  auto cache = Cache::open(Options::from_env());
  ASSERT_EQ(cache->tiers().size(), 3u);
  EXPECT_EQ(cache->tiers().back()->name(), "redis");
  KeyInfo k = *KeyBuilder("two-machines").add_string("src", std::getenv("KCACHE_TEST_CHILD_KEY")).finish();
  std::optional<OnLeaseWait> on_wait;
  if (peer_waits)
    on_wait.emplace(*cache, [peer_waits] {
      if (FILE* w = std::fopen(peer_waits, "w")) std::fclose(w);
    });
  Source src;
  auto e = cache->get_or_compile(
      k,
      [&]() -> Expected<std::vector<Artifact>> {
        std::this_thread::sleep_for(Ms(compile_ms));
        if (peer_waits) {
          EXPECT_TRUE(wait_until([&] { return ::access(peer_waits, F_OK) == 0; }));
        }
        FILE* f = std::fopen(log.c_str(), "a");
        std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
        std::fclose(f);
        return std::vector<Artifact>{{"obj", "built once for everyone"}};
      },
      &src);
  on_wait.reset();
  ASSERT_TRUE(e.has_value());
  FILE* f = std::fopen(out, "w");
  std::fprintf(f, "%s %s", std::string(source_name(src)).c_str(), std::string(*e->artifact("obj")).c_str());
  std::fclose(f);
}

TEST(Redis, TwoMachinesOneCompilesTheOtherHits) {
  TempDir d, a, b;
  START_REDIS(srv, d);
  std::string secret = d.path() + "/secret";
  FILE* f = std::fopen(secret.c_str(), "w");
  std::fprintf(f, "shared-team-secret\n");
  std::fclose(f);
  std::string compiles = d.path() + "/compiles";
  auto env = [&](const TempDir& dir, const std::string& out) {
    return std::vector<std::string>{"KCACHE_DIR=" + dir.path(),
                                    "KCACHE_REMOTE=" + srv.url(),
                                    "KCACHE_REMOTE_SECRET_FILE=" + secret,
                                    "KCACHE_LOG=error",
                                    "KCACHE_TEST_CHILD_OUT=" + out,
                                    "KCACHE_TEST_CHILD_COMPILES=" + compiles,
                                    "KCACHE_TEST_CHILD_COMPILE_MS=50",
                                    "KCACHE_TEST_CHILD_KEY=kernel-1"};
  };
  ASSERT_EQ(wait_child(spawn_child(env(a, d.path() + "/out-a"))), 0);
  EXPECT_EQ(slurp(d.path() + "/out-a"), "compiled built once for everyone");
  ASSERT_EQ(wait_child(spawn_child(env(b, d.path() + "/out-b"))), 0);
  EXPECT_EQ(slurp(d.path() + "/out-b"), "remote built once for everyone");
  EXPECT_EQ(count_lines(slurp(compiles)), 1u);

  // Both machines miss a new key at once: one compiles, the other waits on
  // the Redis lease and takes the entry from the server. The compile ends
  // once the other machine waits.
  auto envk = [&](const TempDir& dir, const std::string& out) {
    auto e = env(dir, out);
    e[6] = "KCACHE_TEST_CHILD_COMPILE_MS=0";
    e[7] = "KCACHE_TEST_CHILD_KEY=kernel-2";
    e.push_back("KCACHE_TEST_CHILD_PEER_WAITS=" + d.path() + "/peer-waits");
    return e;
  };
  TempDir a2, b2;
  pid_t pa = spawn_child(envk(a2, d.path() + "/out-a2"));
  pid_t pb = spawn_child(envk(b2, d.path() + "/out-b2"));
  ASSERT_EQ(wait_child(pa), 0);
  ASSERT_EQ(wait_child(pb), 0);
  std::string oa = slurp(d.path() + "/out-a2"), ob = slurp(d.path() + "/out-b2");
  EXPECT_EQ(count_lines(slurp(compiles)), 2u) << "kernel-2 was compiled on both machines";
  EXPECT_TRUE((oa.starts_with("compiled ") && ob.starts_with("waited ")) ||
              (ob.starts_with("compiled ") && oa.starts_with("waited ")))
      << oa << " / " << ob;
  EXPECT_TRUE(oa.ends_with(" built once for everyone") && ob.ends_with(" built once for everyone"));

  // The value on the server is signed.
  RedisClient c("127.0.0.1", srv.port());
  auto k = KeyBuilder("two-machines").add_string("src", "kernel-1").finish()->key;
  std::string v = c.str({"GET", entry_redis_key(k)});
  ASSERT_GE(v.size(), 40u);
  EXPECT_EQ(v[5], 1);
}

// The remote's leases reach the assembly: two caches in two folders (two
// machines) share single-flight through the server.
TEST(Redis, AssemblyCombinesTheDiskLeasesWithTheRemotes) {
  TempDir d;
  START_REDIS(srv, d);
  Options o;
  o.remote_url = srv.url();
  o.dir = d.path() + "/a";
  Assembly a = assemble(o);
  o.dir = d.path() + "/b";
  Assembly b = assemble(o);
  ASSERT_TRUE(a.remote && b.remote);
  EXPECT_EQ(a.remote->name(), "redis");
  EXPECT_EQ(a.tiers.back(), a.remote);
  ASSERT_TRUE(a.leases && b.leases);
  EXPECT_EQ(a.leases->name(), "redis");
  Key k = key_of(1);
  EXPECT_EQ(a.leases->acquire(k, 10000), LeaseResult::acquired);
  EXPECT_EQ(b.leases->acquire(k, 10000), LeaseResult::busy);  // the server says another machine has it
  a.leases->release(k);
  ASSERT_TRUE(a.remote->flush().is_ok());
  EXPECT_EQ(b.leases->acquire(k, 10000), LeaseResult::acquired);
  b.leases->release(k);
  // Without single-flight there are no leases, remote or local.
  o.process_single_flight = false;
  Assembly c = assemble(o);
  EXPECT_TRUE(c.remote);
  EXPECT_EQ(c.leases, nullptr);
  // A scheme's open gives the tier and, for Redis, the leases.
  auto opened = open_remote(srv.url(), "");
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  ASSERT_TRUE(opened->tier);
  ASSERT_TRUE(opened->leases);
  auto alone = opened->leases(nullptr);
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->acquire(key_of(2), 10000), LeaseResult::acquired);
  auto bad = open_remote("redis://:hunter2@127.0.0.1:1?nope=1", "");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().to_string().find("hunter2"), std::string::npos);
  auto unknown = open_remote("memcached://:hunter2@127.0.0.1:1", "");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().code(), Errc::invalid_argument);
  EXPECT_EQ(unknown.error().message(),
            "remote URL has scheme 'memcached://', not a known one (built in: redis://, redis+cluster://)");
}

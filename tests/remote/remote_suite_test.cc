// The remote policy tier (kcache/remote.h) over two transports: a real
// redis-server started by each test, and the in-process fault transport.
// The same conformance checks and fault suite run over both; a few faults
// only the in-process transport can produce on cue are checked over it alone.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kcache/cache.h"
#include "remote_backends.h"

using namespace kcache;
using namespace kcache::test;

namespace {

Remote as_remote(Expected<Remote> r) {
  EXPECT_TRUE(r.has_value()) << r.status().to_string();
  return r ? *r : Remote{};
}

class RemoteTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "redis" && find_program("redis-server").empty()) {
      std::fprintf(stderr, "*** SKIPPED: redis-server is not installed\n");
      GTEST_SKIP() << "redis-server is not installed";
    }
    server_ = start_remote(GetParam());
    ASSERT_TRUE(server_->ok()) << server_->error();
  }
  // The tier and its leases.
  Remote remote(RemoteTierOptions o = {}) { return as_remote(make_remote(server_->transport(), o)); }
  std::shared_ptr<RemoteTier> tier(RemoteTierOptions o = {}) { return remote(o).tier; }
  // Short timeouts and a breaker that stays open for the whole test.
  static RemoteTierOptions quick() {
    RemoteTierOptions o;
    o.connect_timeout_ms = 150;
    o.command_timeout_ms = 200;
    o.breaker_cooldown_ms = 60000;
    return o;
  }
  std::unique_ptr<RemoteServer> server_;
};

std::string names(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

}  // namespace

// ---- conformance ----------------------------------------------------------

using RemoteConformance = RemoteTest;

TEST_P(RemoteConformance, EmptyIsAMiss) {
  auto t = tier();
  auto r = t->get(key_of(1));
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(t->stats().misses, 1u);
  // A re-check inside one request counts no second miss.
  ASSERT_TRUE(t->get(key_of(1), Access::uncounted).has_value());
  EXPECT_EQ(t->stats().misses, 1u);
}

TEST_P(RemoteConformance, PutThenGetReturnsIdenticalBytes) {
  RemoteTierOptions o;
  o.write_queue_depth = 100;
  auto t = tier(o);
  for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE(t->put(make_entry(i, 100 + i * 997)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  for (uint64_t i = 0; i < 50; ++i) {
    auto r = t->get(key_of(i));
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    ASSERT_TRUE(r->has_value()) << i;
    EXPECT_TRUE(entry_ok(**r, i, 100 + i * 997));
    EXPECT_EQ((*r)->meta().compile_cost_us, 1234u);
    EXPECT_EQ((*r)->meta().producer, "test");
  }
  auto s = t->stats();
  EXPECT_EQ(s.hits, 50u);
  EXPECT_EQ(s.puts, 50u);
  EXPECT_EQ(s.errors, 0u);
}

TEST_P(RemoteConformance, PutReplaces) {
  auto t = tier();
  ASSERT_TRUE(t->put(make_entry(1, 100)).is_ok());
  auto e2 = EntryBuilder(key_of(1)).add("obj", "second").build();
  ASSERT_TRUE(t->put(*e2).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  auto r = t->get(key_of(1));
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ(*(*r)->artifact("obj"), "second");
}

TEST_P(RemoteConformance, RemoveAndRemoveAbsent) {
  auto t = tier();
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  ASSERT_TRUE(t->remove(key_of(3)).is_ok());
  ASSERT_TRUE(t->remove(key_of(1000)).is_ok());  // absent: fine
  EXPECT_FALSE(t->get(key_of(3))->has_value());
  EXPECT_TRUE(t->get(key_of(4))->has_value());
}

TEST_P(RemoteConformance, AnotherClientSeesTheEntries) {
  RemoteTierOptions o;
  o.secret = "shared";
  {
    auto a = tier(o);
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(a->put(make_entry(i)).is_ok());
  }  // the destructor sends what is queued
  auto b = tier(o);
  for (uint64_t i = 0; i < 10; ++i) {
    auto r = b->get(key_of(i));
    ASSERT_TRUE(r.has_value() && r->has_value()) << i;
    EXPECT_TRUE(entry_ok(**r, i));
  }
}

TEST_P(RemoteConformance, ManyThreadsReadAndWrite) {
  RemoteTierOptions o;
  o.write_queue_depth = 1000;
  auto t = tier(o);
  std::atomic<int> bad{0};
  std::vector<std::thread> ths;
  for (int w = 0; w < 8; ++w) {
    ths.emplace_back([&, w] {
      for (uint64_t i = 0; i < 40; ++i) {
        uint64_t k = w * 1000 + i;
        if (!t->put(make_entry(k, 300)).is_ok()) bad++;
        auto r = t->get(key_of(w * 1000 + (i ? i - 1 : 0)));
        if (!r)
          bad++;
        else if (r->has_value() && !entry_ok(**r, w * 1000 + (i ? i - 1 : 0), 300))
          bad++;
      }
    });
  }
  for (auto& th : ths) th.join();
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_EQ(bad.load(), 0);
  for (int w = 0; w < 8; ++w)
    for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(t->get(key_of(w * 1000 + i))->has_value());
  EXPECT_EQ(t->stats().puts, 320u);
}

TEST_P(RemoteConformance, ReadOnlyRefusesWritesAndPassesReads) {
  auto rw = tier();
  ASSERT_TRUE(rw->put(make_entry(1)).is_ok());
  ASSERT_TRUE(rw->flush().is_ok());
  RemoteTierOptions o;
  o.read_only = true;
  auto ro = tier(o);
  EXPECT_FALSE(ro->writable());
  EXPECT_TRUE(ro->name().ends_with("(ro)"));
  EXPECT_EQ(ro->put(make_entry(2)).code(), Errc::read_only);
  EXPECT_EQ(ro->remove(key_of(1)).code(), Errc::read_only);
  EXPECT_TRUE(ro->get(key_of(1))->has_value());
  auto wrapped = make_read_only(rw);
  EXPECT_EQ(wrapped->put(make_entry(3)).code(), Errc::read_only);
  EXPECT_TRUE(wrapped->get(key_of(1))->has_value());
  EXPECT_EQ(wrapped->kind(), TierKind::remote);
  EXPECT_EQ(ro->stats().rejected, 2u);
}

TEST_P(RemoteConformance, OversizedEntryIsRefusedNotFatal) {
  RemoteTierOptions o;
  o.max_entry_bytes = 4096;
  auto t = tier(o);
  EXPECT_EQ(t->put(make_entry(1, 10000)).code(), Errc::too_large);
  auto big = tier();
  ASSERT_TRUE(big->put(make_entry(2, 10000)).is_ok());
  ASSERT_TRUE(big->flush().is_ok());
  auto r = t->get(key_of(2));
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->has_value());  // larger than this tier accepts: a miss
  EXPECT_EQ(t->stats().rejected, 2u);
}

// docs/format.md, "Redis value": the bytes on the server are the same over
// every transport.
TEST_P(RemoteConformance, ValueBytesFollowTheFormat) {
  auto plain = tier();
  RemoteTierOptions so;
  so.secret = "team-secret";
  auto sig = tier(so);
  Entry e1 = make_entry(1), e2 = make_entry(2);
  ASSERT_TRUE(plain->put(e1).is_ok());
  ASSERT_TRUE(sig->put(e2).is_ok());
  ASSERT_TRUE(plain->flush().is_ok());
  ASSERT_TRUE(sig->flush().is_ok());
  std::string v1 = server_->get_raw(key_of(1)), v2 = server_->get_raw(key_of(2));
  ASSERT_EQ(v1.size(), 8 + e1.encoded().size());
  EXPECT_EQ(v1.substr(0, 8), std::string("KCRV\x01\x00\x00\x00", 8));
  EXPECT_EQ(v1.substr(8), std::string(e1.encoded()));
  ASSERT_EQ(v2.size(), 8 + 32 + e2.encoded().size());
  EXPECT_EQ(v2.substr(0, 6), std::string("KCRV\x01\x01", 6));
  EXPECT_NE(v2.substr(6, 2), std::string(2, '\0')) << "the secret's fingerprint";
  EXPECT_EQ(v2.substr(40), std::string(e2.encoded()));
  // A value written by hand in this format reads back.
  Entry e3 = make_entry(3);
  server_->put_raw(key_of(3), std::string("KCRV\x01\x00\x00\x00", 8) + std::string(e3.encoded()));
  auto r = plain->get(key_of(3));
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_TRUE(entry_ok(**r, 3));
}

TEST_P(RemoteConformance, PoisonedValuesAreMissesLoggedOncePerKey) {
  RemoteTierOptions o;
  o.secret = "team-secret";
  auto t = tier(o);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  std::string good = server_->get_raw(key_of(1));
  ASSERT_EQ(good.size(), 40 + make_entry(1).encoded().size());
  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 1;
  server_->put_raw(key_of(2), good);  // a valid value under another key
  server_->put_raw(key_of(3), flipped);
  server_->put_raw(key_of(4), "garbage");
  server_->put_raw(key_of(5), std::string(make_entry(5).encoded()));  // no value header
  RemoteTierOptions other = o;
  other.secret = "another-secret";
  auto foreign = tier(other);  // signed with another secret
  ASSERT_TRUE(foreign->put(make_entry(6)).is_ok());
  ASSERT_TRUE(foreign->flush().is_ok());
  LogCapture log;
  // Each poisoned key is read three times, as one compile of it does.
  for (int round = 0; round < 3; ++round)
    for (uint64_t i = 2; i <= 6; ++i) {
      auto r = t->get(key_of(i), round ? Access::uncounted : Access::counted);
      ASSERT_TRUE(r.has_value()) << i;
      EXPECT_FALSE(r->has_value()) << "poisoned value " << i << " was accepted";
    }
  EXPECT_EQ(t->stats().rejected, 15u);
  EXPECT_EQ(t->stats().corrupt, 0u);  // nothing reached Entry::decode
  EXPECT_EQ(log.warnings(), 5u) << log.text();
  EXPECT_FALSE(t->breaker_open());
  // Storing the key again makes a later poisoning worth a new line.
  ASSERT_TRUE(t->put(make_entry(4)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_TRUE(t->get(key_of(4))->has_value());
  server_->put_raw(key_of(4), "garbage again");
  EXPECT_FALSE(t->get(key_of(4))->has_value());
  EXPECT_EQ(log.warnings(), 6u) << log.text();
}

TEST_P(RemoteConformance, GetManyMatchesGets) {
  RemoteTierOptions o;
  o.write_queue_depth = 500;
  auto t = tier(o);
  std::vector<Key> keys;
  for (uint64_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(t->put(make_entry(i, 200)).is_ok());
    keys.push_back(key_of(i));
  }
  ASSERT_TRUE(t->flush().is_ok());
  for (uint64_t i = 1000; i < 1010; ++i) keys.push_back(key_of(i));
  server_->put_raw(key_of(1000), "garbage");
  auto got = t->get_many(keys);
  ASSERT_EQ(got.size(), keys.size());
  for (uint64_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_TRUE(entry_ok(*got[i], i, 200));
  }
  for (size_t i = 200; i < keys.size(); ++i) EXPECT_FALSE(got[i].has_value());
  EXPECT_EQ(t->stats().hits, 200u);
  EXPECT_EQ(t->stats().misses, 10u);
  EXPECT_EQ(t->stats().rejected, 1u);
}

TEST_P(RemoteConformance, LeasesGiveOneHolderAndExpire) {
  Remote ra = remote(), rb = remote();
  auto a = ra.leases, b = rb.leases;
  ASSERT_TRUE(a && b);
  Key k = key_of(1);
  EXPECT_TRUE(*a->acquire_lease(k, 10000));
  EXPECT_FALSE(*b->acquire_lease(k, 10000));
  EXPECT_TRUE(*a->acquire_lease(k, 10000));  // held: renewed
  EXPECT_TRUE(a->renew_lease(k, 10000));
  EXPECT_FALSE(b->renew_lease(k, 10000));
  uint64_t t0 = mono_ms();
  EXPECT_FALSE(b->wait_for(k, 150).has_value());
  EXPECT_GE(mono_ms() - t0, 140u);
  // Store, then release (queued in that order): the waiter gets the entry.
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(ra.tier->put(make_entry(1)).is_ok());
    a->release_lease(k);
  });
  auto got = b->wait_for(k, 5000);
  holder.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(entry_ok(*got, 1));
  ASSERT_TRUE(ra.tier->flush().is_ok());
  EXPECT_TRUE(*b->acquire_lease(k, 10000));
  // A lease whose holder goes away expires, and the next caller takes over.
  Key k2 = key_of(2);
  EXPECT_TRUE(*a->acquire_lease(k2, 200));
  EXPECT_FALSE(*b->acquire_lease(k2, 200));
  t0 = mono_ms();
  EXPECT_FALSE(b->wait_for(k2, 5000).has_value());
  EXPECT_LT(mono_ms() - t0, 1500u);
  EXPECT_TRUE(*b->acquire_lease(k2, 10000));
  a->release_lease(k2);  // not a's any more: must not remove b's
  ASSERT_TRUE(ra.tier->flush().is_ok());
  EXPECT_FALSE(*a->acquire_lease(k2, 10000));
  EXPECT_EQ(b->counters().leases_taken, 2u);
  EXPECT_EQ(b->counters().leases_busy, 2u);
}

TEST_P(RemoteConformance, CombinedLeasesQueueMachinesOnTheServer) {
  Remote a = remote(), b = remote();
  auto la = make_remote_leases(a.leases, nullptr), lb = make_remote_leases(b.leases, nullptr);
  ASSERT_TRUE(la && lb);
  EXPECT_EQ(la->acquire(key_of(1), 10000), LeaseResult::acquired);
  EXPECT_EQ(lb->acquire(key_of(1), 10000), LeaseResult::busy);
  la->release(key_of(1));
  ASSERT_TRUE(a.tier->flush().is_ok());
  EXPECT_EQ(lb->acquire(key_of(1), 10000), LeaseResult::acquired);
  // No remote leases: the local leases come back unchanged.
  EXPECT_EQ(make_remote_leases(nullptr, nullptr), nullptr);
  EXPECT_EQ(make_remote_leases(nullptr, la), la);
}

TEST_P(RemoteConformance, ValuesExpireAfterTheirTtl) {
  RemoteTierOptions o;
  o.ttl_ms = 300;
  auto t = tier(o);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_TRUE(t->get(key_of(1))->has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_FALSE(t->get(key_of(1))->has_value());
}

INSTANTIATE_TEST_SUITE_P(Backends, RemoteConformance, ::testing::Values("redis", "memory"), names);

// ---- faults -----------------------------------------------------------------

using RemoteFaults = RemoteTest;

TEST_P(RemoteFaults, HungServerCostsOneTimeoutThenIsSkipped) {
  RemoteTierOptions o = quick();
  Remote r0 = remote(o);
  auto t = r0.tier;
  ASSERT_TRUE(t->get(key_of(1)).has_value());  // a pooled connection
  LogCapture log;
  server_->hang();
  uint64_t t0 = mono_ms();
  auto r = t->get(key_of(1));
  uint64_t dt = mono_ms() - t0;
  ASSERT_FALSE(r.has_value()) << "a hung server answered";
  EXPECT_EQ(r.error().code(), Errc::timeout) << r.error().to_string();
  EXPECT_GE(dt, o.command_timeout_ms - 50);
  EXPECT_LE(dt, o.command_timeout_ms + o.connect_timeout_ms + 250);
  EXPECT_TRUE(t->breaker_open());
  // The rest of the request, and the requests after it, skip the server.
  t0 = mono_ms();
  for (int i = 0; i < 5; ++i) {
    auto g = t->get(key_of(2 + i));
    ASSERT_TRUE(g.has_value());
    EXPECT_FALSE(g->has_value());
  }
  EXPECT_FALSE(r0.leases->acquire_lease(key_of(1), 1000).has_value());
  EXPECT_FALSE(r0.leases->wait_for(key_of(1), 1000).has_value());
  EXPECT_TRUE(t->put(make_entry(9)).is_ok());
  EXPECT_LT(mono_ms() - t0, o.command_timeout_ms / 2);  // no second timeout
  RemoteCounters c = t->counters();
  EXPECT_EQ(c.breaker_opens, 1u);
  EXPECT_EQ(c.timeouts, 1u);
  EXPECT_GE(t->stats().skipped, 8u);
  EXPECT_EQ(log.warnings(), 1u) << log.text();
  server_->unhang();
}

TEST_P(RemoteFaults, HungServerIsProbedAgainAfterTheCooldown) {
  RemoteTierOptions o = quick();
  o.breaker_cooldown_ms = 300;
  auto t = tier(o);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  LogCapture log;
  server_->hang();
  EXPECT_FALSE(t->get(key_of(1)).has_value());
  EXPECT_TRUE(t->breaker_open());
  server_->unhang();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto r = t->get(key_of(1));  // the probe
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  ASSERT_TRUE(r->has_value());
  EXPECT_FALSE(t->breaker_open());
  EXPECT_EQ(log.warnings(), 1u) << log.text();
  EXPECT_EQ(log.count("server answers again"), 1u) << log.text();
}

TEST_P(RemoteFaults, DeadServerIsSkippedAfterTheThreshold) {
  RemoteTierOptions o = quick();
  auto t = tier(o);
  ASSERT_TRUE(t->get(key_of(1)).has_value());
  LogCapture log;
  server_->kill();
  uint64_t t0 = mono_ms();
  for (unsigned i = 0; i < o.breaker_threshold; ++i) {
    auto r = t->get(key_of(1));
    ASSERT_FALSE(r.has_value()) << i;
    EXPECT_EQ(r.error().code(), Errc::unavailable) << r.error().to_string();
  }
  EXPECT_TRUE(t->breaker_open());
  auto skipped = t->get(key_of(1));
  ASSERT_TRUE(skipped.has_value());
  EXPECT_FALSE(skipped->has_value());
  EXPECT_LT(mono_ms() - t0, o.command_timeout_ms);  // cheap failures: no timeout paid
  RemoteCounters c = t->counters();
  EXPECT_EQ(c.breaker_opens, 1u);
  EXPECT_EQ(c.unreachable, o.breaker_threshold);
  EXPECT_EQ(c.timeouts, 0u);
  EXPECT_EQ(log.warnings(), 1u) << log.text();
}

TEST_P(RemoteFaults, KeyOfTheWrongTypeIsAMissNotAnOutage) {
  auto t = tier(quick());
  ASSERT_TRUE(t->put(make_entry(2)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  server_->set_wrong_type(key_of(1));
  LogCapture log;
  for (int i = 0; i < 10; ++i) {
    auto r = t->get(key_of(1));
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    EXPECT_FALSE(r->has_value());
  }
  EXPECT_FALSE(t->breaker_open());
  EXPECT_EQ(t->counters().bad_replies, 10u);
  EXPECT_EQ(t->counters().breaker_opens, 0u);
  EXPECT_TRUE(t->get(key_of(2))->has_value());
  EXPECT_EQ(log.warnings(), 1u) << log.text();
  // Writing the key replaces what was there.
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  EXPECT_TRUE(t->get(key_of(1))->has_value());
}

TEST_P(RemoteFaults, PutsNeverWaitForAHungServer) {
  RemoteTierOptions o = quick();
  o.write_queue_depth = 8;
  auto t = tier(o);
  ASSERT_TRUE(t->get(key_of(0)).has_value());
  std::vector<Entry> entries;
  for (uint64_t i = 0; i < 50; ++i) entries.push_back(make_entry(i));
  server_->hang();
  uint64_t t0 = mono_ms();
  for (const Entry& e : entries) ASSERT_TRUE(t->put(e).is_ok());
  EXPECT_LT(mono_ms() - t0, o.command_timeout_ms / 2);
  // The first write runs into its timeout and opens the breaker; the rest
  // are skipped, so flushing ends within one timeout and a bit.
  t0 = mono_ms();
  (void)t->flush();
  EXPECT_LE(mono_ms() - t0, o.command_timeout_ms + o.connect_timeout_ms + 250);
  TierStats s = t->stats();
  EXPECT_EQ(s.puts, 0u);
  EXPECT_EQ(s.skipped + s.dropped + s.errors, 50u);
  EXPECT_EQ(t->counters().breaker_opens, 1u);
  server_->unhang();
}

// The whole request, through a Cache with the remote's leases: the lookup,
// the re-check, the lease and the store share one timeout.
TEST_P(RemoteFaults, ACompileThroughTheCachePaysAtMostOneTimeout) {
  RemoteTierOptions o = quick();
  Remote r = this->remote(o);
  auto remote = r.tier;
  auto cache = Cache::with_tiers({make_memory_tier(), remote});
  cache->set_leases(make_remote_leases(r.leases, nullptr));
  auto fn = [](uint64_t i) {
    return [i]() -> Expected<std::vector<Artifact>> { return std::vector<Artifact>{{"obj", bytes_for(i, 100)}}; };
  };
  ASSERT_TRUE(cache->get_or_compile(key_of(0), fn(0)).has_value());
  (void)cache->flush();  // the committer's writes, then the remote's queue
  LogCapture log(LogLevel::warn);
  server_->hang();
  uint64_t worst = 0;
  for (uint64_t i = 1; i <= 5; ++i) {
    uint64_t t0 = mono_ms();
    Source s;
    auto e = cache->get_or_compile(key_of(i), fn(i), &s);
    uint64_t dt = mono_ms() - t0;
    worst = std::max(worst, dt);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(s, Source::compiled);
    EXPECT_EQ(*e->artifact("obj"), bytes_for(i, 100));
    EXPECT_LE(dt, o.command_timeout_ms + o.connect_timeout_ms + 250) << "call " << i;
    if (i > 1) {
      EXPECT_LT(dt, o.command_timeout_ms / 2) << "call " << i << " after the breaker opened";
    }
  }
  EXPECT_EQ(cache->stats().compiles, 6u);
  EXPECT_EQ(remote->counters().timeouts, 1u);
  EXPECT_EQ(log.warnings(), 1u) << log.text();
  server_->unhang();
}

// A poisoned key is read three times by one compile (lookup, re-check,
// after taking the lease): one warn line, not three.
TEST_P(RemoteFaults, APoisonedKeyIsOneLinePerCompile) {
  RemoteTierOptions o = quick();
  o.secret = "team-secret";
  Remote r = this->remote(o);
  auto remote = r.tier;
  auto cache = Cache::with_tiers({remote});
  cache->set_leases(make_remote_leases(r.leases, nullptr));
  LogCapture log(LogLevel::warn);
  uint64_t compiles = 0;
  for (int round = 1; round <= 2; ++round) {
    server_->put_raw(key_of(7), "KCRV\x01\x01\x00\x00 forged bytes without a valid MAC");
    Source s;
    auto e = cache->get_or_compile(
        key_of(7),
        [&]() -> Expected<std::vector<Artifact>> {
          ++compiles;
          return std::vector<Artifact>{{"obj", "good"}};
        },
        &s);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(s, Source::compiled);
    (void)cache->flush();  // the committer's writes, then the remote's queue
    EXPECT_EQ(log.warnings(), static_cast<size_t>(round)) << log.text();
    EXPECT_EQ(remote->stats().rejected, 3u * round);
    // The compile replaced the poisoned value: the next lookup hits.
    Source again;
    ASSERT_TRUE(cache->get(key_of(7), &again).has_value());
    EXPECT_EQ(again, Source::remote);
  }
  EXPECT_EQ(compiles, 2u);
  EXPECT_FALSE(remote->breaker_open());
}

INSTANTIATE_TEST_SUITE_P(Backends, RemoteFaults, ::testing::Values("redis", "memory"), names);

// ---- faults only the in-process transport produces on cue -------------------

namespace {

struct Injected {
  std::shared_ptr<FaultTransport> t = std::make_shared<FaultTransport>();
  Remote remote(RemoteTierOptions o) { return as_remote(make_remote(t, t, o)); }
  std::shared_ptr<RemoteTier> tier(RemoteTierOptions o) { return remote(o).tier; }
};

}  // namespace

TEST(RemoteInjected, SlowRepliesWithinTheTimeoutAreServed) {
  Injected x;
  RemoteTierOptions o;
  o.command_timeout_ms = 300;
  auto t = x.tier(o);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  ASSERT_TRUE(t->flush().is_ok());
  x.t->inject(FaultTransport::Fault::slow, 60);
  uint64_t t0 = mono_ms();
  auto r = t->get(key_of(1));
  uint64_t dt = mono_ms() - t0;
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_GE(dt, 55u);
  EXPECT_FALSE(t->breaker_open());
  EXPECT_EQ(t->stats().errors, 0u);
}

TEST(RemoteInjected, SlowRepliesPastTheTimeoutAreTimeouts) {
  Injected x;
  RemoteTierOptions o;
  o.command_timeout_ms = 100;
  o.breaker_cooldown_ms = 60000;
  auto t = x.tier(o);
  x.t->inject(FaultTransport::Fault::slow, 5000);
  uint64_t t0 = mono_ms();
  auto r = t->get(key_of(1));
  uint64_t dt = mono_ms() - t0;
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Errc::timeout);
  EXPECT_GE(dt, 95u);
  EXPECT_LT(dt, 1000u);
  EXPECT_TRUE(t->breaker_open());
}

TEST(RemoteInjected, EachFaultIsCountedByItsKind) {
  using F = FaultTransport::Fault;
  struct Case {
    F fault;
    Errc code;
    bool opens_at_once;
  };
  for (const Case& c : {Case{F::reset, Errc::unavailable, false}, Case{F::refused, Errc::unavailable, false},
                        Case{F::garbage, Errc::unavailable, false}, Case{F::error_reply, Errc::io_error, false},
                        Case{F::timeout, Errc::timeout, true}}) {
    Injected x;
    RemoteTierOptions o;
    o.command_timeout_ms = 50;
    o.breaker_cooldown_ms = 60000;
    auto t = x.tier(o);
    LogCapture log;
    x.t->inject(c.fault);
    auto r = t->get(key_of(1));
    ASSERT_FALSE(r.has_value()) << static_cast<int>(c.fault);
    EXPECT_EQ(r.error().code(), c.code) << r.error().to_string();
    EXPECT_EQ(t->breaker_open(), c.opens_at_once) << static_cast<int>(c.fault);
    // Cheap failures open it at the threshold.
    for (int i = 0; i < 2 && !t->breaker_open(); ++i) EXPECT_FALSE(t->get(key_of(1)).has_value());
    EXPECT_TRUE(t->breaker_open()) << static_cast<int>(c.fault);
    EXPECT_TRUE(t->get(key_of(1)).has_value());  // skipped: a miss
    RemoteCounters k = t->counters();
    uint64_t n = c.opens_at_once ? 1 : 3;
    EXPECT_EQ(k.timeouts, c.code == Errc::timeout ? n : 0u);
    EXPECT_EQ(k.unreachable, c.code == Errc::unavailable ? n : 0u);
    EXPECT_EQ(k.server_errors, c.code == Errc::io_error ? n : 0u);
    EXPECT_EQ(t->stats().errors, n);
    EXPECT_EQ(t->stats().skipped, 1u);
    EXPECT_EQ(log.warnings(), 1u) << log.text();
  }
}

TEST(RemoteInjected, WrongTypeRepliesNeverOpenTheBreaker) {
  Injected x;
  Remote rt = x.remote({});
  auto t = rt.tier;
  x.t->inject(FaultTransport::Fault::wrong_type);
  for (int i = 0; i < 10; ++i) {
    auto r = t->get(key_of(i));
    ASSERT_TRUE(r.has_value());
    EXPECT_FALSE(r->has_value());
  }
  EXPECT_FALSE(rt.leases->acquire_lease(key_of(1), 1000).has_value());
  EXPECT_FALSE(t->breaker_open());
  EXPECT_EQ(t->counters().bad_replies, 11u);
  x.t->inject(FaultTransport::Fault::none);
  EXPECT_TRUE(*rt.leases->acquire_lease(key_of(1), 1000));
}

TEST(RemoteInjected, AFailedProbeReopensWithoutANewWarning) {
  Injected x;
  RemoteTierOptions o;
  o.command_timeout_ms = 30;
  o.breaker_cooldown_ms = 100;
  auto t = x.tier(o);
  LogCapture log;
  x.t->inject(FaultTransport::Fault::timeout);
  for (int round = 0; round < 3; ++round) {
    EXPECT_FALSE(t->get(key_of(1)).has_value());  // a timeout: the first, then the probes
    EXPECT_TRUE(t->breaker_open());
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
  }
  EXPECT_EQ(t->counters().breaker_opens, 1u);
  EXPECT_EQ(t->counters().timeouts, 3u);
  EXPECT_EQ(log.warnings(), 1u) << log.text();
  x.t->inject(FaultTransport::Fault::none);
  EXPECT_TRUE(t->get(key_of(1)).has_value());
  EXPECT_FALSE(t->breaker_open());
  // A new outage after the server answered is a new event: a new line.
  x.t->inject(FaultTransport::Fault::timeout);
  EXPECT_FALSE(t->get(key_of(1)).has_value());
  EXPECT_EQ(log.warnings(), 2u) << log.text();
  EXPECT_EQ(t->counters().breaker_opens, 2u);
}

TEST(RemoteInjected, TheTransportGetsThePolicysTimeouts) {
  Injected x;
  RemoteTierOptions o;
  o.command_timeout_ms = 70;
  auto t = x.tier(o);
  x.t->inject(FaultTransport::Fault::timeout);
  uint64_t t0 = mono_ms();
  EXPECT_FALSE(t->get(key_of(1)).has_value());
  uint64_t dt = mono_ms() - t0;
  EXPECT_GE(dt, 65u);
  EXPECT_LT(dt, 500u);
}

// ---- the value store apart from the lease backend ------------------------------

namespace {

// A server without leases: the value store of a FaultTransport, and nothing
// else.
class ValuesOnly final : public RemoteTransport {
 public:
  explicit ValuesOnly(std::shared_ptr<FaultTransport> t) : t_(std::move(t)) {}
  std::string_view name() const noexcept override { return "values-only"; }
  void set_timeouts(uint64_t connect_ms, uint64_t command_ms) override { t_->set_timeouts(connect_ms, command_ms); }
  Expected<RemoteBytes> get(const Key& key) override { return t_->get(key); }
  Status get_many(std::span<const Key> keys, std::vector<Expected<RemoteBytes>>* out) override {
    return t_->get_many(keys, out);
  }
  Status set(const Key& key, std::string_view value, uint64_t ttl_ms) override { return t_->set(key, value, ttl_ms); }
  Status remove(const Key& key) override { return t_->remove(key); }

 private:
  std::shared_ptr<FaultTransport> t_;
};

// Both parts of a FaultTransport, recording the order in which writes and
// lease releases reach the server (each when its call returns).
class Recording final : public RemoteTransport, public RemoteLeaseBackend {
 public:
  explicit Recording(std::shared_ptr<FaultTransport> t) : t_(std::move(t)) {}
  std::string_view name() const noexcept override { return t_->name(); }
  void set_timeouts(uint64_t connect_ms, uint64_t command_ms) override { t_->set_timeouts(connect_ms, command_ms); }
  Expected<RemoteBytes> get(const Key& key) override { return t_->get(key); }
  Status get_many(std::span<const Key> keys, std::vector<Expected<RemoteBytes>>* out) override {
    return t_->get_many(keys, out);
  }
  Status set(const Key& key, std::string_view value, uint64_t ttl_ms) override {
    Status st = t_->set(key, value, ttl_ms);
    note("set " + key.hex().substr(0, 4));
    return st;
  }
  Status remove(const Key& key) override { return t_->remove(key); }
  Expected<bool> lease_acquire(const Key& key, std::string_view token, uint64_t ttl_ms) override {
    return t_->lease_acquire(key, token, ttl_ms);
  }
  Expected<bool> lease_renew(const Key& key, std::string_view token, uint64_t ttl_ms) override {
    return t_->lease_renew(key, token, ttl_ms);
  }
  Expected<bool> lease_release(const Key& key, std::string_view token) override {
    auto r = t_->lease_release(key, token);
    note("release " + key.hex().substr(0, 4));
    return r;
  }
  Expected<bool> lease_held(const Key& key) override { return t_->lease_held(key); }
  std::vector<std::string> log() {
    std::lock_guard g(mu_);
    return log_;
  }

 private:
  void note(std::string s) {
    std::lock_guard g(mu_);
    log_.push_back(std::move(s));
  }
  std::shared_ptr<FaultTransport> t_;
  std::mutex mu_;
  std::vector<std::string> log_;  // GUARDED_BY(mu_)
};

}  // namespace

TEST(RemoteSplit, AValueStoreWithoutLeasesGivesATierAndNoLeases) {
  auto server = std::make_shared<FaultTransport>();
  auto r = make_remote(std::make_shared<ValuesOnly>(server), nullptr);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  ASSERT_TRUE(r->tier);
  EXPECT_EQ(r->leases, nullptr);
  EXPECT_EQ(r->tier->name(), "values-only");
  EXPECT_EQ(r->tier->kind(), TierKind::remote);
  ASSERT_TRUE(r->tier->put(make_entry(1)).is_ok());
  ASSERT_TRUE(r->tier->flush().is_ok());
  auto got = r->tier->get(key_of(1));
  ASSERT_TRUE(got.has_value() && got->has_value());
  EXPECT_TRUE(entry_ok(**got, 1));
  auto many = r->tier->get_many({key_of(1), key_of(2)});
  ASSERT_EQ(many.size(), 2u);
  EXPECT_TRUE(many[0].has_value());
  EXPECT_FALSE(many[1].has_value());
  EXPECT_EQ(r->tier->stats().puts, 1u);
  EXPECT_EQ(r->tier->stats().hits, 2u);
  // make_remote_tier is the same tier, over the value store alone.
  auto t = make_remote_tier(std::make_shared<ValuesOnly>(server));
  ASSERT_TRUE(t.has_value());
  EXPECT_TRUE((*t)->get(key_of(1))->has_value());

  // Through a Cache: no remote leases, so the machine's own (here none)
  // decide, and the compile is stored in the remote.
  auto leases = make_remote_leases(r->leases, nullptr);
  EXPECT_EQ(leases, nullptr);
  auto cache = Cache::with_tiers({make_memory_tier(), r->tier});
  cache->set_leases(leases);
  Source s;
  auto e = cache->get_or_compile(
      key_of(5),
      [] {
        return Expected<std::vector<Artifact>>(std::vector<Artifact>{{"obj", "five"}});
      },
      &s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(s, Source::compiled);
  (void)cache->flush();
  auto stored = r->tier->get(key_of(5));
  ASSERT_TRUE(stored.has_value() && stored->has_value());
  EXPECT_EQ(*(*stored)->artifact("obj"), "five");
}

TEST(RemoteSplit, ALeaseIsReleasedOnlyAfterTheWriteBeforeIt) {
  auto server = std::make_shared<FaultTransport>();
  auto rec = std::make_shared<Recording>(server);
  auto r = make_remote(rec, rec);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  ASSERT_TRUE(r->leases);
  auto other = make_remote(server, server);  // another machine
  ASSERT_TRUE(other.has_value());
  auto combined = make_remote_leases(r->leases, nullptr);
  Key k1 = key_of(1), k2 = key_of(2);
  ASSERT_EQ(combined->acquire(k1, 10000), LeaseResult::acquired);
  ASSERT_TRUE(*r->leases->acquire_lease(k2, 10000));
  EXPECT_EQ(other->leases->acquire(k1, 10000), LeaseResult::busy);
  // Slow writes: each set takes 150 ms on the writer thread, while the
  // releases are queued at once behind them.
  server->inject(FaultTransport::Fault::slow, 150);
  ASSERT_TRUE(r->tier->put(make_entry(1)).is_ok());
  combined->release(k1);
  ASSERT_TRUE(r->tier->put(make_entry(2)).is_ok());
  r->leases->release_lease(k2);
  // A waiter on the other machine finds the entry once the lease is gone.
  auto waited = other->leases->wait_for(k1, 5000);
  ASSERT_TRUE(waited.has_value());
  EXPECT_TRUE(entry_ok(*waited, 1));
  ASSERT_TRUE(r->tier->flush().is_ok());
  server->inject(FaultTransport::Fault::none);
  std::string h1 = k1.hex().substr(0, 4), h2 = k2.hex().substr(0, 4);
  EXPECT_EQ(rec->log(), (std::vector<std::string>{"set " + h1, "release " + h1, "set " + h2, "release " + h2}));
  EXPECT_EQ(other->leases->acquire(k1, 10000), LeaseResult::acquired);
  EXPECT_EQ(other->leases->acquire(k2, 10000), LeaseResult::acquired);
}

TEST(RemoteSplit, OptionsThatMustBePositiveRefuseZero) {
  auto t = std::make_shared<FaultTransport>();
  struct Case {
    const char* name;
    void (*zero)(RemoteTierOptions*);
  };
  const Case cases[] = {
      {"connect_timeout_ms", [](RemoteTierOptions* o) { o->connect_timeout_ms = 0; }},
      {"command_timeout_ms", [](RemoteTierOptions* o) { o->command_timeout_ms = 0; }},
      {"max_entry_bytes", [](RemoteTierOptions* o) { o->max_entry_bytes = 0; }},
      {"breaker_threshold", [](RemoteTierOptions* o) { o->breaker_threshold = 0; }},
      {"breaker_timeouts", [](RemoteTierOptions* o) { o->breaker_timeouts = 0; }},
      {"breaker_cooldown_ms", [](RemoteTierOptions* o) { o->breaker_cooldown_ms = 0; }},
      {"write_queue_depth", [](RemoteTierOptions* o) { o->write_queue_depth = 0; }},
  };
  for (const Case& c : cases) {
    RemoteTierOptions o;
    c.zero(&o);
    auto r = make_remote(t, t, o);
    ASSERT_FALSE(r.has_value()) << c.name;
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_EQ(r.error().message(), std::string("remote option ") + c.name + " must be at least 1");
  }
  // The defaults, and a ttl of 0 (no expiry), are fine.
  RemoteTierOptions defaults;
  EXPECT_EQ(defaults.connect_timeout_ms, 250u);
  EXPECT_EQ(defaults.command_timeout_ms, 500u);
  EXPECT_EQ(defaults.ttl_ms, 0u);
  EXPECT_EQ(defaults.max_entry_bytes, uint64_t(64) << 20);
  EXPECT_EQ(defaults.breaker_threshold, 3u);
  EXPECT_EQ(defaults.breaker_timeouts, 1u);
  EXPECT_EQ(defaults.breaker_cooldown_ms, 10000u);
  EXPECT_EQ(defaults.write_queue_depth, 64u);
  EXPECT_TRUE(make_remote(t, t, defaults).has_value());
  EXPECT_FALSE(make_remote(nullptr, t).has_value());
}

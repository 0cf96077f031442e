// Faults and time injected through an Env (tests/support/fault_env.h): a full or
// read-only disk and failing reads under the files engine, slow syncs,
// lease expiry and temp-file ages on a clock the test moves, and the
// committer's gathering wait held by that clock. No root, no mounts, no
// real sleeps.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "cache/committer.h"
#include "cache/lease_wait.h"
#include "cache/tier_chain.h"
#include "fault_env.h"
#include "kcache/cache.h"
#include "kcache/lease.h"
#include "kcache/tier.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

// Polls `pred` until it holds or `bound_ms` of real time passed; false
// then, so the caller's assertion fails.
template <class F>
bool eventually(F pred, uint64_t bound_ms = 10'000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(bound_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

uint64_t real_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

std::shared_ptr<Tier> files_tier(const std::string& dir, const std::shared_ptr<FaultEnv>& env, DiskTierOptions o = {}) {
  o.env = env;
  auto t = open_files_tier(dir, o);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().to_string());
  return t ? *t : nullptr;
}

size_t files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (Env::posix()->list_dir(dir, &names) != 0) return 0;
  return names.size();
}

bool exists(const std::string& p) {
  struct stat st;
  return Env::posix()->stat(p, &st) == 0;
}

std::string entry_path(const std::string& dir, uint64_t i) {
  std::string h = key_of(i).hex();
  return dir + "/" + h.substr(0, 2) + "/" + h + ".kce";
}

}  // namespace

TEST(EnvFault, NoSpaceOnPutFailsCleanlyAndKeepsEarlierEntries) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto t = files_tier(d.path(), env);
  ASSERT_TRUE(t);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());

  env->no_space = true;
  const uint64_t faults_before = env->faults.load();
  Status st = t->put(make_entry(5));
  EXPECT_EQ(st.code(), Errc::no_space) << st.to_string();
  EXPECT_GT(env->faults.load(), faults_before);
  // Nothing torn: no temp file left, nothing published for the key.
  EXPECT_EQ(files_in(d.path() + "/tmp"), 0u);
  EXPECT_FALSE(exists(entry_path(d.path(), 5)));
  auto miss = t->get(key_of(5));
  ASSERT_TRUE(miss.has_value());
  EXPECT_FALSE(miss->has_value());
  // Earlier entries are still whole and readable on the full disk.
  for (uint64_t i = 0; i < 5; ++i) {
    auto g = t->get(key_of(i));
    ASSERT_TRUE(g.has_value() && g->has_value()) << i;
    EXPECT_TRUE(entry_ok(**g, i)) << i;
  }
  TierStats s = t->stats();
  EXPECT_EQ(s.entries, 5u);
  EXPECT_EQ(s.puts, 5u);
  EXPECT_GE(s.errors, 1u);

  // Space again: writes work again.
  env->no_space = false;
  ASSERT_TRUE(t->put(make_entry(5)).is_ok());
  EXPECT_EQ(t->stats().entries, 6u);
}

TEST(EnvFault, ReadOnlyRefusesWritesAndServesGets) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  {
    auto t = files_tier(d.path(), env);
    ASSERT_TRUE(t);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  }
  env->read_only = true;
  const uint64_t renames_before = env->renames.load();
  // Opening a store on a read-only disk works; it only serves lookups.
  auto t = files_tier(d.path(), env);
  ASSERT_TRUE(t);
  Status st = t->put(make_entry(3));
  EXPECT_EQ(st.code(), Errc::read_only) << st.to_string();
  EXPECT_EQ(env->renames.load(), renames_before);  // never got as far as publishing
  EXPECT_FALSE(exists(entry_path(d.path(), 3)));
  for (uint64_t i = 0; i < 3; ++i) {
    auto g = t->get(key_of(i));
    ASSERT_TRUE(g.has_value() && g->has_value()) << i;
    EXPECT_TRUE(entry_ok(**g, i)) << i;
  }
  // Recency and counters cannot be stored: flush reports it, nothing breaks.
  EXPECT_FALSE(t->flush().is_ok());
  EXPECT_EQ(t->stats().hits, 3u);
  EXPECT_EQ(t->stats().entries, 3u);
}

TEST(EnvFault, ReadErrorIsAnErrorNotARemoval) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto t = files_tier(d.path(), env);
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->put(make_entry(7)).is_ok());
  ASSERT_EQ(t->stats().entries, 1u);

  env->io_error = true;
  auto g = t->get(key_of(7));
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.error().code(), Errc::io_error) << g.error().to_string();
  // Counted as an error, not as corrupt; and the stored totals, unreadable
  // now, are not overwritten with this process's deltas alone.
  EXPECT_FALSE(t->flush().is_ok());
  TierStats during = t->stats();
  EXPECT_EQ(during.errors, 1u);
  EXPECT_EQ(during.corrupt, 0u);

  env->io_error = false;
  EXPECT_TRUE(exists(entry_path(d.path(), 7)));  // nothing removed
  auto again = t->get(key_of(7));
  ASSERT_TRUE(again.has_value() && again->has_value());
  EXPECT_TRUE(entry_ok(**again, 7));
  ASSERT_TRUE(t->flush().is_ok());
  TierStats after = t->stats();
  EXPECT_EQ(after.entries, 1u);
  EXPECT_EQ(after.puts, 1u);
  EXPECT_EQ(after.errors, 1u);
  EXPECT_EQ(after.hits, 1u);
}

TEST(EnvFault, SlowSyncsAreCountedOnTheInjectedClock) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  env->fsync_delay_ms = 250;
  auto t = files_tier(d.path(), env);
  ASSERT_TRUE(t);
  const uint64_t t0 = env->now_mono_us(), real0 = real_ms();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(t->put(make_entry(i)).is_ok());
  EXPECT_EQ(env->fsyncs.load(), 4u);  // one data sync per put (Durability::normal)
  EXPECT_EQ(env->now_mono_us() - t0, 4 * 250'000u);
  EXPECT_LT(real_ms() - real0, 1000u);  // a second of "syncing" took no real second

  TempDir d2;
  auto env2 = std::make_shared<FaultEnv>();
  DiskTierOptions none;
  none.durability = Durability::none;
  auto t2 = files_tier(d2.path(), env2, none);
  ASSERT_TRUE(t2);
  ASSERT_TRUE(t2->put(make_entry(0)).is_ok());
  EXPECT_EQ(env2->fsyncs.load(), 0u);
}

TEST(EnvFault, StaleTempFilesAreCollectedByAgeOnTheInjectedClock) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  DiskTierOptions o;
  o.stale_temp_ms = 60'000;
  auto t = files_tier(d.path(), env, o);
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->put(make_entry(1)).is_ok());
  const std::string stray = d.path() + "/tmp/" + key_of(2).hex() + ".4242.0.1";
  std::ofstream(stray) << "half an entry of a writer that died";
  ASSERT_TRUE(exists(stray));

  ASSERT_TRUE(t->admin()->verify(false).has_value());  // a walk: young, kept
  EXPECT_TRUE(exists(stray));
  env->advance(59'000);
  ASSERT_TRUE(t->admin()->verify(false).has_value());  // mtime is in whole seconds: still under the bound
  EXPECT_TRUE(exists(stray));
  env->advance(3'000);
  ASSERT_TRUE(t->admin()->verify(false).has_value());
  EXPECT_FALSE(exists(stray));
  // The published entry is no temp file.
  auto g = t->get(key_of(1));
  ASSERT_TRUE(g.has_value() && g->has_value());
}

TEST(EnvFault, ExpiredFileLeaseIsTakenOverAfterAdvance) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto holder = open_file_leases(d.path(), env);
  auto taker = open_file_leases(d.path(), env);
  ASSERT_TRUE(holder.has_value() && taker.has_value());
  const Key k = key_of(11);
  ASSERT_EQ((*holder)->acquire(k, 1000), LeaseResult::acquired);
  EXPECT_EQ((*taker)->acquire(k, 1000), LeaseResult::busy);
  env->advance(999);
  EXPECT_EQ((*taker)->acquire(k, 1000), LeaseResult::busy);
  env->advance(2);
  EXPECT_EQ((*taker)->acquire(k, 1000), LeaseResult::acquired);
  EXPECT_EQ((*taker)->takeovers(), 1u);
  EXPECT_EQ((*holder)->takeovers(), 0u);
  // The old holder lost it: it can neither renew nor release it.
  EXPECT_FALSE((*holder)->renew(k, 1000));
  (*holder)->release(k);
  EXPECT_EQ((*holder)->acquire(k, 1000), LeaseResult::busy);
}

TEST(EnvFault, LeaseWaitEndsWhenTheHolderExpiresOnTheInjectedClock) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto holder = open_file_leases(d.path(), env);
  auto mine = open_file_leases(d.path(), env);
  ASSERT_TRUE(holder.has_value() && mine.has_value());
  const Key k = key_of(12);
  ASSERT_EQ((*holder)->acquire(k, 5000), LeaseResult::acquired);

  LeaseWait w(/*ttl_ms=*/5000, /*bound_ms=*/60'000, env);
  w.set_leases(*mine);
  const uint64_t t0 = env->now_mono_us(), real0 = real_ms();
  bool waited = false;
  EXPECT_EQ(w.claim(k, /*wait=*/true, &waited), LeaseWait::Claim::held);
  EXPECT_TRUE(waited);
  EXPECT_EQ(w.waits(), 1u);
  EXPECT_EQ(w.timeouts(), 0u);
  EXPECT_EQ(w.takeovers(), 1u);
  const uint64_t waited_ms = (env->now_mono_us() - t0) / 1000;
  EXPECT_GE(waited_ms, 5000u);  // not before the holder's TTL ran out
  EXPECT_LT(waited_ms, 5100u);  // and soon after (polls are at most 50 ms apart)
  EXPECT_LT(real_ms() - real0, 3000u);
  EXPECT_GT(env->sleeps.load(), 10u);
  w.release(k);
  EXPECT_EQ((*holder)->acquire(k, 1000), LeaseResult::acquired);  // released: free again
  w.stop();
}

TEST(EnvFault, LeaseWaitGivesUpAtItsBoundOnTheInjectedClock) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto holder = open_file_leases(d.path(), env);
  auto mine = open_file_leases(d.path(), env);
  ASSERT_TRUE(holder.has_value() && mine.has_value());
  const Key k = key_of(13);
  ASSERT_EQ((*holder)->acquire(k, 600'000), LeaseResult::acquired);
  LeaseWait w(5000, /*bound_ms=*/2000, env);
  w.set_leases(*mine);
  const uint64_t t0 = env->now_mono_us();
  bool waited = false;
  EXPECT_EQ(w.claim(k, true, &waited), LeaseWait::Claim::timed_out);
  EXPECT_TRUE(waited);
  EXPECT_EQ(w.timeouts(), 1u);
  EXPECT_EQ(w.takeovers(), 0u);
  const uint64_t waited_ms = (env->now_mono_us() - t0) / 1000;
  EXPECT_GE(waited_ms, 2000u);
  EXPECT_LT(waited_ms, 2100u);
  // Without waiting: busy at once, no time passes.
  const uint64_t t1 = env->now_mono_us();
  EXPECT_EQ(w.claim(k, false, &waited), LeaseWait::Claim::busy);
  EXPECT_FALSE(waited);
  EXPECT_EQ(env->now_mono_us(), t1);
  w.stop();
}

TEST(EnvFault, HeartbeatRenewsOnTheInjectedClock) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto mine = open_file_leases(d.path(), env);
  auto other = open_file_leases(d.path(), env);
  ASSERT_TRUE(mine.has_value() && other.has_value());
  const Key k = key_of(14);
  LeaseWait w(/*ttl_ms=*/3000, 60'000, env);
  w.set_leases(*mine);
  bool waited = false;
  ASSERT_EQ(w.claim(k, true, &waited), LeaseWait::Claim::held);
  // The heartbeat renews every ttl/3 on the Env's clock: move it in steps
  // well past the TTL, letting the heartbeat see each step; the lease
  // stays ours.
  for (int i = 0; i < 10; ++i) {
    const uint64_t before = env->writes.load();
    env->advance(1100);
    ASSERT_TRUE(eventually([&] { return env->writes.load() > before; })) << "no renewal at step " << i;
  }
  EXPECT_EQ((*other)->acquire(k, 1000), LeaseResult::busy);
  w.release(k);
  w.stop();
  EXPECT_EQ((*other)->acquire(k, 1000), LeaseResult::acquired);
}

TEST(EnvFault, CommitterGroupWaitsForTheInjectedClock) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  TierChain chain;
  auto t = files_tier(d.path(), std::make_shared<FaultEnv>());
  ASSERT_TRUE(t);
  chain.add(t);
  Committer c(chain, env);
  std::atomic<int> then_ran{0};
  c.submit(make_entry(21), [&] { then_ran.fetch_add(1); });
  ASSERT_TRUE(c.find(key_of(21)).has_value());
  // The group gathers for 100 ms of the Env's clock, which does not move
  // by itself: nothing is written however long we wait for real.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(c.groups(), 0u);
  EXPECT_EQ(then_ran.load(), 0);
  env->advance(99);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c.groups(), 0u);
  env->advance(2);
  ASSERT_TRUE(eventually([&] { return c.groups() == 1; }));
  ASSERT_TRUE(eventually([&] { return then_ran.load() == 1; }));
  EXPECT_TRUE(eventually([&] { return c.idle(); }));
  EXPECT_FALSE(c.find(key_of(21)).has_value());
  auto g = t->get(key_of(21));
  ASSERT_TRUE(g.has_value() && g->has_value());
  EXPECT_TRUE(entry_ok(**g, 21));
  // flush() cuts the wait short without any clock movement.
  c.submit(make_entry(22), nullptr);
  (void)c.flush();
  EXPECT_EQ(c.groups(), 2u);
  c.stop();
}

TEST(EnvFault, CacheOverAFullDiskStillReturnsTheCompile) {
  TempDir d;
  auto env = std::make_shared<FaultEnv>();
  auto t = files_tier(d.path(), env);
  ASSERT_TRUE(t);
  env->no_space = true;
  Options o;
  o.log_level = LogLevel::off;
  auto c = Cache::with_tiers({t}, o);
  ASSERT_TRUE(c);
  auto k = KeyBuilder("env-fault").add_string("src", "kernel").finish();
  ASSERT_TRUE(k.has_value());
  std::atomic<int> calls{0};
  auto fn = [&]() -> Expected<std::vector<Artifact>> {
    calls.fetch_add(1);
    return std::vector<Artifact>{{"obj", "OBJECT CODE"}};
  };
  Source s;
  auto e = c->get_or_compile(*k, fn, &s);
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ(s, Source::compiled);
  EXPECT_EQ(*e->artifact("obj"), "OBJECT CODE");
  (void)c->flush();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_GE(c->stats().faults, 1u);
  EXPECT_FALSE(exists(d.path() + "/" + k->key.hex().substr(0, 2) + "/" + k->key.hex() + ".kce"));
  EXPECT_EQ(files_in(d.path() + "/tmp"), 0u);
  // Still answers (by compiling again: the only tier is full).
  auto e2 = c->get_or_compile(*k, fn, &s);
  ASSERT_TRUE(e2.has_value());
  EXPECT_EQ(*e2->artifact("obj"), "OBJECT CODE");
}

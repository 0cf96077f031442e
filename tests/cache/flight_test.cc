// Flights: begin() / commit() / abandon(), the lease-style API for hosts
// that run their own compile between two calls to the cache. Threads of one
// process and separate processes (fork) share one compile per key.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "kcache/cache.h"
#include "process_sync.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

KeyInfo info_of(uint64_t i) { return *KeyBuilder("flight").add_u64("i", i).finish(); }

std::vector<Artifact> arts(const std::string& s) { return {{"obj", s}}; }

// A child process that owns key 7's flight (returned once it does, or -1):
// once `go` is posted it commits "child", or is killed while owning when
// `dies`.
pid_t fork_owner_of_7(const Options& o, Signal& go, bool dies) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    auto c = Cache::open(o);
    Flight f = c->begin(info_of(7));
    char x = f.owner() ? '1' : '0';
    (void)!::write(ready[1], &x, 1);
    go.wait();
    if (dies) ::kill(::getpid(), SIGKILL);
    int rc = f.commit(arts("child")).has_value() ? 0 : 1;
    c.reset();
    ::_exit(rc);
  }
  ::close(ready[1]);
  char x = 0;
  bool owns = ::read(ready[0], &x, 1) == 1 && x == '1';
  ::close(ready[0]);
  if (!owns && pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

TEST(Flight, OwnerCommitsThenHits) {
  TempDir d;
  auto c = Cache::open(disk_options(d.path()));
  {
    Flight f = c->begin(info_of(1));
    ASSERT_TRUE(f.owner());
    EXPECT_FALSE(f.hit());
    auto e = f.commit(arts("one"));
    ASSERT_TRUE(e.has_value()) << e.error().to_string();
    EXPECT_EQ(*e->artifact("obj"), "one");
    EXPECT_FALSE(f.owner());
    EXPECT_EQ(f.source(), Source::compiled);
    EXPECT_EQ(*f.entry().artifact("obj"), "one");
    // A committed flight cannot commit again.
    auto again = f.commit(arts("two"));
    ASSERT_FALSE(again.has_value());
    EXPECT_EQ(again.error().code(), Errc::invalid_argument);
  }
  Flight g = c->begin(info_of(1));
  ASSERT_TRUE(g.hit());
  EXPECT_FALSE(g.owner());
  EXPECT_EQ(g.source(), Source::memory);
  EXPECT_EQ(*g.entry().artifact("obj"), "one");
  EXPECT_EQ(g.commit(arts("x")).error().code(), Errc::invalid_argument);

  // Committed to disk once flushed: a second cache (no memory tier
  // content) finds it there.
  (void)c->flush();
  auto c2 = Cache::open(disk_options(d.path()));
  Flight h = c2->begin(info_of(1));
  ASSERT_TRUE(h.hit());
  EXPECT_EQ(h.source(), Source::disk);
  auto s = c->stats();
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.misses, 1u);
}

TEST(Flight, WaiterInThisProcessGetsTheOwnersEntry) {
  TempDir d;
  auto c = Cache::open(disk_options(d.path()));
  Flight f = c->begin(info_of(2));
  ASSERT_TRUE(f.owner());
  std::atomic<bool> got{false};
  Source src = Source::compiled;
  std::string bytes;
  std::thread t([&] {
    Flight w = c->begin(info_of(2));
    EXPECT_TRUE(w.hit());
    src = w.source();
    if (w.hit()) bytes = std::string(*w.entry().artifact("obj"));
    got = true;
  });
  EXPECT_TRUE(wait_until([&] { return c->stats().waits >= 1; })) << "the thread never waited";
  EXPECT_FALSE(got.load());  // waiting on the owner
  ASSERT_TRUE(f.commit(arts("two")).has_value());
  t.join();
  EXPECT_EQ(src, Source::waited);
  EXPECT_EQ(bytes, "two");
  EXPECT_EQ(c->stats().compiles, 1u);
  EXPECT_EQ(c->stats().waits, 1u);
}

TEST(Flight, AbandonHandsTheKeyToAWaiter) {
  TempDir d;
  auto c = Cache::open(disk_options(d.path()));
  std::optional<Flight> f(c->begin(info_of(3)));
  ASSERT_TRUE(f->owner());
  std::atomic<bool> waiter_owns{false};
  std::thread t([&] {
    Flight w = c->begin(info_of(3));
    waiter_owns = w.owner();
    if (w.owner()) (void)w.commit(arts("from waiter"));
  });
  EXPECT_TRUE(wait_until([&] { return c->stats().waits >= 1; })) << "the thread never waited";
  f->abandon();
  EXPECT_FALSE(f->owner());
  t.join();
  EXPECT_TRUE(waiter_owns.load());
  auto e = c->get(info_of(3).key);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e->artifact("obj"), "from waiter");
}

TEST(Flight, DroppedFlightAbandons) {
  TempDir d;
  auto c = Cache::open(disk_options(d.path()));
  {
    Flight f = c->begin(info_of(4));
    ASSERT_TRUE(f.owner());
  }
  EXPECT_FALSE(c->get(info_of(4).key).has_value());
  // The key is free again, in this process and for others.
  Flight g = c->begin(info_of(4));
  EXPECT_TRUE(g.owner());
  Flight moved = std::move(g);
  EXPECT_TRUE(moved.owner());
  EXPECT_FALSE(g.owner());
  ASSERT_TRUE(moved.commit(arts("four")).has_value());
}

TEST(Flight, InvalidArtifactsAbandonAndSayWhy) {
  TempDir d;
  auto c = Cache::open(disk_options(d.path()));
  Flight f = c->begin(info_of(5));
  ASSERT_TRUE(f.owner());
  auto e = f.commit({{"", "x"}});
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code(), Errc::invalid_argument);
  EXPECT_FALSE(f.owner());
  EXPECT_TRUE(c->begin(info_of(5)).owner());
}

TEST(Flight, DisabledCacheOwnsAndStoresNothing) {
  TempDir d;
  Options o = disk_options(d.path());
  o.disabled = true;
  auto c = Cache::open(o);
  Flight f = c->begin(info_of(6));
  ASSERT_TRUE(f.owner());
  ASSERT_TRUE(f.commit(arts("six")).has_value());
  EXPECT_TRUE(c->begin(info_of(6)).owner());
}

// Another process owns the key: begin() waits for its commit and returns
// its entry; a process killed while owning is taken over.
TEST(Flight, OtherProcessOwnsThenCommitsOrDies) {
  for (bool dies : {false, true}) {
    TempDir d;
    Options o = disk_options(d.path());
    o.lease_ttl_ms = 300;
    Signal go;  // the child commits or dies once posted
    pid_t pid = fork_owner_of_7(o, go, dies);
    ASSERT_GT(pid, 0);
    auto c = Cache::open(o);
    std::optional<OnLeaseWait> on_wait(std::in_place, *c, [&] { go.post(); });
    Flight f = c->begin(info_of(7));
    on_wait.reset();
    go.post();  // had the wait never come
    if (dies) {
      EXPECT_TRUE(f.owner());
      ASSERT_TRUE(f.commit(arts("parent")).has_value());
      EXPECT_GE(c->stats().lease_takeovers, 1u);
    } else {
      ASSERT_TRUE(f.hit());
      EXPECT_EQ(f.source(), Source::waited);
      EXPECT_EQ(*f.entry().artifact("obj"), "child");
      EXPECT_EQ(c->stats().lease_waits, 1u);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (dies) {
      EXPECT_TRUE(WIFSIGNALED(status));
    } else {
      EXPECT_EQ(WEXITSTATUS(status), 0);
    }
  }
}

// try_begin never waits: while another process owns the key it answers
// busy() at once (neither hit nor owner, no lease wait); a key nobody holds
// is owned; once the owner commits, the entry is a hit; a key whose owner
// was killed is taken over.
TEST(Flight, TryBeginAnswersBusyWhileAnotherProcessOwns) {
  for (bool dies : {false, true}) {
    TempDir d;
    Options o = disk_options(d.path());
    Signal go;  // the child commits or dies once posted
    pid_t pid = fork_owner_of_7(o, go, dies);
    ASSERT_GT(pid, 0);
    auto c = Cache::open(o);
    auto t0 = std::chrono::steady_clock::now();
    Flight held = c->try_begin(info_of(7));
    EXPECT_TRUE(held.busy());
    EXPECT_FALSE(held.owner());
    EXPECT_FALSE(held.hit());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    EXPECT_EQ(c->stats().lease_waits, 0u);
    Flight other = c->try_begin(info_of(8));
    EXPECT_TRUE(other.owner());
    EXPECT_FALSE(other.busy());
    ASSERT_TRUE(other.commit(arts("parent")).has_value());
    go.post();
    int status = 0;
    ::waitpid(pid, &status, 0);  // reaped: a killed owner's PID is gone
    Flight again = c->try_begin(info_of(7));
    EXPECT_FALSE(again.busy());
    if (dies) {
      EXPECT_TRUE(WIFSIGNALED(status));
      EXPECT_TRUE(again.owner());
      EXPECT_GE(c->stats().lease_takeovers, 1u);
    } else {
      EXPECT_EQ(WEXITSTATUS(status), 0);
      ASSERT_TRUE(again.hit());
      EXPECT_EQ(*again.entry().artifact("obj"), "child");
    }
  }
}

}  // namespace

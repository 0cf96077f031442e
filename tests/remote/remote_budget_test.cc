// A slow remote costs at most its budget: with the real redis-server hung
// (SIGSTOP), paused (CLIENT PAUSE), dead (SIGKILL), refused (nothing
// listening) or unreachable (connects hang: a listener whose backlog is
// full), one Cache::get_or_compile through a Cache opened with a disk
// store, its leases and the remote tier adds at most one command timeout
// plus one connect timeout, and each fault is one warn line in the log.
// Each trial starts a fresh server, cache folder and tier (a fresh
// breaker). KCACHE_REMOTE_TRIALS sets the trials per fault (default 2),
// KCACHE_REMOTE_COMMAND_MS / KCACHE_REMOTE_CONNECT_MS the tier's timeouts
// (default 300 / 200); each fault prints a summary line
// (docs/reliability.md, "Remote tier", quotes them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "kcache/cache.h"
#include "kcache/remote.h"
#include "remote_backends.h"

using namespace kcache;
using namespace kcache::test;

namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  uint64_t v = s ? std::strtoull(s, nullptr, 10) : 0;
  return v ? v : fallback;
}
const uint64_t kCommandMs = env_or("KCACHE_REMOTE_COMMAND_MS", 300);
const uint64_t kConnectMs = env_or("KCACHE_REMOTE_CONNECT_MS", 200);
constexpr uint64_t kMarginMs = 250;
constexpr int kCallsPerTrial = 4;

enum class Fault { hung, paused, dead, refused, connect_hangs };
const char* fault_name(Fault f) {
  switch (f) {
    case Fault::hung:
      return "hung (SIGSTOP)";
    case Fault::paused:
      return "paused (CLIENT PAUSE)";
    case Fault::dead:
      return "dead (SIGKILL)";
    case Fault::refused:
      return "refused (nothing listening)";
    case Fault::connect_hangs:
      return "connect hangs (full backlog)";
  }
  return "?";
}

int trials() {
  const char* s = std::getenv("KCACHE_REMOTE_TRIALS");
  int n = s ? std::atoi(s) : 2;
  return n > 0 ? n : 2;
}

CompileFn compile_of(uint64_t i) {
  return [i]() -> Expected<std::vector<Artifact>> { return std::vector<Artifact>{{"obj", bytes_for(i, 200)}}; };
}

struct Tally {
  uint64_t calls = 0, worst_ms = 0, worst_first_ms = 0, failed_compiles = 0, worst_local_ms = 0;
  uint64_t timeouts = 0, unreachable = 0, server_errors = 0, skipped = 0, warn_lines = 0, events = 0;
};

void run_trial(Fault fault, const std::string& log_path, Tally* tally) {
  TempDir dir;
  std::unique_ptr<RedisServer> srv;
  std::string url;
  int listener = -1, filler = -1;
  if (fault == Fault::refused) {
    url = "redis://127.0.0.1:" + std::to_string(pick_port());
  } else if (fault == Fault::connect_hangs) {
    // A listener that never accepts, with a backlog of one that one
    // connection fills: the kernel drops further SYNs, so connects hang.
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(listener, 0), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
    filler = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(filler, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    url = "redis://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  } else {
    srv = std::make_unique<RedisServer>(dir.path());
    ASSERT_TRUE(srv->ok()) << srv->error();
    url = srv->url();
  }
  Options o;
  o.dir = dir.path() + "/cache";
  o.remote_url = url + "?command_timeout_ms=" + std::to_string(kCommandMs) +
                 "&connect_timeout_ms=" + std::to_string(kConnectMs) + "&breaker_cooldown_ms=60000";
  o.log_level = LogLevel::warn;
  o.log_file = log_path;
  auto cache = Cache::open(o);
  ASSERT_EQ(cache->tiers().size(), 3u);
  auto remote = std::dynamic_pointer_cast<RemoteTier>(cache->tiers().back());
  ASSERT_TRUE(remote);

  if (srv) {  // a healthy round first: pooled connections, a stored entry
    Source s;
    ASSERT_TRUE(cache->get_or_compile(key_of(0), compile_of(0), &s).has_value());
    (void)cache->flush();  // the committer's writes, then the remote's queue
    ASSERT_EQ(remote->stats().puts, 1u);
  }
  auto warn_lines = [&] {
    std::ifstream f(log_path);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    for (size_t at = s.find("kcache: warning: "); at != std::string::npos; at = s.find("kcache: warning: ", at + 1))
      ++n;
    return n;
  };
  uint64_t before = warn_lines();

  switch (fault) {
    case Fault::hung:
      srv->freeze();
      break;
    case Fault::paused: {
      RedisClient admin("127.0.0.1", srv->port());
      ASSERT_EQ(admin.str({"CLIENT", "PAUSE", "20000"}), "OK");
      break;
    }
    case Fault::dead:
      srv->stop();
      break;
    case Fault::refused:
    case Fault::connect_hangs:
      break;
  }

  for (int c = 1; c <= kCallsPerTrial; ++c) {
    uint64_t key = 1000 + c;
    uint64_t t0 = mono_ms();
    Source s;
    auto e = cache->get_or_compile(key_of(key), compile_of(key), &s);
    uint64_t dt = mono_ms() - t0;
    ++tally->calls;
    tally->worst_ms = std::max(tally->worst_ms, dt);
    if (c == 1) tally->worst_first_ms = std::max(tally->worst_first_ms, dt);
    if (!e.has_value()) {
      ++tally->failed_compiles;
      ADD_FAILURE() << fault_name(fault) << ": compile failed: " << e.error().to_string();
      continue;
    }
    EXPECT_EQ(s, Source::compiled);
    EXPECT_EQ(*e->artifact("obj"), bytes_for(key, 200));
    EXPECT_LE(dt, kCommandMs + kConnectMs + kMarginMs) << fault_name(fault) << ", call " << c;
  }
  uint64_t lines = warn_lines() - before;
  EXPECT_EQ(lines, 1u) << fault_name(fault) << ": warn lines for one event";
  EXPECT_TRUE(remote->breaker_open()) << fault_name(fault);
  EXPECT_EQ(remote->counters().breaker_opens, 1u) << fault_name(fault);
  RemoteCounters k = remote->counters();
  tally->timeouts += k.timeouts;
  tally->unreachable += k.unreachable;
  tally->server_errors += k.server_errors;
  tally->skipped += remote->stats().skipped;
  tally->warn_lines += lines;
  tally->events += 1;
  cache.reset();
  if (fault == Fault::hung) srv->thaw();
  if (filler >= 0) ::close(filler);
  if (listener >= 0) ::close(listener);
}

void run_fault(Fault fault) {
  if (find_program("redis-server").empty()) {
    std::fprintf(stderr, "*** SKIPPED: redis-server is not installed\n");
    GTEST_SKIP() << "redis-server is not installed";
  }
  TempDir logs;
  Tally t;
  const int n = trials();
  {
    // What the same calls cost with no remote at all (the disk store's own
    // commits): the rest of a call's time is what the remote added.
    TempDir dir;
    Options o;
    o.dir = dir.path();
    o.log_level = LogLevel::warn;
    auto cache = Cache::open(o);
    for (int c = 1; c <= kCallsPerTrial; ++c) {
      uint64_t t0 = mono_ms();
      ASSERT_TRUE(cache->get_or_compile(key_of(1000 + c), compile_of(1000 + c)).has_value());
      t.worst_local_ms = std::max(t.worst_local_ms, mono_ms() - t0);
    }
  }
  for (int i = 0; i < n; ++i) {
    run_trial(fault, logs.path() + "/trial" + std::to_string(i) + ".log", &t);
    if (::testing::Test::HasFatalFailure()) break;
  }
  util::set_log(LogLevel::warn, "");
  std::printf(
      "remote budget: %s: %d trials, %llu calls, %llu failed compiles, worst call %llu ms (first call "
      "%llu ms; without a remote %llu ms; bound %llu ms); failures: %llu timeouts, %llu unreachable, %llu "
      "server errors; %llu skipped calls; %llu warn lines for %llu events\n",
      fault_name(fault), n, (unsigned long long)t.calls, (unsigned long long)t.failed_compiles,
      (unsigned long long)t.worst_ms, (unsigned long long)t.worst_first_ms, (unsigned long long)t.worst_local_ms,
      (unsigned long long)(kCommandMs + kConnectMs + kMarginMs), (unsigned long long)t.timeouts,
      (unsigned long long)t.unreachable, (unsigned long long)t.server_errors, (unsigned long long)t.skipped,
      (unsigned long long)t.warn_lines, (unsigned long long)t.events);
  // A hang costs exactly one timeout per trial; a dead or refusing server
  // none (its cheap failures reach the threshold).
  if (fault == Fault::hung || fault == Fault::paused || fault == Fault::connect_hangs) {
    EXPECT_EQ(t.timeouts, static_cast<uint64_t>(n));
  } else {
    EXPECT_EQ(t.timeouts, 0u);
  }
}

}  // namespace

TEST(RemoteBudget, HungServer) { run_fault(Fault::hung); }
TEST(RemoteBudget, PausedServer) { run_fault(Fault::paused); }
TEST(RemoteBudget, DeadServer) { run_fault(Fault::dead); }
TEST(RemoteBudget, RefusedConnections) { run_fault(Fault::refused); }
TEST(RemoteBudget, ConnectsHang) { run_fault(Fault::connect_hangs); }

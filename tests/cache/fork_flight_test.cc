// A child of fork() whose parent had a flight in progress on another thread
// (the thread compiling a key, or holding a Flight, when a second thread
// forked): the child's first request for that key on the inherited Cache
// must compile and return, never wait for a thread the child does not have.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "kcache/cache.h"
#include "test_util.h"

namespace kcache::test {
namespace {

class ForkFlight : public ::testing::TestWithParam<Engine> {
 protected:
  std::unique_ptr<Cache> open_cache() {
    Options o;
    o.dir = dir_.path();
    o.engine = GetParam();
    o.log_level = LogLevel::error;
    return Cache::open(o);
  }
  TempDir dir_;
};

// Runs `child` in a forked child under a 20 s alarm, and `parent` in this
// process once the child exists: 0 when the child's function returned
// true, else its exit status or 128 + the signal that ended it.
int in_child(const std::function<bool()>& child, const std::function<void()>& parent) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    ::_exit(child() ? 0 : 1);
  }
  parent();
  int st = 0;
  if (pid < 0 || ::waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

CompileFn make(std::string value) {
  return [value]() -> Expected<std::vector<Artifact>> { return std::vector<Artifact>{{"obj", value}}; };
}

TEST_P(ForkFlight, FlightHeldByAParentThreadNeverHangsTheChild) {
  SKIP_UNDER_TSAN();  // the child's compile may start the store's threads
  auto c = open_cache();
  KeyInfo k = *KeyBuilder("fork-flight").add_u64("i", 1).finish();
  std::atomic<bool> holding{false}, forked{false};
  std::thread owner([&] {
    Flight f = c->begin(k);
    ASSERT_TRUE(f.owner());
    holding = true;
    while (!forked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)f.commit({{"obj", "parent"}});
  });
  while (!holding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int rc = in_child(
      [&] {
        auto e = c->get_or_compile(k, make("child"));
        if (!e) return false;
        Flight f = c->begin(*KeyBuilder("fork-flight").add_u64("i", 1).finish());
        return f.owner() || f.has_entry();  // answered either way
      },
      [&] { forked = true; });
  owner.join();
  EXPECT_EQ(rc, 0) << "the child hung (14 = SIGALRM) or failed";
  auto e = c->get(k.key);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e->artifact("obj"), "parent");
}

TEST_P(ForkFlight, CompileInProgressOnAParentThreadNeverHangsTheChild) {
  SKIP_UNDER_TSAN();
  auto c = open_cache();
  KeyInfo k = *KeyBuilder("fork-flight").add_u64("i", 2).finish();
  std::atomic<bool> compiling{false}, forked{false};
  std::thread owner([&] {
    auto e = c->get_or_compile(k, [&]() -> Expected<std::vector<Artifact>> {
      compiling = true;
      while (!forked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return std::vector<Artifact>{{"obj", "parent"}};
    });
    EXPECT_TRUE(e.has_value());
  });
  while (!compiling) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int rc = in_child([&] { return c->get_or_compile(k, make("child")).has_value(); }, [&] { forked = true; });
  owner.join();
  EXPECT_EQ(rc, 0) << "the child hung (14 = SIGALRM) or failed";
}

INSTANTIATE_TEST_SUITE_P(Engines, ForkFlight, ::testing::Values(Engine::lmdb, Engine::files),
                         [](const auto& info) { return info.param == Engine::lmdb ? "lmdb" : "files"; });

}  // namespace
}  // namespace kcache::test

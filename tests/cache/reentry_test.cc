// Re-entry: the thread compiling a key asks the cache for the same key
// again (from inside its compile function, or with a second begin() before
// commit or abandon). Waiting would be waiting for itself, for ever; the
// request is refused at once. Through a second Cache of the process on the
// same store, the thread holding the key's lease compiles without it.
//
// Each case runs in a child of fork() that the parent kills if it has not
// ended within kHangS seconds: a hang is reported as one, not as a stuck
// suite.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "kcache/cache.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr int kHangS = 30;

// Runs `body` in a child; its return value is the exit code. "hung" when
// the child had to be killed.
std::string in_child(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHangS);
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return "hung";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!WIFEXITED(st)) return "killed by signal " + std::to_string(WTERMSIG(st));
  return "exit " + std::to_string(WEXITSTATUS(st));
}

KeyInfo info_of(uint64_t i) { return *KeyBuilder("reentry").add_u64("i", i).finish(); }

Expected<std::vector<Artifact>> arts(const std::string& s) { return std::vector<Artifact>{{"obj", s}}; }

// Exit codes of the children: 0 is success, each failed check its own.
#define CHILD_CHECK(cond, code) \
  do {                          \
    if (!(cond)) return code;   \
  } while (0)

TEST(Reentry, GetOrCompileInsideItsOwnCompileIsRefused) {
  TempDir d;
  EXPECT_EQ(in_child([&] {
              auto c = Cache::open(disk_options(d.path()));
              int inner_calls = 0;
              Status inner_error;
              auto r = c->get_or_compile(info_of(1), [&]() -> Expected<std::vector<Artifact>> {
                auto inner = c->get_or_compile(info_of(1), [&]() -> Expected<std::vector<Artifact>> {
                  ++inner_calls;
                  return arts("inner");
                });
                if (!inner) inner_error = inner.error();
                return arts("outer");
              });
              CHILD_CHECK(r.has_value(), 1);
              CHILD_CHECK(*r->artifact("obj") == "outer", 2);
              CHILD_CHECK(inner_calls == 0, 3);
              CHILD_CHECK(inner_error.code() == Errc::invalid_argument, 4);
              CHILD_CHECK(inner_error.message().find("re-entrant") != std::string::npos, 5);
              // The key works as before afterwards: a hit.
              Source s = Source::compiled;
              auto again = c->get_or_compile(
                  info_of(1), [] { return arts("again"); }, &s);
              CHILD_CHECK(again && *again->artifact("obj") == "outer" && s == Source::memory, 6);
              return 0;
            }),
            "exit 0");
}

TEST(Reentry, SecondBeginInTheOwningThreadIsRefused) {
  TempDir d;
  EXPECT_EQ(in_child([&] {
              auto c = Cache::open(disk_options(d.path()));
              Flight f = c->begin(info_of(2));
              CHILD_CHECK(f.owner() && f.error().is_ok(), 1);
              Flight g = c->begin(info_of(2));
              CHILD_CHECK(!g.owner() && !g.hit() && !g.has_entry(), 2);
              CHILD_CHECK(g.error().code() == Errc::invalid_argument, 3);
              CHILD_CHECK(g.commit({{"obj", "x"}}).error().code() == Errc::invalid_argument, 4);
              // get_or_compile from the owning thread: refused too.
              int calls = 0;
              auto r = c->get_or_compile(info_of(2), [&] {
                ++calls;
                return arts("y");
              });
              CHILD_CHECK(!r && r.error().code() == Errc::invalid_argument && calls == 0, 5);
              CHILD_CHECK(f.commit({{"obj", "first"}}).has_value(), 6);
              Flight h = c->begin(info_of(2));
              CHILD_CHECK(h.hit() && *h.entry().artifact("obj") == "first", 7);
              return 0;
            }),
            "exit 0");
}

TEST(Reentry, BeginInsideGetOrCompileOfTheKeyIsRefused) {
  TempDir d;
  EXPECT_EQ(in_child([&] {
              auto c = Cache::open(disk_options(d.path()));
              Status inner;
              auto r = c->get_or_compile(info_of(3), [&] {
                Flight f = c->begin(info_of(3));
                inner = f.error();
                return arts("outer");
              });
              CHILD_CHECK(r.has_value(), 1);
              CHILD_CHECK(inner.code() == Errc::invalid_argument, 2);
              return 0;
            }),
            "exit 0");
}

// Another thread asking for a key this thread owns still waits for it and
// gets its entry: only the owning thread itself is refused.
TEST(Reentry, OtherThreadsStillWaitForTheOwner) {
  TempDir d;
  EXPECT_EQ(in_child([&] {
              auto c = Cache::open(disk_options(d.path()));
              Flight f = c->begin(info_of(4));
              CHILD_CHECK(f.owner(), 1);
              std::atomic<int> got{0};
              std::thread t([&] {
                auto r = c->get_or_compile(info_of(4), [] { return arts("other"); });
                got = r && *r->artifact("obj") == "owner" ? 1 : 2;
              });
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
              CHILD_CHECK(f.commit({{"obj", "owner"}}).has_value(), 2);
              t.join();
              CHILD_CHECK(got == 1, 3);
              return 0;
            }),
            "exit 0");
}

// A compile function that hands its own key to a helper thread and joins
// it: the helper's wait for the flight is bounded by wait_bound_ms, after
// which it compiles without the flight, so the arrangement ends instead of
// hanging; both get an entry. The same for a helper that calls begin().
TEST(Reentry, CompileThatJoinsAThreadAskingForItsKeyEndsAtTheWaitBound) {
  TempDir d;
  for (bool flight : {false, true}) {
    SCOPED_TRACE(flight ? "begin" : "get_or_compile");
    EXPECT_EQ(in_child([&] {
                Options o = disk_options(d.path() + (flight ? "/b" : "/a"));
                o.wait_bound_ms = 300;
                auto c = Cache::open(o);
                std::atomic<int> helper{0};
                auto r = c->get_or_compile(info_of(6), [&] {
                  std::thread t([&] {
                    if (flight) {
                      Flight f = c->begin(info_of(6));
                      helper = f.owner() && f.commit({{"obj", "helper"}}).has_value() ? 1 : 2;
                    } else {
                      auto e = c->get_or_compile(info_of(6), [] { return arts("helper"); });
                      helper = e && *e->artifact("obj") == "helper" ? 1 : 2;
                    }
                  });
                  t.join();
                  return arts("outer");
                });
                CHILD_CHECK(r.has_value(), 1);
                CHILD_CHECK(helper == 1, 2);
                CHILD_CHECK(c->stats().compiles == 2, 3);
                return 0;
              }),
              "exit 0");
  }
}

// Two Caches of one process on one store: the thread compiling a key in the
// first asks the second for it. The second's lease claim would find the
// first holding the lease and wait (up to the wait bound, 300 s); it
// compiles without the lease instead.
TEST(Reentry, SecondCacheOnTheSameStoreDoesNotWaitForItsOwnThread) {
  TempDir d;
  EXPECT_EQ(in_child([&] {
              auto a = Cache::open(disk_options(d.path()));
              auto b = Cache::open(disk_options(d.path()));
              int inner_calls = 0;
              auto r = a->get_or_compile(info_of(5), [&] {
                auto inner = b->get_or_compile(info_of(5), [&] {
                  ++inner_calls;
                  return arts("same");
                });
                return inner ? arts("same") : inner.error();
              });
              CHILD_CHECK(r.has_value(), 1);
              CHILD_CHECK(inner_calls == 1, 2);
              (void)a->flush();
              (void)b->flush();
              // The lease went with the write: a third Cache gets the entry.
              Options o = disk_options(d.path(), false);
              auto fresh = Cache::open(o);
              Source s = Source::compiled;
              auto hit = fresh->get_or_compile(
                  info_of(5), [] { return arts("third"); }, &s);
              CHILD_CHECK(hit && *hit->artifact("obj") == "same" && s == Source::disk, 3);
              return 0;
            }),
            "exit 0");
}

}  // namespace

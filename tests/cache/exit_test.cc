// What a process stored reaches the disk however it ends: exit() or a
// return from main without closing its Cache (the exit handler flushes
// every open Cache), _exit() after flush(), and _exit() without flush()
// under Options::sync_commit; and what a compile produced (get_or_compile,
// a Flight's commit, get_or_compile_batch) is on disk when the call
// returns, so a child killed by SIGKILL or SIGTERM right after keeps it,
// and another process sees it while the child still runs. Each trial is a
// child of fork() that compiles, then ends; the parent opens the store
// afresh and counts the entries.
//
// KCACHE_TRIALS sets the number of trials per case (default 5).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kcache/cache.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

int trials() {
  const char* t = std::getenv("KCACHE_TRIALS");
  int n = t ? std::atoi(t) : 0;
  return n > 0 ? n : 5;
}

constexpr uint64_t kPerChild = 24;

// Runs `body` in a child of fork() and returns its wait status. The body
// ends the child its own way; returning from it is exit code 97.
int in_child(const std::function<void()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(97);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

Options options_for(const std::string& dir, const std::string& engine) {
  Options o = disk_options(dir);
  EXPECT_TRUE(o.set("engine", engine).is_ok());
  return o;
}

enum class Path { get_or_compile, flight, batch };

std::vector<Artifact> artifacts_of(uint64_t i) {
  return {{"obj", bytes_for(i, 1000)}, {"sig", "kernel_" + std::to_string(i)}};
}

// Keys [first, first + n) compiled through `path`.
void compile_keys(Cache& c, uint64_t first, uint64_t n, Path path) {
  if (path == Path::batch) {
    std::vector<BatchItem> items;
    for (uint64_t i = first; i < first + n; ++i) {
      BatchItem it;
      it.key.key = key_of(i);
      it.compile = [i]() -> Expected<std::vector<Artifact>> { return artifacts_of(i); };
      items.push_back(std::move(it));
    }
    BatchOptions bo;
    bo.threads = 2;
    (void)c.get_or_compile_batch(items, bo);
    return;
  }
  for (uint64_t i = first; i < first + n; ++i) {
    KeyInfo k;
    k.key = key_of(i);
    if (path == Path::flight) {
      Flight f = c.begin(k);
      if (f.owner()) (void)f.commit(artifacts_of(i));
    } else {
      (void)c.get_or_compile(k, [i]() -> Expected<std::vector<Artifact>> { return artifacts_of(i); });
    }
  }
}
void compile_keys(Cache& c, uint64_t first, uint64_t n, bool flights) {
  compile_keys(c, first, n, flights ? Path::flight : Path::get_or_compile);
}

// Entries [first, first + n) that a fresh Cache without a memory tier finds
// with the right bytes.
uint64_t count_on_disk(const std::string& dir, const std::string& engine, uint64_t first, uint64_t n) {
  Options o = options_for(dir, engine);
  o.memory_tier = false;
  auto c = Cache::open(o);
  uint64_t found = 0;
  for (uint64_t i = first; i < first + n; ++i)
    if (auto e = c->get(key_of(i)); e && entry_ok(*e, i)) ++found;
  return found;
}

enum class Way { exit_without_close, flush_then_underscore_exit, sync_commit_underscore_exit };

// One trial: a child stores kPerChild entries and ends `way`; returns how
// many the parent finds.
uint64_t trial(const std::string& dir, const std::string& engine, Way way, bool flights, uint64_t first) {
  int st = in_child([&] {
    Options o = options_for(dir, engine);
    o.sync_commit = way == Way::sync_commit_underscore_exit;
    // Never closed: the exit paths below are all the Cache gets.
    Cache* c = Cache::open(o).release();
    compile_keys(*c, first, kPerChild, flights);
    switch (way) {
      case Way::exit_without_close:
        std::exit(0);
      case Way::flush_then_underscore_exit:
        (void)c->flush();
        ::_exit(0);
      case Way::sync_commit_underscore_exit:
        ::_exit(0);
    }
  });
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  return count_on_disk(dir, engine, first, kPerChild);
}

class ExitCommit : public ::testing::TestWithParam<std::string> {
 protected:
  void run(Way way, bool flights) {
    TempDir d;
    uint64_t lost = 0;
    const int n = trials();
    for (int t = 0; t < n; ++t) {
      uint64_t first = uint64_t(t) * kPerChild;
      lost += kPerChild - trial(d.path(), GetParam(), way, flights, first);
    }
    EXPECT_EQ(lost, 0u) << "entries lost in " << n << " trials of " << kPerChild;
  }
};

TEST_P(ExitCommit, ExitWithoutCloseKeepsEveryEntry) { run(Way::exit_without_close, false); }
TEST_P(ExitCommit, ExitWithoutCloseKeepsEveryFlightCommit) { run(Way::exit_without_close, true); }
TEST_P(ExitCommit, FlushThenUnderscoreExitKeepsEveryEntry) { run(Way::flush_then_underscore_exit, false); }
TEST_P(ExitCommit, SyncCommitThenUnderscoreExitKeepsEveryEntry) { run(Way::sync_commit_underscore_exit, false); }
TEST_P(ExitCommit, SyncCommitThenUnderscoreExitKeepsEveryFlightCommit) { run(Way::sync_commit_underscore_exit, true); }

INSTANTIATE_TEST_SUITE_P(Engines, ExitCommit, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

// What a compile produced is on disk when the call returns: a child that
// compiles (no flush, no sync_commit), tells the parent, and waits is seen
// by the parent's own fresh Cache while it still runs, then killed by
// `sig`; the parent counts again.
uint64_t killed_trial(const std::string& dir, const std::string& engine, Path path, int sig, uint64_t first,
                      uint64_t* seen_while_alive) {
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    Options o = options_for(dir, engine);
    Cache* c = Cache::open(o).release();
    compile_keys(*c, first, kPerChild, path);
    char b = 1;
    (void)!::write(ready[1], &b, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char b = 0;
  EXPECT_EQ(::read(ready[0], &b, 1), 1);
  ::close(ready[0]);
  *seen_while_alive = count_on_disk(dir, engine, first, kPerChild);
  ::kill(pid, sig);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "child status " << st;
  return count_on_disk(dir, engine, first, kPerChild);
}

// The same without the wait: the child kills itself with SIGKILL the moment
// its last call returns.
uint64_t self_killed_trial(const std::string& dir, const std::string& engine, Path path, uint64_t first) {
  int st = in_child([&] {
    Options o = options_for(dir, engine);
    Cache* c = Cache::open(o).release();
    compile_keys(*c, first, kPerChild, path);
    ::raise(SIGKILL);
  });
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "child status " << st;
  return count_on_disk(dir, engine, first, kPerChild);
}

struct KilledCase {
  Path path;
  int sig;
  bool waits;  // tells the parent and waits to be killed; else kills itself
};

class KilledAfterReturn : public ::testing::TestWithParam<std::tuple<std::string, KilledCase>> {};

TEST_P(KilledAfterReturn, KeepsEveryCompiledEntry) {
  SKIP_UNDER_TSAN();  // children open Caches of their own
  const auto& [engine, kc] = GetParam();
  TempDir d;
  uint64_t lost = 0, unseen = 0;
  const int n = trials();
  for (int t = 0; t < n; ++t) {
    uint64_t first = uint64_t(t) * kPerChild;
    if (kc.waits) {
      uint64_t seen = 0;
      lost += kPerChild - killed_trial(d.path(), engine, kc.path, kc.sig, first, &seen);
      unseen += kPerChild - seen;
    } else {
      lost += kPerChild - self_killed_trial(d.path(), engine, kc.path, first);
    }
  }
  EXPECT_EQ(unseen, 0u) << "entries another process did not see while the compiling one ran, " << n << " trials";
  EXPECT_EQ(lost, 0u) << "entries lost in " << n << " trials of " << kPerChild;
}

const KilledCase kKilledCases[] = {
    {Path::get_or_compile, SIGKILL, false}, {Path::flight, SIGKILL, false}, {Path::batch, SIGKILL, false},
    {Path::get_or_compile, SIGKILL, true},  {Path::flight, SIGTERM, true},  {Path::batch, SIGTERM, true},
};

INSTANTIATE_TEST_SUITE_P(Engines, KilledAfterReturn,
                         ::testing::Combine(::testing::ValuesIn(engine_names()), ::testing::ValuesIn(kKilledCases)),
                         [](const auto& info) {
                           const KilledCase& k = std::get<1>(info.param);
                           const char* path = k.path == Path::get_or_compile ? "get_or_compile"
                                              : k.path == Path::flight       ? "flight"
                                                                             : "batch";
                           return std::get<0>(info.param) + "_" + path + "_" +
                                  (k.sig == SIGKILL ? "SIGKILL" : "SIGTERM") + (k.waits ? "_seen_first" : "");
                         });

// A Cache closed before exit leaves nothing for the exit handler; one still
// open in the parent of a child that exits is not the child's to write
// (the child inherited it): neither may hang or crash the exit.
TEST(ExitHandler, ClosedAndInheritedCachesExitCleanly) {
  SKIP_UNDER_TSAN();  // the child opens a Cache of its own (a committer thread)
  TempDir d;
  const std::string engine = engine_names()[0];
  Options o = options_for(d.path(), engine);
  auto parent = Cache::open(o);
  compile_keys(*parent, 0, 4, false);
  int st = in_child([&] {
    {
      auto own = Cache::open(o);  // opened and closed in the child
      compile_keys(*own, 100, 4, false);
    }
    compile_keys(*parent, 200, 4, false);  // the inherited one: misses, no writes
    std::exit(0);
  });
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  (void)parent->flush();
  EXPECT_EQ(count_on_disk(d.path(), engine, 0, 4), 4u);
  EXPECT_EQ(count_on_disk(d.path(), engine, 100, 4), 4u);
}

// A tier that counts how it is written: synced puts, unsynced puts, syncs.
class CountingTier final : public Tier {
 public:
  std::string_view name() const noexcept override { return "counting"; }
  TierKind kind() const noexcept override { return TierKind::disk; }
  Status sync() override {
    ++syncs;
    return Status();
  }
  std::atomic<int> puts{0}, unsynced_puts{0}, syncs{0};

 protected:
  Expected<std::optional<Entry>> do_get(const Key& k, Access) override {
    std::lock_guard lk(mu_);
    auto it = kept_.find(k);
    if (it == kept_.end()) return std::optional<Entry>();
    return std::optional<Entry>(it->second);
  }
  Status do_put(const Entry& e) override {
    ++puts;
    return keep(e);
  }
  Status do_put_unsynced(const Entry& e) override {
    ++unsynced_puts;
    return keep(e);
  }
  Status do_remove(const Key& k) override {
    std::lock_guard lk(mu_);
    kept_.erase(k);
    return Status();
  }
  TierStats do_stats() override { return TierStats(); }

 private:
  Status keep(const Entry& e) {
    std::lock_guard lk(mu_);
    kept_.insert_or_assign(e.key(), e);
    return Status();
  }
  std::mutex mu_;
  std::unordered_map<Key, Entry> kept_;
};

// A compile's commit skips its sync; the committer syncs the tier once for
// the compiles of its window, and flush() waits for that sync. Under
// sync_commit each compile's commit is synced instead. Plain puts keep the
// group committer (one group, synced by its own commit).
TEST(SyncCommit, CompilesAreWrittenAtOnceAndSyncedByTheCommitter) {
  for (bool sync_commit : {false, true}) {
    auto tier = std::make_shared<CountingTier>();
    Options o;
    o.sync_commit = sync_commit;
    auto c = Cache::with_tiers({tier}, o);
    compile_keys(*c, 0, 8, Path::get_or_compile);
    compile_keys(*c, 8, 8, Path::flight);
    compile_keys(*c, 16, 8, Path::batch);
    // Written before each call returned.
    EXPECT_EQ(tier->puts.load() + tier->unsynced_puts.load(), 24);
    EXPECT_EQ(tier->unsynced_puts.load(), sync_commit ? 0 : 24);
    (void)c->flush();
    if (sync_commit) {
      EXPECT_EQ(tier->syncs.load(), 0);
    } else {
      EXPECT_GE(tier->syncs.load(), 1);
      EXPECT_LE(tier->syncs.load(), 24);
    }
    // Plain puts: through the committer, synced by their group's commit.
    const int puts_before = tier->puts.load(), syncs_before = tier->syncs.load();
    for (uint64_t i = 100; i < 110; ++i) ASSERT_TRUE(c->put(make_entry(i)));
    (void)c->flush();
    EXPECT_EQ(tier->puts.load() - puts_before, 10);
    EXPECT_EQ(tier->syncs.load(), syncs_before);
  }
}

TEST(SyncCommit, IsAnOptionByNameAndVariable) {
  Options o;
  EXPECT_FALSE(o.sync_commit);
  ASSERT_TRUE(o.set("sync_commit", "1").is_ok());
  EXPECT_TRUE(o.sync_commit);
  EXPECT_EQ(*o.get("sync_commit"), "1");
  ::setenv("KCACHE_SYNC_COMMIT", "yes", 1);
  Options e = Options::from_env();
  ::unsetenv("KCACHE_SYNC_COMMIT");
  EXPECT_TRUE(e.sync_commit);
  bool listed = false;
  for (const auto& i : option_table()) listed |= i.name == "sync_commit" && i.env == "KCACHE_SYNC_COMMIT";
  EXPECT_TRUE(listed);
}

}  // namespace

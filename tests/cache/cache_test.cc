#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kcache/cache.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

Options opts(const std::string& dir) {
  Options o;
  o.dir = dir;
  o.log_level = LogLevel::error;
  return o;
}

CompileFn artifact_fn(std::atomic<int>* calls, std::string value, int sleep_ms = 0) {
  return [=]() -> Expected<std::vector<Artifact>> {
    calls->fetch_add(1);
    if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    return std::vector<Artifact>{{"obj", value}};
  };
}

}  // namespace

TEST(Cache, CompileOnceThenHitFromMemoryThenDisk) {
  TempDir d;
  KeyInfo k = *KeyBuilder("t").add_string("src", "x").finish();
  std::atomic<int> calls{0};
  {
    auto c = Cache::open(opts(d.path()));
    Source s;
    auto e = c->get_or_compile(k, artifact_fn(&calls, "OBJ"), &s);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(s, Source::compiled);
    EXPECT_EQ(*e->artifact("obj"), "OBJ");
    EXPECT_EQ(e->manifest(), k.manifest);
    e = c->get_or_compile(k, artifact_fn(&calls, "OBJ"), &s);
    EXPECT_EQ(s, Source::memory);
    EXPECT_EQ(calls.load(), 1);
  }
  auto c = Cache::open(opts(d.path()));
  Source s;
  auto e = c->get_or_compile(k, artifact_fn(&calls, "OBJ"), &s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(s, Source::disk);
  EXPECT_EQ(calls.load(), 1);
  // Promoted into memory.
  c->get(k.key, &s);
  EXPECT_EQ(s, Source::memory);
  auto st = c->stats();
  EXPECT_EQ(st.tiers.size(), 2u);
  EXPECT_EQ(st.compiles, 0u);
  EXPECT_EQ(st.hits, 2u);
}

TEST(Cache, SingleFlightAcrossThreads) {
  TempDir d;
  auto c = Cache::open(opts(d.path()));
  KeyInfo k = *KeyBuilder("t").add_string("src", "slow").finish();
  std::atomic<int> calls{0};
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i)
    th.emplace_back([&] {
      auto e = c->get_or_compile(k, artifact_fn(&calls, "R", 200));
      if (e && *e->artifact("obj") == "R") ++ok;
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(ok.load(), 16);
  EXPECT_EQ(c->stats().compiles, 1u);
}

TEST(Cache, FailedCompileReachesEveryWaiterAndIsNotStored) {
  TempDir d;
  auto c = Cache::open(opts(d.path()));
  KeyInfo k = *KeyBuilder("t").add_string("src", "bad").finish();
  std::atomic<int> calls{0};
  CompileFn fail = [&]() -> Expected<std::vector<Artifact>> {
    calls++;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return Status(Errc::compile_failed, "syntax error at line 3");
  };
  std::atomic<int> failed{0};
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i)
    th.emplace_back([&] {
      auto e = c->get_or_compile(k, fail);
      if (!e && e.error().message() == "syntax error at line 3") ++failed;
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(failed.load(), 8);
  EXPECT_FALSE(c->get(k.key).has_value());
  std::atomic<int> calls2{0};
  auto e = c->get_or_compile(k, artifact_fn(&calls2, "fixed"));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(calls2.load(), 1);
}

TEST(Cache, ThrowingCompileReleasesWaiters) {
  auto c = Cache::with_tiers({make_memory_tier()});
  KeyInfo k = *KeyBuilder("t").add_string("src", "throw").finish();
  EXPECT_THROW(c->get_or_compile(k, []() -> Expected<std::vector<Artifact>> { throw std::runtime_error("boom"); }),
               std::runtime_error);
  std::atomic<int> calls{0};
  EXPECT_TRUE(c->get_or_compile(k, artifact_fn(&calls, "ok")).has_value());
}

// A thread waiting on a key whose leader's compile threw is not handed
// that exception as a failure: it compiles the key itself and stores it.
TEST(Cache, WaiterCompilesWhenTheLeadersCompileThrows) {
  auto c = Cache::with_tiers({make_memory_tier()});
  KeyInfo k = *KeyBuilder("t").add_string("src", "throw-waited").finish();
  std::atomic<bool> leading{false};
  std::atomic<int> calls{0};
  std::thread leader([&] {
    EXPECT_THROW(c->get_or_compile(k,
                                   [&]() -> Expected<std::vector<Artifact>> {
                                     leading = true;
                                     std::this_thread::sleep_for(std::chrono::milliseconds(200));
                                     throw std::runtime_error("interrupted");
                                   }),
                 std::runtime_error);
  });
  while (!leading) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Source s = Source::other;
  auto e = c->get_or_compile(k, artifact_fn(&calls, "waiter"), &s);
  leader.join();
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ(*e->artifact("obj"), "waiter");
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(c->get(k.key).has_value());
}

TEST(Cache, DisabledAlwaysCompilesAndStoresNothing) {
  TempDir d;
  Options o = opts(d.path());
  o.disabled = true;
  auto c = Cache::open(o);
  KeyInfo k = *KeyBuilder("t").add_string("src", "x").finish();
  std::atomic<int> calls{0};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->get_or_compile(k, artifact_fn(&calls, "x")).has_value());
  EXPECT_EQ(calls.load(), 3);
  EXPECT_TRUE(c->tiers().empty());
}

TEST(Cache, RecompileOverwrites) {
  TempDir d;
  KeyInfo k = *KeyBuilder("t").add_string("src", "x").finish();
  std::atomic<int> calls{0};
  (void)Cache::open(opts(d.path()))->get_or_compile(k, artifact_fn(&calls, "old"));
  Options o = opts(d.path());
  o.recompile = true;
  auto e = Cache::open(o)->get_or_compile(k, artifact_fn(&calls, "new"));
  EXPECT_EQ(calls.load(), 2);
  auto again = Cache::open(opts(d.path()))->get(k.key);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again->artifact("obj"), "new");
}

TEST(Cache, ReadOnlyLooksUpButNeverStores) {
  TempDir d;
  KeyInfo a = *KeyBuilder("t").add_string("src", "a").finish();
  KeyInfo b = *KeyBuilder("t").add_string("src", "b").finish();
  std::atomic<int> calls{0};
  (void)Cache::open(opts(d.path()))->get_or_compile(a, artifact_fn(&calls, "A"));
  Options o = opts(d.path());
  o.read_only = true;
  o.memory_tier = false;
  auto c = Cache::open(o);
  Source s;
  ASSERT_TRUE(c->get_or_compile(a, artifact_fn(&calls, "A"), &s).has_value());
  EXPECT_EQ(s, Source::disk);
  ASSERT_TRUE(c->get_or_compile(b, artifact_fn(&calls, "B")).has_value());
  EXPECT_EQ(calls.load(), 2);
  EXPECT_FALSE(Cache::open(opts(d.path()))->get(b.key).has_value());
}

TEST(Cache, UnwritableFolderRunsWithoutDiskTier) {
  if (::geteuid() == 0) {
    // root ignores permissions: use a path under a regular file instead.
    TempDir d;
    std::string file = d.path() + "/plain";
    ASSERT_EQ(::system(("touch '" + file + "'").c_str()), 0);
    auto c = Cache::open(opts(file + "/cache"));
    EXPECT_EQ(c->tiers().size(), 1u);
    std::atomic<int> calls{0};
    KeyInfo k = *KeyBuilder("t").add_string("src", "x").finish();
    EXPECT_TRUE(c->get_or_compile(k, artifact_fn(&calls, "x")).has_value());
    return;
  }
  TempDir d;
  ::chmod(d.path().c_str(), 0500);
  auto c = Cache::open(opts(d.path() + "/cache"));
  EXPECT_EQ(c->tiers().size(), 1u);
  std::atomic<int> calls{0};
  KeyInfo k = *KeyBuilder("t").add_string("src", "x").finish();
  EXPECT_TRUE(c->get_or_compile(k, artifact_fn(&calls, "x")).has_value());
  ::chmod(d.path().c_str(), 0700);
}

TEST(Cache, EnvironmentOverridesOptions) {
  ::setenv("KCACHE_DIR", "/tmp/kc-env-dir", 1);
  ::setenv("KCACHE_MAX_SIZE", "3M", 1);
  ::setenv("KCACHE_READONLY", "1", 1);
  ::setenv("KCACHE_RECOMPILE", "true", 1);
  ::setenv("KCACHE_DISABLE", "0", 1);
  ::setenv("KCACHE_STATS", "yes", 1);
  ::setenv("KCACHE_LOG", "debug:/tmp/kc.log", 1);
  Options o = Options::from_env();
  EXPECT_EQ(o.dir, "/tmp/kc-env-dir");
  EXPECT_EQ(o.disk.max_bytes, 3u << 20);
  EXPECT_TRUE(o.read_only);
  EXPECT_TRUE(o.recompile);
  EXPECT_FALSE(o.disabled);
  EXPECT_TRUE(o.print_stats);
  EXPECT_EQ(o.log_level, LogLevel::debug);
  EXPECT_EQ(o.log_file, "/tmp/kc.log");
  ::setenv("KCACHE_MAX_SIZE", "lots", 1);
  EXPECT_EQ(Options::from_env().disk.max_bytes, Options().disk.max_bytes);  // unparsable: ignored
  EXPECT_EQ(o.disk.durability, Durability::normal);
  ::setenv("KCACHE_DURABILITY", "none", 1);
  EXPECT_EQ(Options::from_env().disk.durability, Durability::none);
  ::setenv("KCACHE_DURABILITY", "full", 1);
  EXPECT_EQ(Options::from_env().disk.durability, Durability::full);
  ::setenv("KCACHE_DURABILITY", "sometimes", 1);
  EXPECT_EQ(Options::from_env().disk.durability, Durability::normal);  // unknown: ignored
  for (const char* v : {"KCACHE_DIR", "KCACHE_MAX_SIZE", "KCACHE_READONLY", "KCACHE_RECOMPILE", "KCACHE_DISABLE",
                        "KCACHE_STATS", "KCACHE_LOG", "KCACHE_DURABILITY"})
    ::unsetenv(v);
}

TEST(Cache, DefaultFolderFollowsXdgThenHome) {
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(Options::default_dir(), "/x/cache/kcache");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(Options::default_dir(), "/home/u/.cache/kcache");
}

TEST(Cache, DefaultFolderIsCreatedPrivate) {
  TempDir d;
  ::setenv("XDG_CACHE_HOME", d.path().c_str(), 1);
  Options o;
  o.log_level = LogLevel::error;
  auto c = Cache::open(o);
  struct stat st;
  ASSERT_EQ(::stat((d.path() + "/kcache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ::unsetenv("XDG_CACHE_HOME");
}

TEST(Cache, FilesEngineWorksThroughTheFacade) {
  TempDir d;
  Options o = opts(d.path());
  o.engine = Engine::files;
  o.memory_tier = false;
  KeyInfo k = *KeyBuilder("t").add_string("src", "x").finish();
  std::atomic<int> calls{0};
  (void)Cache::open(o)->get_or_compile(k, artifact_fn(&calls, "F"));
  Source s;
  auto e = Cache::open(o)->get_or_compile(k, artifact_fn(&calls, "F"), &s);
  EXPECT_EQ(s, Source::disk);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(Cache::open(o)->tiers()[0]->name(), "files");
}

// Regression: KCACHE_READONLY wrapped the in-process memory tier too, so
// every hit was read from disk and copied again.
TEST(CacheRegression, ReadOnlyStillPromotesIntoMemory) {
  TempDir d;
  KeyInfo k = *KeyBuilder("t").add_string("src", "ro-mem").finish();
  std::atomic<int> calls{0};
  (void)Cache::open(opts(d.path()))->get_or_compile(k, artifact_fn(&calls, "A"));
  Options o = opts(d.path());
  o.read_only = true;
  auto c = Cache::open(o);
  Source s;
  ASSERT_TRUE(c->get(k.key, &s).has_value());
  EXPECT_EQ(s, Source::disk);
  ASSERT_TRUE(c->get(k.key, &s).has_value());
  EXPECT_EQ(s, Source::memory);
  EXPECT_EQ(c->tiers()[0]->name(), "memory");
  EXPECT_FALSE(c->tiers()[1]->writable());
}

// Regression: the memory tier counted only the compressed bytes of a
// compressed entry, so its budget did not bound its memory.
TEST(CacheRegression, MemoryTierCountsDecompressedBytes) {
  MemoryTierOptions mo;
  mo.max_bytes = 1 << 20;
  mo.shards = 1;
  auto mem = make_memory_tier(mo);
  std::string text;
  for (int i = 0; i < 40000; ++i) text += "ld.global.f32 %f" + std::to_string(i % 9) + ";\n";
  for (uint64_t i = 0; i < 20; ++i) {
    auto e = EntryBuilder(key_of(i)).add("ptx", text).compression(Compression::automatic).build();
    ASSERT_TRUE(e.has_value());
#if KCACHE_HAVE_ZSTD
    ASSERT_TRUE(e->compressed());
#endif
    EXPECT_GE(e->memory_size(), text.size());
    (void)mem->put(*e);
  }
  EXPECT_LE(mem->stats().bytes, mo.max_bytes);
  EXPECT_LE(mem->stats().entries, (mo.max_bytes / text.size()) + 1);
}

// Regression: a Cache used in a child of fork() joined the parent's
// heartbeat thread, which does not exist there, and hung in ~Cache.
TEST(CacheRegression, ForkedChildCanDestroyItsInheritedCache) {
  TempDir d;
  auto c = Cache::open(opts(d.path()));
  KeyInfo k = *KeyBuilder("t").add_string("src", "fork").finish();
  std::atomic<int> calls{0};
  ASSERT_TRUE(c->get_or_compile(k, artifact_fn(&calls, "P")).has_value());  // starts the heartbeat
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    std::atomic<int> n{0};
    KeyInfo k2 = *KeyBuilder("t").add_string("src", "fork-child").finish();
    auto e = c->get_or_compile(k2, artifact_fn(&n, "C"));  // a lease in the child
    c.reset();                                             // must not hang
    ::_exit(e && *e->artifact("obj") == "C" ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "child killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_TRUE(c->get_or_compile(k, artifact_fn(&calls, "P")).has_value());
}

// Puts return before the disk has the entry (the committer writes it);
// until then every lookup of this Cache still finds it, without a memory
// tier too, and after flush() another Cache finds it on disk.
TEST(Cache, EntriesOnTheirWayToDiskAreFound) {
  TempDir d;
  Options o = kcache::test::disk_options(d.path(), /*memory=*/false);
  auto c = Cache::open(o);
  for (uint64_t i = 0; i < 64; ++i) {
    KeyInfo k = *KeyBuilder("committer").add_u64("i", i).finish();
    ASSERT_TRUE(c->put(k, {{"obj", kcache::test::bytes_for(i, 4096)}}).has_value());
    auto e = c->get(k.key);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(*e->artifact("obj"), kcache::test::bytes_for(i, 4096));
  }
  (void)c->flush();
  auto other = Cache::open(o);
  for (uint64_t i = 0; i < 64; ++i) {
    Source s = Source::compiled;
    ASSERT_TRUE(other->get(KeyBuilder("committer").add_u64("i", i).finish()->key, &s).has_value()) << i;
    EXPECT_EQ(s, Source::disk);
  }
}

namespace {

// Threads of this process now (/proc/self/task).
int threads_now() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// Threads of this process once those that were joined are gone from
// /proc/self/task: pthread_join can return while the kernel still lists the
// ending thread, so a count taken at once may include it.
int settled_threads() {
  for (int i = 0; i < 200 && threads_now() > 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return threads_now();
}

}  // namespace

// kcache starts a thread only when it has work for it: a process that
// looks up (hits a few entries, misses some keys without a manifest, which
// are not journaled) and stores nothing runs none, on either engine; what
// it counted is written at close all the same. The first store starts the
// committer (a journaled miss, the journal's writer).
TEST(Cache, AProcessThatNeverStoresStartsNoThread) {
  for (const auto& engine : engine_names()) {
    TempDir d;
    Options o = disk_options(d.path(), /*memory=*/false);
    o.engine = parse_engine(engine);
    std::vector<KeyInfo> keys;
    for (int i = 0; i < 8; ++i) keys.push_back(*KeyBuilder("t").add_u64("i", i).label("k").finish());
    {
      auto c = Cache::open(o);
      for (const auto& k : keys) ASSERT_TRUE(c->put(k, {{"obj", "code"}}));
    }  // its threads are joined here
    const int before = settled_threads();
    {
      auto c = Cache::open(o);
      for (const auto& k : keys) EXPECT_TRUE(c->get(k)) << engine;
      for (int i = 0; i < 4; ++i) EXPECT_FALSE(c->get(KeyBuilder("t").add_u64("absent", i).finish()->key)) << engine;
      EXPECT_EQ(threads_now(), before) << engine;
      ASSERT_TRUE(c->put(*KeyBuilder("t").add_u64("new", 1).finish(), {{"obj", "code"}}));
      EXPECT_GT(threads_now(), before) << engine;  // the committer
    }
    auto c = Cache::open(o);
    CacheStats st = c->stats();
    ASSERT_FALSE(st.tiers.empty());
    EXPECT_EQ(st.tiers.back().stats.hits, 8u) << engine;  // written at close
    EXPECT_EQ(st.tiers.back().stats.misses, 4u) << engine;
  }
}

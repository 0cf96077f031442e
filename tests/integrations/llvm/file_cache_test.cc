// kcache::llvm::localCache, the llvm::FileCache drop-in: the protocol of
// llvm::localCache (checked side by side with it), one compile per key
// across threads and processes, abandoning, faults that never reach the
// host, and hit buffers that stay valid for as long as the host keeps them.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <latch>
#include <mutex>
#include <thread>

#include <llvm/Support/Caching.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include "kcache/llvm_file_cache.h"
#include "test_util.h"

using kcache::test::TempDir;
namespace kl = kcache::llvm;
namespace compat = kcache::llvm::compat;

namespace {

// What AddBuffer received, by task.
struct Received {
  std::mutex mu;
  std::map<unsigned, std::string> bytes;  // GUARDED_BY(mu)
  std::map<unsigned, std::string> names;  // GUARDED_BY(mu)
  int calls = 0;                          // GUARDED_BY(mu)

  llvm::AddBufferFn fn() {
    return compat::make_add_buffer([this](unsigned task, std::string name, std::unique_ptr<llvm::MemoryBuffer> mb) {
      std::lock_guard lk(mu);
      bytes[task] = mb->getBuffer().str();
      names[task] = std::move(name);
      ++calls;
    });
  }
  std::string at(unsigned task) {
    std::lock_guard lk(mu);
    return bytes.count(task) ? bytes[task] : std::string("<none>");
  }
  int count() {
    std::lock_guard lk(mu);
    return calls;
  }
};

// One lookup as ThinLTO's backend makes it: on a miss, `object` is written
// into the stream, which is committed as the release's hosts commit (by
// destroying it up to LLVM 20). Returns whether it was a miss.
bool lookup(const llvm::FileCache& cache, unsigned task, const std::string& key, const std::string& object,
            const std::string& module = "mod") {
  auto add = compat::call_cache(cache, task, key, module);
  EXPECT_TRUE(bool(add)) << (add ? "" : llvm::toString(add.takeError()));
  if (!add || !*add) return false;
  auto stream = compat::call_add_stream(*add, task, module);
  EXPECT_TRUE(bool(stream)) << (stream ? "" : llvm::toString(stream.takeError()));
  if (!stream) return true;
  *(*stream)->OS << object;
#if LLVM_VERSION_MAJOR >= 21
  EXPECT_FALSE(bool((*stream)->commit()));
#endif
  stream->reset();
  return true;
}

kl::FileCacheOptions with_counters(std::shared_ptr<kl::FileCacheCounters> c) {
  kl::FileCacheOptions o;
  o.counters = std::move(c);
  return o;
}

std::shared_ptr<kcache::Cache> open_cache(const std::string& dir) {
  kcache::Options o;
  o.dir = dir;
  return kcache::Cache::open(o);
}

}  // namespace

// The drop-in answers the calls LLVM's hosts make as llvm::localCache does:
// a miss gives a stream whose commit hands the object to AddBuffer, the
// same key again is a hit through AddBuffer with no stream, and a new
// FileCache on the folder (a later link) hits too.
TEST(LlvmFileCache, AnswersAsLlvmLocalCacheDoes) {
  TempDir llvm_dir, kcache_dir;
  Received llvm_got, kcache_got;
  auto theirs = llvm::localCache("ThinLTO", "Thin", llvm_dir.path(), llvm_got.fn());
  ASSERT_TRUE(bool(theirs)) << llvm::toString(theirs.takeError());
  auto ours = kl::localCache("ThinLTO", "Thin", kcache_dir.path(), kcache_got.fn());
  ASSERT_TRUE(bool(ours)) << llvm::toString(ours.takeError());

  const std::string key = "0123456789abcdef0123456789abcdef01234567";
  const std::string obj = std::string(
                              "\x7f"
                              "ELF object bytes",
                              17) +
                          std::string(5000, 'x');
  for (auto* c : {&*theirs, &*ours}) {
    EXPECT_TRUE(lookup(*c, 3, key, obj));   // miss: compiled, committed, handed on
    EXPECT_FALSE(lookup(*c, 4, key, obj));  // hit
  }
  for (auto* got : {&llvm_got, &kcache_got}) {
    EXPECT_EQ(got->count(), 2);
    EXPECT_EQ(got->at(3), obj);
    EXPECT_EQ(got->at(4), obj);
    if (compat::kCacheCallbacksHaveModuleName) {
      EXPECT_EQ(got->names[4], "mod");
    }
  }
  // Another key is a miss for both.
  EXPECT_TRUE(lookup(*theirs, 5, key + "0", "other"));
  EXPECT_TRUE(lookup(*ours, 5, key + "0", "other"));

  // A later link, in a FileCache of its own.
  Received later;
  auto again = kl::localCache("ThinLTO", "Thin", kcache_dir.path(), later.fn());
  ASSERT_TRUE(bool(again));
  EXPECT_FALSE(lookup(*again, 0, key, "not this"));
  EXPECT_EQ(later.at(0), obj);
  // The cache name is part of the key: another host's cache misses.
  auto other = kl::localCache("julia-cache", "jlobj", kcache_dir.path(), later.fn());
  ASSERT_TRUE(bool(other));
  EXPECT_TRUE(lookup(*other, 1, key, "julia's"));
}

// Eight threads asking for one key at once compile it once; every one of
// them gets the object.
TEST(LlvmFileCache, EightThreadsOnOneKeyCompileOnce) {
  TempDir dir;
  Received got;
  auto counters = std::make_shared<kl::FileCacheCounters>();
  auto cache = kl::localCache(open_cache(dir.path()), "ThinLTO", got.fn(), with_counters(counters));
  constexpr unsigned kThreads = 8;
  std::latch start(kThreads);
  std::atomic<int> compiled{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      if (lookup(cache, t, "the-one-key", "the object")) compiled.fetch_add(1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiled.load(), 1);
  EXPECT_EQ(counters->streams.load(), 1u);
  EXPECT_EQ(counters->commits.load(), 1u);
  EXPECT_EQ(counters->hits.load(), kThreads - 1);
  EXPECT_EQ(got.count(), static_cast<int>(kThreads));
  for (unsigned t = 0; t < kThreads; ++t) EXPECT_EQ(got.at(t), "the object") << "task " << t;
}

// Four processes asking for one key at once compile it once. The one that
// compiles leaves through _exit right after its AddBuffer, as LLD does:
// the object is in the store all the same.
TEST(LlvmFileCache, FourProcessesOnOneKeyCompileOnceAndTheObjectSurvivesExit) {
  TempDir dir;
  constexpr int kProcs = 4;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) != 0) ::_exit(3);  // all start when the pipe closes
      Received got;
      auto cache = kl::localCache("ThinLTO", "Thin", dir.path(), got.fn());
      if (!cache) ::_exit(2);
      bool miss = lookup(*cache, 0, "shared-key", "object from one process");
      if (got.at(0) != "object from one process") ::_exit(1);
      ::_exit(miss ? 10 : 20);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  int compiled = 0, hit = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    int code = WEXITSTATUS(status);
    if (code == 10) ++compiled;
    if (code == 20) ++hit;
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(hit, kProcs - 1);
  Received later;
  auto cache = kl::localCache("ThinLTO", "Thin", dir.path(), later.fn());
  ASSERT_TRUE(bool(cache));
  EXPECT_FALSE(lookup(*cache, 0, "shared-key", "recompiled"));
  EXPECT_EQ(later.at(0), "object from one process");
}

// A miss whose AddStreamFn is dropped unused, or whose stream is dropped
// without a commit where that does not commit, gives the key up: nothing
// is stored, and the next caller (waiting or later) compiles it.
TEST(LlvmFileCache, DroppedStreamAbandonsTheKey) {
  TempDir dir;
  Received got;
  auto counters = std::make_shared<kl::FileCacheCounters>();
  kl::FileCacheOptions o = with_counters(counters);
  o.commit_on_destroy = false;
  auto cache = kl::localCache(open_cache(dir.path()), "ThinLTO", got.fn(), o);

  // The AddStreamFn dropped while another thread waits for the key.
  auto add = compat::call_cache(cache, 0, "k", "m");
  ASSERT_TRUE(add && *add);
  std::atomic<bool> waiter_compiled{false};
  std::thread waiter([&] { waiter_compiled = lookup(cache, 1, "k", "from the waiter"); });
  *add = llvm::AddStreamFn();  // the host gave up (its compile failed)
  waiter.join();
  // Dropped without a stream: the waiter compiled, without commit() its
  // stream stored nothing either.
  EXPECT_TRUE(waiter_compiled.load());
  EXPECT_EQ(counters->abandons.load(), 2u);
  EXPECT_EQ(counters->commits.load(), 0u);
  EXPECT_EQ(got.count(), 0);

  // A stream dropped without commit(): nothing stored.
  auto add2 = compat::call_cache(cache, 2, "k2", "m");
  ASSERT_TRUE(add2 && *add2);
  {
    auto stream = compat::call_add_stream(*add2, 2, "m");
    ASSERT_TRUE(bool(stream));
    *(*stream)->OS << "half written";
  }
  add2->operator=(llvm::AddStreamFn());
  EXPECT_EQ(counters->abandons.load(), 3u);
  EXPECT_TRUE(lookup(cache, 3, "k2", "whole"));  // still a miss

  // Up to LLVM 20 hosts commit by destroying the stream: the default.
  EXPECT_EQ(kl::FileCacheOptions().commit_on_destroy, LLVM_VERSION_MAJOR < 21);
}

// A cache fault never becomes an error returned to the host: an entry under
// the key that holds no object, or a folder kcache cannot use, is a miss the
// host compiles, and the object still reaches AddBuffer.
TEST(LlvmFileCache, CacheFaultIsAMissNeverAnError) {
  TempDir dir;
  auto cache = open_cache(dir.path());
  auto key =
      kcache::KeyBuilder(kl::kFileCacheNamespace).add_string("cache_name", "ThinLTO").add_string("key", "bad").finish();
  ASSERT_TRUE(bool(key));
  ASSERT_TRUE(cache->put(*key, {{"not-an-object", "junk"}}).has_value());
  Received got;
  auto counters = std::make_shared<kl::FileCacheCounters>();
  auto fc = kl::localCache(cache, "ThinLTO", got.fn(), with_counters(counters));
  EXPECT_TRUE(lookup(fc, 0, "bad", "compiled anyway"));
  EXPECT_EQ(got.at(0), "compiled anyway");
  EXPECT_EQ(counters->faults.load(), 1u);

  // A file where the folder should be.
  std::string file = dir.path() + "/plain-file";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  Received got2;
  auto fc2 = kl::localCache("ThinLTO", "Thin", file + "/cache", got2.fn());
  ASSERT_TRUE(bool(fc2));
  EXPECT_TRUE(lookup(*fc2, 0, "k", "compiled without a disk"));
  EXPECT_EQ(got2.at(0), "compiled without a disk");
}

// Hosts keep every buffer until the link ends: hits from the disk store are
// copies, valid after the FileCache and its Cache are gone, and many held
// at once do not disturb each other.
TEST(LlvmFileCache, HitBuffersOutliveTheCache) {
  TempDir dir;
  constexpr unsigned kKeys = 200;
  auto object = [](unsigned i) { return std::string(4096 + i, static_cast<char>('a' + i % 26)); };
  {
    Received got;
    auto fc = kl::localCache("ThinLTO", "Thin", dir.path(), got.fn());
    ASSERT_TRUE(bool(fc));
    for (unsigned i = 0; i < kKeys; ++i) ASSERT_TRUE(lookup(*fc, i, "key" + std::to_string(i), object(i)));
  }
  std::vector<std::unique_ptr<llvm::MemoryBuffer>> held(kKeys);
  {
    kcache::Options o;
    o.dir = dir.path();
    o.memory_tier = false;  // every hit from LMDB
    auto counters = std::make_shared<kl::FileCacheCounters>();
    auto fc =
        kl::localCache(kcache::Cache::open(o), "ThinLTO",
                       compat::make_add_buffer([&](unsigned task, std::string, std::unique_ptr<llvm::MemoryBuffer> mb) {
                         held[task] = std::move(mb);
                       }),
                       with_counters(counters));
    for (unsigned i = 0; i < kKeys; ++i) EXPECT_FALSE(lookup(fc, i, "key" + std::to_string(i), "x"));
    EXPECT_EQ(counters->hits.load(), kKeys);
  }
  for (unsigned i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(held[i]);
    EXPECT_EQ(held[i]->getBuffer().str(), object(i)) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(held[i]->getBufferStart()) % 8, 0u);
  }
}

// Under KCACHE_DISABLE (read as the folder's Cache is opened) every lookup
// is a miss the host compiles, and the object still reaches AddBuffer.
TEST(LlvmFileCache, DisabledByTheEnvironmentCompilesEveryTime) {
  TempDir dir;
  ::setenv("KCACHE_DISABLE", "1", 1);
  Received got;
  auto fc = kl::localCache("ThinLTO", "Thin", dir.path(), got.fn());
  ::unsetenv("KCACHE_DISABLE");
  ASSERT_TRUE(bool(fc));
  EXPECT_TRUE(lookup(*fc, 0, "k", "first"));
  EXPECT_TRUE(lookup(*fc, 1, "k", "second"));
  EXPECT_EQ(got.at(0), "first");
  EXPECT_EQ(got.at(1), "second");
}

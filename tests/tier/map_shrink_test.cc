// Files that shrink or vanish under a process that has them open: a
// bundle rewritten in place by `cp` and truncated while a reader runs, the
// lease table and LMDB's data.mdb truncated under their users, garbage in
// the lease table's buckets, and a store folder deleted while in use. Each
// is a miss (or uncoordinated compiles) and one log line, never a SIGBUS,
// a stall or wrong bytes. Each case runs in a child process, so a signal
// is a failed test rather than a crashed suite.
//
// KCACHE_TEST_TRIALS=N repeats the racing cases N times (default 3).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "kcache/bundle.h"
#include "kcache/lease.h"
#include "lease/table_layout.h"
#include "test_util.h"
#include "util/util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr size_t kBig = 20000;  // entries in overflow pages, bundle data past the first pages

int trials() {
  const char* v = std::getenv("KCACHE_TEST_TRIALS");
  int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 3;
}

// Runs fn in a child process; its exit code, or 128 + the signal it died of.
template <class F>
int in_child(F&& fn) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Takes and gives back 59 leases, one after another; how many were refused.
template <class Leases>
int refused_of_59(Leases& l) {
  int refused = 0;
  for (uint64_t i = 0; i < 59; ++i) {
    if (l.acquire(key_of(i), 10000) != LeaseResult::acquired)
      ++refused;
    else
      l.release(key_of(i));
  }
  return refused;
}

// Lines of the log file, and those that contain `needle`.
std::pair<int, int> log_counts(const std::string& path, const std::string& needle) {
  return {static_cast<int>(log_lines(path).size()), static_cast<int>(log_lines(path, needle).size())};
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Waits (bounded) until `counter` moved `by` past where it was.
void wait_for(const std::atomic<uint64_t>& counter, uint64_t by) {
  const uint64_t until = counter.load() + by;
  for (int i = 0; i < 20000 && counter.load() < until; ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
}

// What `cp new old` does: the same file (inode), truncated, then written.
bool rewrite_in_place(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < bytes.size()) {
    size_t n = std::min<size_t>(4096, bytes.size() - off);
    ssize_t w = ::write(fd, bytes.data() + off, n);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  ::close(fd);
  return off == bytes.size();
}

void fill_store(const std::string& dir, uint64_t first, int n) {
  auto cache = Cache::open(disk_options(dir, false));
  for (int i = 0; i < n; ++i) ASSERT_TRUE(cache->put(make_entry(first + static_cast<uint64_t>(i), kBig)));
}

TEST(MapShrink, BundleRewrittenInPlaceAndTruncatedUnderAReader) {
  for (int trial = 0; trial < trials(); ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    TempDir td;
    const std::string b = td.path() + "/b.kcb", fresh = td.path() + "/new.kcb", log = td.path() + "/log";
    constexpr int kN = 40;
    fill_store(td.path() + "/a", 0, kN);
    fill_store(td.path() + "/n", 100, kN);
    {
      auto a = Cache::open(disk_options(td.path() + "/a", false));
      auto n = Cache::open(disk_options(td.path() + "/n", false));
      ASSERT_TRUE(write_bundle(*a, BundleSelection{}, b).has_value());
      ASSERT_TRUE(write_bundle(*n, BundleSelection{}, fresh).has_value());
    }
    const std::string fresh_bytes = file_text(fresh);
    int code = in_child([&] {
      Options o;
      o.memory_tier = false;
      o.disk_tier = false;
      o.bundles.files = {b};
      o.log_level = LogLevel::warn;
      o.log_file = log;
      auto cache = Cache::open(o);
      std::atomic<bool> stop{false};
      std::atomic<uint64_t> rounds{0}, hits{0}, wrong{0};
      std::thread reader([&] {
        while (!stop.load()) {
          for (int i = 0; i < kN; ++i) {
            auto e = cache->get(key_of(static_cast<uint64_t>(i)));
            if (!e) continue;
            hits.fetch_add(1);
            if (!entry_ok(*e, static_cast<uint64_t>(i), kBig)) wrong.fetch_add(1);
          }
          rounds.fetch_add(1);
        }
      });
      wait_for(rounds, 2);
      const uint64_t hits_before = hits.load();
      bool rewritten = rewrite_in_place(b, fresh_bytes);
      wait_for(rounds, 2);
      bool cut = ::truncate(b.c_str(), 100) == 0;
      wait_for(rounds, 2);
      cut = cut && ::truncate(b.c_str(), 0) == 0;
      wait_for(rounds, 2);
      stop = true;
      reader.join();
      int after = 0;
      for (int i = 0; i < kN; ++i) after += cache->get(key_of(static_cast<uint64_t>(i))).has_value();
      if (!rewritten || !cut) return 4;
      if (hits_before == 0) return 5;
      if (wrong.load()) return 2;
      return after ? 3 : 0;
    });
    EXPECT_EQ(code, 0) << "128 + signal when it died; 2: wrong bytes; 3: hits after the bundle was replaced";
    auto [all, changed] = log_counts(log, "changed on disk");
    EXPECT_EQ(changed, 1) << file_text(log);
    EXPECT_LE(all, 2) << file_text(log);  // and perhaps one short read in the race
  }
}

TEST(MapShrink, LeaseTableTruncatedUnderItsUsers) {
  for (int trial = 0; trial < trials(); ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    TempDir td;
    const std::string log = td.path() + "/log", dir = td.path() + "/store";
    std::filesystem::create_directories(dir);
    int code = in_child([&] {
      util::set_log(LogLevel::warn, log);
      auto l = open_table_leases(dir);
      if (!l) return 6;
      std::atomic<bool> stop{false};
      std::atomic<uint64_t> ops{0};
      std::thread user([&] {
        for (uint64_t n = 0; !stop.load(); ++n) {
          Key k = key_of(n % 64);
          if ((*l)->acquire(k, 10000) == LeaseResult::acquired) (*l)->release(k);
          ops.fetch_add(1);
        }
      });
      wait_for(ops, 1000);
      bool cut = ::truncate((dir + "/" + lease::table::kFileName).c_str(), 0) == 0;
      wait_for(ops, 1000);
      stop = true;
      user.join();
      if (!cut) return 4;
      return (*l)->acquire(key_of(1), 10000) == LeaseResult::error ? 0 : 3;
    });
    EXPECT_EQ(code, 0) << "128 + signal when it died; 3: a lease from a truncated table";
    auto [all, truncated] = log_counts(log, "truncated");
    EXPECT_EQ(truncated, 1) << file_text(log);
    EXPECT_EQ(all, 1) << file_text(log);
  }
}

TEST(MapShrink, LmdbDataFileTruncatedUnderAReader) {
  for (int trial = 0; trial < trials(); ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    TempDir td;
    const std::string dir = td.path() + "/c", log = td.path() + "/log";
    constexpr int kN = 59;
    fill_store(dir, 0, kN);
    int code = in_child([&] {
      Options o = disk_options(dir, false);
      o.log_level = LogLevel::warn;
      o.log_file = log;
      auto cache = Cache::open(o);
      for (int i = 0; i < kN; ++i) {
        auto e = cache->get(key_of(static_cast<uint64_t>(i)));
        if (!e || !entry_ok(*e, static_cast<uint64_t>(i), kBig)) return 5;
      }
      // Two pages left: the meta pages. Every tree page is gone.
      if (::truncate((dir + "/lmdb/data.mdb").c_str(), 8192) != 0) return 4;
      int after = 0;
      for (int round = 0; round < 3; ++round)
        for (int i = 0; i < kN; ++i) after += cache->get(key_of(static_cast<uint64_t>(i))).has_value();
      (void)cache->put(make_entry(1000, kBig));
      (void)cache->flush();
      return after ? 3 : 0;
    });
    EXPECT_EQ(code, 0) << "128 + signal when it died; 3: hits from a truncated store";
    auto [all, truncated] = log_counts(log, "truncated");
    EXPECT_EQ(truncated, 1) << file_text(log);
    EXPECT_EQ(all, 1) << file_text(log);
  }
}

// A hit held as a view into the map (what Cache::get returns from LMDB
// with no memory tier in front) and copied out after data.mdb was cut: the
// copy that the C ABI and Python make of every such hit (Entry::detach)
// reports the store unavailable instead of dying of SIGBUS.
TEST(MapShrink, HeldHitCopiedAfterTheDataFileShrank) {
  TempDir td;
  const std::string dir = td.path() + "/c";
  fill_store(dir, 0, 8);
  int code = in_child([&] {
    auto cache = Cache::open(disk_options(dir, false));
    auto e = cache->get(key_of(3));
    if (!e || !e->pinned() || !entry_ok(*e, 3, kBig)) return 5;
    if (::truncate((dir + "/lmdb/data.mdb").c_str(), 8192) != 0) return 4;
    auto d = e->detach();
    if (d) return 3;
    return d.error().code() == Errc::unavailable ? 0 : 6;
  });
  EXPECT_EQ(code, 0) << "128 + signal when it died; 3: a copy of bytes that are gone; 6: another error";
}

// The same race as the C ABI's kcache_get and Python's Cache.get run it
// (util::CopiedHits: each hit copied out inside the lookup's guard): readers
// look up and copy out while another thread cuts data.mdb. Every result is
// a correct entry or a miss; the process never dies.
TEST(MapShrink, LookupsAndCopiesRacingATruncation) {
  for (int trial = 0; trial < trials(); ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    TempDir td;
    const std::string dir = td.path() + "/c";
    constexpr int kN = 59;
    fill_store(dir, 0, kN);
    int code = in_child([&] {
      Options o = disk_options(dir, false);
      o.log_level = LogLevel::off;
      auto cache = Cache::open(o);
      std::atomic<uint64_t> copies{0};
      std::atomic<int> wrong{0};
      std::atomic<bool> stop{false};
      std::vector<std::thread> readers;
      for (int t = 0; t < 2; ++t)
        readers.emplace_back([&] {
          util::CopiedHits copied;
          for (uint64_t i = 0; !stop.load(); i = (i + 1) % kN) {
            auto e = cache->get(key_of(i));
            copies.fetch_add(1);
            if (!e) continue;
            auto d = e->detach();
            if (d && !entry_ok(*d, i, kBig)) wrong.fetch_add(1);
          }
        });
      wait_for(copies, 200);
      int rc = ::truncate((dir + "/lmdb/data.mdb").c_str(), 8192) == 0 ? 0 : 4;
      wait_for(copies, 200);
      stop = true;
      for (auto& t : readers) t.join();
      return rc ? rc : (wrong.load() ? 3 : 0);
    });
    EXPECT_EQ(code, 0) << "128 + signal when it died; 3: wrong bytes";
  }
}

TEST(LogOnce, GarbageInLeaseBucketsIsOneLineAndNoWait) {
  for (int trial = 0; trial < trials(); ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    TempDir td;
    const std::string log = td.path() + "/log", dir = td.path() + "/store";
    std::filesystem::create_directories(dir);
    int code = in_child([&] {
      util::set_log(LogLevel::warn, log);
      auto l = open_table_leases(dir);
      if (!l) return 6;
      // Garbage over every bucket, locks and slots.
      std::string junk(lease::table::kTableSize - lease::table::kHeaderSize, '\0');
      std::mt19937_64 rng(static_cast<uint64_t>(trial) + 7);
      for (auto& c : junk) c = static_cast<char>(rng());
      int fd = ::open((dir + "/" + lease::table::kFileName).c_str(), O_WRONLY);
      if (fd < 0 ||
          ::pwrite(fd, junk.data(), junk.size(), lease::table::kHeaderSize) != static_cast<ssize_t>(junk.size()))
        return 4;
      ::close(fd);
      return refused_of_59(**l);
    });
    EXPECT_EQ(code, 0) << "leases refused after garbage in the buckets (or 128 + signal)";
    auto [all, garbage] = log_counts(log, "garbage");
    EXPECT_EQ(garbage, 1) << file_text(log);
    EXPECT_EQ(all, 1) << file_text(log);
  }
}

// Garbage in the slots only, the locks intact (mapped and unmapped tables):
// records no process could have written are taken over, said once.
TEST(LogOnce, GarbageInLeaseSlotsIsOneLineAndEveryLeaseGranted) {
  for (int trial = 0; trial < trials(); ++trial) {
    for (bool mapped : {true, false}) {
      SCOPED_TRACE("trial " + std::to_string(trial) + (mapped ? " mapped" : " unmapped"));
      TempDir td;
      const std::string log = td.path() + "/log", dir = td.path() + "/store";
      std::filesystem::create_directories(dir);
      int code = in_child([&] {
        util::set_log(LogLevel::warn, log);
        auto l = mapped ? open_table_leases(dir) : lease::table::open_unmapped(dir);
        if (!l) return 6;
        std::mt19937_64 rng(static_cast<uint64_t>(trial) + 99);
        int fd = ::open((dir + "/" + lease::table::kFileName).c_str(), O_WRONLY);
        if (fd < 0) return 4;
        for (size_t b = 0; b < lease::table::kBuckets; ++b) {
          std::string junk(lease::table::kSlots * lease::table::kSlotSize, '\0');
          for (auto& c : junk) c = static_cast<char>(rng());
          if (::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(lease::table::slot_at(b, 0))) !=
              static_cast<ssize_t>(junk.size()))
            return 4;
        }
        ::close(fd);
        return refused_of_59(**l);
      });
      EXPECT_EQ(code, 0) << "leases refused after garbage in the slots (or 128 + signal)";
      auto [all, garbage] = log_counts(log, "garbage");
      EXPECT_EQ(garbage, 1) << file_text(log);
      EXPECT_EQ(all, 1) << file_text(log);
    }
  }
}

// A store folder deleted while in use is one line for the process (LMDB:
// the data file is no longer the one open here; the files engine said a
// line per compile, naming each shard folder it could not make), compiles
// still succeed, and nothing makes the deleted store again.
TEST(LogOnce, StoreFolderDeletedWhileInUseIsSaidOnce) {
  for (Engine engine : {Engine::lmdb, Engine::files}) {
    for (int trial = 0; trial < trials(); ++trial) {
      SCOPED_TRACE(std::string(engine_name(engine)) + " trial " + std::to_string(trial));
      TempDir td;
      const std::string dir = td.path() + "/c", log = td.path() + "/log";
      int code = in_child([&] {
        Options o = disk_options(dir, false);
        o.engine = engine;
        o.log_level = LogLevel::warn;
        o.log_file = log;
        auto cache = Cache::open(o);
        for (uint64_t i = 0; i < 10; ++i) (void)cache->put(make_entry(i, kBig));
        (void)cache->flush();
        std::filesystem::remove_all(dir);
        for (uint64_t i = 10; i < 40; ++i) {
          auto e = cache->get_or_compile(key_of(i), [i]() -> Expected<std::vector<Artifact>> {
            return std::vector<Artifact>{{"obj", std::to_string(i)}};
          });
          if (!e) return 5;
          (void)cache->put(make_entry(i + 100, kBig));
          (void)cache->flush();
        }
        return 0;
      });
      EXPECT_EQ(code, 0);
      auto [all, deleted] = log_counts(log, engine == Engine::lmdb ? "deleted or replaced" : "deleted while in use");
      EXPECT_EQ(deleted, 1) << file_text(log);
      EXPECT_EQ(all, 1) << file_text(log);
      EXPECT_FALSE(std::filesystem::exists(dir)) << "nothing makes the deleted store again";
    }
  }
}

}  // namespace

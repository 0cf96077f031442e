// A disk tier on a file system that fills up, and on one that is read-only.
// Compiles must all succeed with correct bytes; a full disk pauses the
// tier's writes with one log line, and counters move; no put is reported
// kept that the disk refused, and a trim makes room that puts then use.
//
// Uses a real 2 MiB tmpfs and a read-only bind mount (the tests run as root
// in CI). Where mounting is not allowed, the same checks run against an
// injected fault (a tier whose puts fail with no_space / read-only), and the
// output says so.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;
namespace fs = std::filesystem;

namespace {

// A mount that is undone however the test ends.
class Mount {
 public:
  Mount() = default;
  ~Mount() {
    if (!target_.empty()) ::umount2(target_.c_str(), MNT_DETACH);
  }
  bool tmpfs(const std::string& target, const char* opts) {
    if (::mount("tmpfs", target.c_str(), "tmpfs", 0, opts) != 0) return fail();
    target_ = target;
    return true;
  }
  // `target` becomes a read-only view of itself.
  bool read_only_bind(const std::string& target) {
    if (::mount(target.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0) return fail();
    target_ = target;
    if (::mount(nullptr, target.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) return fail();
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  bool fail() {
    error_ = strerror(errno);
    return false;
  }
  std::string target_, error_;
};

// Stands in for a file system that refuses writes when none can be mounted.
class FaultyTier final : public Tier {
 public:
  FaultyTier(std::shared_ptr<Tier> inner, Errc code, int ok_puts)
      : inner_(std::move(inner)), code_(code), left_(ok_puts) {}
  std::string_view name() const noexcept override { return inner_->name(); }

 protected:
  Expected<std::optional<Entry>> do_get(const Key& k, Access c) override { return inner_->get(k, c); }
  Status do_put(const Entry& e) override {
    if (left_-- > 0) return inner_->put(e);
    return Status(code_, "injected fault");
  }
  Status do_remove(const Key& k) override { return inner_->remove(k); }
  TierStats do_stats() override { return inner_->stats(); }

 private:
  std::shared_ptr<Tier> inner_;
  Errc code_;
  int left_;
};

std::string artifact_for(uint64_t i) { return bytes_for(i, 20000); }

CompileFn compile_fn(uint64_t i, int* runs) {
  return [i, runs]() -> Expected<std::vector<Artifact>> {
    ++*runs;
    return std::vector<Artifact>{{"obj", artifact_for(i)}};
  };
}

int count_lines(const std::string& file, const std::string& needle) {
  std::ifstream in(file);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

class DiskFullFs : public ::testing::TestWithParam<DiskEngine> {
 protected:
  Options options(const std::string& dir) {
    Options o;
    o.dir = dir;
    o.engine = parse_engine(GetParam().name);
    o.memory_tier = false;        // every lookup goes to the disk tier
    o.disk.max_bytes = 64 << 20;  // the file system fills long before the limit
    o.disk.durability = Durability::none;
    o.log_file = log_;
    return o;
  }
  void TearDown() override { util_reset_log(); }
  // Sends the library's log back to stderr (Cache::open sets it).
  static void util_reset_log() {
    (void)Cache::open([] {
      Options o;
      o.disabled = true;
      return o;
    }());
  }
  TempDir dir_;
  std::string log_ = dir_.path() + "/kcache.log";
};

}  // namespace

TEST_P(DiskFullFs, CompilesSucceedWhenTheDiskFillsAndWritesTurnOffOnce) {
  std::string mnt = dir_.path() + "/small";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  Mount m;
  std::unique_ptr<Cache> cache;
  bool real = m.tmpfs(mnt, "size=2m,mode=0700");
  if (real) {
    printf("[ %s ] full disk: a real 2 MiB tmpfs at %s\n", GetParam().name.c_str(), mnt.c_str());
    cache = Cache::open(options(mnt));
    ASSERT_EQ(cache->tiers().size(), 1u) << "the disk tier did not open on an empty tmpfs";
  } else {
    printf("[ %s ] full disk: mount failed (%s); using an injected no_space fault instead\n", GetParam().name.c_str(),
           m.error().c_str());
    auto inner = GetParam().open(mnt, options(mnt).disk);
    ASSERT_TRUE(inner.has_value());
    Options o = options(mnt);
    cache = Cache::with_tiers({std::make_shared<FaultyTier>(*inner, Errc::no_space, 40)}, o);
    (void)Cache::open([&] {
      Options q = o;
      q.disabled = true;
      return q;
    }());  // route the log to the file
  }

  const uint64_t kKeys = 300;  // 300 x 20 KB: three times the file system
  int runs = 0;
  for (uint64_t i = 0; i < kKeys; ++i) {
    Source src;
    auto e = cache->get_or_compile(key_of(i), compile_fn(i, &runs), &src);
    ASSERT_TRUE(e.has_value()) << "compile " << i << " failed: " << e.error().to_string();
    auto a = e->artifact("obj");
    ASSERT_TRUE(a && *a == artifact_for(i)) << "wrong bytes for " << i;
    EXPECT_EQ(src, Source::compiled);
  }
  EXPECT_EQ(runs, static_cast<int>(kKeys));
  (void)cache->flush();  // the committer's writes, which filled the disk
  CacheStats s = cache->stats();
  ASSERT_EQ(s.tiers.size(), 1u);
  const TierStats& ts = s.tiers[0].stats;
  printf("[ %s ] %llu compiles; disk tier: %llu puts stored, %llu errors; cache faults %llu\n", GetParam().name.c_str(),
         (unsigned long long)s.compiles, (unsigned long long)ts.puts, (unsigned long long)ts.errors,
         (unsigned long long)s.faults);
  EXPECT_EQ(s.compiles, kKeys);
  EXPECT_GT(ts.puts, 0u) << "nothing was stored before the disk filled";
  EXPECT_LT(ts.puts, kKeys) << "the disk never filled";
  EXPECT_GE(s.faults, 1u);
  EXPECT_EQ(count_lines(log_, "writes to this tier are paused") - count_lines(log_, "resumed"), 1)
      << "expected exactly one log line";

  // What was stored before the disk filled is still served, and correct;
  // what was not is compiled again, and correct.
  uint64_t from_disk = 0;
  for (uint64_t i = 0; i < kKeys; ++i) {
    Source src;
    auto e = cache->get_or_compile(key_of(i), compile_fn(i, &runs), &src);
    ASSERT_TRUE(e.has_value()) << e.error().to_string();
    auto a = e->artifact("obj");
    ASSERT_TRUE(a && *a == artifact_for(i)) << "wrong bytes for " << i;
    from_disk += src == Source::disk;
  }
  EXPECT_GT(from_disk, 0u);
  EXPECT_EQ(count_lines(log_, "writes to this tier are paused") - count_lines(log_, "resumed"), 1);
  cache.reset();
}

TEST_P(DiskFullFs, ReadOnlyFolderStillCompiles) {
  std::string d = dir_.path() + "/ro";
  ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
  // Some entries exist before the folder turns read-only.
  {
    auto c = Cache::open(options(d));
    ASSERT_EQ(c->tiers().size(), 1u);
    int runs = 0;
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(c->get_or_compile(key_of(i), compile_fn(i, &runs)).has_value());
  }
  Mount m;
  bool real = m.read_only_bind(d);
  std::unique_ptr<Cache> cache;
  if (real) {
    printf("[ %s ] read-only folder: a read-only bind mount of %s\n", GetParam().name.c_str(), d.c_str());
    cache = Cache::open(options(d));
  } else {
    printf("[ %s ] read-only folder: bind mount failed (%s); using make_read_only instead\n", GetParam().name.c_str(),
           m.error().c_str());
    auto inner = GetParam().open(d, options(d).disk);
    ASSERT_TRUE(inner.has_value());
    cache = Cache::with_tiers({make_read_only(*inner)}, options(d));
  }
  int runs = 0;
  uint64_t from_disk = 0;
  for (uint64_t i = 0; i < 30; ++i) {
    Source src;
    auto e = cache->get_or_compile(key_of(i), compile_fn(i, &runs), &src);
    ASSERT_TRUE(e.has_value()) << "compile " << i << " failed: " << e.error().to_string();
    auto a = e->artifact("obj");
    ASSERT_TRUE(a && *a == artifact_for(i)) << "wrong bytes for " << i;
    from_disk += src == Source::disk;
  }
  // Either the disk tier was left out (said in the log) or it serves what it
  // has without writing; both compile the rest.
  printf("[ %s ] read-only: %zu tiers, %llu hits from disk, %d compiles\n", GetParam().name.c_str(),
         cache->tiers().size(), (unsigned long long)from_disk, runs);
  EXPECT_EQ(static_cast<uint64_t>(runs) + from_disk, 30u);
  EXPECT_GE(runs, 20);
  if (cache->tiers().empty()) {
    EXPECT_GE(count_lines(log_, "running without a disk tier"), 1);
  }
  cache.reset();
}

// No entry is reported kept and then lost: with sync_commit each put that
// the full disk refused says so (no_space), and every put that said ok is
// there for a cache opened afterwards; without it, flush() reports the
// refused writes. Then a trim (here by a second cache on the same store,
// as `kcache trim` does from another process) makes room, and the first
// cache's paused writes resume and are kept.
TEST_P(DiskFullFs, NoEntryReportedKeptIsLostAndTrimMakesRoom) {
  std::string mnt = dir_.path() + "/small";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  Mount m;
  if (!m.tmpfs(mnt, "size=2m,mode=0700")) GTEST_SKIP() << "cannot mount a tmpfs here: " << m.error();
  Options o = options(mnt);
  o.sync_commit = true;
  auto cache = Cache::open(o);
  ASSERT_EQ(cache->tiers().size(), 1u);
  constexpr uint64_t kKeys = 300;  // 300 x 20 KB: three times the file system
  std::vector<uint64_t> kept;
  int refused = 0;
  for (uint64_t i = 0; i < kKeys; ++i) {
    Status st = cache->put(make_entry(i, 20000));
    if (st.is_ok()) {
      kept.push_back(i);
      continue;
    }
    ++refused;
    EXPECT_EQ(st.code(), Errc::no_space) << st.to_string();
  }
  printf("[ %s ] sync_commit puts: %zu kept, %d refused\n", GetParam().name.c_str(), kept.size(), refused);
  EXPECT_GT(refused, 0) << "the disk never filled";
  ASSERT_FALSE(kept.empty()) << "nothing was stored before the disk filled";
  {
    Options r = options(mnt);
    auto again = Cache::open(r);
    for (uint64_t i : kept) {
      auto e = again->get(key_of(i));
      ASSERT_TRUE(e.has_value()) << "entry " << i << " was reported kept and is not there";
      EXPECT_TRUE(entry_ok(*e, i, 20000)) << "entry " << i << " has wrong bytes";
    }
    // Plain puts on the full disk: flush() says they were not written.
    for (uint64_t i = kKeys; i < kKeys + 20; ++i) ASSERT_TRUE(again->put(make_entry(i, 20000)).is_ok());
    Status st = again->flush();
    EXPECT_FALSE(st.is_ok()) << "flush() reported the refused writes as kept";
    EXPECT_EQ(st.code(), Errc::no_space) << st.to_string();
    // Reported once: the next flush has nothing new to say.
    EXPECT_TRUE(again->flush().is_ok());
  }
  {
    auto trimmer = Cache::open(options(mnt));
    ASSERT_EQ(trimmer->tiers().size(), 1u);
    StoreAdmin* admin = trimmer->tiers()[0]->admin();
    ASSERT_NE(admin, nullptr);
    auto evicted = admin->trim(512 << 10);
    ASSERT_TRUE(evicted.has_value()) << evicted.error().to_string();
    EXPECT_GT(*evicted, 0u);
  }
  // The first cache's writes were paused by the full disk; once the pause
  // is over, its next put uses the room the trim made.
  std::this_thread::sleep_for(std::chrono::milliseconds(5200));
  Status st = cache->put(make_entry(kKeys + 100, 20000));
  EXPECT_TRUE(st.is_ok()) << "a put after the trim: " << st.to_string();
  cache.reset();
  auto check = Cache::open(options(mnt));
  auto e = check->get(key_of(kKeys + 100));
  ASSERT_TRUE(e.has_value()) << "the put after the trim is not there";
  EXPECT_TRUE(entry_ok(*e, kKeys + 100, 20000));
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskFullFs, ::testing::ValuesIn(disk_engines()), disk_engine_name);

// Regression tests, one per disk-tier bug found by the robustness tests,
// each named after what broke.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;
namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& p) {
  std::string s;
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return s;
  char b[65536];
  ssize_t n;
  while ((n = ::read(fd, b, sizeof b)) > 0) s.append(b, static_cast<size_t>(n));
  ::close(fd);
  return s;
}

}  // namespace

#if KCACHE_HAVE_LMDB
// A branch page whose child page number pointed past the file made mdb_get
// read outside the map (SIGSEGV): LMDB has no page checksums. The store is
// now checked when opened, and a damaged one is moved aside and replaced.
TEST(DiskRegression, LmdbBranchPointingOutsideTheFileIsQuarantinedNotACrash) {
  TempDir dir;
  std::string d = dir.path() + "/lmdb";
  {
    DiskTierOptions o;
    o.durability = Durability::none;
    auto t = open_lmdb_tier(d, o);
    ASSERT_TRUE(t.has_value());
    for (uint64_t i = 0; i < 2000; ++i) ASSERT_TRUE((*t)->put(make_entry(i, 200)).is_ok());
  }
  fs::remove(d + "/lock.mdb");
  std::string bytes = read_all(d + "/data.mdb");
  size_t branches = 0;
  int fd = ::open((d + "/data.mdb").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (size_t pg = 2; (pg + 1) * 4096 <= bytes.size(); ++pg) {
    const char* p = bytes.data() + pg * 4096;
    uint64_t no;
    std::memcpy(&no, p, 8);
    uint16_t flags;
    std::memcpy(&flags, p + 10, 2);
    if (no != pg || flags != 0x01) continue;
    // Every child of this branch page now points far past the end.
    uint16_t lower;
    std::memcpy(&lower, p + 12, 2);
    for (size_t i = 0; 16 + 2 * i < lower; ++i) {
      uint16_t off;
      std::memcpy(&off, p + 16 + 2 * i, 2);
      unsigned char far[4] = {0xff, 0xff, 0xff, 0x7f};
      ASSERT_EQ(::pwrite(fd, far, 4, static_cast<off_t>(pg * 4096 + off)), 4);
    }
    ++branches;
  }
  ::close(fd);
  ASSERT_GT(branches, 0u) << "the store has no branch page to damage";

  int ws = run_child([&] {
    auto t = open_lmdb_tier(d);
    if (!t) return 2;
    for (uint64_t i = 0; i < 2000; ++i) {
      auto g = (*t)->get(key_of(i));
      if (g && g->has_value() && !entry_ok(**g, i, 200)) return 3;
    }
    if (!(*t)->put(make_entry(5000, 300)).is_ok()) return 4;
    auto g = (*t)->get(key_of(5000));
    if (!g || !g->has_value() || !entry_ok(**g, 5000, 300)) return 5;
    return (*t)->stats().corrupt >= 1 ? 0 : 6;
  });
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  bool aside = false;
  for (const auto& e : fs::directory_iterator(dir.path()))
    aside |= e.path().filename().string().find("lmdb.corrupt-") == 0;
  EXPECT_TRUE(aside) << "the damaged store was not moved aside";
}

// LMDB reports a short page write on a full file system as EIO, so the
// Cache saw an I/O error on every put instead of turning writes off once.
TEST(DiskRegression, LmdbFullFileSystemIsNoSpaceNotIoError) {
  TempDir dir;
  std::string mnt = dir.path() + "/small";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << strerror(errno) << "); disk_full_fs_test covers the fault";
  Status last;
  {
    DiskTierOptions o;
    o.durability = Durability::none;
    auto t = open_lmdb_tier(mnt + "/lmdb", o);
    ASSERT_TRUE(t.has_value()) << t.error().to_string();
    for (uint64_t i = 0; i < 200 && last.is_ok(); ++i) last = (*t)->put(make_entry(i, 20000));
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
  EXPECT_EQ(last.code(), Errc::no_space) << last.to_string();
}
#endif

// A damaged `stats` file claiming terabytes made the next put evict every
// entry of the files engine (eviction trusted the stored totals).
TEST(DiskRegression, FilesDamagedStatsFileDoesNotEvictEveryEntry) {
  TempDir dir;
  std::string d = dir.path() + "/files";
  DiskTierOptions o;
  o.max_bytes = 64 << 20;
  o.durability = Durability::none;
  {
    auto t = open_files_tier(d, o);
    ASSERT_TRUE(t.has_value());
    for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE((*t)->put(make_entry(i, 1000)).is_ok());
  }
  int fd = ::open((d + "/stats").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char hi = 0x40;  // bit 62 of the bytes counter (the 8th u64, little-endian)
  ASSERT_EQ(::pwrite(fd, &hi, 1, 7 * 8 + 7), 1);
  ::close(fd);

  auto t = open_files_tier(d, o);
  ASSERT_TRUE(t.has_value());
  ASSERT_TRUE((*t)->put(make_entry(100, 1000)).is_ok());
  Walk w = walk(**t);
  EXPECT_EQ(w.entries, 51u) << "entries were evicted because of a damaged counter";
  auto s = (*t)->stats();
  EXPECT_EQ(s.entries, w.entries);
  EXPECT_EQ(s.bytes, w.bytes) << "the damaged counter was not recounted";
}

// Processes replacing one key at once each counted it as new (the check for
// an existing file and the rename were not under one lock), so `entries` and
// `bytes` drifted above the store's contents.
TEST(DiskRegression, FilesCountersStayExactWhenProcessesReplaceOneKey) {
  TempDir dir;
  std::string d = dir.path() + "/files";
  DiskTierOptions o;
  o.durability = Durability::none;
  ASSERT_TRUE(open_files_tier(d, o).has_value());
  std::vector<pid_t> pids;
  fflush(nullptr);
  for (int p = 0; p < 4; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto t = open_files_tier(d, o);
      if (!t) _exit(2);
      for (int i = 0; i < trials(300, 60); ++i)
        if (!(*t)->put(make_entry(static_cast<uint64_t>(i % 3), 500 + i % 3)).is_ok()) _exit(3);
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int ws;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  }
  auto t = open_files_tier(d, o);
  ASSERT_TRUE(t.has_value());
  Walk w = walk(**t);
  EXPECT_EQ(w.entries, 3u);
  EXPECT_EQ((*t)->stats().entries, 3u);
  EXPECT_EQ((*t)->stats().bytes, w.bytes);
}

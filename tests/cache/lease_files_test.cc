// The files engine's lease files against what a member of a shared group,
// or a store swapped in after open, can put under a lease file's name: a
// FIFO, a symbolic link, a folder. None may block or redirect a process;
// each counts as a stale record.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "kcache/lease.h"
#include "lease/table_layout.h"
#include "test_util.h"
#include "util/util.h"

namespace kcache::test {
namespace {

// A hang fails the test at once instead of at ctest's timeout.
struct Alarm {
  explicit Alarm(unsigned s) { ::alarm(s); }
  ~Alarm() { ::alarm(0); }
};

std::string lease_path(const std::string& dir, const Key& k) { return dir + "/leases/" + k.hex() + ".lease"; }

TEST(FileLeasesPlanted, FifoUnderTheLeaseNameNeitherHangsNorBlocksTheLease) {
  TempDir d;
  auto l = *open_file_leases(d.path());
  Key k = key_of(1);
  ASSERT_EQ(::mkfifo(lease_path(d.path(), k).c_str(), 0600), 0);
  Alarm a(20);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
  struct stat st;
  ASSERT_EQ(::lstat(lease_path(d.path(), k).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));  // the FIFO was removed, a real lease made
  EXPECT_EQ(l->takeovers(), 1u);
  l->release(k);
  EXPECT_NE(::access(lease_path(d.path(), k).c_str(), F_OK), 0);
}

TEST(FileLeasesPlanted, SymlinkUnderTheLeaseNameIsNeitherFollowedNorWrittenThrough) {
  TempDir d;
  auto l = *open_file_leases(d.path());
  Key k = key_of(2);
  const std::string target = d.path() + "/elsewhere";
  ASSERT_TRUE(util::write_file_atomic(target, "keep me").is_ok());
  ASSERT_EQ(::symlink(target.c_str(), lease_path(d.path(), k).c_str()), 0);
  Alarm a(20);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_TRUE(l->renew(k, 60000));
  struct stat st;
  ASSERT_EQ(::lstat(lease_path(d.path(), k).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(*util::read_file(target), "keep me");
}

TEST(FileLeasesPlanted, FolderUnderTheLeaseNameIsUncoordinatedNeverAWait) {
  TempDir d;
  auto l = *open_file_leases(d.path());
  Key k = key_of(3);
  ASSERT_EQ(::mkdir(lease_path(d.path(), k).c_str(), 0700), 0);
  Alarm a(20);
  // Cannot be removed as a file: the key is compiled uncoordinated at once
  // (no wait), and another key is unaffected.
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::error);
  EXPECT_EQ(l->acquire(key_of(4), 60000), LeaseResult::acquired);
}

TEST(FileLeasesPlanted, StoreSwappedInAfterOpenIsNeverReached) {
  TempDir d;
  const std::string store = d.path() + "/store";
  auto l = *open_file_leases(store);
  Key k = key_of(5);
  // The store folder is moved away and another put in its place, holding a
  // FIFO under the lease's name.
  ASSERT_EQ(::rename(store.c_str(), (d.path() + "/moved").c_str()), 0);
  ASSERT_TRUE(util::make_dirs(store + "/leases").is_ok());
  ASSERT_EQ(::mkfifo(lease_path(store, k).c_str(), 0600), 0);
  Alarm a(20);
  EXPECT_EQ(l->acquire(k, 60000), LeaseResult::acquired);
  // The lease is in the folder that was opened, and the new one is untouched.
  EXPECT_EQ(::access(lease_path(d.path() + "/moved", k).c_str(), F_OK), 0);
  struct stat st;
  ASSERT_EQ(::lstat(lease_path(store, k).c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// The LMDB engine's lease table with a garbage header (not another
// layout's: no lease table magic at all) is made afresh on the next open,
// and single-flight across openers works again.
TEST(TableLeasesDamaged, GarbageHeaderIsRebuiltAndSingleFlightHoldsAgain) {
  TempDir d;
  { ASSERT_TRUE(open_table_leases(d.path()).has_value()); }
  const std::string table = d.path() + "/" + lease::table::kFileName;
  int fd = ::open(table.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const std::string junk(64, '\x5a');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  auto a = open_table_leases(d.path());
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  auto b = open_table_leases(d.path());
  ASSERT_TRUE(b.has_value()) << b.error().to_string();
  EXPECT_EQ((*a)->acquire(key_of(9), 60000), LeaseResult::acquired);
  EXPECT_EQ((*b)->acquire(key_of(9), 60000), LeaseResult::busy);
  (*a)->release(key_of(9));
  EXPECT_EQ((*b)->acquire(key_of(9), 60000), LeaseResult::acquired);
}

// Another version's table (the magic's version digit differs) is not
// damage: it is refused, never overwritten under a process that uses it.
TEST(TableLeasesDamaged, AnotherVersionsHeaderIsLeftAlone) {
  TempDir d;
  { ASSERT_TRUE(open_table_leases(d.path()).has_value()); }
  const std::string table = d.path() + "/" + lease::table::kFileName;
  int fd = ::open(table.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "KCLEASE9", 8, 0), 8);
  ::close(fd);
  EXPECT_FALSE(open_table_leases(d.path()).has_value());
  char magic[8];
  fd = ::open(table.c_str(), O_RDONLY);
  ASSERT_EQ(::pread(fd, magic, 8, 0), 8);
  ::close(fd);
  EXPECT_EQ(std::string(magic, 8), "KCLEASE9");
}

}  // namespace
}  // namespace kcache::test

// A bundle on a read-only file system (a tmpfs remounted read-only) and in
// a folder without write permission: mounted through Cache::open, served,
// verified, and never written.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "bundle_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

void serve_from(const std::string& bundle_path, const std::string& cache_dir) {
  Options o = disk_options(cache_dir);
  o.bundles.files = {bundle_path};
  auto cache = Cache::open(o);
  ASSERT_EQ(cache->tiers().size(), 3u);
  for (uint64_t i = 0; i < 20; ++i) {
    Source s;
    auto e = cache->get(key_of(i), &s);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_TRUE(entry_ok(*e, i));
    EXPECT_EQ(s, Source::bundle);
  }
  auto rep = verify_bundle(bundle_path);
  ASSERT_TRUE(rep.has_value()) << rep.error().to_string();
  EXPECT_EQ(rep->checked, 20u);
  EXPECT_TRUE(rep->bad.empty());
}

}  // namespace

TEST(BundleReadOnly, OnAReadOnlyMount) {
  TempDir d;
  std::string mnt = d.path() + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("kcache-bundle-test", mnt.c_str(), "tmpfs", 0, "size=16m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "); needs root with CAP_SYS_ADMIN";
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  std::string path = mnt + "/pkg.kcb";
  {
    auto store = open_store(d.path() + "/src");
    fill(*store, 0, 20);
    ASSERT_TRUE(write_bundle(*store, BundleSelection{}, path).has_value());
  }
  ASSERT_EQ(::mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0) << std::strerror(errno);
  // Truly read-only now, even for root.
  ASSERT_NE(::access(path.c_str(), W_OK), 0);
  EXPECT_EQ(errno, EROFS);
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  serve_from(path, d.path() + "/cache");
  struct stat after;
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(before.st_size, after.st_size);
}

TEST(BundleReadOnly, InAFolderWithoutWritePermission) {
  TempDir d;
  std::string dir = d.path() + "/ro";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string path = dir + "/pkg.kcb";
  {
    auto store = open_store(d.path() + "/src");
    fill(*store, 0, 20);
    ASSERT_TRUE(write_bundle(*store, BundleSelection{}, path).has_value());
  }
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  serve_from(path, d.path() + "/cache");
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
}

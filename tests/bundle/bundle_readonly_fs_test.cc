// A bundle on a read-only file system and in a folder without write
// permission: mounted through Cache::open, served, verified, and never
// written. The read-only disk comes from the Cache's Env
// (tests/support/fault_env.h), so this runs as any user; one test (root
// with CAP_SYS_ADMIN) puts the bundle on a tmpfs really remounted
// read-only. Bundles are read and written through the Env: a failing disk
// under a mounted bundle makes its lookups errors, never wrong bytes, and
// a full disk under the writer leaves no temp file.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "bundle_util.h"
#include "fault_env.h"
#include "tier/bundle/bundle_reader.h"

using namespace kcache;
using namespace kcache::test;

namespace {

// Serves the 20 entries of the bundle through a Cache with options `o`
// (memory, the bundle and, when o.disk_tier, a disk store) and verifies it.
void serve_from(const std::string& bundle_path, Options o) {
  o.bundles.files = {bundle_path};
  auto cache = Cache::open(o);
  ASSERT_EQ(cache->tiers().size(), o.disk_tier ? 3u : 2u);
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

// Writes a bundle of entries 0..n-1 to `path` from a store made in `src`.
void write_test_bundle(const std::string& src, uint64_t n, const std::string& path) {
  auto store = open_store(src);
  fill(*store, 0, n);
  ASSERT_TRUE(write_bundle(*store, BundleSelection{}, path).has_value());
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
  write_test_bundle(d.path() + "/src", 20, path);
  ASSERT_EQ(::mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0) << std::strerror(errno);
  // Truly read-only now, even for root.
  ASSERT_NE(::access(path.c_str(), W_OK), 0);
  EXPECT_EQ(errno, EROFS);
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  serve_from(path, disk_options(d.path() + "/cache"));
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
  write_test_bundle(d.path() + "/src", 20, path);
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  serve_from(path, disk_options(d.path() + "/cache"));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
}

TEST(BundleReadOnly, OnAReadOnlyDiskThroughTheEnv) {
  TempDir d;
  std::string path = d.path() + "/pkg.kcb";
  write_test_bundle(d.path() + "/src", 20, path);
  auto env = std::make_shared<FaultEnv>();
  env->manual_clock = false;
  env->read_only = true;
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  Options o = disk_options(d.path() + "/cache");
  o.disk_tier = false;
  o.env = env;
  serve_from(path, o);
  EXPECT_GE(env->reads.load(), 20u) << "the bundle was not read through the Env";
  EXPECT_EQ(env->writes.load(), 0u);
  EXPECT_EQ(env->faults.load(), 0u) << "something tried to write";
  struct stat after;
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(before.st_size, after.st_size);
}

TEST(BundleEnv, ReadErrorsUnderAMountedBundleAreErrorsNotEntries) {
  TempDir d;
  std::string path = d.path() + "/pkg.kcb";
  write_test_bundle(d.path() + "/src", 5, path);
  auto env = std::make_shared<FaultEnv>();
  env->manual_clock = false;
  auto r = bundle::open_file(path, {}, env);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  auto tier = bundle::make_tier(std::move(r).value());
  env->io_error = true;
  for (uint64_t i = 0; i < 5; ++i) {
    auto g = tier->get(key_of(i));
    ASSERT_FALSE(g.has_value()) << i;
    EXPECT_EQ(g.error().code(), Errc::io_error) << g.error().to_string();
  }
  env->io_error = false;
  for (uint64_t i = 0; i < 5; ++i) {
    auto g = tier->get(key_of(i));
    ASSERT_TRUE(g.has_value() && g->has_value()) << i;
    EXPECT_TRUE(entry_ok(**g, i));
  }
}

TEST(BundleEnv, AFullDiskUnderTheWriterFailsAndLeavesNoTempFile) {
  TempDir d;
  auto store = open_store(d.path() + "/src");
  fill(*store, 0, 20);
  const std::string out = d.path() + "/out";
  ASSERT_EQ(::mkdir(out.c_str(), 0700), 0);
  auto env = std::make_shared<FaultEnv>();
  env->manual_clock = false;
  BundleWriteOptions wo;
  wo.env = env;
  for (int fault = 0; fault < 2; ++fault) {
    (fault == 0 ? env->no_space : env->write_io_error) = true;
    auto info = write_bundle(*store, BundleSelection{}, out + "/pkg.kcb", wo);
    (fault == 0 ? env->no_space : env->write_io_error) = false;
    ASSERT_FALSE(info.has_value()) << "fault " << fault;
    EXPECT_EQ(info.error().code(), fault == 0 ? Errc::no_space : Errc::io_error) << info.error().to_string();
    EXPECT_NE(info.error().message().find(out), std::string::npos) << info.error().to_string();
    std::vector<std::string> left;
    ASSERT_EQ(Env::posix()->list_dir_at(AT_FDCWD, out, &left), 0);
    EXPECT_TRUE(left.empty()) << left.size() << " files left, first " << left.front();
  }
  auto info = write_bundle(*store, BundleSelection{}, out + "/pkg.kcb", wo);
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_EQ(info->entries, 20u);
  EXPECT_GT(env->writes.load(), 0u);
}

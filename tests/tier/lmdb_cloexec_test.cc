// LMDB 0.9.24 opens data.mdb without close-on-exec: every program a process
// with an open store exec'd (a compiler, a shell) kept the store's file
// open. The tier marks every descriptor on the store's files close-on-exec.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include <filesystem>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

TEST(LmdbCloexec, ExecedProgramDoesNotInheritTheStoreFiles) {
  TempDir td;
  std::string dir = td.path() + "/store";
  auto t = open_lmdb_tier(dir);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  ASSERT_TRUE((*t)->put(make_entry(1, 5000)).is_ok());
  auto r = (*t)->get(key_of(1));
  ASSERT_TRUE(r && r->has_value());

  // In this process: the store's files are open, and all close-on-exec.
  int store_fds = 0;
  for (const auto& de : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(de.path(), ec);
    if (ec || target.string().rfind(dir + "/", 0) != 0) continue;
    int fd = std::stoi(de.path().filename().string());
    ++store_fds;
    EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "fd " << fd << " -> " << target << " survives exec";
  }
  EXPECT_GE(store_fds, 2) << "expected the data and lock files open";

  // In a program started from here: none of them.
  FILE* p = ::popen("ls -l /proc/self/fd/", "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  ASSERT_NE(out.find("->"), std::string::npos) << "no listing: " << out;
  EXPECT_EQ(out.find("data.mdb"), std::string::npos) << out;
  EXPECT_EQ(out.find("lock.mdb"), std::string::npos) << out;
}

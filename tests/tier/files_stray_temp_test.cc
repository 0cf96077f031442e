// Temp files left in <dir>/tmp by writers that died: collected once older
// than stale_temp_ms, and never in the way of later writes (an orphan file
// once made every later write of a cache fail while reads still worked).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> temps(const std::string& dir) {
  std::vector<std::string> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir + "/tmp", ec)) v.push_back(e.path().string());
  return v;
}

void age(const std::string& p, int seconds) {
  struct timespec ts[2];
  ::clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= seconds;
  ts[1] = ts[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), ts, 0), 0);
}

}  // namespace

TEST(FilesStrayTemp, KilledWritersTempIsCollectedWhenStaleAndNeverBlocksWrites) {
  TempDir dir;
  std::string d = dir.path() + "/files";
  DiskTierOptions o;
  o.stale_temp_ms = 2000;
  o.max_entry_bytes = 256 << 20;
  ASSERT_TRUE(open_files_tier(d, o).has_value());

  // A real orphan: a writer killed while it writes a large entry.
  fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto t = open_files_tier(d, o);
    if (!t) _exit(2);
    Entry big = make_entry(1, 64 << 20);
    for (;;) (void)(*t)->put(big);
  }
  for (int i = 0; i < 20000 && temps(d).empty(); ++i) ::usleep(100);
  ::kill(pid, SIGKILL);
  int ws;
  ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
  std::vector<std::string> orphans = temps(d);
  ASSERT_FALSE(orphans.empty()) << "the writer was not caught inside a write";
  // Orphans named as the next writers of the same keys would name theirs,
  // and one that is not even ours to parse.
  for (const char* name : {"/tmp/"
                           "0000000000000000000000000000000a",
                           "/tmp/junk"}) {
    int fd = ::open((d + name).c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  orphans = temps(d);

  // Fresh orphans stay (a live writer may own them) and block nothing.
  auto t = open_files_tier(d, o);
  ASSERT_TRUE(t.has_value());
  for (uint64_t k = 0; k < 20; ++k) ASSERT_TRUE((*t)->put(make_entry(k, 3000)).is_ok()) << k;
  ASSERT_TRUE((*t)->put(make_entry(1, 5000)).is_ok());
  auto g = (*t)->get(key_of(1));
  ASSERT_TRUE(g && g->has_value() && entry_ok(**g, 1, 5000));
  for (const auto& p : orphans) EXPECT_TRUE(fs::exists(p)) << p << " was collected while fresh";

  // Once older than stale_temp_ms they go: at the next open and at walks.
  for (const auto& p : orphans) age(p, 3);
  t = open_files_tier(d, o);
  ASSERT_TRUE(t.has_value());
  EXPECT_TRUE(temps(d).empty()) << temps(d).size() << " stale temp files left after open";

  // Another stale one, collected by a walk (list) without reopening.
  std::string late = d + "/tmp/late";
  int fd = ::open(late.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  age(late, 3);
  ASSERT_TRUE((*t)->admin()->list([](const ListItem&) { return true; }).is_ok());
  EXPECT_FALSE(fs::exists(late));

  // Writes work even when someone removes tmp/ itself.
  fs::remove_all(d + "/tmp");
  ASSERT_TRUE((*t)->put(make_entry(99, 4000)).is_ok());
  g = (*t)->get(key_of(99));
  ASSERT_TRUE(g && g->has_value() && entry_ok(**g, 99, 4000));
  auto v = (*t)->admin()->verify(false);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->bad.empty());
  EXPECT_EQ((*t)->stats().entries, 21u);
}

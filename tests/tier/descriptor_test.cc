// A program started with descriptor 0, 1 or 2 closed (a daemon, some
// launchers): the next file opened takes that number. Had a store file
// taken it, the program's own output and the library's log lines would land
// at offset 0 of the store. Each child here closes a standard descriptor,
// uses a store (gets, puts, a warning line, the program's own output on
// the closed numbers), and exits; the parent then finds every entry intact
// and the store where it was.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kcache/bundle.h"
#include "test_util.h"
#include "util/util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr int kEntries = 59;

Options store_options(const std::string& dir, const std::string& engine) {
  Options o = disk_options(dir, false);
  o.log_level = LogLevel::warn;
  EXPECT_TRUE(o.set("engine", engine).is_ok());
  return o;
}

// Which of descriptors 0-2 name a file under `dir` (as a bit mask).
int std_fds_in(const std::string& dir) {
  int mask = 0;
  for (int fd = 0; fd < 3; ++fd) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
    if (!ec && target.string().rfind(dir + "/", 0) == 0) mask |= 1 << fd;
  }
  return mask;
}

// In a child with the descriptors of `closed` (a bit mask) closed: uses the
// store, writes what a program writes to its standard descriptors and a
// warning line, and exits 0; 10 + mask when store files took descriptors,
// 20 + fd when a write to a closed one did not fail as it would have.
[[noreturn]] void child(const std::string& dir, const std::string& engine, int closed, const std::string& bundle) {
  for (int fd = 0; fd < 3; ++fd)
    if (closed & (1 << fd)) ::close(fd);
  int code = 0;
  {
    Options o = store_options(dir, engine);
    if (!bundle.empty()) o.bundles.files = {bundle};
    auto cache = Cache::open(o);
    for (int i = 0; i < kEntries; ++i) {
      auto e = cache->get(key_of(i));
      if (!e || !entry_ok(*e, i, 3000)) code = 2;
    }
    (void)cache->put(make_entry(1000, 3000));
    const int taken = std_fds_in(dir) | (bundle.empty() ? 0 : std_fds_in(bundle.substr(0, bundle.rfind('/'))));
    if (taken) code = 10 + taken;
    // A warning from the library, and the program's own output on the
    // numbers it closed (as `printf` would write to a closed stdout).
    KCACHE_LOG(LogLevel::warn, "a warning line from a process started with closed descriptors");
    const std::string line = "program output that must not reach the store\n";
    // It still fails, as on a closed descriptor: the program can tell.
    for (int fd = 0; fd < 3; ++fd)
      if ((closed & (1 << fd)) && !(::write(fd, line.data(), line.size()) < 0 && errno == EBADF) && code == 0)
        code = 20 + fd;
  }
  ::_exit(code);
}

bool moved_aside(const std::string& dir) {
  for (const auto& de : std::filesystem::directory_iterator(dir))
    if (de.path().filename().string().find(".corrupt-") != std::string::npos) return true;
  return false;
}

class ClosedStdFds : public ::testing::TestWithParam<std::string> {};

TEST_P(ClosedStdFds, StoreFilesNeverTakeThemAndTheStoreSurvives) {
  const std::string engine = GetParam();
  for (int closed : {1, 2, 4, 3, 7}) {
    SCOPED_TRACE("closed descriptor mask " + std::to_string(closed));
    TempDir td;
    const std::string dir = td.path();
    {
      auto cache = Cache::open(store_options(dir, engine));
      for (int i = 0; i < kEntries; ++i) ASSERT_TRUE(cache->put(make_entry(i, 3000)));
    }
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) child(dir, engine, closed, "");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child died of signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "10 + mask: store files took standard descriptors";

    auto cache = Cache::open(store_options(dir, engine));
    int intact = 0;
    for (int i = 0; i < kEntries; ++i) {
      auto e = cache->get(key_of(i));
      intact += e && entry_ok(*e, i, 3000);
    }
    EXPECT_EQ(intact, kEntries);
    auto e = cache->get(key_of(1000));
    EXPECT_TRUE(e && entry_ok(*e, 1000, 3000));
    EXPECT_FALSE(moved_aside(dir)) << "the store was moved aside";
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, ClosedStdFds, ::testing::ValuesIn(engine_names()));

// A mounted bundle opened with descriptor 1 closed is not put on it.
TEST(ClosedStdFdsBundle, BundleFileNeverTakesThem) {
  TempDir td;
  const std::string dir = td.path() + "/store", bdir = td.path() + "/bundles";
  std::filesystem::create_directories(bdir);
  {
    auto cache = Cache::open(store_options(dir, "lmdb"));
    for (int i = 0; i < kEntries; ++i) ASSERT_TRUE(cache->put(make_entry(i, 3000)));
    ASSERT_TRUE(write_bundle(*cache, BundleSelection{}, bdir + "/b.kcb").has_value());
  }
  for (int closed : {1, 2, 7}) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) child(dir, "lmdb", closed, bdir + "/b.kcb");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "closed mask " << closed;
    EXPECT_TRUE(verify_bundle(bdir + "/b.kcb").value().bad.empty());
  }
}

// A file of the program's own that took descriptor 2 after the log was
// first used (the program closed it and opened a data file read-write)
// never gets the library's log lines.
TEST(ClosedStdFdsLog, LogNeverWritesToADataFileOnDescriptor2) {
  TempDir td;
  const std::string data = td.path() + "/program-data";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 2);
    util::set_log(LogLevel::warn, "");
    KCACHE_LOG(LogLevel::warn, "first line, to stderr");
    ::close(2);
    int fd = ::open(data.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd != 2) ::_exit(3);
    KCACHE_LOG(LogLevel::warn, "second line, after the program's data file took descriptor 2");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(std::filesystem::file_size(data), 0u) << "a log line was written into the program's data file";
}

}  // namespace

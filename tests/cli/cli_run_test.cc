// `kcache run`: the command-line face of single-flight.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "util/util.h"

using kcache::test::TempDir;

namespace {

int sh(const std::string& cmd) {
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int lines(const std::string& p) {
  std::string s = slurp(p);
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

const char* kKey = "00112233445566778899aabbccddeeff";

class Run : public ::testing::TestWithParam<std::string> {
 protected:
  std::string cli(const std::string& args) {
    return std::string(KCACHE_CLI) + " --dir '" + d_.path() + "/cache' --engine " + GetParam() + " " + args;
  }
  // A "compiler": writes two outputs and counts its runs.
  std::string compiler(int sleep_ms = 0) {
    return "-- sh -c 'sleep " + std::to_string(sleep_ms / 1000.0) +
           "; printf obj-bytes > \"$0/out.o\"; printf meta > \"$0/out.json\"; echo ran >> \"$0/count\"' '" + d_.path() +
           "'";
  }
  std::string arts() { return "--artifact obj='" + d_.path() + "/out.o' --artifact meta='" + d_.path() + "/out.json'"; }
  TempDir d_;
};

}  // namespace

TEST_P(Run, MissRunsOnceThenHitWritesTheFiles) {
  ASSERT_EQ(sh(cli(std::string("run --key ") + kKey + " " + arts() + " " + compiler())), 0);
  EXPECT_EQ(lines(d_.path() + "/count"), 1);
  ::unlink((d_.path() + "/out.o").c_str());
  ::unlink((d_.path() + "/out.json").c_str());
  ASSERT_EQ(sh(cli(std::string("run --key ") + kKey + " " + arts() + " " + compiler())), 0);
  EXPECT_EQ(lines(d_.path() + "/count"), 1) << "a hit must not run the command";
  EXPECT_EQ(slurp(d_.path() + "/out.o"), "obj-bytes");
  EXPECT_EQ(slurp(d_.path() + "/out.json"), "meta");
  // The entry is an ordinary one: get reads it.
  EXPECT_EQ(sh(cli(std::string("get --key ") + kKey + " --artifact obj -o '" + d_.path() + "/got'")), 0);
  EXPECT_EQ(slurp(d_.path() + "/got"), "obj-bytes");
}

TEST_P(Run, CommandStatusIsPassedOnAndFailuresAreNotStored) {
  std::string a = "--artifact obj='" + d_.path() + "/x'";
  EXPECT_EQ(sh(cli(std::string("run --key ") + kKey + " " + a + " -- sh -c 'echo ran >> \"$0/count\"; exit 7' '" +
                   d_.path() + "'")),
            7);
  EXPECT_EQ(sh(cli(std::string("run --key ") + kKey + " " + a + " -- sh -c 'echo ran >> \"$0/count\"; exit 7' '" +
                   d_.path() + "'")),
            7);
  EXPECT_EQ(lines(d_.path() + "/count"), 2);
  EXPECT_EQ(sh(cli(std::string("get --key ") + kKey + " --artifact obj >/dev/null 2>&1")), 1);
  // Exit 0 without producing the file: the command's status, nothing stored.
  EXPECT_EQ(sh(cli(std::string("run --key ") + kKey + " " + a + " -- true 2>/dev/null")), 0);
  EXPECT_EQ(sh(cli(std::string("get --key ") + kKey + " --artifact obj >/dev/null 2>&1")), 1);
}

TEST_P(Run, ConcurrentRunsCompileOnce) {
  std::string cmd = cli(std::string("run --key ") + kKey + " " + arts() + " " + compiler(700));
  std::vector<pid_t> pids;
  for (int i = 0; i < 6; ++i) {
    pid_t p = ::fork();
    if (p == 0) {
      int st = std::system(cmd.c_str());
      ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 99);
    }
    pids.push_back(p);
  }
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  EXPECT_EQ(lines(d_.path() + "/count"), 1) << "six concurrent runs, one compile";
  EXPECT_EQ(slurp(d_.path() + "/out.o"), "obj-bytes");
}

TEST_P(Run, UsageErrors) {
  EXPECT_EQ(sh(cli("run --artifact a=b -- true 2>/dev/null")), 2);                          // no key
  EXPECT_EQ(sh(cli(std::string("run --key ") + kKey + " -- true 2>/dev/null")), 2);         // no artifact
  EXPECT_EQ(sh(cli(std::string("run --key ") + kKey + " --artifact a=b 2>/dev/null")), 2);  // no command
  EXPECT_EQ(sh(cli(std::string("run --key ") + kKey + " --artifact ab -- true 2>/dev/null")), 2);
  EXPECT_EQ(sh(cli("ls -- x 2>/dev/null")), 2);
}

INSTANTIATE_TEST_SUITE_P(Engines, Run,
#if KCACHE_HAVE_LMDB
                         ::testing::Values("lmdb", "files"),
#else
                         ::testing::Values("files"),
#endif
                         [](const auto& info) { return info.param; });

// Regression: when the stored entry lacked one of the requested artifacts,
// `kcache run` ran COMMAND twice.
TEST_P(Run, EntryLackingAnArtifactRunsTheCommandOnce) {
  std::string in = d_.path() + "/a.in";
  ASSERT_TRUE(kcache::util::write_file_atomic(in, "only-a").is_ok());
  ASSERT_EQ(sh(cli(std::string("put --key ") + kKey + " a='" + in + "' >/dev/null")), 0);
  ASSERT_EQ(sh(cli(std::string("run --key ") + kKey + " " + arts() + " " + compiler())), 0);
  EXPECT_EQ(lines(d_.path() + "/count"), 1);
  EXPECT_EQ(slurp(d_.path() + "/out.o"), "obj-bytes");
}

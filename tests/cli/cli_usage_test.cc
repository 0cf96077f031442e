// kcache tool usage, help and version: bad command lines exit 2 with one
// line on stderr and touch no store; the same for every engine.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"

namespace kcache::test {
namespace {

class CliUsageTest : public CliTest {};

TEST_P(CliUsageTest, BadUsageExitsTwoWithOneLine) {
  std::string in = file("x");
  spit(in, "x");
  const std::string k = key_of(1).hex();
  const std::vector<std::vector<std::string>> cases = {
      {"frobnicate"},
      {"ls", "--frob"},
      {"get", "--artifact", "obj"},
      {"get", "--key", k},
      {"get", "--key", "xyz", "--artifact", "obj"},
      {"get", "--key", k + "0", "--artifact", "obj"},
      {"show"},
      {"put", "obj=" + in},
      {"put", "--key", k},
      {"put", "--key", k, in},
      {"put", "--key", k, "=" + in},
      {"put", "--key", k, "obj=" + in, "obj=" + in},
      {"ls", "extra"},
      {"verify", "--fix=yes"},
      {"get", "--json", "--key", k, "--artifact", "obj"},
      {"show", "--key"},
      {"--engine", "bdb", "ls"},
      {},
  };
  for (const auto& args : cases) {
    SCOPED_TRACE(::testing::PrintToString(args));
    expect_failure(run(args), 2);
  }
  // Nothing above created a store.
  EXPECT_FALSE(std::ifstream(dir()).good());
}

// An empty folder (`--dir "$UNSET"`, KCACHE_DIR="$UNSET") is bad usage,
// never the default store; an unset KCACHE_DIR is the default store.
TEST_P(CliUsageTest, AnEmptyFolderIsBadUsageNotTheDefaultStore) {
  const std::string home = file("xdg");
  const char* old = std::getenv("XDG_CACHE_HOME");
  std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", home.c_str(), 1);
  std::string in = file("in");
  spit(in, "bytes");
  const std::string k = key_of(1).hex();
  Result r = run_in("", {"--engine", engine(), "put", "--key", k, "obj=" + in});
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_failure(run_in("", {"--dir", "", "--engine", engine(), "clear"}), 2, "dir");
  expect_failure(run_in("", {"--engine", engine(), "clear"}, {{"KCACHE_DIR", ""}}), 2, "KCACHE_DIR");
  r = run_in("", {"--engine", engine(), "get", "--key", k, "--artifact", "obj"});
  EXPECT_EQ(r.out, "bytes") << "the default store kept its entry: " << r.err;
  r = run_in("", {"--engine", engine(), "clear"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "removed 1 entry\n");
  if (old) {
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

TEST_P(CliUsageTest, VersionAndHelp) {
  Result r = run({"--version"}, false);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind(std::string("kcache ") + version_string() + "\n", 0), 0u) << r.out;
  for (const auto& f : features()) EXPECT_NE(r.out.find(" " + f), std::string::npos) << f;
  r = run({"version", "--json"}, false);
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("\"features\":["), std::string::npos);
  for (const char* h : {"--help", "help", "-h"}) {
    r = run({h}, false);
    EXPECT_EQ(r.rc, 0) << h;
    EXPECT_EQ(r.err, "");
    for (const char* cmd : {"put", "get", "ls", "show", "stats", "verify", "trim", "clear", "explain"})
      EXPECT_NE(r.out.find(std::string("  ") + cmd + " "), std::string::npos) << cmd;
  }
  r = run({"get", "--help"}, false);
  EXPECT_EQ(r.rc, 0);
}

// `kcache help CMD` and `kcache CMD --help` print that command's usage,
// not the whole usage; the whole usage lists every command.
TEST_P(CliUsageTest, HelpOfOneCommandIsThatCommandsUsageOnly) {
  const std::string whole = run({"--help"}, false).out;
  for (const char* cmd :
       {"put", "get", "ls", "show", "stats", "verify", "trim", "clear", "explain", "misses", "run", "mark", "bundle"}) {
    SCOPED_TRACE(cmd);
    Result a = run({"help", cmd}, false);
    Result b = run({cmd, "--help"}, false);
    EXPECT_EQ(a.rc, 0) << a.err;
    EXPECT_EQ(b.rc, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(a.out.find(std::string("\n  ") + cmd + " "), std::string::npos) << a.out;
    EXPECT_LT(lines(a.out), 20u) << a.out;
    EXPECT_LT(a.out.size(), whole.size() / 3) << a.out;
    // No other command's line.
    for (const char* other : {"put --key", "get --key", "clear [--json]", "misses [--limit"})
      if (std::string(other).rfind(cmd, 0) != 0) {
        EXPECT_EQ(a.out.find(other), std::string::npos) << other;
      }
  }
  expect_failure(run({"help", "frobnicate"}, false), 2, "'frobnicate'");
}

// What is wrong with a command line is named: the option that is not one,
// the option without its value, the single-valued option given twice.
TEST_P(CliUsageTest, TheFaultyOptionIsNamed) {
  expect_failure(run({"--foo"}, false), 2, "unknown option '--foo'");
  expect_failure(run({"--dir"}, false), 2, "option --dir needs a value");
  expect_failure(run({"ls", "--dir"}, false), 2, "option --dir needs a value");
  expect_failure(run({"ls", "--frob"}), 2, "unknown option '--frob'");
  const std::string k = key_of(1).hex();
  expect_failure(run({"get", "--key", k, "--artifact", "a", "--artifact", "b"}), 2,
                 "option --artifact given more than once");
  expect_failure(run({"--dir", "/tmp/a", "--dir", "/tmp/b", "ls"}, false), 2, "option --dir given more than once");
  expect_failure(run({"get", "--key", k, "--key", k, "--artifact", "a"}), 2, "option --key given more than once");
}

// A failed write names the path the user gave, never a temp file of ours.
TEST_P(CliUsageTest, AFailedOutputNamesTheUsersPath) {
  put(key_of(1), "bytes");
  Result r = run({"get", "--key", key_of(1).hex(), "--artifact", "obj", "-o", "/nonexistent/dir/x"});
  expect_failure(r, 3, "/nonexistent/dir/x");
  EXPECT_EQ(r.err.find("kcache-tmp"), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Cli, CliUsageTest, ::testing::Values(std::string("files")),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

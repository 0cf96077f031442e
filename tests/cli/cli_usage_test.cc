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

INSTANTIATE_TEST_SUITE_P(Cli, CliUsageTest, ::testing::Values(std::string("files")),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

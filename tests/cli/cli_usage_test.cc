// kcache tool usage, help and version: bad command lines exit 2 with one
// line on stderr and touch no store; the same for every engine.
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

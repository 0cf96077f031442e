// The kcache tool tells the store's state as it is: a store that exists
// but is refused reads as refused (exit 3, the reason with names), never as
// empty; and the diagnostics (misses, explain, stats, ls, show, verify
// without --fix) leave every counter and every entry's recency as they
// found them. Each engine; real processes, a real store written by the
// library.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli_util.h"
#include "kcache/cache.h"

namespace kcache::test {
namespace {

class CliStateTest : public CliTest {
 protected:
  // A store written as a JIT writes it: three entries with manifests
  // compiled one after another (distinct recency), then a lookup that
  // misses and is journaled with its manifest.
  void fill_like_a_jit() {
    Options o;
    o.dir = dir();
    ASSERT_TRUE(o.set("engine", engine()).is_ok());
    o.memory_tier = false;
    auto cache = Cache::open(o);
    for (const char* opt : {"O1", "O2", "O3"}) {
      auto k = kernel_key(opt);
      auto e = cache->get_or_compile(k, [&]() -> Expected<std::vector<Artifact>> {
        return std::vector<Artifact>{{"obj", std::string("code for ") + opt}};
      });
      ASSERT_TRUE(e) << e.error().to_string();
      (void)cache->flush();
      ::usleep(5000);  // a later last use for each
    }
    auto k = kernel_key("O1");
    ASSERT_TRUE(cache->get(k).has_value());  // one hit
    auto miss = kernel_key("O4");
    auto e = cache->get_or_compile(miss, [&]() -> Expected<std::vector<Artifact>> {
      return std::vector<Artifact>{{"obj", std::string("code for O4")}};
    });
    ASSERT_TRUE(e);
    (void)cache->flush();
  }

  // Everything a diagnostic could change: the counters and totals, and
  // each entry's last use.
  std::string state() {
    Result s = run({"stats", "--json"});
    EXPECT_EQ(s.rc, 0) << s.err;
    Result l = run({"ls", "--json"});
    EXPECT_EQ(l.rc, 0) << l.err;
    return s.out + l.out;
  }
};

TEST_P(CliStateTest, DiagnosticsChangeNoCounterAndNoRecency) {
  fill_like_a_jit();
  const std::string before = state();
  ASSERT_NE(json_num(before, "hits"), 0) << before;
  ASSERT_NE(json_num(before, "misses"), 0) << before;
  const std::string manifest = write_text_manifest(file("lookup.txt"), kernel_key("O5"));
  const std::vector<std::vector<std::string>> diagnostics = {
      {"misses"},
      {"misses", "--json"},
      {"explain", "--key", kernel_key("O4").key.hex()},
      {"explain", "--manifest", manifest},
      {"explain", "--key", kernel_key("O1").key.hex()},
      {"stats"},
      {"ls"},
      {"show", "--key", kernel_key("O1").key.hex()},
      {"show", "--key", kernel_key("O9").key.hex()},
      {"verify"},
  };
  for (const auto& args : diagnostics) {
    SCOPED_TRACE(::testing::PrintToString(args));
    Result r = run(args);
    EXPECT_LE(r.rc, 1) << r.err;
    EXPECT_EQ(state(), before);
  }
  // A real lookup does count: the check above can see a change.
  EXPECT_EQ(run({"get", "--key", kernel_key("O1").key.hex(), "--artifact", "obj"}).rc, 0);
  EXPECT_NE(state(), before);
}

// A store that exists but is refused (a folder others may write) is
// reported as refused, with the group's name, by every command that needs
// it, never as an empty or missing store.
TEST_P(CliStateTest, ARefusedStoreIsReportedNotEmpty) {
  put(key_of(1), "bytes");
  ASSERT_EQ(::chmod(dir().c_str(), 0770), 0);
  struct stat st;
  ASSERT_EQ(::stat(dir().c_str(), &st), 0);
  std::string group = std::to_string(st.st_gid);
  if (struct group* g = ::getgrgid(st.st_gid)) group += std::string(" (") + g->gr_name + ")";
  const std::string k = key_of(1).hex();
  const std::vector<std::vector<std::string>> needing = {
      {"stats"},
      {"stats", "--json"},
      {"ls"},
      {"verify"},
      {"trim"},
      {"clear"},
      {"misses"},
      {"explain", "--key", k},
      {"mark"},
      {"get", "--key", k, "--artifact", "obj"},
      {"show", "--key", k},
  };
  for (const auto& args : needing) {
    SCOPED_TRACE(::testing::PrintToString(args));
    Result r = run(args);
    expect_failure(r, 3, "writable by group " + group);
    EXPECT_NE(r.err.find("cannot open the store " + dir() + "/" + engine()), std::string::npos) << r.err;
  }
  // doctor reports it among the parts, and fails.
  Result d = run({"doctor"});
  EXPECT_EQ(d.rc, 3) << d.err;
  EXPECT_NE(d.out.find("FAIL store   cannot open the store"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("writable by group " + group), std::string::npos) << d.out;
  ASSERT_EQ(::chmod(dir().c_str(), 0700), 0);
  Result r = run({"get", "--key", k, "--artifact", "obj"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "bytes");
}

INSTANTIATE_TEST_SUITE_P(Engines, CliStateTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

// `kcache misses` and `kcache explain --key` without --manifest, on misses
// a JIT's Cache journaled: each explained with values, grouped by cause.
#include <gtest/gtest.h>

#include <unistd.h>

#include "cli_util.h"
#include "kcache/cache.h"

namespace kcache::test {
namespace {

KeyInfo module_key(const std::string& label, int opt, const std::string& cpu = "znver3") {
  return *KeyBuilder("interp/1")
              .add_bytes("ir", "ir of " + label)
              .add_i64("ir_opt_level", opt)
              .add_string("cpu", cpu)
              .label(label)
              .finish();
}

class ExplainCli : public CliTest {
 protected:
  // Compiles every module at `opt` through a Cache, as a JIT would.
  void jit_run(int opt, const std::string& cpu = "znver3", int modules = 5) {
    Options o = disk_options(dir());
    o.engine = parse_engine(engine());
    auto cache = Cache::open(o);
    for (int i = 0; i < modules; ++i) {
      auto r = cache->get_or_compile(module_key("mod" + std::to_string(i) + ".c", opt, cpu), [] {
        return std::vector<Artifact>{{"obj", "code"}};
      });
      ASSERT_TRUE(r);
    }
  }
};

TEST_P(ExplainCli, MissesAreExplainedAndGrouped) {
  Result r = run({"misses"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("no misses recorded"), std::string::npos) << r.out;

  jit_run(2);  // cold: 5 misses, nothing stored before them
  jit_run(2);  // warm: hits, nothing journaled
  jit_run(3);  // another level: 5 misses, each explained by its own O2 entry

  r = run({"misses"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("10 misses, by cause:\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  5 misses: ir_opt_level 2 \u2192 3  (interp/1)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  5 misses: no earlier entry of its label  (interp/1)\n"), std::string::npos) << r.out;
  // The cold run: nothing of their labels before them, at most modules of
  // other labels.
  EXPECT_NE(r.out.find("\n    no earlier entry of its label; nearest of another label "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nearest " + module_key("mod3.c", 2).key.hex() + " \"mod3.c\": ir_opt_level: 2 \u2192 3\n"),
            std::string::npos)
      << r.out;

  r = run({"misses", "--json", "--limit", "5"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "\"time_ms\":"), 5u) << r.out;
  KeyInfo m0 = module_key("mod0.c", 3), was = module_key("mod0.c", 2);
  EXPECT_NE(r.out.find("{\"key\":\"" + m0.key.hex() + "\",\"time_ms\":"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"cause\":\"ir_opt_level 2 \u2192 3\",\"label\":\"mod0.c\",\"namespace\":\"interp/1\""),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"nearest\":{\"key\":\"" + was.key.hex() +
                       "\",\"label\":\"mod0.c\",\"components\":3,\"differences\":[{"
                       "\"name\":\"ir_opt_level\",\"change\":\"changed\",\"stored\":\"2\",\"lookup\":\"3\"}],"
                       "\"age_ms\":"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"skipped\":0}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"groups\":[{\"count\":5,\"namespace\":\"interp/1\",\"cause\":\"ir_opt_level 2 \u2192 3\"}]"),
            std::string::npos)
      << r.out;

  // explain --key alone: the journal has the lookup's manifest.
  KeyInfo m4 = module_key("mod4.c", 3);
  Options o = disk_options(dir());
  o.engine = parse_engine(engine());
  {
    // Make mod4 at O3 a miss again: remove its entry.
    auto cache = Cache::open(o);
    ASSERT_TRUE(cache->tiers().back()->remove(m4.key).is_ok());
  }
  r = run({"explain", "--key", m4.key.hex()});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.out.find("its manifest is from the miss journal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nearest " + module_key("mod4.c", 2).key.hex() +
                       ": 1 of 3 components differ (label \"mod4.c\", as the lookup's)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  ir_opt_level         changed  2 \u2192 3\n"), std::string::npos) << r.out;
  r = run({"explain", "--key", m4.key.hex(), "--json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("\"from_journal\":true,\"unreadable\":0,\"label\":\"mod4.c\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"stored\":\"2\",\"lookup\":\"3\""), std::string::npos) << r.out;

  // A key no one looked up: explain says how to compare it.
  r = run({"explain", "--key", key_of(7).hex()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("the miss journal has no record of it"), std::string::npos) << r.out;

  r = run({"misses", "--limit", "x"});
  expect_failure(r, 2, "--limit");
}

TEST_P(ExplainCli, ACpuChangeReadsAsNames) {
  jit_run(2, "znver3", 2);
  jit_run(2, "x86-64", 2);
  Result r = run({"misses"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("  2 misses: cpu znver3 \u2192 x86-64  (interp/1)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": cpu: znver3 \u2192 x86-64\n"), std::string::npos) << r.out;
}

// A damaged record of the journal is skipped and said to be, never the
// end of `misses`.
TEST_P(ExplainCli, ADamagedJournalRecordIsSkipped) {
  jit_run(2, "znver3", 3);
  std::string journal = dir() + "/" + engine() + ".misses";
  std::string b = slurp(journal);
  ASSERT_GT(b.size(), 100u);
  b[b.size() - 20] ^= 0x5a;  // inside the last record
  spit(journal, b);
  Result r = run({"misses"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("2 misses, by cause:\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(1 unreadable journal record(s) skipped)\n"), std::string::npos) << r.out;
  r = run({"misses", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "\"time_ms\":"), 2u) << r.out;
  EXPECT_NE(r.out.find(",\"skipped\":1}"), std::string::npos) << r.out;
}

// Diagnostics do not change the cache: misses, explain and show read the
// store with Access::peek, so its hit and miss counters and every entry's
// last use (as `ls` lists them) are what they were before.
TEST_P(ExplainCli, DiagnosticsLeaveCountersAndRecencyAsTheyWere) {
  jit_run(2, "znver3", 3);  // three misses
  jit_run(2, "znver3", 3);  // three hits
  jit_run(3, "znver3", 3);  // three more misses
  Result ls_before = run({"ls", "--json"});
  ASSERT_EQ(ls_before.rc, 0) << ls_before.err;
  ASSERT_EQ(count_of(ls_before.out, "\"key\":"), 6u) << ls_before.out;
  Result stats_before = run({"stats", "--json"});
  ASSERT_EQ(stats_before.rc, 0) << stats_before.err;
  auto counter = [](const std::string& json, const std::string& name) {
    size_t at = json.find("\"" + name + "\":");
    return at == std::string::npos ? std::string("?") : json.substr(at, json.find(',', at) - at);
  };
  ::usleep(20 * 1000);  // a use now would record a later time

  Result r = run({"misses"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("6 misses, by cause:\n"), std::string::npos) << r.out;
  r = run({"explain", "--key", module_key("mod1.c", 3).key.hex()});  // stored since its miss
  EXPECT_EQ(r.rc, 0) << r.err;
  r = run({"show", "--key", module_key("mod0.c", 2).key.hex()});
  EXPECT_EQ(r.rc, 0) << r.err;

  Result ls_after = run({"ls", "--json"});
  ASSERT_EQ(ls_after.rc, 0) << ls_after.err;
  EXPECT_EQ(ls_after.out, ls_before.out) << "a diagnostic changed an entry's last use";
  Result stats_after = run({"stats", "--json"});
  ASSERT_EQ(stats_after.rc, 0) << stats_after.err;
  for (const char* name : {"hits", "misses", "corrupt", "puts", "entries"})
    EXPECT_EQ(counter(stats_after.out, name), counter(stats_before.out, name)) << name;
  EXPECT_NE(counter(stats_before.out, "hits"), "\"hits\":0") << stats_before.out;  // the warm lookups
}

INSTANTIATE_TEST_SUITE_P(Engines, ExplainCli, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

// `kcache stats --format openmetrics`: the store's statistics for
// Prometheus (node_exporter's textfile collector), checked by a strict
// reader of the format (openmetrics_parser.h) on a store whose path needs
// escaping. Each engine, the real binary.
#include <string>

#include "cli_util.h"
#include "openmetrics_parser.h"

namespace kcache::test {
namespace {

TEST(OpenMetricsParser, RefusesWhatTheFormatForbids) {
  const std::string head = "# HELP kcache_hits h\n# TYPE kcache_hits counter\n";
  EXPECT_EQ(parse_exposition(head + "kcache_hits_total{a=\"x\\\"y\"} 3\n# EOF\n").error, "");
  EXPECT_NE(parse_exposition(head + "kcache_hits_total 3\n").error, "");                     // no # EOF
  EXPECT_NE(parse_exposition(head + "kcache_hits_total{a=\"x\\q\"} 3\n# EOF\n").error, "");  // bad escape
  EXPECT_NE(parse_exposition(head + "kcache_hits_total{a=\"x\"y\"} 3\n# EOF\n").error, "");  // unescaped quote
  EXPECT_NE(parse_exposition(head + "kcache-hits 3\n# EOF\n").error, "");                    // bad name
  EXPECT_NE(parse_exposition(head + "kcache_other 3\n# EOF\n").error, "");                   // no TYPE
  EXPECT_NE(parse_exposition("# HELP x h\n# TYPE x counter\nx 1\n# EOF\n").error, "");       // sample not _total
  // The clash the official parser refuses: a counter family named *_total.
  EXPECT_NE(parse_exposition("# HELP x_total h\n# TYPE x_total counter\nx_total 1\n# EOF\n").error, "");
  EXPECT_NE(
      parse_exposition(head + "kcache_hits_total 1\n# TYPE g gauge\n# HELP g h\ng 1\nkcache_hits_total 2\n# EOF\n")
          .error,
      "");  // a family's samples apart
  // Prometheus text 0.0.4: the counter family is named *_total, no # EOF.
  const auto prom = ExpositionFormat::prometheus;
  EXPECT_EQ(parse_exposition("# HELP x_total h\n# TYPE x_total counter\nx_total 1\n", prom).error, "");
  EXPECT_NE(parse_exposition("# HELP x h\n# TYPE x counter\nx 1\n", prom).error, "");
  EXPECT_NE(parse_exposition("# HELP x_total h\n# TYPE x_total counter\nx_total 1\n# EOF\n", prom).error, "");
}

class CliMetricsTest : public CliTest {
 protected:
  // A folder whose name needs every escape a label value has.
  std::string odd_dir() const { return file("odd \"quoted\" back\\slash"); }
};

TEST_P(CliMetricsTest, StatsAsOpenMetrics) {
  const std::string d = odd_dir();
  spit(file("a"), std::string(3000, 'a'));
  ASSERT_EQ(run_in(d, {"put", "--key", key_of(1).hex(), "obj=" + file("a")}).rc, 0);
  ASSERT_EQ(run_in(d, {"put", "--key", key_of(2).hex(), "obj=" + file("a")}).rc, 0);
  EXPECT_EQ(run_in(d, {"get", "--key", key_of(1).hex(), "--artifact", "obj"}).rc, 0);
  EXPECT_EQ(run_in(d, {"get", "--key", key_of(9).hex(), "--artifact", "obj"}).rc, 1);

  Result r = run_in(d, {"stats", "--format", "openmetrics"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  Exposition e = parse_exposition(r.out);
  ASSERT_EQ(e.error, "") << r.out;
  const std::map<std::string, std::string> store = {
      {"tier", engine()}, {"kind", "disk"}, {"store", d + "/" + engine()}};
  EXPECT_EQ(e.value("kcache_hits_total", store), 1);
  EXPECT_EQ(e.value("kcache_misses_total", store), 1);
  EXPECT_EQ(e.value("kcache_puts_total", store), 2);
  EXPECT_EQ(e.value("kcache_evictions_total", store), 0);
  EXPECT_EQ(e.value("kcache_errors_total", store), 0);
  EXPECT_EQ(e.value("kcache_corrupt_total", store), 0);
  EXPECT_EQ(e.value("kcache_entries", store), 2);
  EXPECT_GT(e.value("kcache_bytes", store), 6000);
  EXPECT_GE(e.value("kcache_disk_used_bytes", {{"store", d + "/" + engine()}}), e.value("kcache_bytes", store));
  EXPECT_EQ(e.value("kcache_max_bytes"), 4.0 * (1ull << 30));
  EXPECT_EQ(e.value("kcache_store_up"), 1);
  EXPECT_EQ(e.type["kcache_hits"], "counter");
  EXPECT_EQ(e.type.count("kcache_hits_total"), 0u);
  EXPECT_EQ(e.type["kcache_entries"], "gauge");
  // Looking is not a lookup: the next report is the same.
  EXPECT_EQ(run_in(d, {"stats", "--format", "openmetrics"}).out, r.out);

  // The same figures as Prometheus text 0.0.4.
  Result p = run_in(d, {"stats", "--format", "prometheus"});
  ASSERT_EQ(p.rc, 0) << p.err;
  Exposition pe = parse_exposition(p.out, ExpositionFormat::prometheus);
  ASSERT_EQ(pe.error, "") << p.out;
  EXPECT_EQ(pe.type["kcache_hits_total"], "counter");
  for (const char* name :
       {"kcache_hits_total", "kcache_misses_total", "kcache_puts_total", "kcache_entries", "kcache_bytes"})
    EXPECT_EQ(pe.value(name, store), e.value(name, store)) << name;
  // The same samples, less OpenMetrics' _created (when the counters began).
  size_t created = 0;
  for (const auto& smp : e.samples) created += smp.name.size() > 8 && smp.name.ends_with("_created") ? 1 : 0;
  EXPECT_EQ(pe.samples.size() + created, e.samples.size());

  expect_failure(run_in(d, {"stats", "--format", "xml"}), 2, "--format 'xml'");
  expect_failure(run_in(d, {"stats", "--format", "openmetrics", "--json"}), 2, "do not go together");
  // A store not created yet: valid, and says it is not up.
  r = run_in(file("none"), {"stats", "--format", "openmetrics"});
  ASSERT_EQ(r.rc, 0) << r.err;
  e = parse_exposition(r.out);
  ASSERT_EQ(e.error, "") << r.out;
  EXPECT_EQ(e.value("kcache_store_up"), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, CliMetricsTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

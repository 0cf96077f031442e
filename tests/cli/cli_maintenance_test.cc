// The kcache tool on the whole store (ls, stats, verify, trim, clear), run
// as a real process on a fresh cache folder for each disk engine.
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli_util.h"

namespace kcache::test {
namespace {

TEST_P(CliTest, StatsJsonCountsPutsHitsAndMisses) {
  put(key_of(1), binary_payload(1, 3000));
  put(key_of(2), binary_payload(2, 5000));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run({"get", "--key", key_of(1).hex(), "--artifact", "obj"}).rc, 0);
  EXPECT_EQ(run({"get", "--key", key_of(9).hex(), "--artifact", "obj"}).rc, 1);
  EXPECT_EQ(run({"get", "--key", key_of(8).hex(), "--artifact", "obj"}).rc, 1);

  Result r = run({"stats", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "entries"), 2);
  EXPECT_EQ(json_num(r.out, "puts"), 2);
  EXPECT_EQ(json_num(r.out, "hits"), 3);
  EXPECT_EQ(json_num(r.out, "misses"), 2);
  EXPECT_EQ(json_num(r.out, "evictions"), 0);
  EXPECT_EQ(json_num(r.out, "corrupt"), 0);
  EXPECT_EQ(json_num(r.out, "errors"), 0);
  // Encoded sizes: payload plus header and names, so a bit over 8000.
  long long bytes = json_num(r.out, "bytes");
  EXPECT_GT(bytes, 8000);
  EXPECT_LT(bytes, 9000);
  EXPECT_NE(r.out.find("\"engine\":\"" + engine() + "\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"dir\":\"" + dir() + "\""), std::string::npos) << r.out;

  // The table says the same for people.
  r = run({"stats"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("hits        3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("misses      2\n"), std::string::npos) << r.out;
}

TEST_P(CliTest, LsListsEveryEntry) {
  Result r = run({"ls", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "count"), 0);
  EXPECT_FALSE(std::ifstream(dir()).good()) << "ls must not create the cache folder";
  for (uint64_t i = 0; i < 3; ++i) put(key_of(i), binary_payload(i, 1000 + i));
  r = run({"ls", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "count"), 3);
  EXPECT_EQ(count_of(r.out, "\"key\":"), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_NE(r.out.find(key_of(i).hex()), std::string::npos);
  r = run({"ls"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(lines(r.out), 5u) << r.out;  // header, 3 entries, total
  EXPECT_NE(r.out.find("3 entries"), std::string::npos) << r.out;
}

TEST_P(CliTest, VerifyFindsAndFixesACorruptEntry) {
  for (uint64_t i = 0; i < 3; ++i) put(key_of(i), binary_payload(i, 20000));
  Result r = run({"verify"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("checked 3 entries: all good"), std::string::npos) << r.out;

  corrupt(key_of(1), marker_of(1));
  r = run({"verify"});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("bad " + key_of(1).hex()), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(key_of(0).hex()), std::string::npos) << r.out;
  r = run({"verify", "--json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(json_num(r.out, "checked"), 3);
  EXPECT_EQ(json_num(r.out, "bad_count"), 1);
  EXPECT_EQ(json_num(r.out, "removed"), 0);

  // The rest of the tool keeps working on a store with a corrupt entry.
  r = run({"ls", "--json"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(json_num(r.out, "count"), 3);
  EXPECT_EQ(run({"stats"}).rc, 0);
  EXPECT_EQ(run({"get", "--key", key_of(0).hex(), "--artifact", "obj"}).out, binary_payload(0, 20000));

  // --fix removes it and still exits 1, so scripts notice.
  r = run({"verify", "--fix", "--json"});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(json_num(r.out, "removed"), 1);
  EXPECT_NE(r.out.find(key_of(1).hex()), std::string::npos);
  r = run({"verify"});
  EXPECT_EQ(r.rc, 0) << r.out;
  r = run({"ls", "--json"});
  EXPECT_EQ(json_num(r.out, "count"), 2);
  EXPECT_EQ(r.out.find(key_of(1).hex()), std::string::npos);
  r = run({"stats", "--json"});
  EXPECT_EQ(json_num(r.out, "entries"), 2);
  EXPECT_GE(json_num(r.out, "corrupt"), 1);
}

// A lease table whose header was overwritten: cross-process single-flight
// is degraded until it is rebuilt. doctor fails the leases part, verify
// reports it (exit 1), verify --fix rebuilds it, and both are then clean.
TEST_P(CliTest, VerifyAndDoctorReportAndRepairADamagedLeaseTable) {
  if (engine() != "lmdb") GTEST_SKIP() << "the lease table belongs to the LMDB engine";
  put(key_of(1), binary_payload(1, 1000));
  {
    Options o = disk_options(dir());
    o.engine = Engine::lmdb;
    auto cache = Cache::open(o);  // makes the lease table beside the store
    ASSERT_TRUE(cache->get(key_of(1)).has_value());
  }
  const std::string table = dir() + "/lmdb/leases2.tab";
  Result r = run({"doctor"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("leases"), std::string::npos) << "a healthy table is no line: " << r.out;
  {
    int fd = ::open(table.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << table;
    std::string junk(64, '\xab');
    ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), 64);
    ::close(fd);
  }
  r = run({"doctor"});
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("FAIL leases"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("degraded: " + table + " has a damaged header"), std::string::npos) << r.out;
  r = run({"verify"});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("lease table: " + table + " has a damaged header\n"), std::string::npos) << r.out;
  r = run({"verify", "--fix", "--json"});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("\"lease_table_repaired\":true"), std::string::npos) << r.out;
  r = run({"verify"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("lease table"), std::string::npos) << r.out;
  r = run({"doctor"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
}

TEST_P(CliTest, TrimEvictsLeastRecentlyUsedDownToMaxSize) {
  for (uint64_t i = 0; i < 6; ++i) {
    put(key_of(i), binary_payload(i, 10000));
    ::usleep(20000);  // distinct recency stamps
  }
  // Using entry 0 makes it the most recent: it must survive.
  ASSERT_EQ(run({"get", "--key", key_of(0).hex(), "--artifact", "obj"}).rc, 0);
  Result r = run({"trim", "--max-size", "25K", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "evicted"), 4) << r.out;
  EXPECT_EQ(json_num(r.out, "entries"), 2);
  EXPECT_LE(json_num(r.out, "bytes"), 25 * 1024);
  r = run({"ls", "--json"});
  EXPECT_EQ(json_num(r.out, "count"), 2);
  EXPECT_NE(r.out.find(key_of(0).hex()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(key_of(5).hex()), std::string::npos) << r.out;
  r = run({"stats", "--json"});
  EXPECT_EQ(json_num(r.out, "evictions"), 4);

  // Default limit: the configured one (KCACHE_MAX_SIZE), here 12K.
  r = run({"trim"}, true, {{"KCACHE_MAX_SIZE", "12K"}});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("evicted 1 entry"), std::string::npos) << r.out;
  EXPECT_EQ(json_num(run({"ls", "--json"}).out, "count"), 1);
  expect_failure(run({"trim", "--max-size", "lots"}), 2, "--max-size");
}

TEST_P(CliTest, ClearRemovesEverything) {
  for (uint64_t i = 0; i < 4; ++i) put(key_of(i), binary_payload(i, 500));
  Result r = run({"clear"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "removed 4 entries\n");
  r = run({"ls", "--json"});
  EXPECT_EQ(json_num(r.out, "count"), 0);
  r = run({"stats", "--json"});
  EXPECT_EQ(json_num(r.out, "entries"), 0);
  EXPECT_EQ(json_num(r.out, "bytes"), 0);
  expect_failure(run({"get", "--key", key_of(1).hex(), "--artifact", "obj"}), 1);
}

INSTANTIATE_TEST_SUITE_P(Engines, CliTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

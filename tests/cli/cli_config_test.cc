// `kcache config`: every setting in effect and where it came from, config
// files written by `config set` and read by every command, and bad values
// refused the same way (exit 2) whether they come from a file, a variable
// or the command line. Each engine, the real binary.
#include <sys/stat.h>

#include <string>
#include <vector>

#include "cli_util.h"

namespace kcache::test {
namespace {

class CliConfigTest : public CliTest {
 protected:
  // The start of a `doctor --hosts` line.
  static std::string fmt_host(const std::string& host) { return host + std::string(9 - host.size(), ' '); }
  // The line of `config` output for option `name`.
  static std::string line_of(const std::string& out, const std::string& name) {
    size_t p = out.find(name + " ");
    while (p != std::string::npos && p != 0 && out[p - 1] != '\n') p = out.find(name + " ", p + 1);
    if (p == std::string::npos) return std::string();
    return out.substr(p, out.find('\n', p) - p);
  }
};

TEST_P(CliConfigTest, ShowsEachSettingAndWhereItCameFrom) {
  const std::string store_file = dir() + "/config";
  const std::string user_file = file("xdg") + "/kcache/config";
  Result r = run({"config", "set", "max_size", "5G"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "max_size = 5G in " + store_file + "\n");
  r = run({"config", "set", "compression", "zstd", "--user"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "compression = zstd in " + user_file + "\n");

  r = run({"config"}, true, {{"KCACHE_DURABILITY", "Full"}});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(line_of(r.out, "max_size").find("5G"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "max_size").find("(config file " + store_file + ")"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "compression").find("(config file " + user_file + ")"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "durability").find("full"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "durability").find("(environment KCACHE_DURABILITY)"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "engine").find("(command line --engine)"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "dir").find(dir() + " "), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "lease_ttl_ms").find("(default)"), std::string::npos) << r.out;
  r = run({"config", "--json"});
  EXPECT_NE(r.out.find("{\"name\":\"max_size\",\"value\":\"5G\",\"origin\":\"config file " + store_file + "\""),
            std::string::npos)
      << r.out;
  r = run({"config", "get", "MAX_SIZE"}, true, {{"KCACHE_MAX_SIZE", "6g"}});
  EXPECT_EQ(r.out, "6G\n");

  // Every command reads the kept limit; trim --max-size is for one trim.
  put(key_of(1), std::string(4000, 'a'));
  r = run({"trim", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "max_bytes"), 5LL << 30);
  r = run({"trim", "--max-size", "1K", "--json"});
  EXPECT_EQ(json_num(r.out, "max_bytes"), 1024);
  EXPECT_EQ(json_num(r.out, "evicted"), 1);
  EXPECT_EQ(run({"config", "get", "max_size"}).out, "5G\n");
  r = run({"stats", "--json"});
  EXPECT_EQ(json_num(r.out, "max_bytes"), 5LL << 30);

  r = run({"config", "unset", "max_size"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(run({"config", "get", "max_size"}).out, "4G\n");
}

// A bad value is bad usage (exit 2, one line naming where it came from),
// whichever setting and wherever it was set; names and words in any case.
TEST_P(CliConfigTest, BadValuesExitTwoEverywhere) {
  expect_failure(run({"ls"}, true, {{"KCACHE_MAX_SIZE", "abc"}}), 2, "KCACHE_MAX_SIZE: 'abc'");
  expect_failure(run({"ls"}, true, {{"KCACHE_ENGINE", "bdb"}}), 2, "KCACHE_ENGINE: 'bdb'");
  expect_failure(run({"ls"}, true, {{"KCACHE_DURABILITY", "always"}}), 2, "KCACHE_DURABILITY");
  expect_failure(run({"config", "set", "max_size", "abc"}), 2, "'abc' is not a size");
  expect_failure(run({"config", "set", "max_sise", "1G"}), 2, "did you mean max_size?");
  expect_failure(run({"config", "set", "dir", "/x"}), 2, "--user");
  expect_failure(run({"config", "set", "remote", "redis://127.0.0.1:1\nmax_size = 1G"}), 2, "line break");
  Result r = run({"ls"}, true, {{"KCACHE_DURABILITY", "NONE"}, {"KCACHE_COMPRESSION", "Zstd"}});
  EXPECT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(run({"config", "set", "max_size", "1G"}).rc, 0);
  spit(dir() + "/config", slurp(dir() + "/config") + "max_size = lots\n");
  expect_failure(run({"ls"}), 2, dir() + "/config:2: 'lots' is not a size");
  expect_failure(run({"stats"}), 2, dir() + "/config:2");
  // `config set` repairs it.
  r = run({"config", "set", "max_size", "2G"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(run({"ls"}).rc, 0);
}

// A misspelt variable is said, once, with the name it was probably meant
// to be.
TEST_P(CliConfigTest, AMisspeltVariableNamesTheNearestOne) {
  std::string in = file("in");
  spit(in, "x");
  Result r = run({"put", "--key", key_of(1).hex(), "obj=" + in}, true, {{"KCACHE_READ_ONLY", "1"}});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("KCACHE_READ_ONLY is not a kcache variable; did you mean KCACHE_READONLY?"), std::string::npos)
      << r.err;
}

// stats --zero prints the counters, then sets them to 0 (entries and bytes
// stay); stats shows the disk space the store's files take.
TEST_P(CliConfigTest, StatsZeroAndDiskUsed) {
  put(key_of(1), std::string(5000, 'a'));
  put(key_of(2), std::string(7000, 'b'));
  EXPECT_EQ(run({"get", "--key", key_of(1).hex(), "--artifact", "obj"}).rc, 0);
  EXPECT_EQ(run({"get", "--key", key_of(3).hex(), "--artifact", "obj"}).rc, 1);
  Result r = run({"stats", "--zero", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "hits"), 1);
  EXPECT_EQ(json_num(r.out, "misses"), 1);
  EXPECT_EQ(json_num(r.out, "puts"), 2);
  EXPECT_NE(r.out.find("\"zeroed\":true"), std::string::npos) << r.out;
  EXPECT_GE(json_num(r.out, "disk_used"), json_num(r.out, "bytes"));
  r = run({"stats", "--json"});
  EXPECT_EQ(json_num(r.out, "hits"), 0);
  EXPECT_EQ(json_num(r.out, "misses"), 0);
  EXPECT_EQ(json_num(r.out, "puts"), 0);
  EXPECT_EQ(json_num(r.out, "entries"), 2);
  EXPECT_GT(json_num(r.out, "bytes"), 12000);
  r = run({"stats"});
  EXPECT_NE(r.out.find("\ndisk used   "), std::string::npos) << r.out;
  // Read-only: nothing is zeroed, and it says so.
  expect_failure(run({"stats", "--zero"}, true, {{"KCACHE_READONLY", "1"}}), 3, "read-only");
}

// A line of a config file that sets nothing is a warning naming the file,
// the line and the nearest name; every command still runs (config and
// doctor included), and `config unset` removes the line.
TEST_P(CliConfigTest, AnUnknownSettingIsAWarningAndUnsetRemovesIt) {
  const std::string user_file = file("xdg") + "/kcache/config";
  ASSERT_EQ(run({"config", "set", "max_size", "3G", "--user"}).rc, 0);
  spit(user_file, slurp(user_file) + "maxsize = 1G\n");
  const std::string warning = "kcache: warning: config file " + user_file +
                              ":2: 'maxsize' is not a kcache setting, so it sets nothing; did you mean max_size?\n";
  Result r = run({"ls"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, warning);
  r = run({"config", "get", "max_size"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "3G\n");  // the rest of the file applies
  r = run({"doctor"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");  // said in the report
  EXPECT_NE(r.out.find("WARN config  config file " + user_file + ":2: 'maxsize' is not a kcache setting"),
            std::string::npos)
      << r.out;
  r = run({"config", "unset", "maxsize", "--user"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "maxsize removed from " + user_file + "\n");
  EXPECT_EQ(slurp(user_file), "max_size = 3G\n");
  r = run({"ls"});
  EXPECT_EQ(r.err, "");
  // A name no line sets is refused, with the nearest one.
  expect_failure(run({"config", "unset", "maxsize", "--user"}), 2, "did you mean max_size?");
}

// A config file another user could have written is not read, and a command
// that would run without its settings refuses to (exit 3, one line);
// `config` shows what is in effect, doctor fails it.
TEST_P(CliConfigTest, AGroupWritableConfigIsRefused) {
  const std::string user_file = file("xdg") + "/kcache/config";
  ASSERT_EQ(run({"config", "set", "max_size", "3G", "--user"}).rc, 0);
  ASSERT_EQ(::chmod(user_file.c_str(), 0660), 0);
  Result r = run({"ls"});
  expect_failure(r, 3, "kcache: ls: config file " + user_file + " is not read, as another user could have written it");
  EXPECT_NE(r.err.find("(chmod go-w " + user_file + " if its settings are yours)"), std::string::npos) << r.err;
  r = run({"config", "get", "max_size"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "4G\n");
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  r = run({"doctor"});
  EXPECT_EQ(r.rc, 3);
  EXPECT_NE(r.out.find("FAIL config  config file " + user_file + " is not read"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "kcache: doctor: 1 part does not work\n");
  ASSERT_EQ(::chmod(user_file.c_str(), 0600), 0);
  EXPECT_EQ(run({"ls"}).rc, 0);
}

// doctor judges a store that does not exist yet by the first put's rules:
// a group-writable folder it would go in fails, as the put then is refused.
TEST_P(CliConfigTest, DoctorJudgesAStoreNotCreatedYetAsThePutWill) {
  ASSERT_EQ(::mkdir(dir().c_str(), 0770), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 0770), 0);
  Result r = run({"doctor"});
  EXPECT_EQ(r.rc, 3) << r.out;
  EXPECT_NE(r.out.find("FAIL store   " + dir() + "/" + engine() + " (" + engine() +
                       "): not created yet, and the first put would be refused: "),
            std::string::npos)
      << r.out;
  spit(file("in"), "x");
  EXPECT_EQ(run({"put", "--key", key_of(1).hex(), "obj=" + file("in")}).rc, 3);
  ASSERT_EQ(::chmod(dir().c_str(), 0700), 0);
  r = run({"doctor"});
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("ok   store   " + dir() + "/" + engine() + " (" + engine() +
                       "): not created yet (the first put creates it)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(run({"put", "--key", key_of(1).hex(), "obj=" + file("in")}).rc, 0);
}

// A value checked only when the store opens is named with its variable.
TEST_P(CliConfigTest, ABadSharedGroupNamesItsVariable) {
  expect_failure(run({"ls"}, true, {{"KCACHE_SHARED", "nosuchgroup"}}), 2,
                 "kcache: ls: KCACHE_SHARED=nosuchgroup: shared group 'nosuchgroup' does not exist");
  expect_failure(run({"doctor"}, true, {{"KCACHE_SHARED", "nosuchgroup"}}), 2, "KCACHE_SHARED=nosuchgroup");
}

// A remote that cannot be set up is said once by stats, in its report and
// its one failure line, naming the variable.
TEST_P(CliConfigTest, AnUnusableRemoteIsSaidOnceByStats) {
  Result r = run({"stats"}, true, {{"KCACHE_REMOTE", "bogus://x"}});
  EXPECT_EQ(r.rc, 3);
  EXPECT_NE(r.out.find("\nremote      NOT SET UP (invalid argument: remote URL has scheme 'bogus://'"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("kcache: stats: the remote of KCACHE_REMOTE is not set up: ", 0), 0u) << r.err;
}

// doctor --hosts: KCACHE_DIR is every host's store; without it each host's
// default, from the variables each host reads.
TEST_P(CliConfigTest, DoctorNamesTheStoreOfEachHost) {
  Result r = run({"doctor", "--hosts"}, false, {{"KCACHE_DIR", dir()}});
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* h : {"library", "triton", "jax", "warp", "torch", "wave"})
    EXPECT_NE(r.out.find(fmt_host(h) + dir() + " (environment KCACHE_DIR"), std::string::npos) << h << r.out;
  EXPECT_EQ(lines(r.out), 6u) << r.out;
  const std::map<std::string, std::string> env = {{"TRITON_HOME", file("th")},
                                                  {"XDG_CACHE_HOME", file("xdg-cache")},
                                                  {"TRITON_CACHE_DIR", file("tc")},
                                                  {"JAX_COMPILATION_CACHE_DIR", file("jc")},
                                                  {"TORCHINDUCTOR_CACHE_DIR", file("ti")},
                                                  {"WAVE_CACHE_DIR", file("wc")}};
  r = run({"doctor", "--hosts"}, false, env);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find(fmt_host("library") + file("xdg-cache") + "/kcache (default"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt_host("triton") + file("tc") + "/kcache (TRITON_CACHE_DIR)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt_host("jax") + file("jc") + "/kcache (JAX_COMPILATION_CACHE_DIR)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(fmt_host("warp") + file("xdg-cache") + "/warp/VERSION/kcache (Warp's default cache"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(fmt_host("torch") + file("ti") + "/kcache (TORCHINDUCTOR_CACHE_DIR)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(fmt_host("wave") + file("wc") + "/kcache (WAVE_CACHE_DIR)"), std::string::npos) << r.out;
  auto no_inductor = env;
  no_inductor.erase("TORCHINDUCTOR_CACHE_DIR");
  no_inductor["TMPDIR"] = file("tmp");
  no_inductor["LOGNAME"] = "someone";
  r = run({"doctor", "--hosts"}, false, no_inductor);
  EXPECT_NE(r.out.find(fmt_host("torch") + file("tmp") + "/torchinductor_someone/kcache (Inductor's default cache)"),
            std::string::npos)
      << r.out;
  auto no_triton = env;
  no_triton.erase("TRITON_CACHE_DIR");
  r = run({"doctor", "--hosts", "--json"}, false, no_triton);
  EXPECT_NE(
      r.out.find("{\"host\":\"triton\",\"store\":\"" + file("th") + "/.triton/cache/kcache\",\"why\":\"TRITON_HOME\"}"),
      std::string::npos)
      << r.out;
}

INSTANTIATE_TEST_SUITE_P(Engines, CliConfigTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

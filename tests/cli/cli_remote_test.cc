// The kcache tool with KCACHE_REMOTE, against a real redis-server started by
// the test: put stores in Redis too, and get, show and run in another cache
// folder find it there; stats lists the remote tier; a remote that is down
// is a miss, never a failed run, and a put that could not reach it says so.
// For each disk engine.
#include <string>
#include <vector>

#include "cli_util.h"
#include "openmetrics_parser.h"
#include "redis_server.h"

namespace kcache::test {
namespace {

class CliRemoteTest : public CliTest {
 protected:
  void SetUp() override {
    server_ = std::make_unique<RedisServer>(redis_dir_.path());
    if (!server_->ok()) {
      if (find_program("redis-server").empty()) GTEST_SKIP() << server_->error();
      FAIL() << server_->error();
    }
  }
  std::map<std::string, std::string> remote_env() const { return {{"KCACHE_REMOTE", server_->url()}}; }
  // The Redis key of an entry (kcache/redis.h: prefix "kcache:", key in braces).
  std::string redis_key(const Key& k) const { return "kcache:{" + k.hex() + "}"; }
  bool in_redis(const Key& k) {
    RedisClient c("127.0.0.1", server_->port());
    return c.str({"EXISTS", redis_key(k)}) == "1";
  }

  TempDir redis_dir_;
  std::unique_ptr<RedisServer> server_;
};

TEST_P(CliRemoteTest, PutStoresInRedisAndGetInAnotherFolderHits) {
  Key k = key_of(31);
  std::string data = binary_payload(31, 50000);
  spit(file("obj"), data);
  std::string a = file("cache-a"), b = file("cache-b");
  Result r = run_in(a, {"put", "--json", "--key", k.hex(), "obj=" + file("obj")}, remote_env());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("\"tiers\":[\"" + engine() + "\",\"redis\"]"), std::string::npos) << r.out;
  EXPECT_TRUE(in_redis(k)) << "put did not reach Redis";

  // Another folder, same Redis: a hit with the exact bytes, and the read
  // creates no store there.
  r = run_in(b, {"get", "--key", k.hex(), "--artifact", "obj"}, remote_env());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, data);
  struct stat st;
  EXPECT_NE(::stat(b.c_str(), &st), 0) << "get created " << b;
  r = run_in(b, {"show", "--json", "--key", k.hex()}, remote_env());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"tier\":\"redis\""), std::string::npos) << r.out;
  EXPECT_EQ(json_num(r.out, "payload_bytes"), 50000);
  r = run_in(b, {"explain", "--key", k.hex()}, remote_env());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("is stored (in redis)"), std::string::npos) << r.out;

  // Without KCACHE_REMOTE the other folder has nothing.
  expect_failure(run_in(b, {"get", "--key", k.hex(), "--artifact", "obj"}), 1, "no entry for key " + k.hex());
  // And the first folder has it on its own disk store.
  r = run_in(a, {"get", "--key", k.hex(), "--artifact", "obj"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, data);
}

TEST_P(CliRemoteTest, RunStoresThroughTheRemote) {
  Key k = key_of(32);
  std::string out = file("out.o"), count = file("count");
  std::vector<std::string> args = {"run",        "--key",      k.hex(),
                                   "--artifact", "obj=" + out, "--",
                                   "sh",         "-c",         "printf compiled > \"$0\"; echo ran >> \"$1\"",
                                   out,          count};
  Result r = run_in(file("cache-a"), args, remote_env());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines(slurp(count)), 1u);
  EXPECT_TRUE(in_redis(k)) << "run did not store in Redis";

  // A second machine (another folder, same Redis) gets the files without
  // running the command.
  ::unlink(out.c_str());
  r = run_in(file("cache-b"), args, remote_env());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines(slurp(count)), 1u) << "a remote hit must not run the command";
  EXPECT_EQ(slurp(out), "compiled");
  r = run_in(file("cache-b"), {"get", "--key", k.hex(), "--artifact", "obj"}, remote_env());
  EXPECT_EQ(r.out, "compiled");
}

TEST_P(CliRemoteTest, StatsListsEveryTier) {
  put(key_of(33), "local");
  Result r = run({"stats", "--json"}, true, remote_env());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_num(r.out, "entries"), 1);  // the disk store's totals stay at the top
  EXPECT_NE(r.out.find("\"tiers\":[{\"name\":\"" + engine() + "\",\"kind\":\"disk\",\"stats\":{\"hits\":"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("{\"name\":\"redis\",\"kind\":\"remote\",\"reachable\":true,\"rtt_us\":"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"stats\":{\"hits\":0,"), std::string::npos) << r.out;
  r = run({"stats"}, true, remote_env());
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("\nremote      redis: "), std::string::npos) << r.out;
  // Without KCACHE_REMOTE only the disk store is listed.
  r = run({"stats", "--json"});
  EXPECT_EQ(r.out.find("redis"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.out, "\"kind\":"), 1u) << r.out;
}

TEST_P(CliRemoteTest, ARemoteThatIsDownIsAMissAndRunStillRuns) {
  int port = server_->port();
  server_->stop();
  std::map<std::string, std::string> env = {{"KCACHE_REMOTE", "redis://127.0.0.1:" + std::to_string(port)},
                                            {"KCACHE_LOG", "off"}};
  Key k = key_of(34);
  expect_failure(run({"get", "--key", k.hex(), "--artifact", "obj"}, true, env), 1, k.hex());
  std::string out = file("out.o");
  Result r =
      run({"run", "--key", k.hex(), "--artifact", "obj=" + out, "--", "sh", "-c", "printf x > \"$0\"", out}, true, env);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(out), "x");
  // Stored on the disk store all the same.
  r = run({"get", "--key", k.hex(), "--artifact", "obj"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "x");

  // An explicit put says what it could not do: exit 3, naming the remote
  // and where the entry did go.
  spit(file("in"), "put while down");
  r = run({"put", "--key", key_of(35).hex(), "obj=" + file("in")}, true, env);
  expect_failure(r, 3, "redis: ");
  EXPECT_NE(r.err.find("(stored in " + engine() + ")"), std::string::npos) << r.err;
  EXPECT_EQ(run({"get", "--key", key_of(35).hex(), "--artifact", "obj"}).out, "put while down");
}

// doctor opens every configured tier and says how each is; with the server
// killed it says so and exits 3, and stats no longer looks healthy.
TEST_P(CliRemoteTest, DoctorAndStatsSayWhetherTheRemoteWorks) {
  put(key_of(40), "local");
  spit(file("secret"), "s3cret\n");
  auto env = remote_env();
  env["KCACHE_REMOTE_SECRET_FILE"] = file("secret");
  Result r = run({"doctor"}, true, env);
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("ok   store   " + dir() + "/" + engine() + " (" + engine() + "): 1 entry"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("owner uid " + std::to_string(::geteuid())), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ok   remote  redis: reachable, round trip "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ok   secret  " + file("secret") + ": a value signed with it round-trips"), std::string::npos)
      << r.out;
  EXPECT_EQ(lines(r.out), 3u) << r.out;
  r = run({"doctor", "--json"}, true, env);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("{\"ok\":true,\"checks\":[", 0), 0u) << r.out;
  EXPECT_EQ(run({"stats"}, true, env).rc, 0);
  r = run({"stats", "--format", "openmetrics"}, true, env);
  EXPECT_EQ(r.rc, 0) << r.err;
  Exposition m = parse_exposition(r.out);
  ASSERT_EQ(m.error, "") << r.out;
  EXPECT_EQ(m.value("kcache_tier_up", {{"tier", "redis"}, {"kind", "remote"}}), 1);
  EXPECT_GT(m.value("kcache_probe_latency_seconds", {{"tier", "redis"}}), 0);

  server_->stop();
  env["KCACHE_LOG"] = "off";
  r = run({"doctor"}, true, env);
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("ok   store"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL remote  redis: unreachable: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL secret"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("kcache: doctor: 2 parts do not work"), std::string::npos) << r.err;
  r = run({"doctor", "--json"}, true, env);
  EXPECT_EQ(r.out.rfind("{\"ok\":false,", 0), 0u) << r.out;
  r = run({"stats"}, true, env);
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.out.find("remote      redis: UNREACHABLE ("), std::string::npos) << r.out;
  r = run({"stats", "--json"}, true, env);
  EXPECT_EQ(r.rc, 3);
  EXPECT_NE(r.out.find("\"reachable\":false"), std::string::npos) << r.out;
  // Metrics exit 0 whenever printed: `> f.$$ && mv f.$$ f` replaces the
  // file that said the remote was up.
  r = run({"stats", "--format", "openmetrics"}, true, env);
  EXPECT_EQ(r.rc, 0) << r.err;
  m = parse_exposition(r.out);
  ASSERT_EQ(m.error, "") << r.out;
  EXPECT_EQ(m.value("kcache_tier_up", {{"tier", "redis"}}), 0);
  // Without a remote, doctor has only the store to look at.
  r = run({"doctor"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines(r.out), 1u) << r.out;
}

// KCACHE_REMOTE_SECRET_FILE signs what put stores: a reader with the same
// secret hits, one with another secret does not take the bytes.
TEST_P(CliRemoteTest, SignedValuesNeedTheSameSecret) {
  spit(file("secret"), "s3cret\n");
  spit(file("other"), "not-the-secret\n");
  spit(file("in"), "signed bytes");
  Key k = key_of(36);
  auto env = remote_env();
  env["KCACHE_REMOTE_SECRET_FILE"] = file("secret");
  Result r = run_in(file("cache-a"), {"put", "--key", k.hex(), "obj=" + file("in")}, env);
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(in_redis(k));
  r = run_in(file("cache-b"), {"get", "--key", k.hex(), "--artifact", "obj"}, env);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "signed bytes");
  env["KCACHE_REMOTE_SECRET_FILE"] = file("other");
  env["KCACHE_LOG"] = "off";
  r = run_in(file("cache-c"), {"get", "--key", k.hex(), "--artifact", "obj"}, env);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.out, "");
  // A secret file that cannot be read leaves the remote out (never used
  // unsigned), so put fails and says so.
  env["KCACHE_REMOTE_SECRET_FILE"] = file("no-such-secret");
  r = run_in(file("cache-d"), {"put", "--key", key_of(37).hex(), "obj=" + file("in")}, env);
  expect_failure(r, 3, "KCACHE_REMOTE");
  EXPECT_FALSE(in_redis(key_of(37)));
}

// The server keeps statistics for every client: two writer processes at a
// time (their own cache folders, two namespaces) add their hits, misses and
// puts to counters on the server, and a third process in a fresh folder
// reads them, with the values stored counted on the server itself (not a
// lease, not a foreign key), in text, JSON and OpenMetrics that the real
// parser's rules accept; --zero zeroes them; shared_stats=0 sends nothing.
TEST_P(CliRemoteTest, TheServerKeepsStatisticsOfEveryClient) {
  auto env = remote_env();
  auto manifest = [&](const std::string& ns, int i) {
    std::string p = file("m-" + ns + std::to_string(i) + ".json");
    spit(p, "{\"namespace\": \"" + ns + "\", \"items\": [{\"name\": \"i\", \"type\": \"string\", \"digest\": \"" +
                std::string(31, '0') + std::to_string(i % 10) + "\"}]}");
    return p;
  };
  spit(file("obj"), binary_payload(7, 3000));
  // Two writers at once, six rounds: each round one `put` in each folder,
  // started together.
  // Each put prints "stored HEX: ..." to its own file.
  auto spawn = [&](const std::string& folder, std::vector<std::string> args, const std::string& out) {
    Command c = command(folder, std::move(args), env);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, KCACHE_CLI, &fa, nullptr, c.argv.data(), c.envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  };
  auto reap = [](pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  };
  std::vector<std::string> stored;  // the keys' hex
  for (int i = 0; i < 6; ++i) {
    std::string oa = file("put-a" + std::to_string(i)), ob = file("put-b" + std::to_string(i));
    pid_t a = spawn(file("cache-a"), {"put", "--manifest", manifest("alpha", i), "obj=" + file("obj")}, oa);
    pid_t b = spawn(file("cache-b"), {"put", "--manifest", manifest("beta", i + 10), "obj=" + file("obj")}, ob);
    ASSERT_EQ(reap(a), 0);
    ASSERT_EQ(reap(b), 0);
    for (const auto& o : {oa, ob}) {
      std::string text = slurp(o);
      ASSERT_EQ(text.rfind("stored ", 0), 0u) << text;
      stored.push_back(text.substr(7, 32));
    }
  }
  // Lookups through the remote from folders that have nothing: 2 hits
  // (of an alpha entry), 1 miss.
  Key alpha0 = *Digest::from_hex(stored[0]);
  for (int i : {0, 1}) {
    Result g = run_in(file("cache-d" + std::to_string(i)), {"get", "--key", alpha0.hex(), "--artifact", "obj"}, env);
    EXPECT_EQ(g.rc, 0) << g.err;
  }
  EXPECT_EQ(run_in(file("cache-e"), {"get", "--key", key_of(99).hex(), "--artifact", "obj"}, env).rc, 1);
  // Keys of the server that are not values.
  RedisClient redis("127.0.0.1", server_->port());
  EXPECT_EQ(redis.str({"SET", "kcache:{" + key_of(98).hex() + "}:lease", "someone"}), "OK");
  EXPECT_EQ(redis.str({"SET", "kcache:unrelated", "x"}), "OK");
  long long value_bytes = 0;
  for (const auto& hex : stored) value_bytes += std::stoll(redis.str({"STRLEN", "kcache:{" + hex + "}"}));
  ASSERT_GT(value_bytes, 12 * 3000);

  // The third process, in a folder of its own.
  Result r = run_in(file("cache-f"), {"stats", "--json"}, env);
  ASSERT_EQ(r.rc, 0) << r.err;
  size_t at = r.out.find("\"server\":{");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::string srv = r.out.substr(at, r.out.find("\"stats\":", at) - at);
  EXPECT_EQ(json_num(srv, "entries"), 12) << srv;
  EXPECT_EQ(json_num(srv, "bytes"), value_bytes) << srv;
  EXPECT_NE(srv.find("\"complete\":true"), std::string::npos) << srv;
  EXPECT_EQ(json_num(srv, "puts"), 12) << srv;
  EXPECT_EQ(json_num(srv, "hits"), 2) << srv;
  EXPECT_EQ(json_num(srv, "misses"), 1) << srv;
  EXPECT_GT(json_num(srv, "counters_since_ms"), 1700000000000LL) << srv;
  std::string alpha = srv.substr(srv.find("{\"namespace\":\"alpha\""));
  EXPECT_EQ(json_num(alpha, "hits"), 2) << srv;
  EXPECT_EQ(json_num(alpha, "puts"), 6) << srv;
  std::string beta = srv.substr(srv.find("{\"namespace\":\"beta\""));
  EXPECT_EQ(json_num(beta, "hits"), 0) << srv;
  EXPECT_EQ(json_num(beta, "puts"), 6) << srv;
  EXPECT_EQ(json_num(alpha, "put_bytes") + json_num(beta, "put_bytes"), value_bytes) << srv;
  r = run_in(file("cache-f"), {"stats"}, env);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("  stored    12 entries, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  clients   2 hits, 1 misses, 12 puts, 0 corrupt, 0 rejected (every client, since "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  namespace alpha: 2 hits, 6 puts ("), std::string::npos) << r.out;
  r = run_in(file("cache-f"), {"stats", "--format", "openmetrics"}, env);
  ASSERT_EQ(r.rc, 0) << r.err;
  Exposition m = parse_exposition(r.out);
  ASSERT_EQ(m.error, "") << r.out;
  EXPECT_EQ(m.value("kcache_puts_total", {{"tier", "redis"}}), 12);
  EXPECT_EQ(m.value("kcache_entries", {{"tier", "redis"}}), 12);
  EXPECT_EQ(m.value("kcache_bytes", {{"tier", "redis"}}), static_cast<double>(value_bytes));
  EXPECT_EQ(m.value("kcache_namespace_puts_total", {{"tier", "redis"}, {"namespace", "beta"}}), 6);
  EXPECT_EQ(m.value("kcache_namespace_hits_total", {{"tier", "redis"}, {"namespace", "alpha"}}), 2);
  EXPECT_GT(m.value("kcache_puts_created", {{"tier", "redis"}}), 1.7e9);
  EXPECT_EQ(m.value("kcache_errors_created", {{"tier", "redis"}}), -1) << "errors are this process's own";

  // --zero: printed, then zeroed; what is stored stays.
  r = run_in(file("cache-f"), {"stats", "--json", "--zero"}, env);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"zeroed\":true,\"namespaces\""), std::string::npos) << r.out;
  r = run_in(file("cache-f"), {"stats", "--json"}, env);
  srv = r.out.substr(r.out.find("\"server\":{"));
  EXPECT_EQ(json_num(srv, "entries"), 12) << srv;
  EXPECT_EQ(json_num(srv, "puts"), 0) << srv;
  EXPECT_EQ(json_num(srv, "hits"), 0) << srv;
  EXPECT_EQ(srv.find("\"namespace\":"), std::string::npos) << srv;

  // shared_stats=0: this client's counts stay its own.
  auto quiet = env;
  quiet["KCACHE_REMOTE"] = server_->url() + "?shared_stats=0";
  EXPECT_EQ(run_in(file("cache-g"), {"get", "--key", alpha0.hex(), "--artifact", "obj"}, quiet).rc, 0);
  EXPECT_EQ(run_in(file("cache-h"), {"get", "--key", alpha0.hex(), "--artifact", "obj"}, env).rc, 0);
  r = run_in(file("cache-f"), {"stats", "--json"}, env);
  srv = r.out.substr(r.out.find("\"server\":{"));
  EXPECT_EQ(json_num(srv, "hits"), 1) << srv;
}

INSTANTIATE_TEST_SUITE_P(Engines, CliRemoteTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

// The kcache tool on one entry (put, get, show), run as a real process on a
// fresh cache folder for each disk engine: exact bytes on stdout, exit codes,
// what a corrupt entry does, and one store shared with the library.
#include <cctype>
#include <string>
#include <vector>

#include "kcache/cache.h"

#include "cli_util.h"

namespace kcache::test {
namespace {

TEST_P(CliTest, PutThenGetReturnsIdenticalBinaryBytes) {
  Key k = key_of(1);
  std::string data = binary_payload(1, 100000);
  ASSERT_NE(data.find('\0'), std::string::npos);
  std::string obj = file("obj.bin"), sig = file("sig.txt");
  spit(obj, data);
  spit(sig, std::string("sig\0nature", 10));
  Result r = run({"put", "--key", k.hex(), "obj=" + obj, "sig=" + sig});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find(k.hex()), std::string::npos);

  r = run({"get", "--key", k.hex(), "--artifact", "obj"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, data);
  r = run({"get", "--key", k.hex(), "--artifact", "sig"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, std::string("sig\0nature", 10));

  // -o writes the file (replacing what was there) and nothing to stdout.
  std::string dest = file("dest.bin");
  spit(dest, "old contents that are longer than nothing");
  r = run({"get", "--key", k.hex(), "--artifact", "obj", "-o", dest});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(slurp(dest), data);
  r = run({"get", "--key", k.hex(), "--artifact=sig", "--output=" + dest});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(dest), std::string("sig\0nature", 10));
}

TEST_P(CliTest, MissAndMissingArtifactExitOne) {
  expect_failure(run({"get", "--key", key_of(7).hex(), "--artifact", "obj"}), 1, "no entry for key " + key_of(7).hex());
  expect_failure(run({"show", "--key", key_of(7).hex()}), 1, key_of(7).hex());
  put(key_of(1), "abc");
  expect_failure(run({"get", "--key", key_of(1).hex(), "--artifact", "ptx"}), 1, "no artifact 'ptx'");
  // A missing input file for put is a not-found too, and stores nothing.
  expect_failure(run({"put", "--key", key_of(2).hex(), "obj=" + file("does-not-exist")}), 1, "does-not-exist");
  Result r = run({"ls", "--json"});
  EXPECT_EQ(json_num(r.out, "count"), 1);
}

TEST_P(CliTest, ShowPrintsArtifactsMetadataAndManifest) {
  KeyInfo info = kernel_key("-O2");
  std::string mf = write_text_manifest(file("m.txt"), info);
  std::string a = file("a"), b = file("b");
  spit(a, std::string(1234, 'a'));
  spit(b, "bb");
  // --key defaults to the manifest's key.
  Result r = run({"put", "--manifest", mf, "ptx=" + a, "cubin=" + b});
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run({"show", "--key", info.key.hex(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("{\"name\":\"ptx\",\"size\":1234}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("{\"name\":\"cubin\",\"size\":2}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"producer\":\"kcache-cli\""), std::string::npos);
  EXPECT_NE(r.out.find("\"namespace\":\"clitest/1\""), std::string::npos);
  for (const auto& it : info.manifest.items) {
    std::string item = "{\"name\":\"" + it.name + "\",\"type\":\"" + std::string(component_type_name(it.type)) +
                       "\",\"digest\":\"" + it.digest.hex() + "\"}";
    EXPECT_NE(r.out.find(item), std::string::npos) << item << "\n" << r.out;
  }
  EXPECT_EQ(json_num(r.out, "payload_bytes"), 1236);
  EXPECT_GT(json_num(r.out, "created_unix_ms"), 1600000000000ll);

  r = run({"show", "--key", info.key.hex()});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("namespace \"clitest/1\", 4 components"), std::string::npos) << r.out;

  // An explicit --key wins over the manifest's own key.
  r = run({"put", "--manifest", mf, "--key", key_of(5).hex(), "ptx=" + a});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = run({"show", "--key", key_of(5).hex(), "--json"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"namespace\":\"clitest/1\""), std::string::npos) << r.out;
}

TEST_P(CliTest, GetOfACorruptEntryIsAMissNotACrash) {
  put(key_of(4), binary_payload(4, 20000));
  corrupt(key_of(4), marker_of(4));
  expect_failure(run({"get", "--key", key_of(4).hex(), "--artifact", "obj"}), 1, "corrupt");
  // The tier dropped it on the way: now it is an ordinary miss.
  expect_failure(run({"get", "--key", key_of(4).hex(), "--artifact", "obj"}), 1, "no entry");
  Result r = run({"stats", "--json"});
  EXPECT_EQ(json_num(r.out, "corrupt"), 1);
  EXPECT_EQ(json_num(r.out, "entries"), 0);
}

// The tool and the library share one store: what a JIT stored through
// Cache is what the tool shows and explains, and the other way round.
TEST_P(CliTest, ReadsWhatTheLibraryStoredAndViceVersa) {
  Options o;
  o.dir = dir();
  o.engine = parse_engine(engine());
  o.memory_tier = false;
  o.producer = "cli_test jit";
  KeyInfo info = kernel_key("-O2");
  std::string obj = binary_payload(11, 7000);
  {
    auto cache = Cache::open(o);
    auto e = cache->get_or_compile(info, [&]() -> Expected<std::vector<Artifact>> {
      return std::vector<Artifact>{{"obj", obj}, {"sig", "saxpy"}};
    });
    ASSERT_TRUE(e.has_value());
  }
  Result r = run({"get", "--key", info.key.hex(), "--artifact", "obj"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, obj);
  r = run({"show", "--key", info.key.hex(), "--json"});
  EXPECT_NE(r.out.find("\"producer\":\"cli_test jit\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"namespace\":\"clitest/1\""), std::string::npos) << r.out;
  r = run({"explain", "--manifest", write_text_manifest(file("o3.txt"), kernel_key("-O3"))});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("nearest " + info.key.hex() + ": 1 of 4 components differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  opt "), std::string::npos) << r.out;

  put(key_of(21), "stored by the tool");
  auto cache = Cache::open(o);
  auto e = cache->get(key_of(21));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->artifact("obj").value_or(""), "stored by the tool");
  EXPECT_EQ(e->meta().producer, "kcache-cli");
}

TEST_P(CliTest, KcacheDirAndEngineComeFromTheEnvironment) {
  std::string d = file("envcache");
  std::string in = file("in.txt");
  spit(in, "from env");
  Result r =
      run({"put", "--key", key_of(3).hex(), "obj=" + in}, false, {{"KCACHE_DIR", d}, {"KCACHE_ENGINE", engine()}});
  ASSERT_EQ(r.rc, 0) << r.err;
  struct stat st;
  EXPECT_EQ(::stat((d + "/" + engine()).c_str(), &st), 0) << "store not under KCACHE_DIR/" << engine();
  r = run({"get", "--key", key_of(3).hex(), "--artifact", "obj"}, false,
          {{"KCACHE_DIR", d}, {"KCACHE_ENGINE", engine()}});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "from env");
  // --dir wins over KCACHE_DIR.
  r = run({"--dir", dir(), "--engine", engine(), "get", "--key", key_of(3).hex(), "--artifact", "obj"}, false,
          {{"KCACHE_DIR", d}});
  EXPECT_EQ(r.rc, 1);
  expect_failure(run({"ls"}, false, {{"KCACHE_DIR", d}, {"KCACHE_ENGINE", "bdb"}}), 2, "KCACHE_ENGINE");
}

// Every KCACHE_* value goes through the library's one parser: a bad one is
// bad usage whichever option it is (a bad size once only warned), any
// case of an engine name is that engine, and a variable that names no
// option is said, not silently ignored.
TEST_P(CliTest, EveryVariableIsCheckedTheSameWay) {
  expect_failure(run({"stats"}, true, {{"KCACHE_MAX_SIZE", "huge"}}), 2, "KCACHE_MAX_SIZE: 'huge'");
  expect_failure(run({"stats"}, true, {{"KCACHE_READONLY", "maybe"}}), 2, "KCACHE_READONLY");
  std::string upper = engine();
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  Result r = run({"stats"}, false, {{"KCACHE_DIR", dir()}, {"KCACHE_ENGINE", upper}});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = run({"stats"}, true, {{"KCACHE_READ_ONLY", "1"}});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("KCACHE_READ_ONLY is not a kcache variable"), std::string::npos) << r.err;
  expect_failure(run({"--engine", "sqlite", "stats"}, false), 2, "sqlite");
}

// The tool reads every KCACHE_* variable as the library does: a read-only
// cache refuses put and serves get; a disabled one stores nothing and
// finds nothing, while `run` still runs its command.
TEST_P(CliTest, ReadonlyAndDisableAreHonoured) {
  put(key_of(41), "stored before");
  spit(file("in"), "new bytes");
  std::map<std::string, std::string> ro = {{"KCACHE_READONLY", "1"}};
  expect_failure(run({"put", "--key", key_of(42).hex(), "obj=" + file("in")}, true, ro), 3, "read-only");
  expect_failure(run({"get", "--key", key_of(42).hex(), "--artifact", "obj"}), 1, "no entry");
  Result r = run({"get", "--key", key_of(41).hex(), "--artifact", "obj"}, true, ro);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "stored before");
  expect_failure(run({"clear"}, true, ro), 3, "read-only");
  EXPECT_EQ(json_num(run({"ls", "--json"}).out, "count"), 1);

  std::map<std::string, std::string> off = {{"KCACHE_DISABLE", "1"}};
  expect_failure(run({"get", "--key", key_of(41).hex(), "--artifact", "obj"}, true, off), 1, "KCACHE_DISABLE");
  expect_failure(run({"put", "--key", key_of(43).hex(), "obj=" + file("in")}, true, off), 3, "disabled");
  std::string out = file("out"), count = file("count");
  std::vector<std::string> cmd = {"run",        "--key",      key_of(41).hex(),
                                  "--artifact", "obj=" + out, "--",
                                  "sh",         "-c",         "printf ran > \"$0\"; echo x >> \"$1\"",
                                  out,          count};
  r = run(cmd, true, off);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(out), "ran");
  EXPECT_EQ(lines(slurp(count)), 1u);
  // Inspection still sees the store: it names the store, not a cache path.
  EXPECT_EQ(json_num(run({"ls", "--json"}, true, off).out, "count"), 1);
  r = run({"get", "--key", key_of(41).hex(), "--artifact", "obj"});
  EXPECT_EQ(r.out, "stored before") << "a disabled run must not overwrite the entry";
}

INSTANTIATE_TEST_SUITE_P(Engines, CliTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

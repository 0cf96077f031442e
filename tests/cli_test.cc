// The kcache command-line tool, run as a real process on a fresh cache
// folder: exit codes, exact bytes on stdout, JSON fields, and what it does to
// a store with corrupt entries. Each test runs against both disk engines.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kcache/key.h"
#include "test_util.h"

extern char** environ;

namespace kcache::test {
namespace {

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// Value of a top-level numeric JSON member such as "hits":12 (the tool
// prints compact JSON, and these names are unique in the documents read).
long long json_num(const std::string& json, const std::string& name) {
  std::string pat = "\"" + name + "\":";
  size_t p = json.find(pat);
  if (p == std::string::npos) return -1;
  return std::strtoll(json.c_str() + p + pat.size(), nullptr, 10);
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

size_t lines(const std::string& s) { return count_of(s, "\n"); }

class CliTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string engine() const { return GetParam(); }
  std::string dir() const { return tmp_.path() + "/cache"; }
  std::string file(const std::string& name) const { return tmp_.path() + "/" + name; }

  // Runs the tool with --dir and --engine for this test, with KCACHE_* taken
  // out of the environment so the caller's settings cannot leak in.
  Result run(std::vector<std::string> args, bool with_store = true,
             const std::map<std::string, std::string>& env_extra = {}) {
    std::vector<std::string> argv_s = {KCACHE_CLI};
    if (with_store) {
      argv_s.insert(argv_s.end(), {"--dir", dir(), "--engine", engine()});
    }
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "KCACHE_", 7) != 0) env_s.push_back(*e);
    for (const auto& [k, v] : env_extra) env_s.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    std::string out_path = file("stdout." + std::to_string(++runs_));
    std::string err_path = file("stderr." + std::to_string(runs_));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    Result r;
    int sp = posix_spawn(&pid, KCACHE_CLI, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(sp, 0) << "spawn " << KCACHE_CLI;
    if (sp != 0) return r;
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    EXPECT_TRUE(WIFEXITED(status)) << "kcache died with signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out_path);
    r.err = slurp(err_path);
    return r;
  }

  // Fails the test unless `r` is a clean failure: code `rc`, nothing on
  // stdout, exactly one line on stderr starting "kcache: ".
  static void expect_failure(const Result& r, int rc, const std::string& mention = "") {
    EXPECT_EQ(r.rc, rc) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("kcache: ", 0), 0u) << r.err;
    if (!mention.empty()) EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
  }

  // Stores artifact `obj` = data under key `k` through the tool.
  void put(const Key& k, const std::string& data, const std::string& extra_manifest = "") {
    std::string p = file("in." + k.hex());
    spit(p, data);
    std::vector<std::string> args = {"put", "--key", k.hex(), "obj=" + p};
    if (!extra_manifest.empty()) args.insert(args.end(), {"--manifest", extra_manifest});
    Result r = run(args);
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_EQ(r.err, "");
  }

  // Flips one byte inside the stored copy of `marker` (artifact bytes, so
  // only the entry checksum can notice). Files engine: the entry's .kce
  // file. LMDB: every copy of the marker in data.mdb.
  void corrupt(const Key& k, const std::string& marker) {
    std::string path = engine() == "files" ? dir() + "/files/" + k.hex().substr(0, 2) + "/" + k.hex() + ".kce"
                                           : dir() + "/lmdb/data.mdb";
    std::string bytes = slurp(path);
    ASSERT_FALSE(bytes.empty()) << path;
    size_t n = 0;
    for (size_t p = bytes.find(marker); p != std::string::npos; p = bytes.find(marker, p + 1)) {
      bytes[p + marker.size() / 2] ^= 0x5a;
      ++n;
    }
    ASSERT_GT(n, 0u) << "marker not found in " << path;
    int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }

  TempDir tmp_;
  int runs_ = 0;
};

// Every byte value, NULs included, with a marker that is unique per key.
std::string binary_payload(uint64_t i, size_t n) {
  std::string s = "MARKER-" + std::to_string(i) + "-" + std::string(24, 'm');
  for (size_t j = 0; s.size() < n; ++j) s += static_cast<char>(j * 7 + i);
  s.resize(n);
  return s;
}
std::string marker_of(uint64_t i) { return "MARKER-" + std::to_string(i) + "-" + std::string(24, 'm'); }

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

// A manifest file in the text format, from a real KeyBuilder.
std::string write_text_manifest(const std::string& path, const KeyInfo& info) {
  std::string t = "# a lookup\nnamespace " + info.manifest.ns + "\n";
  for (const auto& it : info.manifest.items)
    t += it.name + " " + std::string(component_type_name(it.type)) + " " + it.digest.hex() + "\n";
  spit(path, t);
  return path;
}

KeyInfo kernel_key(const std::string& opt, const std::string& target = "sm_90") {
  return *KeyBuilder("clitest/1")
              .add_bytes("ir", "define void @k() { ret void }")
              .add_string("opt", opt)
              .add_string("target", target)
              .add_u64("compiler", 14)
              .finish();
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

TEST_P(CliTest, ExplainNamesTheComponentThatDiffers) {
  KeyInfo stored = kernel_key("-O2");
  KeyInfo other_target = kernel_key("-O1", "sm_80");
  put(stored.key, "ptx-O2", write_text_manifest(file("stored.txt"), stored));
  put(other_target.key, "ptx-O1", write_text_manifest(file("other.txt"), other_target));
  put(key_of(99), "no manifest at all");

  // A stored key is a hit: exit 0.
  Result r = run({"explain", "--key", stored.key.hex()});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("is stored"), std::string::npos) << r.out;

  // The lookup changed only -O2 -> -O3: the nearest entry is `stored`, and
  // exactly "opt" differs.
  KeyInfo lookup = kernel_key("-O3");
  std::string mf = write_text_manifest(file("lookup.txt"), lookup);
  r = run({"explain", "--key", lookup.key.hex(), "--manifest", mf});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.out.find("nearest " + stored.key.hex() + ": 1 of 4 components differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  opt "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  target "), std::string::npos) << r.out;

  r = run({"explain", "--manifest", mf, "--json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("\"nearest\":{\"key\":\"" + stored.key.hex() + "\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"differences\":[{\"name\":\"opt\",\"change\":\"changed\""), std::string::npos) << r.out;
  EXPECT_EQ(json_num(r.out, "compared"), 2);

  // A lookup with an extra component: "added".
  KeyInfo extra = *KeyBuilder("clitest/1")
                       .add_bytes("ir", "define void @k() { ret void }")
                       .add_string("opt", "-O2")
                       .add_string("target", "sm_90")
                       .add_u64("compiler", 14)
                       .add_bool("fast_math", true)
                       .finish();
  r = run({"explain", "--manifest", write_text_manifest(file("extra.txt"), extra)});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("fast_math"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("added"), std::string::npos) << r.out;

  // show --json output feeds explain directly.
  r = run({"show", "--key", stored.key.hex(), "--json"});
  ASSERT_EQ(r.rc, 0);
  spit(file("show.json"), r.out);
  r = run({"explain", "--manifest", file("show.json")});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(stored.key.hex() + " is stored"), std::string::npos) << r.out;

  // Another namespace: nothing to compare with, said plainly.
  KeyInfo foreign = *KeyBuilder("elsewhere/2").add_string("opt", "-O2").finish();
  r = run({"explain", "--manifest", write_text_manifest(file("foreign.txt"), foreign)});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("no stored entry has namespace \"elsewhere/2\""), std::string::npos) << r.out;

  // Entries stored without a manifest (key_of(99)) are not candidates, and
  // an empty manifest file is bad usage.
  EXPECT_NE(r.out.find("(stored namespaces: \"clitest/1\" x2)"), std::string::npos) << r.out;
  spit(file("empty.txt"), "# nothing\n");
  expect_failure(run({"explain", "--manifest", file("empty.txt")}), 2, "no component");

  // A malformed manifest is bad usage.
  spit(file("bad.txt"), "opt string nothex\n");
  expect_failure(run({"explain", "--manifest", file("bad.txt")}), 2, "digest");
  spit(file("bad.json"), "{\"namespace\": \"x\", \"items\": [");
  expect_failure(run({"explain", "--manifest", file("bad.json")}), 2, "JSON");
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
  Result r = run({"put", "--key", key_of(3).hex(), "obj=" + in}, false,
                 {{"KCACHE_DIR", d}, {"KCACHE_ENGINE", engine()}});
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

INSTANTIATE_TEST_SUITE_P(Engines, CliTest,
                         ::testing::Values(
#if KCACHE_HAVE_LMDB
                             std::string("lmdb"),
#endif
                             std::string("files")),
                         [](const auto& info) { return info.param; });

// ---- usage, help, version: the same for every engine -------------------------

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

// The kcache command-line tool run as a real process, for the CLI test
// suites (tests/cli_*_test.cc): a fixture that runs it on a fresh cache
// folder with the caller's KCACHE_* variables taken out, and helpers to
// read its output and damage its store.
#pragma once

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

struct Result {
  int rc = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// Value of a top-level numeric JSON member such as "hits":12 (the tool
// prints compact JSON, and these names are unique in the documents read).
inline long long json_num(const std::string& json, const std::string& name) {
  std::string pat = "\"" + name + "\":";
  size_t p = json.find(pat);
  if (p == std::string::npos) return -1;
  return std::strtoll(json.c_str() + p + pat.size(), nullptr, 10);
}

inline size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

inline size_t lines(const std::string& s) { return count_of(s, "\n"); }

class CliTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string engine() const { return GetParam(); }
  std::string dir() const { return tmp_.path() + "/cache"; }
  std::string file(const std::string& name) const { return tmp_.path() + "/" + name; }

  // Runs the tool with --dir and --engine for this test, with KCACHE_* taken
  // out of the environment so the caller's settings cannot leak in.
  Result run(std::vector<std::string> args, bool with_store = true,
             const std::map<std::string, std::string>& env_extra = {}) {
    return run_in(with_store ? dir() : std::string(), std::move(args), env_extra);
  }

  // The same with the cache folder `cache_dir` (none: "").
  Result run_in(const std::string& cache_dir, std::vector<std::string> args,
                const std::map<std::string, std::string>& env_extra = {}) {
    Command c = command(cache_dir, std::move(args), env_extra);

    std::string out_path = file("stdout." + std::to_string(++runs_));
    std::string err_path = file("stderr." + std::to_string(runs_));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    Result r;
    int sp = posix_spawn(&pid, KCACHE_CLI, &fa, nullptr, c.argv.data(), c.envp.data());
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(sp, 0) << "spawn " << KCACHE_CLI;
    if (sp != 0) return r;
    return wait_for(pid, out_path, err_path);
  }

  // The tool's arguments (with --dir and --engine when cache_dir is not
  // empty) and environment (KCACHE_* taken out, env_extra added), with the
  // arrays exec wants pointing into them.
  struct Command {
    std::vector<std::string> args, env;
    std::vector<char*> argv, envp;
  };
  Command command(const std::string& cache_dir, std::vector<std::string> args,
                  const std::map<std::string, std::string>& env_extra = {}) const {
    Command c;
    c.args = {KCACHE_CLI};
    if (!cache_dir.empty()) c.args.insert(c.args.end(), {"--dir", cache_dir, "--engine", engine()});
    c.args.insert(c.args.end(), args.begin(), args.end());
    // The user-wide config file is the test's own (none unless it writes
    // one), never the caller's.
    // A variable env_extra sets replaces the caller's (the first of a name
    // in the environment is the one a program reads).
    for (char** e = environ; *e; ++e) {
      const char* eq = std::strchr(*e, '=');
      const bool replaced = eq && env_extra.count(std::string(*e, static_cast<size_t>(eq - *e)));
      if (!replaced && std::strncmp(*e, "KCACHE_", 7) != 0 && std::strncmp(*e, "XDG_CONFIG_HOME=", 16) != 0)
        c.env.push_back(*e);
    }
    if (!env_extra.count("XDG_CONFIG_HOME")) c.env.push_back("XDG_CONFIG_HOME=" + tmp_.path() + "/xdg");
    for (const auto& [k, v] : env_extra) c.env.push_back(k + "=" + v);
    for (auto& a : c.args) c.argv.push_back(a.data());
    c.argv.push_back(nullptr);
    for (auto& e : c.env) c.envp.push_back(e.data());
    c.envp.push_back(nullptr);
    return c;
  }

  // Waits for the tool's process `pid` and reads what it wrote to the two
  // files.
  Result wait_for(pid_t pid, const std::string& out_path, const std::string& err_path) {
    Result r;
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
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
    if (!mention.empty()) {
      EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
    }
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
inline std::string binary_payload(uint64_t i, size_t n) {
  std::string s = "MARKER-" + std::to_string(i) + "-" + std::string(24, 'm');
  for (size_t j = 0; s.size() < n; ++j) s += static_cast<char>(j * 7 + i);
  s.resize(n);
  return s;
}
inline std::string marker_of(uint64_t i) { return "MARKER-" + std::to_string(i) + "-" + std::string(24, 'm'); }

// A manifest file in the text format, from a real KeyBuilder.
inline std::string write_text_manifest(const std::string& path, const KeyInfo& info) {
  std::string t = "# a lookup\nnamespace " + info.manifest.ns + "\n";
  for (const auto& it : info.manifest.items)
    t += it.name + " " + std::string(component_type_name(it.type)) + " " + it.digest.hex() + "\n";
  spit(path, t);
  return path;
}

inline KeyInfo kernel_key(const std::string& opt, const std::string& target = "sm_90") {
  return *KeyBuilder("clitest/1")
              .add_bytes("ir", "define void @k() { ret void }")
              .add_string("opt", opt)
              .add_string("target", target)
              .add_u64("compiler", 14)
              .finish();
}

}  // namespace kcache::test

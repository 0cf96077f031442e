// The kcache tool at its edges, as a real process: a closed stdout, output
// paths that are not regular files, a store it cannot modify, stale temp
// files of killed runs. Some runs need a child that is set up before the
// exec (a closed descriptor, another user), which the fixture's run() cannot
// do: run_child() forks, lets the caller prepare, then execs the tool.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cli_util.h"

namespace kcache::test {
namespace {

class CliEdges : public CliTest {
 protected:
  // Runs the tool with --dir/--engine for this test in a forked child that
  // first calls `prepare` (after stdout and stderr went to files, so
  // `prepare` may close or replace them). A child that cannot be prepared
  // exits 120.
  Result run_child(std::vector<std::string> args, const std::function<bool()>& prepare) {
    std::vector<std::string> argv_s = {KCACHE_CLI, "--dir", dir(), "--engine", engine()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "KCACHE_", 7) != 0) env_s.push_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string out_path = file("child.out." + std::to_string(++runs_));
    std::string err_path = file("child.err." + std::to_string(runs_));
    Result r;
    pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return r;
    }
    if (pid == 0) {
      int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
      int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
      int n = ::open("/dev/null", O_RDONLY);
      if (o < 0 || e < 0 || n < 0 || ::dup2(n, 0) < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(120);
      ::close(o);
      ::close(e);
      ::close(n);
      if (!prepare()) ::_exit(120);
      ::execve(KCACHE_CLI, argv.data(), envp.data());
      ::_exit(121);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    EXPECT_TRUE(WIFEXITED(status)) << "kcache died with signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    EXPECT_LT(r.rc, 120) << "the child could not be prepared";
    r.out = slurp(out_path);
    r.err = slurp(err_path);
    return r;
  }
};

// With stdout closed, `get` writes the artifact nowhere (not into a file
// the tool opened on fd 1) and says so: exit 3, one line. The store is
// untouched.
TEST_P(CliEdges, GetWithStdoutClosedExitsThree) {
  const Key k = key_of(1);
  const std::string data = binary_payload(1, 50000);
  put(k, data);
  Result r = run_child({"get", "--key", k.hex(), "--artifact", "obj"}, [] { return ::close(1) == 0; });
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("stdout"), std::string::npos) << r.err;
  r = run({"verify"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(run({"get", "--key", k.hex(), "--artifact", "obj"}).out, data);
}

// `verify --fix` on a store its user cannot modify (run as another user,
// 65534, that owns the store: a read-only data file for LMDB, read-only
// shard folders for the files engine) reports only what it removed and
// exits 3; both bad entries are still there. `clear` (and `trim` of an
// LMDB store it cannot open) never says it did what it could not.
TEST_P(CliEdges, VerifyFixOnAStoreItCannotModifyExitsThree) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as a second user";
  for (uint64_t i = 0; i < 3; ++i) put(key_of(i), binary_payload(i, 20000));
  corrupt(key_of(1), marker_of(1));
  corrupt(key_of(2), marker_of(2));
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(std::system(("chown -R 65534:65534 '" + dir() + "'").c_str()), 0);
  if (engine() == "files") {
    for (uint64_t i : {1, 2}) ASSERT_EQ(::chmod((dir() + "/files/" + key_of(i).hex().substr(0, 2)).c_str(), 0555), 0);
  } else {
    ASSERT_EQ(::chmod((dir() + "/lmdb/data.mdb").c_str(), 0444), 0);
  }
  auto as_nobody = [] { return ::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0; };

  Result r = run_child({"verify", "--fix", "--json"}, as_nobody);
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("kcache: verify: "), std::string::npos) << r.err;
  if (!r.out.empty()) {
    EXPECT_EQ(json_num(r.out, "removed"), 0) << r.out;
  }
  r = run_child({"clear"}, as_nobody);
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  if (engine() == "lmdb") {  // the files engine trims the shards it can write
    r = run_child({"trim", "--max-size", "1"}, as_nobody);
    EXPECT_EQ(r.rc, 3) << r.out << r.err;
  }

  // Nothing was removed: root (the store's other owner here) still sees both.
  ASSERT_EQ(std::system(("chown -R 0:0 '" + dir() + "'").c_str()), 0);
  ASSERT_EQ(std::system(("chmod -R u+w '" + dir() + "'").c_str()), 0);
  r = run({"verify", "--json"});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(json_num(r.out, "bad_count"), 2) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Engines, CliEdges, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

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
#include <fstream>
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
    Command c = command(dir(), std::move(args));
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
      ::execve(KCACHE_CLI, c.argv.data(), c.envp.data());
      ::_exit(121);
    }
    r = wait_for(pid, out_path, err_path);
    EXPECT_LT(r.rc, 120) << "the child could not be prepared";
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

// `put` whose work is done exits 0 whatever stdout is: closed, or a pipe
// nobody reads (/dev/full stands for a failing one). The entry is stored.
TEST_P(CliEdges, PutWithStdoutClosedOrFailingStillExitsZero) {
  const std::string src = file("obj.bin");
  std::ofstream(src, std::ios::binary) << binary_payload(7, 3000);
  Result r = run_child({"put", "--key", key_of(7).hex(), "obj=" + src}, [] { return ::close(1) == 0; });
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(run({"get", "--key", key_of(7).hex(), "--artifact", "obj"}).out, binary_payload(7, 3000));
  r = run_child({"put", "--key", key_of(8).hex(), "obj=" + src}, [] {
    int f = ::open("/dev/full", O_WRONLY);
    return f >= 0 && ::dup2(f, 1) == 1;
  });
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;  // one line says the report was not written
  EXPECT_EQ(run({"get", "--key", key_of(8).hex(), "--artifact", "obj"}).out, binary_payload(7, 3000));
}

// `verify --fix` on a store its user cannot modify (a read-only data file
// for LMDB, read-only shard folders for the files engine) reports only what
// it removed and exits 3; both bad entries are still there. `clear` (and
// `trim` of an LMDB store it cannot open) never says it did what it could
// not. As root, the tool runs as another user (65534) that owns the store
// (root would ignore the modes); as any other user, as that user.
TEST_P(CliEdges, VerifyFixOnAStoreItCannotModifyExitsThree) {
  const bool root = ::geteuid() == 0;
  for (uint64_t i = 0; i < 3; ++i) put(key_of(i), binary_payload(i, 20000));
  corrupt(key_of(1), marker_of(1));
  corrupt(key_of(2), marker_of(2));
  if (root) {
    ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
    ASSERT_EQ(std::system(("chown -R 65534:65534 '" + dir() + "'").c_str()), 0);
  }
  if (engine() == "files") {
    for (uint64_t i : {1, 2}) ASSERT_EQ(::chmod((dir() + "/files/" + key_of(i).hex().substr(0, 2)).c_str(), 0555), 0);
  } else {
    ASSERT_EQ(::chmod((dir() + "/lmdb/data.mdb").c_str(), 0444), 0);
  }
  auto as_nobody = [root] {
    return !root || (::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0);
  };

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

  // Nothing was removed: the store's owner, its modes restored, still sees both.
  if (root) {
    ASSERT_EQ(std::system(("chown -R 0:0 '" + dir() + "'").c_str()), 0);
  }
  ASSERT_EQ(std::system(("chmod -R u+w '" + dir() + "'").c_str()), 0);
  r = run({"verify", "--json"});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(json_num(r.out, "bad_count"), 2) << r.out;
}

bool is_kind(const std::string& path, mode_t kind) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

// -o never replaces what is not a regular file: a character device is
// written through (a full one fails, naming the path), a FIFO is written
// through to its reader, a symbolic link's target is replaced and the link
// stays; a bundle, which must be a file, refuses devices and FIFOs.
// Failures name the user's path, not a temp file.
TEST_P(CliEdges, OutputPathsThatAreNotRegularFilesAreNeverReplaced) {
  const Key k = key_of(1);
  const std::string data = binary_payload(1, 30000);
  put(k, data);
  const std::vector<std::string> get = {"get", "--key", k.hex(), "--artifact", "obj", "-o"};
  auto with = [](std::vector<std::string> v, const std::string& last) {
    v.push_back(last);
    return v;
  };

  // A device like /dev/full, made here (as root) so the real one is never at stake.
  const std::string full = file("full");
  if (::mknod(full.c_str(), S_IFCHR | 0666, ::makedev(1, 7)) == 0) {
    Result r = run(with(get, full));
    expect_failure(r, 3, full);
    EXPECT_NE(r.err.find("No space"), std::string::npos) << r.err;
    r = run({"bundle", "create", "-o", full});
    expect_failure(r, 3, full);
    EXPECT_TRUE(is_kind(full, S_IFCHR)) << "the device was replaced";
  }

  const std::string fifo = file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Held open for reading and writing here, so the tool's open does not
  // wait and its 30000 bytes fit in the pipe without a reader draining it.
  int held = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(held, 0);
  Result r = run(with(get, fifo));
  EXPECT_EQ(r.rc, 0) << r.err;
  std::string got(data.size() + 1, '\0');
  ssize_t n = ::read(held, got.data(), got.size());
  got.resize(n > 0 ? static_cast<size_t>(n) : 0);
  ::close(held);
  EXPECT_EQ(got, data);
  expect_failure(run({"bundle", "create", "-o", fifo}), 3, fifo);
  EXPECT_TRUE(is_kind(fifo, S_IFIFO)) << "the FIFO was replaced";

  const std::string real = file("real.o"), link = file("link.o");
  spit(real, "old");
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  r = run(with(get, link));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(is_kind(link, S_IFLNK));
  EXPECT_EQ(slurp(real), data);
  const std::string real_kcb = file("real.kcb"), link_kcb = file("link.kcb");
  spit(real_kcb, "old");
  ASSERT_EQ(::symlink(real_kcb.c_str(), link_kcb.c_str()), 0);
  r = run({"bundle", "create", "-o", link_kcb});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(is_kind(link_kcb, S_IFLNK));
  EXPECT_EQ(run({"bundle", "ls", real_kcb}).rc, 0);

  // -o /dev/stdout writes to the descriptor as the shell set it up (here
  // `>> log`: appended), never replacing the file it points to.
  const std::string appended = file("appended.log");
  spit(appended, "head:");
  r = run_child(with(get, "/dev/stdout"), [&] {
    int fd = ::open(appended.c_str(), O_WRONLY | O_APPEND);
    return fd >= 0 && ::dup2(fd, 1) == 1 && ::close(fd) == 0;
  });
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(appended), "head:" + data);

  const std::string nowhere = file("no-such-folder/out");
  r = run(with(get, nowhere));
  expect_failure(r, 3, nowhere);
  EXPECT_EQ(r.err.find("kcache-tmp"), std::string::npos) << r.err;
  r = run({"bundle", "create", "-o", nowhere + ".kcb"});
  expect_failure(r, 3, nowhere + ".kcb");
  EXPECT_EQ(r.err.find(".tmp."), std::string::npos) << r.err;
}

// A killed writer leaves its temp file behind; the next write of the same
// output removes those an hour old or more (its own pattern only), and
// leaves fresh ones (a writer that may still be running) alone.
TEST_P(CliEdges, StaleTempFilesBesideTheOutputAreCollected) {
  const Key k = key_of(1);
  put(k, binary_payload(1, 3000));
  auto age = [](const std::string& p, int seconds) {
    struct timeval tv[2];
    ::gettimeofday(&tv[0], nullptr);
    tv[0].tv_sec -= seconds;
    tv[1] = tv[0];
    return ::utimes(p.c_str(), tv) == 0;
  };
  const std::string kcb = file("pkg.kcb"), obj = file("obj.o");
  const std::string old_kcb = kcb + ".tmp.0123456789abcdef", fresh_kcb = kcb + ".tmp.fedcba9876543210";
  const std::string other = kcb + ".tmp.notours";
  const std::string old_obj = obj + ".kcache-tmp.0123456789abcdef", fresh_obj = obj + ".kcache-tmp.00000000000000aa";
  for (const auto& p : {old_kcb, fresh_kcb, other, old_obj, fresh_obj}) spit(p, "partial");
  for (const auto& p : {old_kcb, other, old_obj}) ASSERT_TRUE(age(p, 2 * 3600));

  Result r = run({"bundle", "create", "-o", kcb});
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run({"get", "--key", k.hex(), "--artifact", "obj", "-o", obj});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(std::ifstream(old_kcb).good()) << "a stale bundle temp file was left";
  EXPECT_FALSE(std::ifstream(old_obj).good()) << "a stale output temp file was left";
  for (const auto& p : {fresh_kcb, other, fresh_obj}) EXPECT_TRUE(std::ifstream(p).good()) << p;
}

INSTANTIATE_TEST_SUITE_P(Engines, CliEdges, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

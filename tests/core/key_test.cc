#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "golden_key.h"
#include "kcache/key.h"
#include "test_util.h"
#include "util/util.h"

using namespace kcache;

namespace {

KeyInfo base(const std::function<void(KeyBuilder&)>& tweak = {}) {
  KeyBuilder b("ns/1");
  if (tweak) {
    tweak(b);
  } else {
    b.add_bytes("ir", "abc").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", true);
  }
  auto k = b.finish();
  EXPECT_TRUE(k.has_value());
  return *k;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n')) out.pop_back();
  return out;
}

}  // namespace

TEST(Key, GoldenValueIsPinned) {
  auto k = golden_key();
  ASSERT_TRUE(k.has_value());
  // Changing this value invalidates every stored cache: only with a format
  // version bump.
  EXPECT_EQ(k->key.hex(), GOLDEN_KEY_HEX);
}

TEST(Key, EveryComponentChangesTheKey) {
  Key k0 = base().key;
  std::set<Key> seen{k0};
  auto variant = [&](auto fn) {
    Key k = base(fn).key;
    EXPECT_TRUE(seen.insert(k).second) << "collision for a one-component change";
  };
  variant([](KeyBuilder& b) {
    b.add_bytes("ir", "abd").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", true);
  });
  variant([](KeyBuilder& b) {
    b.add_bytes("ir", "abc").add_string("cpu", "znver4").add_u64("opt", 2).add_bool("fm", true);
  });
  variant([](KeyBuilder& b) {
    b.add_bytes("ir", "abc").add_string("cpu", "znver3").add_u64("opt", 3).add_bool("fm", true);
  });
  variant([](KeyBuilder& b) {
    b.add_bytes("ir", "abc").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", false);
  });
  // Same bytes under another name, or another type, are different keys.
  variant([](KeyBuilder& b) {
    b.add_bytes("IR", "abc").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", true);
  });
  variant([](KeyBuilder& b) {
    b.add_string("ir", "abc").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", true);
  });
  // An added component changes the key.
  variant([](KeyBuilder& b) {
    b.add_bytes("ir", "abc").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", true).add_string("x", "");
  });
  // Namespace.
  KeyBuilder other("ns/2");
  other.add_bytes("ir", "abc").add_string("cpu", "znver3").add_u64("opt", 2).add_bool("fm", true);
  EXPECT_NE(other.finish()->key, k0);
}

TEST(Key, LengthPrefixingSeparatesBoundaries) {
  auto a = KeyBuilder("n").add_list("l", {"ab", "c"}).finish();
  auto b = KeyBuilder("n").add_list("l", {"a", "bc"}).finish();
  EXPECT_NE(a->key, b->key);
  auto c = KeyBuilder("n").add_map("m", {{"a", "bc"}}).finish();
  auto d = KeyBuilder("n").add_map("m", {{"ab", "c"}}).finish();
  EXPECT_NE(c->key, d->key);
}

TEST(Key, OrderOfAddsDoesNotMatter) {
  auto a = KeyBuilder("n").add_string("x", "1").add_string("y", "2").finish();
  auto b = KeyBuilder("n").add_string("y", "2").add_string("x", "1").finish();
  EXPECT_EQ(a->key, b->key);
  EXPECT_EQ(a->manifest, b->manifest);
}

TEST(Key, DuplicateAndEmptyNamesAreErrors) {
  auto a = KeyBuilder("n").add_string("x", "1").add_string("x", "2").finish();
  ASSERT_FALSE(a.has_value());
  EXPECT_EQ(a.error().code(), Errc::invalid_argument);
  auto b = KeyBuilder("n").add_string("", "1").finish();
  ASSERT_FALSE(b.has_value());
}

TEST(Key, FileContentsNotPath) {
  // A folder of this run's own: another user's files of the same names in
  // a sticky /tmp could not be replaced.
  test::TempDir t;
  const std::string& d = t.path();
  std::string p1 = d + "/kc_key_a.txt", p2 = d + "/kc_key_b.txt";
  ASSERT_TRUE(util::write_file_atomic(p1, "same").is_ok());
  ASSERT_TRUE(util::write_file_atomic(p2, "same").is_ok());
  auto a = KeyBuilder("n").add_file("f", p1).finish();
  auto b = KeyBuilder("n").add_file("f", p2).finish();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->key, b->key);
  auto missing = KeyBuilder("n").add_file("f", d + "/does-not-exist").finish();
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), Errc::io_error);
}

// Only regular files are hashed: a device that never ends (/dev/zero), a
// FIFO without a writer (which would block at open) and a folder make
// finish() fail with a message naming the path. Each runs in a child under
// an alarm, so a builder that never returns fails the test instead of
// hanging it.
TEST(Key, AddFileRefusesWhatIsNotARegularFile) {
  std::string d = ::testing::TempDir() + "/kc_key_kinds." + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
  std::string fifo = d + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo, d}) {
    SCOPED_TRACE(path);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(20);
      auto k = KeyBuilder("n").add_file("f", path).finish();
      bool ok = !k.has_value() && k.error().code() == Errc::io_error &&
                k.error().message().find(path) != std::string::npos &&
                k.error().message().find("not a regular file") != std::string::npos;
      if (!ok) std::fprintf(stderr, "%s\n", k ? "accepted" : k.error().to_string().c_str());
      ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "add_file did not return (signal " << WTERMSIG(status) << ")";
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 0);
    }
  }
  ::unlink(fifo.c_str());
  ::rmdir(d.c_str());
}

TEST(Key, HexRoundTrip) {
  Key k = golden_key()->key;
  auto back = Digest::from_hex(k.hex());
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, k);
  EXPECT_FALSE(Digest::from_hex("xyz"));
  EXPECT_FALSE(Digest::from_hex(std::string(32, 'g')));
}

TEST(Key, ManifestDiffNamesChangedComponents) {
  auto a = KeyBuilder("n").add_string("cpu", "a").add_string("ir", "x").add_string("only_a", "1").finish();
  auto b = KeyBuilder("n").add_string("cpu", "b").add_string("ir", "x").add_string("only_b", "1").finish();
  auto diff = manifest_diff(a->manifest, b->manifest);
  EXPECT_EQ(diff, (std::vector<std::string>{"cpu", "only_a", "only_b"}));
  EXPECT_EQ(a->manifest.key(), a->key);
}

TEST(Key, SameKeyAcrossProcessesWithDifferentEnvironments) {
  std::string expected = golden_key()->key.hex();
  std::string bin = KEY_PRINT_BIN;
  std::vector<std::string> cmds = {
      bin,
      "cd / && env -i HOME=/nonexistent PATH=/usr/bin:/bin " + bin,
      "cd /tmp && env -i ZZZ=1 AAA=2 HOME=/root XDG_CACHE_HOME=/elsewhere " + bin,
      "cd /usr && env -i AAA=2 ZZZ=1 LANG=C " + bin,
      "setarch $(uname -m) -R " + bin + " 2>/dev/null || " + bin,
  };
  for (const auto& c : cmds) EXPECT_EQ(run(c), expected) << c;
}

// Regression tests on three damaged LMDB stores (tests/fixtures/lmdb-damaged,
// see its README.md): garbage over overflow pages that once made a read
// abort in mdb_ovpage_free or loop under mdb_cursor_del.
//
// On a copy of each store, every key is read in its own process under a
// watchdog, then verify --fix, trim and clear run, each in its own process;
// finally a new process opens the store (which moves it aside and salvages
// its intact entries) and reads every key again. Every process must end in
// bounded time without a signal, and every artifact handed out must equal
// the one in original/.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = KCACHE_FIXTURES_DIR "/lmdb-damaged";
const int kLimitMs = trials(20000, 120000);

DiskTierOptions options() {
  DiskTierOptions o;
  o.durability = Durability::none;
  return o;
}

std::vector<Key> fixture_keys() {
  std::vector<Key> keys;
  std::ifstream in(kFixtures + "/keys.txt");
  std::string line;
  while (std::getline(in, line))
    if (auto k = Key::from_hex(line)) keys.push_back(*k);
  return keys;
}

// A writable copy of fixture `name`'s lmdb folder; returns the folder.
std::string copy_store(const std::string& name, const std::string& to) {
  fs::create_directories(to);
  std::string dst = to + "/lmdb";
  fs::copy(kFixtures + "/" + name + "/lmdb", dst, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dst))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return dst;
}

using Artifacts = std::map<std::string, std::string>;

// The artifacts of every key in original/, read in a child so that this
// process starts no thread (children are forked from it).
std::map<Key, Artifacts> original_artifacts(const std::vector<Key>& keys, const std::string& tmp) {
  std::string dir = copy_store("original", tmp + "/original");
  std::map<Key, Artifacts> out;
  auto t = open_lmdb_tier(dir, options());
  EXPECT_TRUE(t.has_value()) << t.error().to_string();
  if (!t) return out;
  for (const Key& k : keys) {
    auto g = (*t)->get(k);
    EXPECT_TRUE(g && g->has_value()) << "original store lacks " << k.hex();
    if (!g || !g->has_value()) continue;
    for (const auto& name : {"a0", "a1"})
      if (auto a = (**g).artifact(name)) out[k][name] = std::string(*a);
  }
  return out;
}

// Exit codes of a reading child.
enum { kHit = 0, kMiss = 1, kWrong = 2, kNoOpen = 3 };

int read_one(const std::string& dir, const Key& k, const Artifacts& want) {
  auto t = open_lmdb_tier(dir, options());
  if (!t) return kNoOpen;
  auto g = (*t)->get(k);
  if (!g || !g->has_value()) return kMiss;
  for (const auto& [name, bytes] : want) {
    auto a = (**g).artifact(name);
    if (!a || *a != bytes) return kWrong;
  }
  return (**g).artifacts().size() == want.size() ? kHit : kWrong;
}

class LmdbDamagedFixture : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(LmdbDamagedFixture, EveryProcessEndsAndEveryArtifactIsTheOriginal) {
  TempDir tmp;
  std::vector<Key> keys = fixture_keys();
  ASSERT_EQ(keys.size(), 60u);
  std::map<Key, Artifacts> orig;
  // Read in a child: opening a tier starts a thread, and this process forks.
  {
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(p[0]);
      auto m = original_artifacts(keys, tmp.path());
      std::string blob;
      for (const auto& [k, arts] : m)
        for (const auto& [name, bytes] : arts) {
          uint64_t n = bytes.size();
          blob.append(reinterpret_cast<const char*>(k.bytes.data()), 16);
          blob.append(name.c_str(), 3);  // "a0\0" / "a1\0"
          blob.append(reinterpret_cast<const char*>(&n), 8);
          blob += bytes;
        }
      _exit(write_all(p[1], blob.data(), blob.size()) ? 0 : 3);
    }
    ::close(p[1]);
    // Read to the end before waiting: the blob is larger than a pipe holds.
    std::string blob;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof buf)) > 0) blob.append(buf, static_cast<size_t>(n));
    ::close(p[0]);
    int ws = 0;
    ASSERT_TRUE(wait_or_kill(pid, kLimitMs, &ws, "reading original/"));
    ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
    for (size_t at = 0; at + 27 <= blob.size();) {
      Key k;
      std::memcpy(k.bytes.data(), blob.data() + at, 16);
      std::string name(blob.data() + at + 16);
      uint64_t len;
      std::memcpy(&len, blob.data() + at + 19, 8);
      orig[k][name] = blob.substr(at + 27, len);
      at += 27 + len;
    }
  }
  ASSERT_EQ(orig.size(), keys.size());

  std::string dir = copy_store(GetParam(), tmp.path() + "/work");
  int hits = 0, misses = 0;
  for (const Key& k : keys) {
    int ws = run_child_bounded([&] { return read_one(dir, k, orig[k]); }, kLimitMs, GetParam() + " get " + k.hex());
    ASSERT_TRUE(WIFEXITED(ws)) << "get " << k.hex() << ": " << describe_wait(ws);
    ASSERT_NE(WEXITSTATUS(ws), kWrong) << "get " << k.hex() << " handed out bytes unlike the original";
    ASSERT_NE(WEXITSTATUS(ws), kNoOpen) << "the store did not open";
    (WEXITSTATUS(ws) == kHit ? hits : misses)++;
  }
  // verify --fix in its own process: it cannot free the damaged run, but
  // it ends, and without a signal.
  auto step = [&](const std::string& d, const std::string& what, const std::function<int(Tier&)>& fn) {
    int ws = run_child_bounded(
        [&] {
          auto t = open_lmdb_tier(d, options());
          return t ? fn(**t) : 2;
        },
        kLimitMs, GetParam() + " " + what);
    EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) <= 1) << what << ": " << describe_wait(ws);
  };
  step(dir, "verify --fix", [](Tier& t) { return t.admin()->verify(true).has_value() ? 0 : 1; });
  // A new process: the store (marked damaged) is moved aside and its intact
  // entries salvaged into a fresh one.
  int after_hits = 0, after_wrong = 0;
  for (const Key& k : keys) {
    int ws = run_child_bounded([&] { return read_one(dir, k, orig[k]); }, kLimitMs, GetParam() + " reopen " + k.hex());
    ASSERT_TRUE(WIFEXITED(ws)) << "get after reopen " << k.hex() << ": " << describe_wait(ws);
    after_hits += WEXITSTATUS(ws) == kHit;
    after_wrong += WEXITSTATUS(ws) == kWrong;
  }
  // On a second copy, eviction of everything and clear meet the damaged
  // run first: they must pass it over or refuse, never free it.
  std::string dir2 = copy_store(GetParam(), tmp.path() + "/work2");
  step(dir2, "trim to 0", [](Tier& t) { return t.admin()->trim(0).has_value() ? 0 : 1; });
  step(dir2, "clear", [](Tier& t) { return t.admin()->clear().is_ok() ? 0 : 1; });
  int wrong2 = 0;
  for (const Key& k : keys) {
    int ws = run_child_bounded([&] { return read_one(dir2, k, orig[k]); }, kLimitMs, GetParam() + " after clear");
    ASSERT_TRUE(WIFEXITED(ws)) << describe_wait(ws);
    wrong2 += WEXITSTATUS(ws) == kWrong;
  }
  EXPECT_EQ(wrong2, 0);
  bool aside = false;
  for (const auto& e : fs::directory_iterator(tmp.path() + "/work"))
    aside |= e.path().filename().string().find("lmdb.corrupt-") == 0;
  printf("[ %s ] first reads: %d hits, %d misses; after reopen: %d hits, %d wrong; moved aside: %s\n",
         GetParam().c_str(), hits, misses, after_hits, after_wrong, aside ? "yes" : "no");
  EXPECT_EQ(after_wrong, 0);
  EXPECT_TRUE(aside) << "the damaged store should have been moved aside";
  EXPECT_GE(hits, 58) << "one entry of each fixture is damaged";
  EXPECT_GE(after_hits, 58) << "the intact entries should have been salvaged";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LmdbDamagedFixture, ::testing::Values("aborts", "hangs-1", "hangs-2"),
                         [](const auto& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

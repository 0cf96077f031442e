// The folders above a disk store are checked as ssh's StrictModes checks
// those above a key file, and the files engine reads and writes only
// through the store folder it opened, with a real second user (uid 65534,
// "nobody"): files chown'ed to it and a forked child that setuid()s to it.
//
// * A store under a folder another user owns, or under a folder others may
//   write, is refused with one log line naming that folder; compiles go on
//   without the disk tier. A sticky folder (owned by root) or a root-owned
//   folder above the store ends the walk.
// * While a process runs, the other user renames the store folder away (in
//   a folder of theirs) and puts a prepared store in its place; or, in a
//   sticky /tmp-like folder, a tmp cleaner removes the store and the other
//   user makes one of their own under the same name. The running files
//   tier never hands out the other user's bytes, nor writes into their
//   store.
//
// Needs root (to chown and to setuid); skips otherwise. KCACHE_TEST_TRIALS sets
// the number of swap trials (default 20):
//   KCACHE_TEST_TRIALS=300 build/tests/tier/strict_modes_test
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

#include "cache/assembly.h"
#include "kcache/cache.h"
#include "robust_util.h"
#include "tier/core/folder_check.h"
#include "util/util.h"

namespace kcache {
namespace {

using test::log_lines;
using test::TempDir;

constexpr uid_t kOther = 65534;  // nobody
constexpr gid_t kOtherGroup = 65534;
constexpr int kEntries = 10;

int swap_trials() {
  const char* v = std::getenv("KCACHE_TEST_TRIALS");
  int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : test::trials(20, 5);
}

// Runs fn in a child process as the other user; returns fn's result, or -1.
int run_as_other(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    gid_t groups[] = {kOtherGroup};
    if (::setgroups(1, groups) != 0 || ::setgid(kOtherGroup) != 0 || ::setuid(kOther) != 0) ::_exit(100);
    ::umask(022);
    ::_exit(fn());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The other user's entry for key i: the same key, other bytes.
std::string foreign_bytes(int i) { return test::bytes_for(1'000'000 + i, 500); }
Entry foreign_entry(int i) {
  EntryBuilder b(test::key_of(i));
  b.add("obj", foreign_bytes(i));
  return *b.build();
}
Entry own_entry(int i) {
  EntryBuilder b(test::key_of(i));
  b.add("obj", test::bytes_for(i, 500));
  return *b.build();
}

CompileFn compile_of(int i) {
  return [i]() -> Expected<std::vector<Artifact>> {
    return std::vector<Artifact>{{"obj", test::bytes_for(static_cast<uint64_t>(i), 500)}};
  };
}

void mkdir_as(const std::string& path, mode_t mode, uid_t uid) {
  ASSERT_EQ(::mkdir(path.c_str(), 0700), 0) << path;
  ASSERT_EQ(::chown(path.c_str(), uid, uid == 0 ? 0 : kOtherGroup), 0) << path;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

class StrictModes : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to another user and to setuid into it";
    if (!engine_built(GetParam())) GTEST_SKIP() << "engine not built";
    // The other user must reach the folders below.
    ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
    log_ = tmp_.path() + "/kcache.log";
  }
  void TearDown() override { util::set_log(LogLevel::warn, ""); }

  Options options(const std::string& dir) const {
    Options o = test::disk_options(dir, /*memory=*/false);
    o.engine = GetParam();
    o.log_level = LogLevel::warn;
    o.log_file = log_;
    return o;
  }
  // Opens a cache in dir: whether it got its disk tier; every compile of
  // kEntries keys must succeed either way.
  bool opens_with_disk(const std::string& dir) {
    auto c = Cache::open(options(dir));
    for (int i = 0; i < kEntries; ++i) EXPECT_TRUE(c->get_or_compile(test::key_of(i), compile_of(i)).has_value());
    EXPECT_EQ(c->stats().compiles, static_cast<uint64_t>(kEntries));
    return !c->tiers().empty();
  }

  TempDir tmp_;
  std::string log_;
};

TEST_P(StrictModes, AStoreUnderAFolderAnotherUserOwnsIsRefusedWithOneLineNamingIt) {
  const std::string theirs = tmp_.path() + "/theirs";
  mkdir_as(theirs, 0755, kOther);
  EXPECT_FALSE(opens_with_disk(theirs + "/kc")) << "a store below another user's folder was opened";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + theirs + ","), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("owned by uid " + std::to_string(kOther)), std::string::npos) << lines[0];
}

TEST_P(StrictModes, AStoreUnderAFolderOthersMayWriteIsRefusedWithOneLineNamingIt) {
  const std::string open = tmp_.path() + "/open";
  mkdir_as(open, 0700, 0);
  for (mode_t mode : {0770, 0707, 0777}) {
    ASSERT_EQ(::chmod(open.c_str(), mode), 0);
    EXPECT_FALSE(opens_with_disk(open + "/kc")) << "parent mode " << std::oct << mode;
  }
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& l : lines) EXPECT_NE(l.find("refusing " + open + ","), std::string::npos) << l;
  EXPECT_NE(lines[0].find("writable by group"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("writable by every user"), std::string::npos) << lines[1];
  // Made private again, the same store opens.
  ASSERT_EQ(::chmod(open.c_str(), 0755), 0);
  EXPECT_TRUE(opens_with_disk(open + "/kc"));
}

TEST_P(StrictModes, ARootOwnedOrStickyFolderAboveTheStoreEndsTheWalk) {
  // Above both: a folder another user owns and everyone may write.
  const std::string wild = tmp_.path() + "/wild";
  mkdir_as(wild, 0777, kOther);
  const std::string sticky = wild + "/sticky";
  mkdir_as(sticky, 01777, 0);
  const std::string root_owned = wild + "/root";
  mkdir_as(root_owned, 0755, 0);
  EXPECT_TRUE(opens_with_disk(sticky + "/kc")) << "a root-owned sticky folder did not end the walk";
  EXPECT_TRUE(opens_with_disk(root_owned + "/kc")) << "a root-owned folder did not end the walk";
  EXPECT_EQ(log_lines(log_, "refusing").size(), 0u);
  // A sticky folder of another user is theirs to empty: refused.
  const std::string their_sticky = tmp_.path() + "/their-sticky";
  mkdir_as(their_sticky, 01777, kOther);
  EXPECT_FALSE(opens_with_disk(their_sticky + "/kc"));
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + their_sticky + ","), std::string::npos) << lines[0];
}

TEST_P(StrictModes, TheCheckFollowsLinksToTheRealFolders) {
  const std::string theirs = tmp_.path() + "/theirs";
  mkdir_as(theirs, 0755, kOther);
  mkdir_as(theirs + "/kc", 0700, 0);
  const std::string link = tmp_.path() + "/link";
  ASSERT_EQ(::symlink((theirs + "/kc").c_str(), link.c_str()), 0);
  EXPECT_FALSE(opens_with_disk(link)) << "a link hid the other user's folder above the store";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + theirs + ","), std::string::npos) << lines[0];
}

TEST_P(StrictModes, AFolderOfTheSharedGroupAboveTheStoreIsAcceptedOthersAreNot) {
  const std::string team = tmp_.path() + "/team";
  mkdir_as(team, 02770, 0);
  ASSERT_EQ(::chown(team.c_str(), 0, kOtherGroup), 0);
  ASSERT_EQ(::chmod(team.c_str(), 02770), 0);
  // The cache folder itself is private: only the one above is the group's.
  mkdir_as(team + "/kc", 0700, 0);
  Options o = options(team + "/kc");
  EXPECT_TRUE(Cache::open(o)->tiers().empty()) << "a group-writable folder was accepted without sharing";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + team + ","), std::string::npos) << lines[0];
  o.shared_group = std::to_string(kOtherGroup);
  EXPECT_FALSE(Cache::open(o)->tiers().empty()) << "the shared group's folder was refused";
}

INSTANTIATE_TEST_SUITE_P(Engines, StrictModes, ::testing::Values(Engine::lmdb, Engine::files),
                         [](const auto& info) { return std::string(engine_name(info.param)); });

// The check itself, without a cache around it.
TEST(StoreFolders, NotFoundForAMissingFolderOkForAPrivateOne) {
  TempDir t;
  EXPECT_EQ(check_store_folders(t.path() + "/none", {}).code(), Errc::not_found);
  EXPECT_TRUE(check_store_folders(t.path(), {}).is_ok()) << check_store_folders(t.path(), {}).to_string();
}

// ---- a store swapped under a running files tier ---------------------------

struct Seen {
  int own = 0, foreign = 0, missing = 0, other = 0;
};

// Reads every key from the running tier and sorts what came back.
Seen read_all(Tier& t) {
  Seen s;
  for (int i = 0; i < kEntries; ++i) {
    auto g = t.get(test::key_of(i));
    if (!g || !g->has_value()) {
      ++s.missing;
      continue;
    }
    auto obj = (**g).artifact("obj");
    if (obj && *obj == test::bytes_for(i, 500))
      ++s.own;
    else if (obj && *obj == foreign_bytes(i))
      ++s.foreign;
    else
      ++s.other;
  }
  return s;
}

// The other user's prepared store at `path`: every key, their bytes.
int prepare_foreign_store(const std::string& path) {
  DiskTierOptions o;
  o.durability = Durability::none;
  auto t = open_files_tier(path, o);
  if (!t) return 50;
  for (int i = 0; i < kEntries; ++i)
    if (!(*t)->put(foreign_entry(i)).is_ok()) return 51;
  return 0;
}

// Whether the other user's store at `path` got an entry for key i.
bool has_file_for(const std::string& path, int i) {
  std::string h = test::key_of(i).hex();
  struct stat st;
  return ::stat((path + "/" + h.substr(0, 2) + "/" + h + ".kce").c_str(), &st) == 0;
}

class SwappedStore : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to another user and to setuid into it";
  }
  // Runs the trials: `swap` replaces the store at `store` (made anew in
  // `parent` for each trial) while a tier holds it open.
  void run(const std::string& what, mode_t parent_mode, uid_t parent_owner,
           const std::function<int(const std::string& store, int trial)>& swap) {
    const int n = swap_trials();
    Seen total;
    int puts_redirected = 0;
    for (int trial = 0; trial < n; ++trial) {
      TempDir t;
      ASSERT_EQ(::chmod(t.path().c_str(), 0755), 0);
      const std::string parent = t.path() + "/parent";
      mkdir_as(parent, parent_mode, parent_owner);
      const std::string store = parent + "/store";
      DiskTierOptions o;
      o.durability = Durability::none;
      auto tier = open_files_tier(store, o);
      ASSERT_TRUE(tier.has_value()) << tier.error().to_string();
      for (int i = 0; i < kEntries; ++i) ASSERT_TRUE((*tier)->put(own_entry(i)).is_ok());
      ASSERT_EQ(read_all(**tier).own, kEntries);
      ASSERT_EQ(swap(store, trial), 0) << what << ": the swap itself failed";
      struct stat st;
      ASSERT_EQ(::stat(store.c_str(), &st), 0);
      ASSERT_EQ(st.st_uid, kOther) << "the store in place is the other user's";
      Seen s = read_all(**tier);
      total.own += s.own;
      total.foreign += s.foreign;
      total.missing += s.missing;
      total.other += s.other;
      // A put after the swap must not land in the other user's store.
      (void)(*tier)->put(own_entry(kEntries));
      if (has_file_for(store, kEntries)) ++puts_redirected;
    }
    std::printf(
        "[ %s ] %d trials x %d reads after the swap: %d own bytes, %d foreign, %d missing, %d other; "
        "%d puts into the other user's store\n",
        what.c_str(), n, kEntries, total.own, total.foreign, total.missing, total.other, puts_redirected);
    EXPECT_EQ(total.foreign, 0) << "the other user's bytes were handed out";
    EXPECT_EQ(total.other, 0);
    EXPECT_EQ(puts_redirected, 0);
  }
};

TEST_F(SwappedStore, RenamedAwayInTheOtherUsersFolderAndReplaced) {
  run("renamed and replaced", 0755, kOther, [](const std::string& store, int trial) {
    return run_as_other([&] {
      if (::rename(store.c_str(), (store + ".moved" + std::to_string(trial)).c_str()) != 0) return 40;
      return prepare_foreign_store(store);
    });
  });
}

TEST_F(SwappedStore, RemovedByATmpCleanerInAStickyFolderAndMadeAnewByTheOtherUser) {
  run("removed by a cleaner in a sticky folder", 01777, 0, [](const std::string& store, int) {
    // The cleaner (root) removes the store; the other user makes theirs.
    if (std::system(("rm -rf '" + store + "'").c_str()) != 0) return 60;
    return run_as_other([&] { return prepare_foreign_store(store); });
  });
}

}  // namespace
}  // namespace kcache

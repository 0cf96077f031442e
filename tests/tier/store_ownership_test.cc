// A disk store another user could have written is never trusted: a second
// real user (made with useradd) creates a cache folder inside a world-
// writable folder and fills it; this user's cache then refuses it (one log
// line, no disk tier, compiles still succeed) on both engines. Group- or
// world-writable folders and foreign files inside an own store are refused
// too. With a shared group (Options::shared_group / KCACHE_SHARED) members
// share one store in both directions, while other groups' write is still
// refused. Needs root (to add users and to setuid into one); skips otherwise.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "kcache/assembly.h"
#include "kcache/cache.h"
#include "kcache/lease.h"
#include "lease/table_layout.h"
#include "test_util.h"
#include "util/util.h"

namespace kcache {
namespace {

using test::log_lines;
using test::TempDir;

constexpr const char* kForeign = "kcache-foreign";  // a second user, member of kShared
constexpr const char* kShared = "kcache-share";     // the group they share with root
constexpr int kEntries = 10;

struct Ids {
  uid_t uid = 0;
  gid_t gid = 0;     // the user's own group
  gid_t shared = 0;  // kShared
};

// Adds the user and group once (idempotent); nullopt with *why when not root.
std::optional<Ids> foreign_user(std::string* why) {
  if (::geteuid() != 0) {
    *why = "needs root to add a second user and to setuid into it";
    return std::nullopt;
  }
  if (!::getgrnam(kShared)) (void)std::system((std::string("groupadd ") + kShared + " >/dev/null 2>&1").c_str());
  if (!::getpwnam(kForeign))
    (void)std::system(
        (std::string("useradd -M -r -s /usr/sbin/nologin -G ") + kShared + " " + kForeign + " >/dev/null 2>&1")
            .c_str());
  struct passwd* pw = ::getpwnam(kForeign);
  struct group* gr = ::getgrnam(kShared);
  if (!pw || !gr) {
    *why = "useradd/groupadd could not create the test user and group";
    return std::nullopt;
  }
  Ids ids{pw->pw_uid, pw->pw_gid, gr->gr_gid};
  return ids;
}

// Runs `fn` in a child process as the foreign user (with its groups);
// returns the child's exit code (fn's result), or -1.
int run_as(const Ids& ids, const std::function<int()>& fn) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    gid_t groups[] = {ids.gid, ids.shared};
    if (::setgroups(2, groups) != 0 || ::setgid(ids.gid) != 0 || ::setuid(ids.uid) != 0) ::_exit(100);
    ::umask(022);
    ::_exit(fn());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

CompileFn compile_of(int i) {
  return [i]() -> Expected<std::vector<Artifact>> {
    return std::vector<Artifact>{{"obj", test::bytes_for(static_cast<uint64_t>(i), 500)}};
  };
}

Options store_options(const std::string& dir, Engine engine, const std::string& log_file = {},
                      const std::string& shared = {}) {
  Options o = test::disk_options(dir, /*memory=*/false);
  o.engine = engine;
  o.log_level = LogLevel::warn;
  o.log_file = log_file;
  o.shared_group = shared;
  return o;
}

// Fills a store with the kEntries test entries; 0 when all were stored.
int fill(const Options& o) {
  auto c = Cache::open(o);
  if (c->tiers().empty()) return 10;
  for (int i = 0; i < kEntries; ++i) {
    if (!c->get_or_compile(test::key_of(i), compile_of(i)).has_value()) return 11;
  }
  (void)c->flush();
  return c->stats().tiers.at(0).stats.puts == static_cast<uint64_t>(kEntries) ? 0 : 12;
}

// How many of the kEntries test entries come from the disk tier.
int disk_hits(Cache& c) {
  int hits = 0;
  for (int i = 0; i < kEntries; ++i) {
    Source src = Source::compiled;
    auto e = c.get_or_compile(test::key_of(i), compile_of(i), &src);
    if (e.has_value() && src == Source::disk && test::bytes_for(i, 500) == *e->artifact("obj")) ++hits;
  }
  return hits;
}

class StoreOwnership : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    std::string why;
    auto ids = foreign_user(&why);
    if (!ids) GTEST_SKIP() << why;
    if (!engine_built(GetParam())) GTEST_SKIP() << "engine not built";
    ids_ = *ids;
    // A world-writable, sticky folder (like /tmp) both users can reach.
    ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
    pub_ = tmp_.path() + "/public";
    ASSERT_EQ(::mkdir(pub_.c_str(), 0777), 0);
    ASSERT_EQ(::chmod(pub_.c_str(), 01777), 0);
    log_ = tmp_.path() + "/kcache.log";
  }
  void TearDown() override { util::set_log(LogLevel::warn, ""); }

  Ids ids_;
  TempDir tmp_;
  std::string pub_, log_;
};

TEST_P(StoreOwnership, AStoreAnotherUserMadeIsRefusedWithOneLogLineAndCompilesStillSucceed) {
  const std::string dir = pub_ + "/kc";
  ASSERT_EQ(run_as(ids_, [&] { return fill(store_options(dir, GetParam())); }), 0);
  struct stat st;
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  ASSERT_EQ(st.st_uid, ids_.uid);  // really the other user's

  auto c = Cache::open(store_options(dir, GetParam(), log_));
  EXPECT_TRUE(c->tiers().empty()) << "the foreign store was opened";
  EXPECT_EQ(disk_hits(*c), 0);
  EXPECT_EQ(c->stats().compiles, static_cast<uint64_t>(kEntries));  // every compile succeeded
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(dir), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("owned by uid " + std::to_string(ids_.uid)), std::string::npos) << lines[0];

  // The refusal comes from the owner: with the owner's own rights the
  // entries are all there (so the refusal above is what hid them).
  EXPECT_EQ(run_as(ids_,
                   [&] {
                     auto own = Cache::open(store_options(dir, GetParam()));
                     return own->tiers().empty() ? 20 : disk_hits(*own) == kEntries ? 0 : 21;
                   }),
            0);
}

TEST_P(StoreOwnership, GroupOrWorldWritableFoldersAreRefused) {
  const std::string dir = tmp_.path() + "/own";
  ASSERT_EQ(fill(store_options(dir, GetParam())), 0);
  std::string engine_dir = dir + "/" + std::string(engine_name(GetParam()));
  for (const std::string& path : {dir, engine_dir}) {
    for (mode_t mode : {0770, 0707}) {
      ASSERT_EQ(::chmod(path.c_str(), mode), 0);
      auto c = Cache::open(store_options(dir, GetParam(), log_));
      EXPECT_TRUE(c->tiers().empty()) << path << " mode " << std::oct << mode;
      ASSERT_EQ(::chmod(path.c_str(), 0700), 0);
    }
  }
  EXPECT_EQ(log_lines(log_, "refusing").size(), 4u);
  auto c = Cache::open(store_options(dir, GetParam()));
  ASSERT_EQ(c->tiers().size(), 1u);
  EXPECT_EQ(disk_hits(*c), kEntries);
}

TEST_P(StoreOwnership, AForeignFileInsideAnOwnStoreIsRefused) {
  const std::string dir = tmp_.path() + "/own";
  ASSERT_EQ(fill(store_options(dir, GetParam())), 0);
  std::string engine_dir = dir + "/" + std::string(engine_name(GetParam()));
  // LMDB's data file; a shard folder of the files engine.
  std::string inner =
      GetParam() == Engine::lmdb ? engine_dir + "/data.mdb" : engine_dir + "/" + test::key_of(3).hex().substr(0, 2);
  ASSERT_EQ(::chown(inner.c_str(), ids_.uid, ids_.gid), 0);
  auto c = Cache::open(store_options(dir, GetParam(), log_));
  EXPECT_TRUE(c->tiers().empty());
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(inner), std::string::npos) << lines[0];
  EXPECT_EQ(disk_hits(*c), 0);
}

TEST_P(StoreOwnership, ASharedGroupSharesOneStoreBothWaysAndStillRefusesOthers) {
  const std::string dir = pub_ + "/team";
  // The other user makes the shared store and fills it.
  ASSERT_EQ(run_as(ids_, [&] { return fill(store_options(dir, GetParam(), {}, kShared)); }), 0);
  struct stat st;
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, ids_.shared);
  EXPECT_TRUE(st.st_mode & S_ISGID);
  EXPECT_TRUE(st.st_mode & S_IWGRP);
  EXPECT_FALSE(st.st_mode & S_IWOTH);

  // Without the option it is still refused.
  {
    auto c = Cache::open(store_options(dir, GetParam()));
    EXPECT_TRUE(c->tiers().empty());
  }
  // With it, this user reads the other's entries...
  {
    auto c = Cache::open(store_options(dir, GetParam(), log_, kShared));
    ASSERT_EQ(c->tiers().size(), 1u) << "shared store refused";
    EXPECT_EQ(disk_hits(*c), kEntries);
    // ...and adds one of its own (the store's counters are shared too).
    uint64_t puts = c->stats().tiers.at(0).stats.puts;
    ASSERT_TRUE(c->get_or_compile(test::key_of(100), compile_of(100)).has_value());
    (void)c->flush();
    EXPECT_EQ(c->stats().tiers.at(0).stats.puts, puts + 1);
  }
  EXPECT_EQ(log_lines(log_, "refusing").size(), 0u);
  // The other user reads this user's entry back from the shared store.
  EXPECT_EQ(run_as(ids_,
                   [&] {
                     auto c = Cache::open(store_options(dir, GetParam(), {}, kShared));
                     if (c->tiers().empty()) return 30;
                     Source src = Source::compiled;
                     auto e = c->get_or_compile(test::key_of(100), compile_of(100), &src);
                     return e.has_value() && src == Source::disk ? 0 : 31;
                   }),
            0);

  // Write permission for another group, or for everyone, is still refused.
  std::string engine_dir = dir + "/" + std::string(engine_name(GetParam()));
  ASSERT_EQ(::chown(engine_dir.c_str(), static_cast<uid_t>(-1), 65534), 0);  // nogroup
  {
    auto c = Cache::open(store_options(dir, GetParam(), log_, kShared));
    EXPECT_TRUE(c->tiers().empty());
  }
  ASSERT_EQ(::chown(engine_dir.c_str(), static_cast<uid_t>(-1), ids_.shared), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 02777), 0);
  {
    auto c = Cache::open(store_options(dir, GetParam(), log_, kShared));
    EXPECT_TRUE(c->tiers().empty());
  }
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("in group 65534"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(", not the shared group"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("writable by every user"), std::string::npos) << lines[1];
}

// The lease table is made by the first process to open the store: a group
// member that did not make it maps it and takes leases in it. The member's
// lease, left behind when it exits, is taken over here: it was written into
// this user's file.
TEST_P(StoreOwnership, AGroupMemberTakesLeasesInATableAnotherUserMade) {
  if (GetParam() != Engine::lmdb) GTEST_SKIP() << "one lease table for both engines";
  const std::string dir = pub_ + "/leases";
  ASSERT_EQ(::mkdir(dir.c_str(), 0770), 0);
  ASSERT_EQ(::chown(dir.c_str(), static_cast<uid_t>(-1), ids_.shared), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 02770), 0);
  auto mine = open_table_leases(dir);
  ASSERT_TRUE(mine.has_value()) << mine.error().to_string();
  struct stat st;
  ASSERT_EQ(::stat((dir + "/" + lease::table::kFileName).c_str(), &st), 0);
  ASSERT_EQ(st.st_uid, ::geteuid());
  const Key k = test::key_of(7);
  EXPECT_EQ(run_as(ids_,
                   [&] {
                     auto theirs = open_table_leases(dir);
                     if (!theirs) return 40;
                     return (*theirs)->acquire(k, 60000) == LeaseResult::acquired ? 0 : 41;
                   }),
            0);
  EXPECT_EQ((*mine)->acquire(k, 60000), LeaseResult::acquired);
  EXPECT_EQ((*mine)->takeovers(), 1u);
}

TEST_P(StoreOwnership, AnUnknownSharedGroupLeavesTheDiskOutWithAClearMessage) {
  const std::string dir = tmp_.path() + "/own";
  auto c = Cache::open(store_options(dir, GetParam(), log_, "kcache-no-such-group"));
  EXPECT_TRUE(c->tiers().empty());
  ASSERT_TRUE(c->get_or_compile(test::key_of(1), compile_of(1)).has_value());
  auto lines = log_lines(log_, "kcache-no-such-group");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("does not exist"), std::string::npos) << lines[0];
}

TEST_P(StoreOwnership, TheEnvironmentNamesTheSharedGroup) {
  ::setenv("KCACHE_SHARED", kShared, 1);
  Options o = Options::from_env();
  ::unsetenv("KCACHE_SHARED");
  EXPECT_EQ(o.shared_group, kShared);
}

INSTANTIATE_TEST_SUITE_P(Engines, StoreOwnership, ::testing::Values(Engine::lmdb, Engine::files),
                         [](const auto& info) { return std::string(engine_name(info.param)); });

}  // namespace
}  // namespace kcache

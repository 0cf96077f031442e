// The folders above a disk store are checked as ssh's StrictModes checks
// those above a key file, and the files engine reads and writes only
// through the store folder it opened.
//
// * A store under a folder another user owns, or under a folder others may
//   write, is refused with one log line naming that folder; compiles go on
//   without the disk tier. A sticky folder (owned by root) or a root-owned
//   folder above the store ends the walk. Owners come from the Cache's Env
//   (tests/support/fault_env.h shows a folder as another user's or root's),
//   modes are real, so these run as any user; one test (root only) makes
//   the other user's folder with a real chown.
// * While a process runs, the store folder is renamed away and a prepared
//   store put in its place; or, in a sticky /tmp-like folder, a tmp cleaner
//   removes the store and a new one is made under the same name. The
//   running files tier never hands out the new store's bytes, nor writes
//   into it. As root the swap is made by a real second user (uid 65534,
//   "nobody", in a forked child that setuid()s to it); as any other user,
//   by a forked child of the same user.
//
// KCACHE_TEST_TRIALS sets the number of swap trials (default 20):
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
#include "fault_env.h"
#include "kcache/cache.h"
#include "robust_util.h"
#include "tier/core/folder_check.h"
#include "util/util.h"

namespace kcache {
namespace {

using test::log_lines;
using test::TempDir;

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;
constexpr int kEntries = 10;

// Another user than this one: nobody, or (for nobody itself) the uid below.
uid_t other_uid() { return ::geteuid() == kNobody ? kNobody - 1 : kNobody; }
gid_t other_gid() { return ::getegid() == kNogroup ? kNogroup - 1 : kNogroup; }

int swap_trials() {
  const char* v = std::getenv("KCACHE_TEST_TRIALS");
  int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : test::trials(20, 5);
}

// Runs fn in a child process: as the other user (nobody) when this process
// is root, else as this user. Returns fn's result, or -1.
int run_as_other(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (::geteuid() == 0) {
      gid_t groups[] = {kNogroup};
      if (::setgroups(1, groups) != 0 || ::setgid(kNogroup) != 0 || ::setuid(kNobody) != 0) ::_exit(100);
    }
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

// A real folder with `mode`, really owned by `uid` (root only: chown).
void mkdir_owned(const std::string& path, mode_t mode, uid_t uid) {
  ASSERT_EQ(::mkdir(path.c_str(), 0700), 0) << path;
  ASSERT_EQ(::chown(path.c_str(), uid, uid == 0 ? 0 : kNogroup), 0) << path;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

class StrictModes : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    if (!engine_built(GetParam())) GTEST_SKIP() << "engine not built";
    env_->manual_clock = false;
    log_ = tmp_.path() + "/kcache.log";
  }
  void TearDown() override { util::set_log(LogLevel::warn, ""); }

  // A folder with `mode` (real) that the Cache's Env shows as owned by
  // `uid` (root's group for root, else the other group).
  void mkdir_as(const std::string& path, mode_t mode, uid_t uid) {
    ASSERT_EQ(::mkdir(path.c_str(), 0700), 0) << path;
    ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
    if (uid != ::geteuid()) {
      ASSERT_TRUE(env_->show_as(path, {uid, uid == 0 ? 0 : other_gid(), {}})) << path;
    }
  }

  Options options(const std::string& dir) const {
    Options o = test::disk_options(dir, /*memory=*/false);
    o.engine = GetParam();
    o.log_level = LogLevel::warn;
    o.log_file = log_;
    o.env = env_;
    return o;
  }
  // Opens a cache in dir: whether it got its disk tier; every compile of
  // kEntries keys must succeed either way.
  bool opens_with_disk(const std::string& dir) { return opens_with_disk(options(dir)); }
  bool opens_with_disk(const Options& o) {
    auto c = Cache::open(o);
    for (int i = 0; i < kEntries; ++i) EXPECT_TRUE(c->get_or_compile(test::key_of(i), compile_of(i)).has_value());
    EXPECT_EQ(c->stats().compiles, static_cast<uint64_t>(kEntries));
    return !c->tiers().empty();
  }

  TempDir tmp_;
  std::string log_;
  std::shared_ptr<test::FaultEnv> env_ = std::make_shared<test::FaultEnv>();
};

TEST_P(StrictModes, AStoreUnderAFolderAnotherUserOwnsIsRefusedWithOneLineNamingIt) {
  const std::string theirs = tmp_.path() + "/theirs";
  mkdir_as(theirs, 0755, other_uid());
  EXPECT_FALSE(opens_with_disk(theirs + "/kc")) << "a store below another user's folder was opened";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + theirs + ","), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("owned by uid " + std::to_string(other_uid())), std::string::npos) << lines[0];
  // Shown as this user's again, the same folder is accepted.
  env_->show_real(theirs);
  EXPECT_TRUE(opens_with_disk(theirs + "/kc"));
}

// The same with a real second user: the folder chown'ed to nobody.
TEST_P(StrictModes, AStoreUnderAFolderARealOtherUserOwnsIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to another user";
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  const std::string theirs = tmp_.path() + "/theirs";
  mkdir_owned(theirs, 0755, kNobody);
  Options o = options(theirs + "/kc");
  o.env = nullptr;  // the system's own answers
  EXPECT_FALSE(opens_with_disk(o)) << "a store below another user's folder was opened";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + theirs + ","), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("owned by uid " + std::to_string(kNobody)), std::string::npos) << lines[0];
}

TEST_P(StrictModes, AStoreUnderAFolderOthersMayWriteIsRefusedWithOneLineNamingIt) {
  const std::string open = tmp_.path() + "/open";
  mkdir_as(open, 0700, ::geteuid());
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
  mkdir_as(wild, 0777, other_uid());
  const std::string sticky = wild + "/sticky";
  mkdir_as(sticky, 01777, 0);
  const std::string root_owned = wild + "/root";
  mkdir_as(root_owned, 0755, 0);
  EXPECT_TRUE(opens_with_disk(sticky + "/kc")) << "a root-owned sticky folder did not end the walk";
  EXPECT_TRUE(opens_with_disk(root_owned + "/kc")) << "a root-owned folder did not end the walk";
  EXPECT_EQ(log_lines(log_, "refusing").size(), 0u);
  // A sticky folder of another user is theirs to empty: refused.
  const std::string their_sticky = tmp_.path() + "/their-sticky";
  mkdir_as(their_sticky, 01777, other_uid());
  EXPECT_FALSE(opens_with_disk(their_sticky + "/kc"));
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + their_sticky + ","), std::string::npos) << lines[0];
}

TEST_P(StrictModes, TheCheckFollowsLinksToTheRealFolders) {
  const std::string theirs = tmp_.path() + "/theirs";
  mkdir_as(theirs, 0755, other_uid());
  mkdir_as(theirs + "/kc", 0700, ::geteuid());
  const std::string link = tmp_.path() + "/link";
  ASSERT_EQ(::symlink((theirs + "/kc").c_str(), link.c_str()), 0);
  EXPECT_FALSE(opens_with_disk(link)) << "a link hid the other user's folder above the store";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + theirs + ","), std::string::npos) << lines[0];
}

TEST_P(StrictModes, AFolderOfTheSharedGroupAboveTheStoreIsAcceptedOthersAreNot) {
  // This process's own group is one it is a member of, whoever runs it.
  const std::string team = tmp_.path() + "/team";
  mkdir_as(team, 02770, ::geteuid());
  // The cache folder itself is private: only the one above is the group's.
  mkdir_as(team + "/kc", 0700, ::geteuid());
  Options o = options(team + "/kc");
  EXPECT_TRUE(Cache::open(o)->tiers().empty()) << "a group-writable folder was accepted without sharing";
  auto lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("refusing " + team + ","), std::string::npos) << lines[0];
  o.shared_group = std::to_string(::getegid());
  EXPECT_FALSE(Cache::open(o)->tiers().empty()) << "the shared group's folder was refused";
  // Shown in another group, it is refused again for a new store beside
  // (for the one made above, a root-owned store folder ends the walk).
  ASSERT_TRUE(env_->show_as(team, {{}, other_gid(), {}}));
  o.dir = team + "/kc2";
  EXPECT_TRUE(Cache::open(o)->tiers().empty()) << "a folder of another group was accepted";
  lines = log_lines(log_, "refusing");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("refusing " + team + ","), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("not the shared group"), std::string::npos) << lines[1];
}

INSTANTIATE_TEST_SUITE_P(Engines, StrictModes, ::testing::Values(Engine::lmdb, Engine::files),
                         [](const auto& info) { return std::string(engine_name(info.param)); });

// The check itself, without a cache around it.
TEST(StoreFolders, NotFoundForAMissingFolderOkForAPrivateOne) {
  TempDir t;
  EXPECT_EQ(check_store_folders(t.path() + "/none", {}).code(), Errc::not_found);
  EXPECT_TRUE(check_store_folders(t.path(), {}).is_ok()) << check_store_folders(t.path(), {}).to_string();
}

// A folder of the walk that cannot be opened or judged is an error that
// names it, never a pass.
TEST(StoreFolders, AFolderThatCannotBeOpenedIsAnErrorNamingIt) {
  TempDir t;
  test::FaultEnv env;
  env.manual_clock = false;
  env.denied = true;
  Status s = check_store_folders(t.path(), {}, env);
  EXPECT_EQ(s.code(), Errc::read_only) << s.to_string();
  EXPECT_NE(s.message().find(t.path()), std::string::npos) << s.to_string();
  env.denied = false;
  EXPECT_TRUE(check_store_folders(t.path(), {}, env).is_ok());
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
      if (::geteuid() == 0) {
        mkdir_owned(parent, parent_mode, parent_owner);
      } else {
        ASSERT_EQ(::mkdir(parent.c_str(), 0700), 0);
        ASSERT_EQ(::chmod(parent.c_str(), parent_mode), 0);
      }
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
      if (::geteuid() == 0) {
        ASSERT_EQ(st.st_uid, kNobody) << "the store in place is the other user's";
      }
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
  run("renamed and replaced", 0755, kNobody, [](const std::string& store, int trial) {
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

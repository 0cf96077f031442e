// A disk tier behind the read-only wrapper never writes to its store: the
// wrapper turns repair off on the tier it wraps, and then a corrupt entry
// is reported (and counted in this process) but not removed, and hits do
// not write recency or counters. Checked with inotify on the store's
// folders (any modification, attribute change, create, delete or rename),
// and, where this process may mount, on a folder made read-only underneath
// an open tier.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr size_t kSize = 20000;

DiskTierOptions options() {
  DiskTierOptions o;
  o.durability = Durability::none;
  o.recency_batch = 2;  // a writer would flush recency after two hits
  return o;
}

size_t count_entries(Tier& t) {
  size_t n = 0;
  EXPECT_TRUE(t.list([&](const ListItem&) {
                 ++n;
                 return true;
               }).is_ok());
  return n;
}

// Flips one payload byte of key 1's stored entry, in place.
void corrupt_entry_1(const std::string& engine, const std::string& dir) {
  if (engine == "files") {
    std::string h = key_of(1).hex();
    std::fstream f(dir + "/" + h.substr(0, 2) + "/" + h + ".kce", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(kEntryHeaderSize + 300);
    char c = static_cast<char>(f.get());
    f.seekp(kEntryHeaderSize + 300);
    f.put(static_cast<char>(c ^ 0x5a));
    return;
  }
  std::fstream f(dir + "/data.mdb", std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  std::string all((std::istreambuf_iterator<char>(f)), {});
  std::string needle = bytes_for(1, kSize).substr(0, 256);
  size_t at = all.find(needle);
  ASSERT_NE(at, std::string::npos) << "entry bytes not found in data.mdb";
  for (; at != std::string::npos; at = all.find(needle, at + 1)) {
    f.seekp(static_cast<std::streamoff>(at + 100));
    f.put(static_cast<char>(all[at + 100] ^ 0x5a));
  }
}

// Watches every folder of a store for changes.
class Watch {
 public:
  explicit Watch(const std::string& dir) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    const uint32_t mask = IN_MODIFY | IN_ATTRIB | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO;
    add(dir, mask);
    for (const auto& de : std::filesystem::recursive_directory_iterator(dir))
      if (de.is_directory()) add(de.path().string(), mask);
  }
  ~Watch() { ::close(fd_); }
  bool ok() const { return fd_ >= 0; }
  // "folder/name:mask" for every event so far.
  std::vector<std::string> events() {
    std::vector<std::string> out;
    alignas(struct inotify_event) char buf[8192];
    for (;;) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<struct inotify_event*>(p);
        std::string name = ev->len ? ev->name : "";
        out.push_back(dirs_[ev->wd] + "/" + name + ":" + std::to_string(ev->mask));
        p += sizeof(struct inotify_event) + ev->len;
      }
    }
    return out;
  }

 private:
  void add(const std::string& d, uint32_t mask) {
    int wd = ::inotify_add_watch(fd_, d.c_str(), mask);
    if (wd >= 0) dirs_[wd] = d;
  }
  int fd_;
  std::map<int, std::string> dirs_;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

class ReadOnlyNoWrite : public ::testing::TestWithParam<DiskEngine> {};

}  // namespace

TEST_P(ReadOnlyNoWrite, CorruptEntryIsReportedNotRemovedAndNothingIsWritten) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  std::string dir = td.path() + "/store";
  {
    auto w = eng.open(dir, options());
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_TRUE((*w)->put(make_entry(1, kSize)).is_ok());
    ASSERT_TRUE((*w)->put(make_entry(2, kSize)).is_ok());
    ASSERT_TRUE((*w)->flush().is_ok());
  }
  corrupt_entry_1(eng.name, dir);
  if (HasFatalFailure()) return;
  TierStats stored;
  {
    auto ro = make_read_only(*eng.open(dir, options()));
    stored = ro->stats();
    Watch watch(dir);
    ASSERT_TRUE(watch.ok());

    auto bad = ro->get(key_of(1));
    ASSERT_FALSE(bad.has_value()) << "a corrupt entry was handed out";
    EXPECT_EQ(bad.error().code(), Errc::corrupt);
    for (int i = 0; i < 20; ++i) {
      auto good = ro->get(key_of(2));
      ASSERT_TRUE(good && good->has_value());
      EXPECT_TRUE(entry_ok(**good, 2, kSize));
    }
    auto miss = ro->get(key_of(3));
    ASSERT_TRUE(miss && !miss->has_value());
    TierStats s = ro->stats();
    EXPECT_EQ(s.corrupt, stored.corrupt + 1);
    EXPECT_EQ(s.hits, stored.hits + 20);
    EXPECT_EQ(s.misses, stored.misses + 1);
    EXPECT_EQ(count_entries(*ro), 2u);
    auto rep = ro->verify(false);
    ASSERT_TRUE(rep.has_value()) << rep.error().to_string();
    EXPECT_EQ(rep->bad.size(), 1u);
    if (!rep->bad.empty()) {
      EXPECT_EQ(rep->bad[0].first, key_of(1));
    }
    EXPECT_FALSE(ro->verify(true).has_value());
    EXPECT_TRUE(ro->flush().is_ok());
    usleep(200 * 1000);  // time for a background flush to show, were there one
    ro.reset();          // closing flushes nothing either
    auto ev = watch.events();
    EXPECT_TRUE(ev.empty()) << "the read-only tier wrote to its store:\n" << join(ev);
  }

  // Still there for a writer, which counts and removes it.
  auto w = eng.open(dir, options());
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(count_entries(**w), 2u);
  EXPECT_EQ((*w)->stats().corrupt, stored.corrupt) << "a read-only process stored a counter";
  auto bad = (*w)->get(key_of(1));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), Errc::corrupt);
  EXPECT_EQ(count_entries(**w), 1u);
}

// The folder becomes read-only underneath an open files tier (a bind mount
// remounted read-only, in a mount namespace of a child): reads still work,
// and flush has nothing to write, so it cannot fail.
TEST(ReadOnlyNoWriteMount, FilesTierOnAReadOnlyMount) {
  TempDir td;
  std::string dir = td.path() + "/store";
  {
    auto w = open_files_tier(dir, options());
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_TRUE((*w)->put(make_entry(1, kSize)).is_ok());
    ASSERT_TRUE((*w)->put(make_entry(2, kSize)).is_ok());
  }
  corrupt_entry_1("files", dir);
  if (HasFatalFailure()) return;
  int ws = run_child([&] {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    auto ro = make_read_only(*open_files_tier(dir, options()));
    if (::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
      return 77;
    if (::access((dir + "/stats").c_str(), W_OK) == 0) return 77;  // not read-only after all
    auto bad = ro->get(key_of(1));
    if (bad || bad.error().code() != Errc::corrupt) return 60;
    for (int i = 0; i < 10; ++i) {
      auto good = ro->get(key_of(2));
      if (!good || !good->has_value() || !entry_ok(**good, 2, kSize)) return 61;
    }
    if (!ro->flush().is_ok()) return 62;
    if (ro->stats().corrupt != 1) return 63;
    auto rep = ro->verify(false);
    if (!rep || rep->bad.size() != 1) return 64;
    ro.reset();
    // Opened on the read-only mount: the store still serves lookups.
    auto late = open_files_tier(dir, options());
    if (!late) return 65;
    auto hit = make_read_only(*late)->get(key_of(2));
    if (!hit || !hit->has_value() || !entry_ok(**hit, 2, kSize)) return 66;
    return 0;
  });
  if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77) GTEST_SKIP() << "cannot make a read-only bind mount here";
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << describe_wait(ws);
  auto w = open_files_tier(dir, options());
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(count_entries(**w), 2u);
}

INSTANTIATE_TEST_SUITE_P(Engines, ReadOnlyNoWrite, ::testing::ValuesIn(disk_engines()), disk_engine_name);

// A disk tier opened read-only (DiskTierOptions::read_only) never writes to
// its store: a corrupt entry is reported (and counted in this process) but
// not removed, and hits do not write recency or counters. The read-only
// wrapper in front of it changes nothing of that, nor of the inner tier. Checked with inotify on the store's
// folders (any modification, attribute change, create, delete or rename),
// and, where this process may mount, on a folder made read-only underneath
// an open tier.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "cache/assembly.h"
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

DiskTierOptions read_only_options() {
  DiskTierOptions o = options();
  o.read_only = true;
  return o;
}

size_t count_entries(Tier& t) {
  size_t n = 0;
  EXPECT_TRUE(t.admin()
                  ->list([&](const ListItem&) {
                    ++n;
                    return true;
                  })
                  .is_ok());
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

// A writable store in `dir` with entries 1 and 2, then entry 1 damaged on
// disk. Check HasFatalFailure() after it.
void store_two_and_corrupt_the_first(const DiskEngine& eng, const std::string& dir) {
  {
    auto w = eng.open(dir, options());
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_TRUE((*w)->put(make_entry(1, kSize)).is_ok());
    ASSERT_TRUE((*w)->put(make_entry(2, kSize)).is_ok());
    ASSERT_TRUE((*w)->flush().is_ok());
  }
  corrupt_entry_1(eng.name, dir);
}

}  // namespace

TEST_P(ReadOnlyNoWrite, CorruptEntryIsReportedNotRemovedAndNothingIsWritten) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  std::string dir = td.path() + "/store";
  store_two_and_corrupt_the_first(eng, dir);
  if (HasFatalFailure()) return;
  TierStats stored;
  {
    auto opened = eng.open(dir, read_only_options());
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    EXPECT_FALSE((*opened)->writable());
    auto ro = make_read_only(*opened);
    opened = Status(Errc::internal, "");  // the wrapper holds the only reference
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
    auto rep = ro->admin()->verify(false);
    ASSERT_TRUE(rep.has_value()) << rep.error().to_string();
    EXPECT_EQ(rep->bad.size(), 1u);
    if (!rep->bad.empty()) {
      EXPECT_EQ(rep->bad[0].first, key_of(1));
    }
    EXPECT_FALSE(ro->admin()->verify(true).has_value());
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

// A peek (Access::peek) of a writable store is a diagnostic: it reports a
// corrupt entry without counting or removing it, and writes nothing at all,
// not even at flush; a use of the same entry then counts and removes it.
TEST_P(ReadOnlyNoWrite, PeekLeavesACorruptEntryAndWritesNothing) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  std::string dir = td.path() + "/store";
  store_two_and_corrupt_the_first(eng, dir);
  if (HasFatalFailure()) return;
  auto t = eng.open(dir, options());
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  const TierStats before = (*t)->stats();
  {
    Watch watch(dir);
    ASSERT_TRUE(watch.ok());
    for (int i = 0; i < 5; ++i) {
      auto bad = (*t)->get(key_of(1), Access::peek);
      ASSERT_FALSE(bad.has_value()) << "a corrupt entry was handed out";
      EXPECT_EQ(bad.error().code(), Errc::corrupt);
      auto good = (*t)->get(key_of(2), Access::peek);
      ASSERT_TRUE(good && good->has_value());
      EXPECT_TRUE(entry_ok(**good, 2, kSize));
      ASSERT_TRUE((*t)->get(key_of(3), Access::peek)->has_value() == false);
    }
    EXPECT_TRUE((*t)->flush().is_ok());
    usleep(200 * 1000);  // time for a background flush to show, were there one
    auto ev = watch.events();
    EXPECT_TRUE(ev.empty()) << "a peek wrote to the store:\n" << join(ev);
  }
  const TierStats after = (*t)->stats();
  for (const auto& f : TierStats::kFields) EXPECT_EQ(after.*f.member, before.*f.member) << f.name;
  EXPECT_EQ(count_entries(**t), 2u);
  auto bad = (*t)->get(key_of(1));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), Errc::corrupt);
  EXPECT_EQ((*t)->stats().corrupt, before.corrupt + 1);
  EXPECT_EQ(count_entries(**t), 1u);
}

// Every write through a store opened read-only is refused with read_only,
// counted as rejected in this process, and the store keeps what it had.
TEST_P(ReadOnlyNoWrite, OpenedReadOnlyRefusesEveryWrite) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  std::string dir = td.path() + "/store";
  {
    auto w = eng.open(dir, options());
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_TRUE((*w)->put(make_entry(1, kSize)).is_ok());
  }
  auto ro = eng.open(dir, read_only_options());
  ASSERT_TRUE(ro.has_value()) << ro.error().to_string();
  Tier& t = **ro;
  EXPECT_FALSE(t.writable());
  ASSERT_NE(t.admin(), nullptr);
  EXPECT_EQ(t.put(make_entry(2, kSize)).code(), Errc::read_only);
  auto many = t.put_many({make_entry(3, kSize)});
  ASSERT_EQ(many.size(), 1u);
  EXPECT_EQ(many[0].code(), Errc::read_only);
  EXPECT_EQ(t.remove(key_of(1)).code(), Errc::read_only);
  EXPECT_EQ(t.admin()->trim(0).error().code(), Errc::read_only);
  EXPECT_EQ(t.admin()->clear().code(), Errc::read_only);
  EXPECT_EQ(t.admin()->verify(true).error().code(), Errc::read_only);
  EXPECT_EQ(t.stats().rejected, 6u);
  auto v = t.admin()->verify(false);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->checked, 1u);
  EXPECT_EQ(count_entries(t), 1u);
  auto hit = t.get(key_of(1));
  ASSERT_TRUE(hit && hit->has_value());
  EXPECT_TRUE(entry_ok(**hit, 1, kSize));
}

// Wrapping a tier others share leaves it as it was: the shared tier still
// removes the corrupt entry it finds, and still takes puts.
TEST_P(ReadOnlyNoWrite, WrapperLeavesTheSharedTierAsItWas) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  std::string dir = td.path() + "/store";
  store_two_and_corrupt_the_first(eng, dir);
  if (HasFatalFailure()) return;
  auto shared = eng.open(dir, options());
  ASSERT_TRUE(shared.has_value()) << shared.error().to_string();
  auto ro = make_read_only(*shared);
  EXPECT_FALSE(ro->writable());
  EXPECT_TRUE((*shared)->writable());
  EXPECT_EQ(ro->put(make_entry(3, kSize)).code(), Errc::read_only);
  auto bad = (*shared)->get(key_of(1));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), Errc::corrupt);
  EXPECT_EQ(count_entries(**shared), 1u) << "the shared tier no longer removes corrupt entries";
  ASSERT_TRUE((*shared)->put(make_entry(3, kSize)).is_ok());
  EXPECT_EQ(count_entries(*ro), 2u);
}

// Options::read_only opens the disk store read-only (DiskStoreSpec::from),
// so the engine itself writes nothing, with or without a wrapper.
TEST_P(ReadOnlyNoWrite, ReadOnlyOptionsOpenTheStoreReadOnly) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  Options o;
  o.dir = td.path();
  o.engine = parse_engine(eng.name);
  o.read_only = true;
  DiskStoreSpec spec = DiskStoreSpec::from(o);
  EXPECT_TRUE(spec.read_only);
  EXPECT_FALSE(spec.leases);
  // A read-only cache creates nothing: a missing store is not_found, and
  // the folder stays empty.
  auto missing = open_disk_store(spec);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), Errc::not_found);
  struct stat st;
  EXPECT_NE(::stat(spec.path().c_str(), &st), 0) << "the read-only open made " << spec.path();
  {
    DiskStoreSpec writer = spec;
    writer.read_only = false;
    ASSERT_TRUE(open_disk_store(writer).has_value());
  }
  auto d = open_disk_store(spec);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_FALSE(d->tier->writable());
  EXPECT_EQ(d->tier->name(), std::string(eng.name) + "(ro)");
  EXPECT_EQ(d->tier->put(make_entry(1, kSize)).code(), Errc::read_only);
  o.read_only = false;
  EXPECT_FALSE(DiskStoreSpec::from(o).read_only);
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
    auto ro = make_read_only(*open_files_tier(dir, read_only_options()));
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
    auto rep = ro->admin()->verify(false);
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

// Bit flips and truncation anywhere in a disk store's files.
//
// A store of entries of many sizes is built once; each trial copies it,
// damages the copy (one class of damage per trial), and reads every key in a
// forked child, so that a crash shows up as a signal instead of ending the
// test. For every key the answer must be the exact bytes, or a miss/fault;
// never wrong bytes, never a crash. A damaged LMDB store may also be moved
// aside (quarantined) and replaced by an empty one, which must then work.
//
// A second LMDB suite writes random bytes (up to 8 KiB) over overflow or
// leaf pages, then reads, repairs (verify --fix, re-puts of what missed),
// trims and clears the store in a child under a watchdog, and reads it once
// more from a new process (which may move it aside and salvage it): no
// abort, no hang, no wrong byte.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "robust_util.h"
#include "util/util.h"

using namespace kcache;
using namespace kcache::test;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kKeys = 40;
constexpr uint64_t kProbeKey = 100000;

size_t size_for(uint64_t k) {
  if (k % 13 == 7) return (1u << 20) + k * 37;  // large: LMDB overflow runs
  if (k % 2 == 0) return 100 + k * 29;          // small: inside LMDB leaf pages
  return 3000 + k * 977;                        // medium: one to a few overflow pages
}

DiskTierOptions options() {
  DiskTierOptions o;
  o.durability = Durability::none;
  return o;
}

struct Outcome {
  uint32_t correct = 0, miss = 0, fault = 0, wrong = 0;
  uint32_t silent_miss = 0;  // a miss with no corrupt/errors counter moved
  uint32_t open_failed = 0;  // the tier did not open (Cache would run without it)
  uint32_t usable = 0;       // a fresh put then get worked afterwards
  uint32_t verify_ok = 0;    // verify(false) ran without error
};

// For the files engine: whether the entry file of `k` exists and its header
// no longer says format version 1 (bytes 8..11).
bool version_field_changed(const DiskEngine& eng, const std::string& dir, const Key& k) {
  if (eng.name != "files") return false;
  std::string h = k.hex();
  auto data = kcache::util::read_file(dir + "/" + h.substr(0, 2) + "/" + h + ".kce", 1 << 30);
  if (!data || data->size() < 12) return false;
  return kcache::util::get_u32(data->data() + 8) != kcache::kEntryFormatVersion;
}

// The child: read every key, then check the store still takes writes.
Outcome read_all(const DiskEngine& eng, const std::string& dir) {
  Outcome o;
  auto t = eng.open(dir, options());
  if (!t) {
    o.open_failed = 1;
    return o;
  }
  Tier& tier = **t;
  for (uint64_t k = 0; k < kKeys; ++k) {
    uint64_t before = tier.stats().corrupt + tier.stats().errors;
    auto g = tier.get(key_of(k));
    if (!g) {
      ++o.fault;
    } else if (!g->has_value()) {
      ++o.miss;
      // A flip in an entry's version field reads as another format version:
      // a miss that, by design, moves no counter (the entry is not removed).
      if (tier.stats().corrupt + tier.stats().errors == before && !version_field_changed(eng, dir, key_of(k)))
        ++o.silent_miss;
    } else if (entry_ok(**g, k, size_for(k))) {
      ++o.correct;
    } else {
      ++o.wrong;
    }
  }
  auto v = tier.admin()->verify(false);
  o.verify_ok = v.has_value();
  if (tier.put(make_entry(kProbeKey, 5000)).is_ok()) {
    auto g = tier.get(key_of(kProbeKey));
    o.usable = g && g->has_value() && entry_ok(**g, kProbeKey, 5000);
  }
  return o;
}

void flip_bits(const std::string& path, std::mt19937_64& rng, uint64_t lo, uint64_t hi, int nbits) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  for (int i = 0; i < nbits && hi > lo; ++i) {
    off_t off = static_cast<off_t>(lo + rng() % (hi - lo));
    unsigned char c;
    ASSERT_EQ(::pread(fd, &c, 1, off), 1);
    c ^= static_cast<unsigned char>(1u << (rng() % 8));
    ASSERT_EQ(::pwrite(fd, &c, 1, off), 1);
  }
  ::close(fd);
}

uint64_t file_size(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string slurp(const std::string& p) {
  std::string s(file_size(p), '\0');
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ssize_t n = ::pread(fd, s.data(), s.size(), 0);
    s.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(fd);
  }
  return s;
}

// Trials copy and damage small stores hundreds of times; on tmpfs that costs
// microseconds, on a busy disk milliseconds per file.
class ShmDir {
 public:
  ShmDir() {
    char t[] = "/dev/shm/kcache-corrupt-XXXXXX";
    if (::mkdtemp(t)) path_ = t;
  }
  ~ShmDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_.empty() ? fallback_.path() : path_; }

 private:
  std::string path_;
  TempDir fallback_;
};

class DiskCorruption : public ::testing::TestWithParam<DiskEngine> {
 protected:
  void SetUp() override {
    tpl_ = dir_.path() + "/template";
    auto t = GetParam().open(tpl_, options());
    ASSERT_TRUE(t.has_value()) << t.error().to_string();
    // Replacements and removals leave a non-empty LMDB free list, so it is
    // part of what gets damaged and checked.
    for (uint64_t k = 0; k < kKeys + 10; ++k) ASSERT_TRUE((*t)->put(make_entry(k, size_for(k))).is_ok());
    for (uint64_t k = kKeys; k < kKeys + 10; ++k) ASSERT_TRUE((*t)->remove(key_of(k)).is_ok());
    for (uint64_t k = 0; k < kKeys; k += 5) ASSERT_TRUE((*t)->put(make_entry(k, size_for(k))).is_ok());
    ASSERT_TRUE((*t)->flush().is_ok());
    t->reset();
    fs::remove(tpl_ + "/lock.mdb");
  }

  // The template's state for one trial, in `<tmp>/w`. The LMDB data file is
  // copied whole; the files engine's folder is copied once and afterwards
  // only what the last trial changed is put back (creating folders is what
  // costs time on a busy disk).
  std::string fresh_copy() {
    std::string d = dir_.path() + "/w";
    for (const auto& e : fs::directory_iterator(dir_.path()))
      if (e.path().filename().string().find(".corrupt-") != std::string::npos) fs::remove_all(e.path());
    if (GetParam().name == "lmdb") {
      fs::remove_all(d);
      fs::create_directory(d);
      fs::copy_file(tpl_ + "/data.mdb", d + "/data.mdb");
      return d;
    }
    if (!fs::exists(d)) {
      fs::copy(tpl_, d, fs::copy_options::recursive);
      return d;
    }
    for (const auto& e : fs::recursive_directory_iterator(d)) {
      if (!e.is_regular_file()) continue;
      std::string rel = fs::relative(e.path(), d).string();
      if (!fs::exists(tpl_ + "/" + rel)) fs::remove(e.path());
    }
    for (const auto& e : fs::recursive_directory_iterator(tpl_)) {
      if (!e.is_regular_file()) continue;
      std::string rel = fs::relative(e.path(), tpl_).string();
      fs::copy_file(e.path(), d + "/" + rel, fs::copy_options::overwrite_existing);
    }
    return d;
  }

  ShmDir dir_;
  std::string tpl_;
};

struct Tally {
  int trials = 0, crashes = 0, quarantined = 0, open_failed = 0, not_usable = 0, verify_failed = 0;
  uint64_t correct = 0, miss = 0, fault = 0, wrong = 0, silent_miss = 0;
  std::vector<std::string> crash_notes;
};

void run_trial(const DiskEngine& eng, const std::string& dir, const std::string& what, Tally& t) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  int ws = run_child([&] {
    ::close(p[0]);
    Outcome o = read_all(eng, dir);
    return write_all(p[1], &o, sizeof o) ? 0 : 3;
  });
  ::close(p[1]);
  Outcome o;
  bool got = ::read(p[0], &o, sizeof o) == sizeof o;
  ::close(p[0]);
  ++t.trials;
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || !got) {
    ++t.crashes;
    if (t.crash_notes.size() < 10) t.crash_notes.push_back(what + ": " + describe_wait(ws));
    return;
  }
  bool aside = false;
  for (const auto& e : fs::directory_iterator(fs::path(dir).parent_path()))
    if (e.path().filename().string().find(".corrupt-") != std::string::npos) aside = true;
  t.quarantined += aside;
  t.open_failed += o.open_failed;
  t.not_usable += !o.open_failed && !o.usable;
  t.verify_failed += !o.open_failed && !o.verify_ok;
  t.correct += o.correct;
  t.miss += o.miss;
  t.fault += o.fault;
  t.wrong += o.wrong;
  t.silent_miss += o.silent_miss;
}

void report(const char* engine, const char* cls, const Tally& t) {
  printf(
      "[ %s %-9s ] %4d trials: %d crashes, %llu wrong, %llu correct, %llu faults, %llu misses (%llu silent), "
      "%d quarantined, %d open failures, %d unusable afterwards\n",
      engine, cls, t.trials, t.crashes, (unsigned long long)t.wrong, (unsigned long long)t.correct,
      (unsigned long long)t.fault, (unsigned long long)t.miss, (unsigned long long)t.silent_miss, t.quarantined,
      t.open_failed, t.not_usable);
  for (const auto& n : t.crash_notes) printf("    crash: %s\n", n.c_str());
}

}  // namespace

TEST_P(DiskCorruption, DamagedStoreGivesRightBytesOrMissNeverWrongOrCrash) {
  const DiskEngine& eng = GetParam();
  std::mt19937_64 rng(777);
  const int n = trials(eng.name == "lmdb" ? 600 : 400, 60);
  std::map<std::string, Tally> tally;
  for (int trial = 0; trial < n; ++trial) {
    std::string d = fresh_copy();
    std::string cls;
    if (eng.name == "lmdb") {
      std::string data = d + "/data.mdb";
      uint64_t size = file_size(data);
      static const char* kClasses[] = {"value", "anywhere", "tree", "truncate"};
      cls = kClasses[trial % 4];
      if (cls == "value") {
        // Inside an entry: from its magic into its bytes.
        std::string bytes = slurp(data);
        std::vector<size_t> at;
        for (size_t pos = bytes.find("KCENTRY\x1a"); pos != std::string::npos; pos = bytes.find("KCENTRY\x1a", pos + 1))
          at.push_back(pos);
        ASSERT_FALSE(at.empty());
        size_t pos = at[rng() % at.size()];
        flip_bits(data, rng, pos, std::min<uint64_t>(size, pos + 1 + rng() % 6000), 1 + rng() % 3);
      } else if (cls == "anywhere") {
        flip_bits(data, rng, 0, size, 1 + rng() % 4);
      } else if (cls == "tree") {
        // Meta, branch and leaf pages (not overflow runs): LMDB trusts every
        // page number and offset in them.
        std::string bytes = slurp(data);
        std::vector<uint64_t> pages;
        for (uint64_t pg = 0; (pg + 1) * 4096 <= bytes.size(); ++pg) {
          uint16_t f = static_cast<uint8_t>(bytes[pg * 4096 + 10]) | (static_cast<uint8_t>(bytes[pg * 4096 + 11]) << 8);
          uint64_t no = 0;
          std::memcpy(&no, bytes.data() + pg * 4096, 8);
          if (no == pg && (f == 0x01 || f == 0x02 || f == 0x08)) pages.push_back(pg);
        }
        ASSERT_GT(pages.size(), 4u);
        uint64_t pg = pages[rng() % pages.size()];
        // Headers and node arrays sit at the page start, nodes at its end.
        uint64_t lo = pg * 4096, hi = lo + 4096;
        if (rng() % 2) hi = lo + 64;
        flip_bits(data, rng, lo, hi, 1 + rng() % 2);
      } else {
        ASSERT_EQ(::truncate(data.c_str(), static_cast<off_t>(rng() % size)), 0);
      }
    } else {
      std::vector<std::string> files;
      for (const auto& e : fs::recursive_directory_iterator(d))
        if (e.path().extension() == ".kce") files.push_back(e.path().string());
      ASSERT_EQ(files.size(), kKeys);
      static const char* kClasses[] = {"flip", "header", "truncate", "mixed"};
      cls = kClasses[trial % 4];
      int nfiles = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < nfiles; ++i) {
        const std::string& f = files[rng() % files.size()];
        uint64_t size = file_size(f);
        if (size == 0) continue;
        if (cls == "flip" || (cls == "mixed" && i % 2 == 0)) {
          flip_bits(f, rng, 0, size, 1 + rng() % 8);
        } else if (cls == "header") {
          flip_bits(f, rng, 0, std::min<uint64_t>(size, 64), 1 + rng() % 2);
        } else {
          ASSERT_EQ(::truncate(f.c_str(), static_cast<off_t>(rng() % size)), 0);
        }
      }
      if (cls == "mixed") flip_bits(d + "/stats", rng, 0, file_size(d + "/stats"), 2);
    }
    ASSERT_FALSE(HasFatalFailure());
    run_trial(eng, d, cls + " #" + std::to_string(trial), tally[cls]);
  }
  Tally all;
  for (const auto& [cls, t] : tally) {
    report(eng.name.c_str(), cls.c_str(), t);
    all.trials += t.trials;
    all.crashes += t.crashes;
    all.wrong += t.wrong;
    all.correct += t.correct;
    all.silent_miss += t.silent_miss;
    all.quarantined += t.quarantined;
    all.open_failed += t.open_failed;
    all.not_usable += t.not_usable;
    all.verify_failed += t.verify_failed;
  }
  EXPECT_EQ(all.crashes, 0) << "a damaged store crashed a reader";
  EXPECT_EQ(all.wrong, 0u) << "a damaged store handed out wrong bytes";
  EXPECT_EQ(all.open_failed, 0) << "a damaged store must be quarantined or read, not refuse to open";
  EXPECT_EQ(all.not_usable, 0) << "a damaged store must still take and return new entries";
  EXPECT_EQ(all.verify_failed, 0);
  // Damage must be noticed: most keys of most trials still read correctly,
  // and the files engine counts every damaged entry it meets.
  EXPECT_GT(all.correct, uint64_t(all.trials) * kKeys / 2);
  if (eng.name == "files") {
    EXPECT_EQ(all.silent_miss, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskCorruption, ::testing::ValuesIn(disk_engines()), disk_engine_name);

#if KCACHE_HAVE_LMDB
namespace {

constexpr uint64_t kGarbageKeys = 60;
// Entries of 200 bytes (inside a leaf page) to about 11 KB (overflow runs
// of up to three pages).
size_t garbage_size(uint64_t k) { return 200 + (k * 2741) % 11000; }

struct GarbageOutcome {
  uint32_t correct = 0, miss = 0, fault = 0, wrong = 0;
};

// Reads every key; with `repair`, then fixes, re-puts what missed, trims to
// half and (every fourth trial) clears, the writes LMDB makes by freeing
// pages, and reads every key again.
GarbageOutcome read_and_repair(const std::string& dir, bool repair, bool clear) {
  GarbageOutcome o;
  auto t = open_lmdb_tier(dir, options());
  if (!t) return o;
  Tier& tier = **t;
  auto read_all_keys = [&] {
    std::vector<uint64_t> missed;
    for (uint64_t k = 0; k < kGarbageKeys; ++k) {
      auto g = tier.get(key_of(k));
      if (!g) {
        ++o.fault;
        missed.push_back(k);
      } else if (!g->has_value()) {
        ++o.miss;
        missed.push_back(k);
      } else if (entry_ok(**g, k, garbage_size(k))) {
        ++o.correct;
      } else {
        ++o.wrong;
      }
    }
    return missed;
  };
  std::vector<uint64_t> missed = read_all_keys();
  if (!repair) return o;
  (void)tier.admin()->verify(true);
  for (uint64_t k : missed) (void)tier.put(make_entry(k, garbage_size(k)));
  (void)read_all_keys();
  (void)tier.admin()->trim(tier.stats().bytes / 2);
  if (clear) (void)tier.admin()->clear();
  (void)read_all_keys();
  return o;
}

}  // namespace

TEST(LmdbGarbage, RandomBytesOverPagesNeverAbortHangOrGiveWrongBytes) {
  ShmDir dir;
  std::string tpl = dir.path() + "/template";
  {
    auto t = open_lmdb_tier(tpl, options());
    ASSERT_TRUE(t.has_value()) << t.error().to_string();
    for (uint64_t k = 0; k < kGarbageKeys + 10; ++k) ASSERT_TRUE((*t)->put(make_entry(k, garbage_size(k))).is_ok());
    for (uint64_t k = kGarbageKeys; k < kGarbageKeys + 10; ++k) ASSERT_TRUE((*t)->remove(key_of(k)).is_ok());
    ASSERT_TRUE((*t)->flush().is_ok());
  }
  fs::remove(tpl + "/lock.mdb");
  const std::string tpl_bytes = slurp(tpl + "/data.mdb");
  // Pages by type, from their headers: overflow runs' first pages and leaves.
  std::vector<uint64_t> overflow, leaf;
  for (uint64_t pg = 2; (pg + 1) * 4096 <= tpl_bytes.size(); ++pg) {
    uint64_t no;
    uint16_t f;
    std::memcpy(&no, tpl_bytes.data() + pg * 4096, 8);
    std::memcpy(&f, tpl_bytes.data() + pg * 4096 + 10, 2);
    if (no != pg) continue;
    if (f == 0x04) overflow.push_back(pg);
    if (f == 0x02) leaf.push_back(pg);
  }
  ASSERT_GT(overflow.size(), 20u);
  ASSERT_GT(leaf.size(), 3u);

  const int n = trials(1000, 100);
  const int limit_ms = trials(20000, 120000);
  std::mt19937_64 rng(8191);
  struct Count {
    int trials = 0, aborts = 0, hangs = 0, quarantined = 0;
    uint64_t correct = 0, miss = 0, fault = 0, wrong = 0;
  };
  std::map<std::string, Count> by_class;
  std::vector<std::string> notes;
  for (int trial = 0; trial < n; ++trial) {
    std::string d = dir.path() + "/w";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().filename().string().rfind("w", 0) == 0) fs::remove_all(e.path(), ec);
    fs::create_directory(d);
    // Garbage: from the start of an overflow run (its header), over a leaf
    // page, or anywhere past the meta pages.
    static const char* kClasses[] = {"overflow", "leaf", "anywhere"};
    std::string cls = kClasses[trial % 3];
    uint64_t off;
    if (cls == "overflow")
      off = overflow[rng() % overflow.size()] * 4096 + rng() % 64;
    else if (cls == "leaf")
      off = leaf[rng() % leaf.size()] * 4096 + rng() % 4096;
    else
      off = 2 * 4096 + rng() % (tpl_bytes.size() - 2 * 4096);
    size_t len = 1 + rng() % 8192;
    std::string bytes = tpl_bytes;
    for (size_t i = 0; i < len && off + i < bytes.size(); ++i) bytes[off + i] = static_cast<char>(rng());
    {
      FILE* f = fopen((d + "/data.mdb").c_str(), "wb");
      ASSERT_TRUE(f);
      ASSERT_EQ(fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
      fclose(f);
    }
    Count& c = by_class[cls];
    ++c.trials;
    std::string what =
        cls + " #" + std::to_string(trial) + " (" + std::to_string(len) + " bytes at " + std::to_string(off) + ")";
    // First process: reads and repairs; second: a new open, reads only.
    for (int pass = 0; pass < 2; ++pass) {
      int p[2];
      ASSERT_EQ(::pipe(p), 0);
      int ws = run_child_bounded(
          [&] {
            ::close(p[0]);
            GarbageOutcome o = read_and_repair(d, pass == 0, trial % 4 == 0);
            return write_all(p[1], &o, sizeof o) ? 0 : 3;
          },
          limit_ms, what);
      ::close(p[1]);
      GarbageOutcome o;
      bool got = ::read(p[0], &o, sizeof o) == sizeof o;
      ::close(p[0]);
      if (ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        // The damaged file, for a closer look.
        std::string keep = ::testing::TempDir() + "kcache-garbage-" + std::to_string(trial) + ".mdb";
        if (FILE* f = fopen(keep.c_str(), "wb")) {
          fwrite(bytes.data(), 1, bytes.size(), f);
          fclose(f);
          notes.push_back(what + ": damaged file kept as " + keep);
        }
      }
      if (ws == -1) {
        ++c.hangs;
        notes.push_back(what + ": hung");
        break;
      }
      if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || !got) {
        ++c.aborts;
        notes.push_back(what + ": " + describe_wait(ws));
        break;
      }
      c.correct += o.correct;
      c.miss += o.miss;
      c.fault += o.fault;
      c.wrong += o.wrong;
      if (o.wrong && notes.size() < 20) notes.push_back(what + ": wrong bytes");
    }
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().filename().string().find(".corrupt-") != std::string::npos) {
        ++c.quarantined;
        break;
      }
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().filename().string().find(".corrupt-") != std::string::npos) fs::remove_all(e.path(), ec);
    if (c.aborts + c.hangs > 10) break;  // enough to see what goes wrong; each hang costs the watchdog's limit
  }
  Count all;
  for (const auto& [cls, c] : by_class) {
    printf(
        "[ lmdb garbage %-8s ] %4d trials: %d aborts, %d hangs, %llu wrong, %llu correct, %llu faults, "
        "%llu misses, %d moved aside\n",
        cls.c_str(), c.trials, c.aborts, c.hangs, (unsigned long long)c.wrong, (unsigned long long)c.correct,
        (unsigned long long)c.fault, (unsigned long long)c.miss, c.quarantined);
    all.trials += c.trials;
    all.aborts += c.aborts;
    all.hangs += c.hangs;
    all.wrong += c.wrong;
    all.correct += c.correct;
  }
  for (size_t i = 0; i < notes.size() && i < 20; ++i) printf("    %s\n", notes[i].c_str());
  EXPECT_EQ(all.aborts, 0);
  EXPECT_EQ(all.hangs, 0);
  EXPECT_EQ(all.wrong, 0u);
  // Most reads still find their entry: damage is local.
  EXPECT_GT(all.correct, uint64_t(all.trials) * kGarbageKeys);
}
#endif

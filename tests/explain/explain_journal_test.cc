// The miss journal (shared by processes, bounded, a torn record never read,
// damage skipped and counted by its reader), the nearest stored entry (same
// label first), and the Cache's miss path: every counted miss journaled, and
// with explain on one log line naming the nearest entry and the values that
// changed.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>

#include "cache/journal.h"
#include "fault_env.h"
#include "kcache/assembly.h"
#include "kcache/cache.h"
#include "kcache/miss_journal.h"
#include "test_util.h"
#include "util/util.h"

namespace kcache {
namespace {

MissRecord record(uint64_t i, const std::string& label = "") {
  MissRecord r;
  auto k =
      *KeyBuilder("journal/1").add_u64("i", i).add_string("cpu", "znver3").add_bytes("ir", "x").label(label).finish();
  r.key = k.key;
  r.manifest = k.manifest;
  r.label = label;
  r.time_ms = 1000 + i;
  r.pid = static_cast<uint32_t>(::getpid());
  r.process = "journal-test";
  return r;
}

uint64_t index_of(const MissRecord& r) {
  for (const auto& it : r.manifest.items)
    if (it.name == "i") return std::stoull(*it.value);
  return UINT64_MAX;
}

off_t file_size(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST(MissJournal, RecordsReadBackWhole) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  auto none = read_miss_journal(store, 10);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  MissJournal j(store, 100);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(j.append(record(i, "k" + std::to_string(i))).is_ok());
  auto recs = read_miss_journal(store, 10);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    const MissRecord& r = (*recs)[i];
    MissRecord want = record(i, "k" + std::to_string(i));
    EXPECT_EQ(r.key, want.key);
    EXPECT_EQ(r.label, "k" + std::to_string(i));
    EXPECT_EQ(r.manifest, want.manifest);
    EXPECT_EQ(r.manifest.items[0].value, "znver3");
    EXPECT_EQ(r.time_ms, 1000 + i);
    EXPECT_EQ(r.pid, static_cast<uint32_t>(::getpid()));
    EXPECT_EQ(r.process, "journal-test");
  }
  // --limit: the newest.
  auto last2 = read_miss_journal(store, 2);
  ASSERT_TRUE(last2);
  ASSERT_EQ(last2->size(), 2u);
  EXPECT_EQ(index_of((*last2)[0]), 3u);
  EXPECT_EQ(index_of((*last2)[1]), 4u);
}

// The journal's file operations go through the Env: a full or read-only
// disk fails an append with its own code and loses no record already
// committed, and the journal works again once the disk does. Rotation
// (link, rename) under a read-only disk fails the same way.
TEST(MissJournal, FaultsOfTheEnvFailAppendsAndLoseNothingCommitted) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  auto env = std::make_shared<test::FaultEnv>();
  MissJournal j(store, 3, false, env);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(j.append(record(i)).is_ok());
  env->no_space = true;
  Status full = j.append(record(3));  // the file is at `keep`: a rotation, which must create a file
  EXPECT_EQ(full.code(), Errc::no_space) << full.to_string();
  env->no_space = false;
  env->read_only = true;
  EXPECT_EQ(j.append(record(4)).code(), Errc::read_only);
  EXPECT_GT(env->faults.load(), 0u);
  auto kept = read_miss_journal(store, 10);
  ASSERT_TRUE(kept);
  ASSERT_EQ(kept->size(), 3u) << "what was committed before the faults is all there";
  EXPECT_EQ(index_of((*kept)[2]), 2u);
  env->read_only = false;
  ASSERT_TRUE(j.append(record(5)).is_ok());
  auto after = read_miss_journal(store, 10);
  ASSERT_TRUE(after);
  EXPECT_EQ(index_of(after->back()), 5u);
}

TEST(MissJournal, BoundedKeepsTheNewest) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  MissJournal j(store, 10);
  off_t one = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(j.append(record(i)).is_ok());
    if (i == 0) one = file_size(MissJournal::path_for(store)) - 24;
  }
  auto recs = read_miss_journal(store, 100000);
  ASSERT_TRUE(recs);
  // Between keep and 2 x keep records: the current file and the previous one.
  EXPECT_GE(recs->size(), 10u);
  EXPECT_LE(recs->size(), 20u);
  EXPECT_EQ(index_of(recs->back()), 999u);
  for (size_t i = 1; i < recs->size(); ++i) EXPECT_EQ(index_of((*recs)[i]), index_of((*recs)[i - 1]) + 1);
  // Records differ by a few digits of "i": allow for them.
  EXPECT_LE(file_size(MissJournal::path_for(store)), 24 + 10 * (one + 8));
  EXPECT_LE(file_size(MissJournal::path_for(store) + ".1"), 24 + 10 * (one + 8));
}

// Posted records reach the file in batches (one lock, one header write per
// file they land in): a batch larger than a generation rotates on the way
// and keeps the newest records, in order, within the same bound.
TEST(MissJournal, PostedBatchesKeepTheNewestInOrder) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  {
    MissJournal j(store, 4);
    for (uint64_t i = 0; i < 11; ++i) j.post(record(i));
    (void)j.flush();
    auto recs = read_miss_journal(store, 100);
    ASSERT_TRUE(recs);
    // 0-3 rotated out, 4-7 the previous generation, 8-10 the current one.
    ASSERT_EQ(recs->size(), 7u);
    for (size_t i = 0; i < recs->size(); ++i) EXPECT_EQ(index_of((*recs)[i]), 4 + i);
    for (uint64_t i = 11; i < 14; ++i) j.post(record(i));
  }  // the destructor writes what was posted
  auto recs = read_miss_journal(store, 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 6u);  // 8-11 previous, 12-13 current
  for (size_t i = 0; i < recs->size(); ++i) EXPECT_EQ(index_of((*recs)[i]), 8 + i);
}

TEST(MissJournal, TornRecordIsNeverReadAndIsOverwritten) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  {
    MissJournal j(store, 100);
    ASSERT_TRUE(j.append(record(1)).is_ok());
  }
  // A crash in the middle of an append: bytes past the committed end.
  {
    std::ofstream f(MissJournal::path_for(store), std::ios::binary | std::ios::app);
    f << std::string("\x40\0\0\0garbage-of-a-torn-record", 29);
  }
  auto recs = read_miss_journal(store, 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 1u);
  MissJournal j(store, 100);
  ASSERT_TRUE(j.append(record(2)).is_ok());
  recs = read_miss_journal(store, 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ(index_of((*recs)[1]), 2u);
}

// ---- reading a journal that is damaged ------------------------------------------

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << b;
}

// The offset of each committed record of a journal file's bytes.
std::vector<size_t> record_offsets(const std::string& b) {
  std::vector<size_t> out;
  size_t end = util::get_u64(b.data() + 16);
  for (size_t pos = 24; pos + 8 <= end; pos += 8 + util::get_u32(b.data() + pos)) out.push_back(pos);
  return out;
}

// Three records written by the real writer, read back; then each kind of
// damage: a record that does not verify, a file cut short under its header,
// an impossible length, a header that is not one, a record that verifies but
// names no type kcache has. What cannot be read is skipped and counted; the
// records around it are read whole.
TEST(ReadMissJournal, DamageIsSkippedAndCounted) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  const std::string path = miss_journal_path(store);
  EXPECT_EQ(path, store + ".misses");
  {
    MissJournal j(store, 100);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(j.append(record(i, "k")).is_ok());
  }
  uint64_t skipped = 99;
  auto recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs) << recs.error().to_string();
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ(skipped, 0u);
  const std::string good = bytes_of(path);
  std::vector<size_t> at = record_offsets(good);
  ASSERT_EQ(at.size(), 3u);

  // A flipped byte in the second record's body: it fails its check.
  std::string b = good;
  b[at[1] + 8 + 30] ^= 0x5a;
  write_bytes(path, b);
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ(index_of((*recs)[0]), 0u);
  EXPECT_EQ(index_of((*recs)[1]), 2u);
  EXPECT_EQ(skipped, 1u);

  // Cut in the middle of the third record (the header still counts it).
  write_bytes(path, good.substr(0, at[2] + 12));
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ(index_of((*recs)[1]), 1u);
  EXPECT_EQ(skipped, 1u);

  // An impossible length: the rest of the file is one skip.
  b = good;
  b[at[1]] = b[at[1] + 1] = b[at[1] + 2] = b[at[1] + 3] = '\xff';
  write_bytes(path, b);
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 1u);
  EXPECT_EQ(skipped, 1u);

  // Not a journal's header: nothing read, one skip; the writer starts over.
  b = good;
  b[0] = 'X';
  write_bytes(path, b);
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  EXPECT_TRUE(recs->empty());
  EXPECT_EQ(skipped, 1u);
  write_bytes(path, "KCMI");  // shorter than a header
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  EXPECT_TRUE(recs->empty());
  EXPECT_EQ(skipped, 1u);
  {
    MissJournal j(store, 100);
    ASSERT_TRUE(j.append(record(7)).is_ok());
  }
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 1u);
  EXPECT_EQ(index_of((*recs)[0]), 7u);
  EXPECT_EQ(skipped, 0u);

  // A record that verifies but whose component has type 42: skipped, never
  // handed on with a type kcache does not know.
  b = good;
  {
    size_t body = at[0] + 8, len = util::get_u32(b.data() + at[0]);
    std::string rec = b.substr(body, len);
    // time:8 pid:4 key:16 process, label, ns (str16 each), n:4, then the
    // first item: name (str16), type:1.
    size_t p = 28;
    for (int i = 0; i < 3; ++i) p += 2 + (static_cast<uint8_t>(rec[p]) | (static_cast<uint8_t>(rec[p + 1]) << 8));
    p += 4;
    p += 2 + (static_cast<uint8_t>(rec[p]) | (static_cast<uint8_t>(rec[p + 1]) << 8));
    rec[p] = 42;
    Digest d = hash_bytes(rec);
    std::string check;
    util::put_u32(check, util::get_u32(reinterpret_cast<const char*>(d.bytes.data())));
    b.replace(at[0] + 4, 4, check);
    b.replace(body, len, rec);
  }
  write_bytes(path, b);
  recs = read_miss_journal(store, SIZE_MAX, &skipped);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ(index_of((*recs)[0]), 1u);
  EXPECT_EQ(skipped, 1u);
}

// Random damage anywhere (bytes flipped, the file cut anywhere): the read
// never fails or crashes, and every record it returns is whole.
TEST(ReadMissJournal, RandomDamageNeverYieldsABrokenRecord) {
  test::TempDir tmp;
  std::string store = tmp.path() + "/lmdb";
  const std::string path = miss_journal_path(store);
  {
    MissJournal j(store, 100);
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(j.append(record(i, "label" + std::to_string(i))).is_ok());
  }
  const std::string good = bytes_of(path);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
  };
  for (int round = 0; round < 300; ++round) {
    std::string b = good;
    int flips = static_cast<int>(next() % 4);
    for (int f = 0; f < flips; ++f) b[next() % b.size()] ^= static_cast<char>(1 + next() % 255);
    if (next() % 2) b.resize(next() % (b.size() + 1));
    write_bytes(path, b);
    uint64_t skipped = 0;
    auto recs = read_miss_journal(store, SIZE_MAX, &skipped);
    ASSERT_TRUE(recs) << "round " << round << ": " << recs.error().to_string();
    EXPECT_LE(recs->size(), 8u);
    for (const auto& r : *recs) {
      uint64_t i = index_of(r);
      ASSERT_LT(i, 8u) << "round " << round;
      EXPECT_EQ(r.key, record(i).key) << "round " << round;
      EXPECT_EQ(r.manifest.key(), r.key) << "round " << round;
      EXPECT_EQ(r.label, "label" + std::to_string(i)) << "round " << round;
    }
  }
}

// Two processes append at once; every record read back is whole and each
// process's records are in their order.
std::vector<MissRecord> two_writers(const std::string& store, size_t keep, int per_child) {
  std::vector<pid_t> kids;
  for (int c = 0; c < 2; ++c) {
    pid_t p = ::fork();
    EXPECT_GE(p, 0);
    if (p == 0) {
      MissJournal j(store, keep);
      int bad = 0;
      for (int i = 0; i < per_child; ++i) {
        MissRecord r = record(static_cast<uint64_t>(c) * 100000 + i);
        r.pid = static_cast<uint32_t>(::getpid());
        bad += !j.append(r).is_ok();
      }
      ::_exit(bad ? 1 : 0);
    }
    kids.push_back(p);
  }
  for (pid_t p : kids) {
    int st = 0;
    EXPECT_EQ(::waitpid(p, &st, 0), p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  auto recs = read_miss_journal(store, 100000);
  EXPECT_TRUE(recs);
  if (!recs) return {};
  std::map<uint32_t, uint64_t> last;
  for (const auto& r : *recs) {
    uint64_t i = index_of(r);
    EXPECT_NE(i, UINT64_MAX);
    EXPECT_EQ(r.key, record(i).key);  // whole: the manifest still hashes to its key
    EXPECT_EQ(r.manifest.key(), r.key);
    if (last.count(r.pid)) {
      EXPECT_GT(i, last[r.pid]);
    }
    last[r.pid] = i;
  }
  return *recs;
}

TEST(MissJournal, SharedByProcesses) {
  test::TempDir tmp;
  auto recs = two_writers(tmp.path() + "/lmdb", 1000, 400);
  EXPECT_EQ(recs.size(), 800u);  // none lost
  std::set<uint32_t> pids;
  for (const auto& r : recs) pids.insert(r.pid);
  EXPECT_EQ(pids.size(), 2u);
}

TEST(MissJournal, BoundedWhileProcessesRotateIt) {
  test::TempDir tmp;
  auto recs = two_writers(tmp.path() + "/lmdb", 64, 400);
  EXPECT_GE(recs.size(), 64u);
  EXPECT_LE(recs.size(), 128u);
  // The newest record is one process's last append.
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(index_of(recs.back()) % 100000, 399u);
}

// ---- nearest -------------------------------------------------------------------

KeyInfo module_key(const std::string& label, const std::string& ir, int opt) {
  return *KeyBuilder("interp/1")
              .add_bytes("ir", ir)
              .add_i64("ir_opt_level", opt)
              .add_string("cpu", "znver3")
              .label(label)
              .finish();
}

MissRecord miss_of(const KeyInfo& k, uint64_t time_ms) {
  return MissRecord{k.key, k.label, k.manifest, time_ms, 1, "test"};
}

Entry stored_entry(const KeyInfo& k, uint64_t created_ms) {
  EntryMeta m;
  m.created_unix_ms = created_ms;
  m.label = k.label;
  return *EntryBuilder(k.key).add("obj", "o").meta(m).manifest(k.manifest).build();
}

TEST(Nearest, PrefersTheSameLabel) {
  auto mem = make_memory_tier();
  KeyInfo lexer = module_key("lexer.c", "lexer -DA", 2);
  KeyInfo parser = module_key("parser.c", "parser", 2);  // stored later: the most recent
  ASSERT_TRUE(mem->put(stored_entry(lexer, 1000)).is_ok());
  ASSERT_TRUE(mem->put(stored_entry(parser, 2000)).is_ok());
  StoredManifests sm;
  ASSERT_TRUE(sm.load(*mem).is_ok());
  EXPECT_EQ(sm.size(), 2u);
  // lexer.c rebuilt with another -D: its IR alone differs, as it does from
  // every other module. The nearest is its own previous version.
  KeyInfo lookup = module_key("lexer.c", "lexer -DB", 2);
  NearestSearch n = sm.nearest(lookup.manifest, lookup.label, lookup.key);
  ASSERT_TRUE(n.entry);
  EXPECT_EQ(n.entry->key, lexer.key);
  EXPECT_EQ(n.entry->label, "lexer.c");
  EXPECT_EQ(n.entry->created_ms, 1000u);
  EXPECT_EQ(n.compared, 2u);
  MissReport nr = make_miss_report(miss_of(lookup, 4000), n);
  ASSERT_EQ(nr.differences.size(), 1u);
  EXPECT_EQ(nr.differences[0].name, "ir");
  EXPECT_EQ(nr.differences[0].change, ManifestChange::changed);
  ASSERT_TRUE(nr.nearest);
  EXPECT_EQ(nr.nearest->age_ms, 3000u);  // made at 1000, missed at 4000
  EXPECT_TRUE(nr.nearest->same_label);
  // Without a label the tie goes to the most recent (parser).
  NearestSearch u = sm.nearest(lookup.manifest, "", lookup.key);
  ASSERT_TRUE(u.entry);
  EXPECT_EQ(u.entry->key, parser.key);
  // A label nothing has: every entry of the namespace is a candidate.
  NearestSearch other = sm.nearest(lookup.manifest, "main.c", lookup.key);
  ASSERT_TRUE(other.entry);
  EXPECT_EQ(other.entry->key, parser.key);
  // Fewer differences beat the label-less ordering; values come along.
  KeyInfo o3 = module_key("lexer.c", "lexer -DA", 3);
  MissReport v = sm.explain(miss_of(o3, 5000));
  ASSERT_TRUE(v.nearest);
  EXPECT_EQ(v.nearest->key, lexer.key);
  EXPECT_EQ(to_text(v, TextForm::verdict), "nearest " + lexer.key.hex() + " \"lexer.c\": ir_opt_level: 2 \u2192 3");
  EXPECT_EQ(miss_cause(v), "ir_opt_level 2 \u2192 3");
  // Only entries made before the miss count, and never the key itself.
  MissRecord before = miss_of(lookup, 1500);
  before.key = lexer.key;
  EXPECT_FALSE(sm.nearest(before.manifest, before.label, before.key, 1500).entry);
  MissReport none = sm.explain(before, 1500);
  EXPECT_FALSE(none.nearest);
  EXPECT_TRUE(none.differences.empty());
  EXPECT_EQ(miss_cause(none), "no earlier entry of its label");
  before.label.clear();
  EXPECT_EQ(miss_cause(sm.explain(before, 1500)), "no earlier entry of namespace \"interp/1\"");
  EXPECT_EQ(to_text(sm.explain(before, 1500), TextForm::verdict), "no earlier entry of namespace \"interp/1\"");
  MissRecord main_c = miss_of(lookup, 5000);
  main_c.label = "main.c";
  EXPECT_EQ(miss_cause(sm.explain(main_c)), "no earlier entry of its label");
  EXPECT_EQ(to_text(sm.explain(main_c), TextForm::verdict)
                .rfind("no earlier entry of its label; nearest of another "
                       "label " +
                           parser.key.hex() + " \"parser.c\": ",
                       0),
            0u);
  // Another namespace is not a candidate.
  auto elsewhere = *KeyBuilder("other/1").add_bytes("ir", "lexer -DA").label("lexer.c").finish();
  NearestSearch ns = sm.nearest(elsewhere.manifest, elsewhere.label, elsewhere.key);
  EXPECT_FALSE(ns.entry);
  EXPECT_EQ(ns.other_namespaces.at("interp/1"), 2u);
}

// ---- the Cache's miss path -------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t test_count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// A process stopped while it holds the journal's lock costs an append or a
// read at most the lock's bound (about a second), never a hang; after a
// timeout the same journal drops records at once for a while; the cache
// that journals a miss meanwhile closes as it would.
TEST(MissJournal, AStuckLockHolderNeverHangsAnAppendAReadOrAClose) {
  test::TempDir tmp;
  Options o = test::disk_options(tmp.path() + "/cache");
  o.memory_tier = false;
  std::string store = tmp.path() + "/cache/lmdb";
  ASSERT_TRUE(util::make_dirs(tmp.path() + "/cache").is_ok());
  MissJournal j(store, 100);
  ASSERT_TRUE(j.append(record(0)).is_ok());
  // Held through another open file description, as another process would.
  int held = ::open(MissJournal::path_for(store).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  auto seconds_since = [](uint64_t t0) { return (util::now_mono_us() - t0) / 1e6; };

  uint64_t t0 = util::now_mono_us();
  Status st = j.append(record(1));
  EXPECT_EQ(st.code(), Errc::timeout) << st.to_string();
  EXPECT_GE(seconds_since(t0), 0.9);  // it waited for the lock
  EXPECT_LT(seconds_since(t0), 10.0);

  t0 = util::now_mono_us();
  st = j.append(record(2));  // the same journal, just after a timeout: no wait
  EXPECT_EQ(st.code(), Errc::timeout) << st.to_string();
  EXPECT_LT(seconds_since(t0), 0.5);

  t0 = util::now_mono_us();
  auto read = read_miss_journal(store, 10);
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().code(), Errc::timeout);
  EXPECT_GE(seconds_since(t0), 0.9);
  EXPECT_LT(seconds_since(t0), 10.0);

  {
    auto cache = Cache::open(o);
    auto compile = [] { return std::vector<Artifact>{{"obj", "code"}}; };
    for (uint64_t i = 0; i < 3; ++i)
      ASSERT_TRUE(cache->get_or_compile(module_key("m" + std::to_string(i), "ir", 2), compile));
    t0 = util::now_mono_us();
  }  // close: the writer waits for the lock once, then drops its batch
  EXPECT_GE(seconds_since(t0), 0.9);
  EXPECT_LT(seconds_since(t0), 10.0);

  ::close(held);
  MissJournal later(store, 100);  // another process, once the holder is gone
  ASSERT_TRUE(later.append(record(3)).is_ok());
  auto recs = read_miss_journal(store, 10);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);  // what was appended without the lock is lost, nothing else
  EXPECT_EQ(index_of((*recs)[0]), 0u);
  EXPECT_EQ(index_of((*recs)[1]), 3u);
}

class ExplainCache : public ::testing::TestWithParam<std::string> {};

TEST_P(ExplainCache, MissesAreJournaledAndExplained) {
  test::TempDir tmp;
  Options o = test::disk_options(tmp.path() + "/cache");
  o.engine = parse_engine(GetParam());
  o.memory_tier = false;
  auto compile = [] { return std::vector<Artifact>{{"obj", "code"}}; };
  {
    auto cache = Cache::open(o);
    for (const char* m : {"lexer.c", "parser.c", "eval.c"})
      ASSERT_TRUE(cache->get_or_compile(module_key(m, std::string("ir of ") + m, 2), compile));
    // A hit is not journaled.
    ASSERT_TRUE(cache->get_or_compile(module_key("eval.c", "ir of eval.c", 2), compile));
  }
  std::string store = tmp.path() + "/cache/" + GetParam();
  auto recs = read_miss_journal(store, 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ((*recs)[0].label, "lexer.c");
  EXPECT_EQ((*recs)[2].label, "eval.c");
  EXPECT_EQ((*recs)[0].key, module_key("lexer.c", "ir of lexer.c", 2).key);

  // Explain on: each miss logs one line with the nearest entry of its label.
  std::string log = tmp.path() + "/log";
  Options e = o;
  e.explain = true;
  e.log_level = LogLevel::warn;
  e.log_file = log;
  {
    auto cache = Cache::open(e);
    ASSERT_TRUE(cache->get_or_compile(module_key("parser.c", "ir of parser.c", 3), compile));
    auto batch = cache->get_or_compile_batch(
        {{module_key("lexer.c", "ir of lexer.c", 3), compile}, {module_key("eval.c", "ir of eval.c", 2), compile}});
    ASSERT_TRUE(batch[0] && batch[1]);
    // A namespace with nothing stored: journaled, no line.
    ASSERT_TRUE(cache->get_or_compile(*KeyBuilder("fresh/1").add_u64("n", 1).finish(), compile));
  }
  util::set_log(LogLevel::error, "");
  std::string text = slurp(log);
  KeyInfo parser2 = module_key("parser.c", "ir of parser.c", 2);
  KeyInfo lexer3 = module_key("lexer.c", "ir of lexer.c", 3);
  EXPECT_NE(
      text.find("miss " + module_key("parser.c", "ir of parser.c", 3).key.hex() + " \"parser.c\" (interp/1): nearest " +
                parser2.key.hex() + " \"parser.c\": ir_opt_level: 2 \u2192 3"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("miss " + lexer3.key.hex() + " \"lexer.c\""), std::string::npos) << text;
  EXPECT_EQ(test_count(text, "\n"), 2u) << text;  // one line per explained miss; the hit and fresh/1: none
  recs = read_miss_journal(store, 100);
  ASSERT_TRUE(recs);
  EXPECT_EQ(recs->size(), 6u);

  // Read-only: nothing journaled.
  Options ro = o;
  ro.read_only = true;
  {
    auto cache = Cache::open(ro);
    ASSERT_TRUE(cache->get_or_compile(module_key("main.c", "ir of main.c", 2), compile));
  }
  // miss_journal = 0: none either.
  Options off = o;
  off.miss_journal = 0;
  {
    auto cache = Cache::open(off);
    ASSERT_TRUE(cache->get_or_compile(module_key("main.c", "ir of main.c", 1), compile));
  }
  recs = read_miss_journal(store, 100);
  ASSERT_TRUE(recs);
  EXPECT_EQ(recs->size(), 6u);
}

// A caller that waits for another's compile of its key and gets the entry
// compiled nothing: the journal holds one miss per compile, not one per
// caller (get_or_compile and begin alike).
TEST_P(ExplainCache, AWaiterThatGotTheEntryIsNotJournaled) {
  test::TempDir tmp;
  Options o = test::disk_options(tmp.path() + "/cache");
  o.engine = parse_engine(GetParam());
  o.memory_tier = false;
  {
    auto cache = Cache::open(o);
    for (int round = 0; round < 2; ++round) {
      KeyInfo k = module_key("kernel.c", "ir " + std::to_string(round), 2);
      const uint64_t waits_before = cache->stats().waits;
      // The leader compiles until both waiters joined its flight.
      auto compile = [&] {
        while (cache->stats().waits < waits_before + 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return std::vector<Artifact>{{"obj", "code"}};
      };
      std::thread leader([&] { ASSERT_TRUE(cache->get_or_compile(k, compile)); });
      while (cache->stats().compiles < static_cast<uint64_t>(round + 1))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::thread waiter([&] {
        Source src = Source::compiled;
        ASSERT_TRUE(cache->get_or_compile(k, compile, &src));
        EXPECT_EQ(src, Source::waited);
      });
      // begin(): a flight that waited and got the entry owns nothing.
      Flight f = cache->begin(k);
      EXPECT_FALSE(f.owner());
      EXPECT_TRUE(f.has_entry());
      leader.join();
      waiter.join();
    }
    EXPECT_EQ(cache->stats().compiles, 2u);
  }
  auto recs = read_miss_journal(tmp.path() + "/cache/" + GetParam(), 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ((*recs)[0].key, module_key("kernel.c", "ir 0", 2).key);
  EXPECT_EQ((*recs)[1].key, module_key("kernel.c", "ir 1", 2).key);
}

INSTANTIATE_TEST_SUITE_P(Engines, ExplainCache, ::testing::ValuesIn(test::engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache

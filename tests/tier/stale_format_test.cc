// An entry written by a build with another entry format version (a rolling
// upgrade sharing a store) is a plain miss to this build: not an error, not
// counted corrupt, not removed by get nor by verify --fix.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "entry/buffer.h"
#include "robust_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr size_t kSize = 10000;

// The encoded entry with `version` in its header and a checksum that is
// right for it (docs/format.md: XXH3-128 of the payload, seeded with
// XXH3-64 of header bytes 0..47, big-endian): valid but for the version.
std::string with_version(std::string enc, uint32_t version) {
  for (int i = 0; i < 4; ++i) enc[8 + i] = static_cast<char>(version >> (8 * i));
  uint64_t seed = XXH3_64bits(enc.data(), 48);
  XXH128_hash_t h = XXH3_128bits_withSeed(enc.data() + kEntryHeaderSize, enc.size() - kEntryHeaderSize, seed);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  std::memcpy(enc.data() + 48, c.digest, 16);
  return enc;
}

// Replaces key 1's stored header (the payload is unchanged) in place.
void restamp_entry_1(const std::string& engine, const std::string& dir, const std::string& old_enc,
                     const std::string& new_enc) {
  std::string path;
  if (engine == "files") {
    std::string h = key_of(1).hex();
    path = dir + "/" + h.substr(0, 2) + "/" + h + ".kce";
  } else {
    path = dir + "/data.mdb";
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  std::string all((std::istreambuf_iterator<char>(f)), {});
  std::string header = old_enc.substr(0, kEntryHeaderSize);
  size_t at = all.find(header);
  ASSERT_NE(at, std::string::npos) << "stored entry not found in " << path;
  for (; at != std::string::npos; at = all.find(header, at + 1)) {
    f.seekp(static_cast<std::streamoff>(at));
    f.write(new_enc.data(), kEntryHeaderSize);
  }
  ASSERT_TRUE(f.good());
}

bool listed(Tier& t, const Key& k) {
  bool found = false;
  EXPECT_TRUE(t.admin()
                  ->list([&](const ListItem& it) {
                    found = found || it.key == k;
                    return true;
                  })
                  .is_ok());
  return found;
}

class StaleFormat : public ::testing::TestWithParam<DiskEngine> {};

}  // namespace

TEST(StaleFormatEntry, DecodeSaysStaleFormatNotCorrupt) {
  Entry e = make_entry(1, kSize);
  std::string v2 = with_version(std::string(e.encoded()), kEntryFormatVersion + 1);
  Key k = key_of(1);
  auto d = Entry::decode(make_heap_buffer(v2), &k);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), Errc::stale_format) << d.error().to_string();
  // The same restamping with this build's version gives a valid entry.
  auto same = Entry::decode(make_heap_buffer(with_version(v2, kEntryFormatVersion)), &k);
  ASSERT_TRUE(same.has_value()) << same.error().to_string();
  EXPECT_TRUE(entry_ok(*same, 1, kSize));
}

TEST_P(StaleFormat, OtherVersionIsAMissNeitherCorruptNorRemoved) {
  const DiskEngine& eng = GetParam();
  TempDir td;
  std::string dir = td.path() + "/store";
  DiskTierOptions o;
  o.durability = Durability::none;
  Entry e = make_entry(1, kSize);
  {
    auto w = eng.open(dir, o);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_TRUE((*w)->put(e).is_ok());
    ASSERT_TRUE((*w)->put(make_entry(2, kSize)).is_ok());
  }
  std::string old_enc(e.encoded());
  restamp_entry_1(eng.name, dir, old_enc, with_version(old_enc, kEntryFormatVersion + 1));
  if (HasFatalFailure()) return;

  auto t = eng.open(dir, o);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  Tier& tier = **t;
  TierStats before = tier.stats();
  for (int i = 0; i < 3; ++i) {
    auto r = tier.get(key_of(1));
    ASSERT_TRUE(r.has_value()) << "an entry of another format version is not an error: " << r.error().to_string();
    EXPECT_FALSE(r->has_value());
  }
  auto ro = make_read_only(*t);
  auto r = ro->get(key_of(1));
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_FALSE(r->has_value());
  TierStats after = tier.stats();
  EXPECT_EQ(after.misses, before.misses + 4);
  EXPECT_EQ(after.corrupt, before.corrupt);
  EXPECT_EQ(after.errors, before.errors);
  EXPECT_TRUE(listed(tier, key_of(1)));

  // verify reports nothing bad, and --fix removes nothing.
  auto rep = tier.admin()->verify(false);
  ASSERT_TRUE(rep.has_value()) << rep.error().to_string();
  EXPECT_TRUE(rep->bad.empty()) << rep->bad[0].second;
  EXPECT_EQ(rep->checked, 2u);
  rep = tier.admin()->verify(true);
  ASSERT_TRUE(rep.has_value()) << rep.error().to_string();
  EXPECT_TRUE(rep->bad.empty());
  EXPECT_EQ(rep->removed, 0u);
  EXPECT_TRUE(listed(tier, key_of(1)));
  EXPECT_EQ(tier.stats().entries, 2u);
  EXPECT_EQ(tier.stats().corrupt, before.corrupt);

  // The other entry still hits.
  auto good = tier.get(key_of(2));
  ASSERT_TRUE(good && good->has_value());
  EXPECT_TRUE(entry_ok(**good, 2, kSize));
}

INSTANTIATE_TEST_SUITE_P(Engines, StaleFormat, ::testing::ValuesIn(disk_engines()), disk_engine_name);

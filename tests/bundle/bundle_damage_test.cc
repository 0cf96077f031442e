// Damaged bundles: bytes changed anywhere, truncated or extended files,
// signed and unsigned, read through bytes and through the file mapping.
// Every trial must end in a refusal, a miss or the right bytes: never wrong
// bytes, never a crash.
#include <random>

#include "bundle_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {

constexpr uint64_t kEntries = 16;
size_t size_of(uint64_t i) { return 100 + i * 173; }

struct Tally {
  uint64_t trials = 0, refused = 0, opened = 0, hits = 0, misses = 0, faults = 0, wrong = 0;
};

// Opens `b` (from bytes or from the file at `path`) and reads every key.
void probe(Tally& t, const std::string& b, bool via_file, const std::string& path,
           const std::vector<std::string>& trust) {
  ++t.trials;
  Expected<std::shared_ptr<Tier>> tier = Status(Errc::internal, "");
  if (via_file) {
    spit(path, b);
    tier = open_bundle(path, trust);
  } else {
    tier = open_bundle_bytes(b, trust);
  }
  if (!tier) {
    ++t.refused;
    return;
  }
  ++t.opened;
  for (uint64_t i = 0; i < kEntries + 2; ++i) {
    auto r = (*tier)->get(key_of(i));
    if (!r) {
      ++t.faults;
    } else if (!r->has_value()) {
      ++t.misses;
    } else if (i < kEntries && entry_ok(**r, i, size_of(i))) {
      ++t.hits;
    } else {
      ++t.wrong;
      ADD_FAILURE() << "wrong bytes for key " << i;
    }
  }
  // Walking and verifying a damaged bundle must not crash either.
  (void)(*tier)->admin()->list([](const ListItem&) { return true; });
  (void)(*tier)->admin()->verify(false);
}

}  // namespace

TEST(BundleDamage, ChangedTruncatedAndExtendedBytesNeverGiveWrongBytes) {
  TempDir d;
  auto store = open_store(d.path());
  for (uint64_t i = 0; i < kEntries; ++i) {
    Compression c = i % 4 == 3 ? Compression::zstd : Compression::none;
    ASSERT_TRUE(store->put(make_entry(i, size_of(i), c)).is_ok());
  }
  std::string key = d.path() + "/key";
  ASSERT_TRUE(bundle_keygen(key).is_ok());
  auto plain = save_bundle(*store, BundleSelection{});
  BundleWriteOptions so;
  so.sign_key_file = key;
  auto sig = save_bundle(*store, BundleSelection{}, so);
  ASSERT_TRUE(plain && sig);
  std::vector<std::string> trust = {key + ".pub"};

  // Undamaged, both read back whole.
  Tally base;
  probe(base, *plain, false, "", {});
  probe(base, *sig, true, d.path() + "/base.kcb", trust);
  ASSERT_EQ(base.hits, 2 * kEntries);

  std::mt19937_64 rng(20261123);
  Tally t;
  const std::string path = d.path() + "/damaged.kcb";
  const int kFlips = 1500, kCuts = 400, kExtends = 100;
  for (int n = 0; n < kFlips; ++n) {
    bool is_signed = n % 2;
    std::string b = is_signed ? *sig : *plain;
    // Half the trials aim at the header, index and signature, where one
    // byte decides the most; the rest anywhere.
    uint64_t data_off = util::get_u64(b.data() + bundle::h_data_offset);
    int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) {
      size_t at = (n / 2) % 2 ? rng() % data_off : rng() % b.size();
      b[at] = static_cast<char>(b[at] ^ (1 + rng() % 255));
    }
    probe(t, b, n % 10 == 0, path, is_signed ? trust : std::vector<std::string>{});
  }
  for (int n = 0; n < kCuts; ++n) {
    bool is_signed = n % 2;
    std::string b = is_signed ? *sig : *plain;
    b.resize(rng() % b.size());
    probe(t, b, n % 3 != 0, path, is_signed ? trust : std::vector<std::string>{});
  }
  for (int n = 0; n < kExtends; ++n) {
    std::string b = n % 2 ? *sig : *plain;
    b.append(1 + rng() % 200, static_cast<char>(rng()));
    probe(t, b, true, path, n % 2 ? trust : std::vector<std::string>{});
  }
  EXPECT_EQ(t.trials, static_cast<uint64_t>(kFlips + kCuts + kExtends));
  EXPECT_EQ(t.wrong, 0u);
  EXPECT_GT(t.refused, 0u);
  EXPECT_GT(t.hits, 0u);
  std::printf(
      "bundle damage: %llu trials, %llu refused, %llu opened; reads: %llu right, %llu misses, "
      "%llu faults, %llu wrong\n",
      (unsigned long long)t.trials, (unsigned long long)t.refused, (unsigned long long)t.opened,
      (unsigned long long)t.hits, (unsigned long long)t.misses, (unsigned long long)t.faults,
      (unsigned long long)t.wrong);
}

// Helpers shared by the bundle tests: stores filled with known entries,
// files read and written whole, and re-sealing a bundle after a deliberate
// change (checksums and digests recomputed, as an adversary could).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "kcache/bundle.h"
#include "kcache/cache.h"
#include "test_util.h"
#include "tier/bundle/bundle_format.h"
#include "util/util.h"

namespace kcache::test {

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Puts entries first..last-1 (make_entry) into `t`.
inline void fill(Tier& t, uint64_t first, uint64_t last, size_t size = 1000) {
  for (uint64_t i = first; i < last; ++i) ASSERT_TRUE(t.put(make_entry(i, size)).is_ok());
}

// An LMDB (default engine) store in `dir`, as the Cache opens it.
inline std::shared_ptr<Tier> open_store(const std::string& dir) {
  auto t = open_lmdb_tier(dir + "/lmdb");
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().to_string());
  return t ? *t : nullptr;
}

// Recomputes an encoded entry's checksum (docs/format.md) after a change.
inline void reseal_entry(char* enc, size_t n) {
  uint64_t seed = XXH3_64bits(enc, 48);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_withSeed(enc + kEntryHeaderSize, n - kEntryHeaderSize, seed));
  std::memcpy(enc + 48, c.digest, 16);
}

// Recomputes every digest and checksum of a bundle from its entries up
// (records' SHA-256, block digests, index and header checksums). The
// signature, if any, is left as it was: it no longer matches.
inline void reseal_bundle(std::string& b) {
  using namespace bundle;
  uint64_t count = util::get_u64(b.data() + h_count);
  uint64_t blocks_off = util::get_u64(b.data() + h_blocks_offset), sig_off = util::get_u64(b.data() + h_sig_offset);
  for (uint64_t i = 0; i < count; ++i) {
    char* rec = b.data() + kHeaderSize + i * kRecordSize;
    uint64_t off = util::get_u64(rec + r_offset), len = util::get_u64(rec + r_length);
    Sha256 h = sha256(std::string_view(b).substr(off, len));
    std::memcpy(rec + r_sha, h.data(), 32);
  }
  for (uint64_t blk = 0; blk * kBlockRecords < count; ++blk) {
    uint64_t first = blk * kBlockRecords, n = std::min<uint64_t>(kBlockRecords, count - first);
    Sha256 h = sha256(std::string_view(b).substr(kHeaderSize + first * kRecordSize, n * kRecordSize));
    std::memcpy(b.data() + blocks_off + blk * 32, h.data(), 32);
  }
  auto isum = xxh128(std::string_view(b).substr(kHeaderSize, sig_off - kHeaderSize));
  std::memcpy(b.data() + h_index_checksum, isum.data(), 16);
  auto hsum = xxh128(std::string_view(b).substr(0, h_header_checksum));
  std::memcpy(b.data() + h_header_checksum, hsum.data(), 16);
}

// Where entry `k`'s bytes lie in bundle `b` (offset, length); 0,0 if absent.
inline std::pair<uint64_t, uint64_t> entry_span(const std::string& b, const Key& k) {
  using namespace bundle;
  uint64_t count = util::get_u64(b.data() + h_count);
  for (uint64_t i = 0; i < count; ++i) {
    const char* rec = b.data() + kHeaderSize + i * kRecordSize;
    if (std::memcmp(rec, k.bytes.data(), 16) == 0)
      return {util::get_u64(rec + r_offset), util::get_u64(rec + r_length)};
  }
  return {0, 0};
}

}  // namespace kcache::test

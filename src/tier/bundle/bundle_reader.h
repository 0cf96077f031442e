// Private: a checked bundle, shared by the bundle tier, verify, import and
// the Cache-level functions. Opening checks the header, the layout, the
// index checksum and the signature; entries are checked when read.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/bundle.h"
#include "kcache/entry.h"
#include "kcache/tier.h"

namespace kcache::bundle {

// The bundle's bytes: a read-only file mapping or a heap copy (64-byte aligned).
class Image {
 public:
  virtual ~Image() = default;
  virtual std::string_view bytes() const noexcept = 0;
};

class Reader {
 public:
  static Expected<std::shared_ptr<Reader>> open(std::shared_ptr<const Image> img, std::string name,
                                                const std::vector<std::string>& trusted_keys);

  uint64_t count() const noexcept { return count_; }
  const BundleInfo& info() const noexcept { return info_; }
  const std::string& name() const noexcept { return name_; }

  // The index slot of `key`, or -1. An error: the signed digest of an index
  // block it had to read does not match.
  Expected<int64_t> find(const Key& key) const;
  Key key_at(uint64_t i) const;
  uint64_t length_at(uint64_t i) const;
  // Entry i's bytes, bounds-checked; its SHA-256 is compared with the index
  // when check_sha, and once per process in a signed bundle.
  Expected<std::string_view> bytes_at(uint64_t i, bool check_sha) const;
  // Entry i verified and decoded (zero-copy: views into the image).
  Expected<Entry> entry_at(uint64_t i, bool check_sha) const;

 private:
  Reader() = default;
  bool block_good(uint64_t b) const;

  std::shared_ptr<const Image> img_;
  std::string name_;
  BundleInfo info_;
  bool signed_ = false;
  uint64_t count_ = 0, blocks_ = 0, data_off_ = 0;
  const char* index_ = nullptr;
  const char* block_sums_ = nullptr;
  // Signed bundles: 0 unchecked, 1 good, 2 bad, per index block and entry.
  mutable std::unique_ptr<std::atomic<uint8_t>[]> block_ok_, entry_ok_;
};

Expected<std::shared_ptr<Reader>> open_file(const std::string& path, const std::vector<std::string>& trusted_keys);
Expected<std::shared_ptr<Reader>> open_bytes(std::string_view bytes, const std::vector<std::string>& trusted_keys);
std::shared_ptr<Tier> make_tier(std::shared_ptr<Reader> r);

}  // namespace kcache::bundle

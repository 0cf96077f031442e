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
#include "kcache/env.h"
#include "kcache/tier.h"

namespace kcache::bundle {

// The bundle's bytes: an open file read with pread, or a heap copy (64-byte
// aligned). A file is never mapped: a bundle rewritten or truncated in
// place (`cp new.kcb b.kcb`) would make every read of a page past its new
// end kill the process with SIGBUS.
class Image {
 public:
  virtual ~Image() = default;
  virtual uint64_t size() const noexcept = 0;
  // Bytes [off, off + len), within size(): a view of the heap copy or a
  // buffer read from the file. Errc::unavailable once the file changed
  // since it was opened (its size or modification time: rewritten in
  // place), Errc::io_error or Errc::corrupt when the read fails or comes
  // back short.
  virtual Expected<std::shared_ptr<const Buffer>> read(uint64_t off, uint64_t len) const = 0;
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
  Expected<std::shared_ptr<const Buffer>> bytes_at(uint64_t i, bool check_sha) const;
  // Entry i verified and decoded (views into the buffer bytes_at gave).
  Expected<Entry> entry_at(uint64_t i, bool check_sha) const;

 private:
  Reader() = default;
  bool block_good(uint64_t b) const;

  std::shared_ptr<const Image> img_;
  std::shared_ptr<const Buffer> head_;  // header, index, digests and signature: [0, data offset)
  std::string name_;
  BundleInfo info_;
  bool signed_ = false;
  uint64_t count_ = 0, blocks_ = 0, data_off_ = 0;
  const char* index_ = nullptr;
  const char* block_sums_ = nullptr;
  // Signed bundles: 0 unchecked, 1 good, 2 bad, per index block and entry.
  mutable std::unique_ptr<std::atomic<uint8_t>[]> block_ok_, entry_ok_;
};

// The bundle file at `path`, opened and read through `env` (null: Env::posix()).
Expected<std::shared_ptr<Reader>> open_file(const std::string& path, const std::vector<std::string>& trusted_keys,
                                            std::shared_ptr<Env> env = nullptr);
Expected<std::shared_ptr<Reader>> open_bytes(std::string_view bytes, const std::vector<std::string>& trusted_keys);
std::shared_ptr<Tier> make_tier(std::shared_ptr<Reader> r);

}  // namespace kcache::bundle

// kcache/entry.h — an entry: the immutable unit a cache stores under a key.
//
// An Entry is a set of named artifacts (e.g. "obj", "ptx", "cubin") plus
// metadata (creation time, compile cost, producer) and the key's manifest.
// It is encoded into one self-describing byte string (see docs/format.md):
// a fixed header (magic, format version, key, lengths, checksum) that is
// verified before any other byte is parsed, then the payload.
//
// An Entry shares its bytes: copying an Entry is cheap, and artifact views
// point into the encoded bytes (zero-copy when the tier hands out mapped
// memory). The views stay valid as long as any copy of the Entry lives.
//
// Thread-safety: an Entry is immutable; copies may be used from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache {

struct EntryMeta {
  uint64_t created_unix_ms = 0;  // wall-clock creation time
  uint64_t compile_cost_us = 0;  // how long the compile took
  std::string producer;          // free text, e.g. "llvm-14 orc"
  std::string label = {};        // what was compiled (KeyInfo::label); not part of the key
};

struct Artifact {
  std::string name;
  std::string data;
};

enum class Compression : uint8_t {
  none = 0,       // never compress (zero-copy reads)
  zstd = 1,       // always try zstd; kept only if it saves >= 1/8
  automatic = 2,  // zstd only for payloads >= 64 KiB that shrink by >= 1/4
};

// Owner of encoded bytes. Implementations: heap memory, or a pinned LMDB
// read transaction whose map the bytes live in.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual std::string_view bytes() const noexcept = 0;
  // True when the bytes pin a resource that must not be held for long
  // (an LMDB read transaction). Long-lived holders detach() such entries.
  virtual bool pinned() const noexcept { return false; }
};
std::shared_ptr<const Buffer> make_heap_buffer(std::string bytes);

class Entry {
 public:
  Entry() = default;

  const Key& key() const noexcept { return key_; }
  // The metadata and the key's manifest are parsed from the encoded bytes
  // on first use (a hit needs neither); copies of an Entry share the result.
  const EntryMeta& meta() const { return described().meta; }
  const Manifest& manifest() const { return described().manifest; }

  // The artifact's bytes, or nullopt if the entry has no such artifact.
  std::optional<std::string_view> artifact(std::string_view name) const noexcept;
  struct ArtifactRef {
    std::string name;
    std::string_view data;
  };
  const std::vector<ArtifactRef>& artifacts() const noexcept { return artifacts_; }
  // Sum of artifact sizes.
  uint64_t payload_size() const noexcept;

  // The encoded form, as stored by tiers.
  std::string_view encoded() const noexcept { return buffer_ ? buffer_->bytes() : std::string_view(); }
  bool compressed() const noexcept { return compressed_; }
  // Bytes this Entry keeps alive: the encoded form plus, for a compressed
  // entry, its decompressed payload.
  uint64_t memory_size() const noexcept { return encoded().size() + (raw_ ? raw_->size() : 0); }
  bool pinned() const noexcept { return buffer_ && buffer_->pinned(); }

  // Verifies and parses encoded bytes. When `expected` is given the key in
  // the header must equal it. Never reads or allocates outside the bounds
  // the verified header gives; corrupt input is Errc::corrupt.
  static Expected<Entry> decode(std::shared_ptr<const Buffer> bytes, const Key* expected = nullptr);
  // Header and checksum check only (no parsing); used by `verify`.
  static Status check(std::string_view encoded, const Key* expected = nullptr);
  // Reads just the key from a header that passes the size/magic check.
  static std::optional<Key> peek_key(std::string_view encoded) noexcept;

  // A copy whose bytes live on the heap (detached from any tier's memory),
  // checked again (checksum) once copied. The copy out of a map is guarded:
  // when the file under the map shrank (another process truncated the
  // store) the result is Errc::unavailable, never a SIGBUS.
  Expected<Entry> detach() const;

 private:
  friend class EntryBuilder;
  friend struct EntryAccess;  // private to the library (src/entry/access.h)
  struct Description {
    EntryMeta meta;
    Manifest manifest;
  };
  struct Lazy;  // the description, parsed once (entry.cc)
  const Description& described() const;
  Key key_;
  std::shared_ptr<Lazy> lazy_;
  std::vector<ArtifactRef> artifacts_;
  bool compressed_ = false;
  std::shared_ptr<const Buffer> buffer_;    // the encoded bytes
  std::shared_ptr<const std::string> raw_;  // decompressed payload, if any
};

class EntryBuilder {
 public:
  explicit EntryBuilder(const Key& key) : key_(key) {}
  EntryBuilder& add(std::string name, std::string data);
  EntryBuilder& add(Artifact a) { return add(std::move(a.name), std::move(a.data)); }
  EntryBuilder& meta(EntryMeta m) {
    meta_ = std::move(m);
    return *this;
  }
  EntryBuilder& manifest(Manifest m) {
    manifest_ = std::move(m);
    return *this;
  }
  EntryBuilder& compression(Compression c) {
    compression_ = c;
    return *this;
  }

  // Fails (invalid_argument) on duplicate or empty artifact names, or names
  // longer than 255 bytes.
  Expected<Entry> build() const;

 private:
  Key key_;
  EntryMeta meta_;
  Manifest manifest_;
  std::vector<Artifact> artifacts_;
  Compression compression_ = Compression::none;
};

// Format constants (docs/format.md).
inline constexpr uint32_t kEntryFormatVersion = 1;
inline constexpr size_t kEntryHeaderSize = 64;
inline constexpr uint64_t kMaxEntrySize = uint64_t(1) << 32;  // 4 GiB

}  // namespace kcache

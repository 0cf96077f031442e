// kcache/key.h — cache keys and how they are built.
//
// A Key is a 128-bit digest. It is made by a KeyBuilder from a namespace and
// named, typed components (the IR, the compiler's identity, the target, every
// option). Encoding is canonical: each component is hashed on its own with
// its type and name, components are ordered by name, maps are sorted by key,
// so the key depends only on what was added, never on the order of add()
// calls, addresses, the environment or the process.
//
// The list (component name, type, component digest) is the key's Manifest.
// It is stored beside each entry so that "why did this miss?" can be answered
// by comparing manifests (kcache explain, kcache misses).
//
// Readable values: a small scalar component (a string of at most 256 bytes,
// an integer, a boolean) also keeps its value in the manifest, so that a
// miss can be explained as `cpu: znver3 -> x86-64` rather than by digests.
// The value is for display only: it is never hashed, so keys do not depend
// on it. mark_private(name) keeps a component's value out of the manifest
// (and so out of every store); only its digest is kept.
//
// A label (the kernel's or module's name) travels with the key in KeyInfo
// and is stored in the entry's metadata; it is not part of the key either.
// Explaining a miss compares it first with entries of the same label.
//
// What a KeyBuilder cannot know: it hashes exactly the bytes it is given. Do
// not add pointers, PIDs, times or absolute paths; hash a file's *contents*
// with add_file(), not its path.
//
// Thread-safety: KeyBuilder is not thread-safe; Key and Manifest are values.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/status.h"

namespace kcache {

// 128-bit digest, stored big-endian-as-printed (bytes[0] is the first hex pair).
struct Digest {
  std::array<uint8_t, 16> bytes{};

  std::string hex() const;  // 32 lowercase hex characters
  static std::optional<Digest> from_hex(std::string_view hex);
  // Byte-wise order (the order of hex()), so digests key ordered maps.
  bool operator==(const Digest& o) const noexcept { return bytes == o.bytes; }
  bool operator!=(const Digest& o) const noexcept { return bytes != o.bytes; }
  bool operator<(const Digest& o) const noexcept { return bytes < o.bytes; }
  bool operator>(const Digest& o) const noexcept { return bytes > o.bytes; }
  bool operator<=(const Digest& o) const noexcept { return bytes <= o.bytes; }
  bool operator>=(const Digest& o) const noexcept { return bytes >= o.bytes; }
};

using Key = Digest;

// Digest of arbitrary bytes (XXH3-128). Fast: it is what keys are made of.
Digest hash_bytes(std::string_view data) noexcept;

enum class ComponentType : uint8_t {
  bytes = 1,
  string = 2,
  u64 = 3,
  i64 = 4,
  boolean = 5,
  map = 6,     // string -> string, sorted by key
  list = 7,    // ordered list of strings
  file = 8,    // contents of a file (the path is not hashed)
  digest = 9,  // a digest computed elsewhere (e.g. a previous stage's output)
};
std::string_view component_type_name(ComponentType t) noexcept;

// Longest string value a manifest keeps for display.
inline constexpr size_t kMaxReadableValue = 256;

struct ManifestItem {
  std::string name;
  ComponentType type;
  Digest digest;
  // The component's value as text, for display only (not hashed): a string
  // of at most kMaxReadableValue bytes, an integer in decimal, a boolean as
  // "true"/"false". Empty for other types, private components and
  // manifests stored without values.
  std::optional<std::string> value = std::nullopt;
  // Name, type and digest: what the key is made of (value is not compared).
  bool operator==(const ManifestItem& o) const { return name == o.name && type == o.type && digest == o.digest; }
  bool operator!=(const ManifestItem& o) const { return !(*this == o); }
};

// The namespace and each component's digest, sorted by name.
struct Manifest {
  std::string ns;
  std::vector<ManifestItem> items;
  bool operator==(const Manifest& o) const { return ns == o.ns && items == o.items; }
  bool operator!=(const Manifest& o) const { return !(*this == o); }

  // The key this manifest hashes to.
  Key key() const noexcept;
};

struct KeyInfo {
  Key key;
  Manifest manifest;
  // What is compiled, e.g. the module's or kernel's name (not part of the
  // key; stored in the entry's metadata). May be empty.
  std::string label = {};
};

// Longest label kept (longer ones are cut).
inline constexpr size_t kMaxLabel = 1024;

class KeyBuilder {
 public:
  // `ns` names the client and its schema version, e.g. "mytriton/3".
  explicit KeyBuilder(std::string_view ns);

  KeyBuilder& add_bytes(std::string_view name, std::string_view data);
  KeyBuilder& add_string(std::string_view name, std::string_view value);
  KeyBuilder& add_u64(std::string_view name, uint64_t value);
  KeyBuilder& add_i64(std::string_view name, int64_t value);
  KeyBuilder& add_bool(std::string_view name, bool value);
  KeyBuilder& add_map(std::string_view name, const std::map<std::string, std::string>& value);
  KeyBuilder& add_list(std::string_view name, const std::vector<std::string>& value);
  KeyBuilder& add_digest(std::string_view name, const Digest& value);
  // Hashes the file's contents. An unreadable file, or anything but a
  // regular file (a folder, a device such as /dev/zero, a FIFO, which is
  // never waited on), makes finish() fail with a message naming it.
  KeyBuilder& add_file(std::string_view name, const std::string& path);

  // Keeps the value of component `name` (added before or after this call)
  // out of the manifest: only its digest is stored. For values that must
  // not be written to a cache (tokens, user names, paths). finish() fails
  // when no component has that name (a misspelt name would leak the value).
  KeyBuilder& mark_private(std::string_view name);
  // The label of what is compiled (KeyInfo::label); not part of the key.
  KeyBuilder& label(std::string_view label);

  // Fails (invalid_argument) when a name was added twice or is empty, or
  // (io_error) when add_file could not read its file. On an rvalue
  // (std::move(builder).finish()) the components move into the KeyInfo
  // instead of being copied.
  Expected<KeyInfo> finish() const&;
  Expected<KeyInfo> finish() &&;

 private:
  void push(std::string_view name, ComponentType type, const Digest& d,
            std::optional<std::string> value = std::nullopt);
  static Expected<KeyInfo> finish(std::string ns, std::vector<ManifestItem> items, std::string label,
                                  const std::vector<std::string>& private_names);
  std::string ns_;
  std::string label_;
  std::vector<ManifestItem> items_;
  std::vector<std::string> private_;
  Status error_;
};

// Names of manifest components that differ between `a` and `b` (added,
// removed or changed), for explaining a miss. A namespace change is reported
// as the pseudo-component "<namespace>".
std::vector<std::string> manifest_diff(const Manifest& a, const Manifest& b);

}  // namespace kcache

template <>
struct std::hash<kcache::Digest> {
  size_t operator()(const kcache::Digest& d) const noexcept {
    uint64_t v;
    __builtin_memcpy(&v, d.bytes.data(), sizeof v);
    return static_cast<size_t>(v);
  }
};

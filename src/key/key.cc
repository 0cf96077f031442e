// Keys: per-component XXH3-128 digests, combined in name order (a Merkle
// layout), so the manifest alone determines the key.
//
// Component digest = XXH3_128(canonical value bytes, seed = type tag).
//   bytes/string/file: the bytes themselves
//   u64/i64: 8 bytes little-endian; boolean: one byte 0/1
//   map: for each pair sorted by key: u64 len, key, u64 len, value
//   list: u64 count, then per item: u64 len, item
//   digest: the 16 digest bytes
// Key = XXH3_128("kcache-key-v1" 0x00, u64 len(ns), ns, u32 count,
//                per item sorted by name: u64 len(name), name, u8 type, 16 bytes)
// Readable values and the label are kept beside the manifest for display
// and are never hashed.
#include "kcache/key.h"

#include "util/fast_xxhash.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "util/fd.h"
#include "util/util.h"

namespace kcache {

static Digest from_xxh(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  Digest d;
  std::memcpy(d.bytes.data(), c.digest, 16);
  return d;
}

Digest hash_bytes(std::string_view data) noexcept { return from_xxh(XXH3_128bits(data.data(), data.size())); }

static Digest hash_typed(ComponentType t, std::string_view data) {
  return from_xxh(XXH3_128bits_withSeed(data.data(), data.size(), static_cast<uint64_t>(t)));
}

std::string Digest::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    s[2 * i] = digits[bytes[i] >> 4];
    s[2 * i + 1] = digits[bytes[i] & 15];
  }
  return s;
}

std::optional<Digest> Digest::from_hex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  Digest d;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v = c - 'A' + 10;
    else
      return std::nullopt;
    d.bytes[i / 2] = static_cast<uint8_t>((d.bytes[i / 2] << 4) | v);
  }
  return d;
}

std::string_view component_type_name(ComponentType t) noexcept {
  switch (t) {
    case ComponentType::bytes:
      return "bytes";
    case ComponentType::string:
      return "string";
    case ComponentType::u64:
      return "u64";
    case ComponentType::i64:
      return "i64";
    case ComponentType::boolean:
      return "bool";
    case ComponentType::map:
      return "map";
    case ComponentType::list:
      return "list";
    case ComponentType::file:
      return "file";
    case ComponentType::digest:
      return "digest";
  }
  return "?";
}

Key Manifest::key() const noexcept {
  std::string buf;
  buf.reserve(32 + ns.size() + items.size() * 48);
  static constexpr char kTag[] = "kcache-key-v1";
  buf.append(kTag, sizeof kTag);  // includes the NUL
  util::put_u64(buf, ns.size());
  buf += ns;
  util::put_u32(buf, static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    util::put_u64(buf, it.name.size());
    buf += it.name;
    buf.push_back(static_cast<char>(it.type));
    buf.append(reinterpret_cast<const char*>(it.digest.bytes.data()), 16);
  }
  return hash_bytes(buf);
}

KeyBuilder::KeyBuilder(std::string_view ns) : ns_(ns) { items_.reserve(16); }

void KeyBuilder::push(std::string_view name, ComponentType type, const Digest& d, std::optional<std::string> value) {
  if (name.empty() && error_.is_ok()) error_ = Status(Errc::invalid_argument, "empty component name");
  items_.push_back(ManifestItem{std::string(name), type, d, std::move(value)});
}

KeyBuilder& KeyBuilder::add_bytes(std::string_view name, std::string_view data) {
  push(name, ComponentType::bytes, hash_typed(ComponentType::bytes, data));
  return *this;
}
KeyBuilder& KeyBuilder::add_string(std::string_view name, std::string_view value) {
  std::optional<std::string> shown;
  if (value.size() <= kMaxReadableValue) shown = std::string(value);
  push(name, ComponentType::string, hash_typed(ComponentType::string, value), std::move(shown));
  return *this;
}
KeyBuilder& KeyBuilder::add_u64(std::string_view name, uint64_t value) {
  std::string b;
  util::put_u64(b, value);
  push(name, ComponentType::u64, hash_typed(ComponentType::u64, b), std::to_string(value));
  return *this;
}
KeyBuilder& KeyBuilder::add_i64(std::string_view name, int64_t value) {
  std::string b;
  util::put_u64(b, static_cast<uint64_t>(value));
  push(name, ComponentType::i64, hash_typed(ComponentType::i64, b), std::to_string(value));
  return *this;
}
KeyBuilder& KeyBuilder::add_bool(std::string_view name, bool value) {
  char c = value ? 1 : 0;
  push(name, ComponentType::boolean, hash_typed(ComponentType::boolean, std::string_view(&c, 1)),
       std::string(value ? "true" : "false"));
  return *this;
}
KeyBuilder& KeyBuilder::add_map(std::string_view name, const std::map<std::string, std::string>& value) {
  std::string b;
  for (const auto& [k, v] : value) {  // std::map iterates in key order
    util::put_u64(b, k.size());
    b += k;
    util::put_u64(b, v.size());
    b += v;
  }
  push(name, ComponentType::map, hash_typed(ComponentType::map, b));
  return *this;
}
KeyBuilder& KeyBuilder::add_list(std::string_view name, const std::vector<std::string>& value) {
  std::string b;
  util::put_u64(b, value.size());
  for (const auto& v : value) {
    util::put_u64(b, v.size());
    b += v;
  }
  push(name, ComponentType::list, hash_typed(ComponentType::list, b));
  return *this;
}
KeyBuilder& KeyBuilder::add_digest(std::string_view name, const Digest& value) {
  push(name, ComponentType::digest,
       hash_typed(ComponentType::digest, std::string_view(reinterpret_cast<const char*>(value.bytes.data()), 16)));
  return *this;
}
namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// The contents of the regular file at `path`. Anything else is refused
// before a byte is read: a device such as /dev/zero never ends, and a FIFO
// would block (it is opened without blocking, then looked at).
Expected<std::string> read_regular_file(const std::string& path) {
  util::Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd) return util::errno_status(errno, "open " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return util::errno_status(errno, "stat " + path);
  if (!S_ISREG(st.st_mode))
    return Status(Errc::invalid_argument, path + " is " + file_kind(st.st_mode) + ", not a regular file");
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return util::errno_status(errno, "read " + path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

KeyBuilder& KeyBuilder::add_file(std::string_view name, const std::string& path) {
  auto data = read_regular_file(path);
  if (!data) {
    if (error_.is_ok())
      error_ = Status(Errc::io_error, "key component '" + std::string(name) + "': " + data.error().to_string());
    push(name, ComponentType::file, Digest{});
    return *this;
  }
  push(name, ComponentType::file, hash_typed(ComponentType::file, *data));
  return *this;
}

KeyBuilder& KeyBuilder::mark_private(std::string_view name) {
  private_.emplace_back(name);
  return *this;
}

KeyBuilder& KeyBuilder::label(std::string_view label) {
  label_ = std::string(label.substr(0, kMaxLabel));
  return *this;
}

Expected<KeyInfo> KeyBuilder::finish() const& {
  if (!error_.is_ok()) return error_;
  return finish(ns_, items_, label_, private_);
}

Expected<KeyInfo> KeyBuilder::finish() && {
  if (!error_.is_ok()) return error_;
  return finish(std::move(ns_), std::move(items_), std::move(label_), private_);
}

Expected<KeyInfo> KeyBuilder::finish(std::string ns, std::vector<ManifestItem> items, std::string label,
                                     const std::vector<std::string>& private_names) {
  Manifest m;
  m.ns = std::move(ns);
  m.items = std::move(items);
  for (auto& it : m.items)
    if (std::find(private_names.begin(), private_names.end(), it.name) != private_names.end()) it.value.reset();
  // A private name that names no component is a misspelling whose value
  // would otherwise be stored in plain text.
  for (const auto& p : private_names)
    if (std::none_of(m.items.begin(), m.items.end(), [&](const ManifestItem& it) { return it.name == p; }))
      return Status(Errc::invalid_argument, "private key component '" + p + "' was never added");
  std::sort(m.items.begin(), m.items.end(),
            [](const ManifestItem& a, const ManifestItem& b) { return a.name < b.name; });
  for (size_t i = 1; i < m.items.size(); ++i)
    if (m.items[i].name == m.items[i - 1].name)
      return Status(Errc::invalid_argument, "key component '" + m.items[i].name + "' added twice");
  KeyInfo info;
  info.key = m.key();
  info.manifest = std::move(m);
  info.label = std::move(label);
  return info;
}

std::vector<std::string> manifest_diff(const Manifest& a, const Manifest& b) {
  std::vector<std::string> out;
  if (a.ns != b.ns) out.push_back("<namespace>");
  size_t i = 0, j = 0;
  while (i < a.items.size() || j < b.items.size()) {
    if (j == b.items.size() || (i < a.items.size() && a.items[i].name < b.items[j].name)) {
      out.push_back(a.items[i++].name);
    } else if (i == a.items.size() || b.items[j].name < a.items[i].name) {
      out.push_back(b.items[j++].name);
    } else {
      if (a.items[i].digest != b.items[j].digest || a.items[i].type != b.items[j].type) out.push_back(a.items[i].name);
      ++i;
      ++j;
    }
  }
  return out;
}

}  // namespace kcache

// Entry encoding. The byte grammar is in docs/format.md; in short:
//
//   entry   := header(64) payload
//   header  := magic "KCENTRY\x1a" | u32 version | u32 flags | key[16]
//              | u64 stored_len | u64 raw_len | checksum[16]
//   checksum = XXH3_128(payload, seed = XXH3_64(header[0..48)))
//   payload := (zstd-compressed when flags&1) raw
//   raw     := u64 created_ms | u64 cost_us | str32 producer
//              | str32 namespace | u32 n_items | n_items * (str16 name, u8 type, digest[16])
//              | u32 n_artifacts | n_artifacts * (str16 name, u64 offset, u64 size)
//              | [ext] | zero padding | artifact bytes, each at a 64-byte aligned offset
//   ext     := "KCX1" | u32 ext_len | str16 label | u32 n | n * (u32 item index, str16 value)
//              (optional; the label and the manifest's readable values.
//              Readers that do not know it skip it: artifacts are found
//              by their offsets. It must end before the first artifact.)
//   offsets are relative to the start of raw; all integers little-endian.
//
// The header is verified (size, magic, version, flags, lengths, checksum)
// before any payload byte is read; every later read is bounds-checked
// against the verified lengths, so corrupt input cannot make us read out of
// bounds or allocate more than the header allows.
#include "util/fast_xxhash.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "entry/buffer.h"
#include "kcache/entry.h"
#include "util/util.h"

#if KCACHE_HAVE_ZSTD
#include <zstd.h>
#endif

namespace kcache {

namespace {

constexpr char kMagic[8] = {'K', 'C', 'E', 'N', 'T', 'R', 'Y', '\x1a'};
constexpr char kExtMagic[4] = {'K', 'C', 'X', '1'};
constexpr uint32_t kFlagZstd = 1;

class StringBuffer final : public Buffer {
 public:
  explicit StringBuffer(std::string s) : s_(std::move(s)) {}
  std::string_view bytes() const noexcept override { return s_; }

 private:
  std::string s_;
};

void put_str16(std::string& out, std::string_view s) {
  out.push_back(static_cast<char>(s.size() & 0xff));
  out.push_back(static_cast<char>(s.size() >> 8));
  out += s;
}
void put_str32(std::string& out, std::string_view s) {
  util::put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

Digest checksum(const char* header, std::string_view payload) {
  uint64_t seed = XXH3_64bits(header, 48);
  XXH128_hash_t h = XXH3_128bits_withSeed(payload.data(), payload.size(), seed);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  Digest d;
  std::memcpy(d.bytes.data(), c.digest, 16);
  return d;
}

// Bounds-checked reader over the raw payload.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool u8(uint8_t& v) {
    if (pos_ + 1 > s_.size()) return false;
    v = static_cast<uint8_t>(s_[pos_++]);
    return true;
  }
  bool u16(uint16_t& v) {
    if (pos_ + 2 > s_.size()) return false;
    v = static_cast<uint16_t>(static_cast<uint8_t>(s_[pos_]) | (static_cast<uint8_t>(s_[pos_ + 1]) << 8));
    pos_ += 2;
    return true;
  }
  bool u32(uint32_t& v) {
    if (pos_ + 4 > s_.size()) return false;
    v = util::get_u32(s_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t& v) {
    if (pos_ + 8 > s_.size()) return false;
    v = util::get_u64(s_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool bytes(size_t n, std::string_view& out) {
    if (n > s_.size() - pos_) return false;
    out = s_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return s_.size() - pos_; }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

Status corrupt(const std::string& why) { return Status(Errc::corrupt, why); }

struct Header {
  uint32_t version, flags;
  Key key;
  uint64_t stored_len, raw_len;
};

Expected<Header> verify_header(std::string_view enc, const Key* expected) {
  if (enc.size() < kEntryHeaderSize) return corrupt("entry shorter than its header");
  const char* p = enc.data();
  if (std::memcmp(p, kMagic, 8) != 0) return corrupt("bad magic");
  Header h;
  h.version = util::get_u32(p + 8);
  h.flags = util::get_u32(p + 12);
  std::memcpy(h.key.bytes.data(), p + 16, 16);
  h.stored_len = util::get_u64(p + 32);
  h.raw_len = util::get_u64(p + 40);
  if (h.version != kEntryFormatVersion)
    return Status(Errc::stale_format, "format version " + std::to_string(h.version) + " (this build reads " +
                                          std::to_string(kEntryFormatVersion) + ")");
  if (h.flags & ~kFlagZstd) return corrupt("unknown flags");
  if (h.stored_len != enc.size() - kEntryHeaderSize) return corrupt("length mismatch");
  if (h.raw_len > kMaxEntrySize) return corrupt("entry too large");
  if (!(h.flags & kFlagZstd) && h.raw_len != h.stored_len) return corrupt("length mismatch");
  if (expected && *expected != h.key) return corrupt("key mismatch");
  Digest sum = checksum(p, enc.substr(kEntryHeaderSize));
  if (std::memcmp(sum.bytes.data(), p + 48, 16) != 0) return corrupt("checksum mismatch");
  return h;
}

std::string encode_extension(const EntryMeta& meta, const Manifest& m) {
  size_t n = 0;
  for (const auto& it : m.items) n += it.value ? 1 : 0;
  if (meta.label.empty() && n == 0) return std::string();
  std::string x(kExtMagic, 4);
  util::put_u32(x, 0);  // ext_len, set below
  put_str16(x, std::string_view(meta.label).substr(0, kMaxLabel));
  util::put_u32(x, static_cast<uint32_t>(n));
  for (size_t i = 0; i < m.items.size(); ++i) {
    if (!m.items[i].value) continue;
    util::put_u32(x, static_cast<uint32_t>(i));
    put_str16(x, std::string_view(*m.items[i].value).substr(0, 65535));
  }
  uint32_t len = static_cast<uint32_t>(x.size());
  std::string l;
  util::put_u32(l, len);
  std::memcpy(x.data() + 4, l.data(), 4);
  return x;
}

// The optional extension after the artifact table, at `at` of raw. Only
// taken when it is whole and ends before every artifact (an older entry
// has zero padding or artifact bytes there); anything else is ignored,
// never an error: it is for display only.
void read_extension(std::string_view raw, size_t at, EntryMeta& meta, Manifest& m,
                    const std::vector<Entry::ArtifactRef>& arts) {
  if (raw.size() - at < 8 || std::memcmp(raw.data() + at, kExtMagic, 4) != 0) return;
  uint64_t len = util::get_u32(raw.data() + at + 4);
  uint64_t limit = raw.size();
  for (const auto& a : arts) limit = std::min<uint64_t>(limit, static_cast<uint64_t>(a.data.data() - raw.data()));
  if (len < 8 || at + len > limit) return;
  Reader r(raw.substr(at + 8, len - 8));
  uint16_t n16;
  uint32_t n;
  std::string_view label;
  if (!r.u16(n16) || !r.bytes(n16, label) || !r.u32(n) || n > r.remaining() / 6) return;
  std::vector<std::pair<uint32_t, std::string_view>> values;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t index;
    std::string_view v;
    if (!r.u32(index) || !r.u16(n16) || !r.bytes(n16, v) || index >= m.items.size()) return;
    values.emplace_back(index, v);
  }
  meta.label = std::string(label);
  for (const auto& [index, v] : values) m.items[index].value = std::string(v);
}

// The metadata and manifest at the start of a payload, walked: checked
// only (meta and m null: decode, which allocates nothing for them) or also
// filled in (on first use). The error, or nullptr.
const char* walk_description(Reader& r, EntryMeta* meta, Manifest* m) {
  std::string_view s;
  uint64_t created, cost;
  uint32_t n32;
  uint16_t n16;
  if (!r.u64(created) || !r.u64(cost)) return "truncated metadata";
  if (!r.u32(n32) || !r.bytes(n32, s)) return "truncated producer";
  if (meta) {
    meta->created_unix_ms = created;
    meta->compile_cost_us = cost;
    meta->producer = std::string(s);
  }
  if (!r.u32(n32) || !r.bytes(n32, s)) return "truncated namespace";
  if (m) m->ns = std::string(s);
  uint32_t items;
  if (!r.u32(items) || items > r.remaining() / 19) return "bad manifest count";
  if (m) m->items.reserve(items);
  for (uint32_t i = 0; i < items; ++i) {
    uint8_t type;
    std::string_view d;
    if (!r.u16(n16) || !r.bytes(n16, s) || !r.u8(type) || !r.bytes(16, d)) return "truncated manifest";
    if (!m) continue;
    ManifestItem it;
    it.name = std::string(s);
    it.type = static_cast<ComponentType>(type);
    std::memcpy(it.digest.bytes.data(), d.data(), 16);
    m->items.push_back(std::move(it));
  }
  return nullptr;
}

}  // namespace

struct Entry::Lazy {
  std::once_flag once;
  size_t ext_at = 0;  // where the extension may start in the payload
  Description d;
};

std::shared_ptr<const Buffer> make_heap_buffer(std::string bytes) {
  return std::make_shared<StringBuffer>(std::move(bytes));
}

std::optional<std::string_view> Entry::artifact(std::string_view name) const noexcept {
  for (const auto& a : artifacts_)
    if (a.name == name) return a.data;
  return std::nullopt;
}

uint64_t Entry::payload_size() const noexcept {
  uint64_t n = 0;
  for (const auto& a : artifacts_) n += a.data.size();
  return n;
}

Status Entry::check(std::string_view encoded, const Key* expected) {
  auto h = verify_header(encoded, expected);
  return h.status();
}

std::optional<Key> Entry::peek_key(std::string_view enc) noexcept {
  if (enc.size() < kEntryHeaderSize || std::memcmp(enc.data(), kMagic, 8) != 0) return std::nullopt;
  Key k;
  std::memcpy(k.bytes.data(), enc.data() + 16, 16);
  return k;
}

Expected<Entry> Entry::decode(std::shared_ptr<const Buffer> buf, const Key* expected) {
  if (!buf) return corrupt("no bytes");
  std::string_view enc = buf->bytes();
  KCACHE_TRY(Header h, verify_header(enc, expected));

  Entry e;
  e.key_ = h.key;
  std::string_view raw = enc.substr(kEntryHeaderSize);
  if (h.flags & kFlagZstd) {
#if KCACHE_HAVE_ZSTD
    // raw_len is covered by the verified checksum; it must also match the
    // frame's own claim before we allocate it.
    unsigned long long claimed = ZSTD_getFrameContentSize(raw.data(), raw.size());
    if (claimed != h.raw_len) return corrupt("zstd frame size disagrees with header");
    // raw_len is at most 4 GiB; memory may still run out. No exception
    // leaves the core: that is a miss like any other fault.
    std::shared_ptr<std::string> out;
    try {
      out = std::make_shared<std::string>();
      out->resize(h.raw_len);
    } catch (const std::bad_alloc&) {
      return Status(Errc::too_large, "no memory to decompress " + std::to_string(h.raw_len) + " bytes");
    }
    size_t n = ZSTD_decompress(out->data(), out->size(), raw.data(), raw.size());
    if (ZSTD_isError(n) || n != h.raw_len) return corrupt("zstd payload does not decode");
    e.raw_ = std::move(out);
    e.compressed_ = true;
    raw = *e.raw_;
#else
    return Status(Errc::corrupt, "entry is zstd-compressed and this build has no zstd");
#endif
  }

  Reader r(raw);
  // The metadata and manifest are checked here and parsed on first use.
  if (const char* why = walk_description(r, nullptr, nullptr)) return corrupt(why);
  std::string_view s;
  uint16_t n16;
  uint32_t count;
  if (!r.u32(count) || count > r.remaining() / 18) return corrupt("bad artifact count");
  e.artifacts_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t off, size;
    if (!r.u16(n16) || !r.bytes(n16, s) || !r.u64(off) || !r.u64(size)) return corrupt("truncated artifact table");
    if (off > raw.size() || size > raw.size() - off) return corrupt("artifact out of bounds");
    e.artifacts_.push_back(ArtifactRef{std::string(s), raw.substr(off, size)});
  }
  e.lazy_ = std::make_shared<Lazy>();
  e.lazy_->ext_at = raw.size() - r.remaining();
  e.buffer_ = std::move(buf);
  return e;
}

const Entry::Description& Entry::described() const {
  static const Description none;
  if (!lazy_) return none;
  std::call_once(lazy_->once, [this] {
    std::string_view raw = compressed_ ? std::string_view(*raw_) : encoded().substr(kEntryHeaderSize);
    Reader r(raw);
    (void)walk_description(r, &lazy_->d.meta, &lazy_->d.manifest);  // decode checked it
    read_extension(raw, lazy_->ext_at, lazy_->d.meta, lazy_->d.manifest, artifacts_);
  });
  return lazy_->d;
}

Entry Entry::detach() const {
  Entry e = *this;
  if (!buffer_) return e;
  auto copy = std::make_shared<AlignedBuffer>(buffer_->bytes().size());
  std::memcpy(copy->data(), buffer_->bytes().data(), copy->size());
  auto d = decode(copy);
  return d ? std::move(d).value() : e;
}

EntryBuilder& EntryBuilder::add(std::string name, std::string data) {
  artifacts_.push_back(Artifact{std::move(name), std::move(data)});
  return *this;
}

Expected<Entry> EntryBuilder::build() const {
  std::set<std::string_view> names;
  for (const auto& a : artifacts_) {
    if (a.name.empty() || a.name.size() > 255)
      return Status(Errc::invalid_argument, "artifact name must be 1 to 255 bytes");
    if (!names.insert(a.name).second) return Status(Errc::invalid_argument, "artifact '" + a.name + "' added twice");
  }
  if (meta_.producer.size() > (1u << 20) || manifest_.ns.size() > (1u << 20))
    return Status(Errc::invalid_argument, "producer or namespace too long");

  std::string raw;
  util::put_u64(raw, meta_.created_unix_ms);
  util::put_u64(raw, meta_.compile_cost_us);
  put_str32(raw, meta_.producer);
  put_str32(raw, manifest_.ns);
  util::put_u32(raw, static_cast<uint32_t>(manifest_.items.size()));
  for (const auto& it : manifest_.items) {
    if (it.name.size() > 65535) return Status(Errc::invalid_argument, "manifest name too long");
    put_str16(raw, it.name);
    raw.push_back(static_cast<char>(it.type));
    raw.append(reinterpret_cast<const char*>(it.digest.bytes.data()), 16);
  }
  util::put_u32(raw, static_cast<uint32_t>(artifacts_.size()));
  // The table's size is known, so offsets can be laid out before writing.
  const std::string ext = encode_extension(meta_, manifest_);
  size_t table_end = raw.size() + ext.size();
  for (const auto& a : artifacts_) table_end += 2 + a.name.size() + 16;
  uint64_t off = (table_end + 63) & ~uint64_t(63);
  std::vector<uint64_t> offsets;
  for (const auto& a : artifacts_) {
    offsets.push_back(off);
    off = (off + a.data.size() + 63) & ~uint64_t(63);
  }
  for (size_t i = 0; i < artifacts_.size(); ++i) {
    put_str16(raw, artifacts_[i].name);
    util::put_u64(raw, offsets[i]);
    util::put_u64(raw, artifacts_[i].data.size());
  }
  raw += ext;
  uint64_t total = artifacts_.empty() ? raw.size() : offsets.back() + artifacts_.back().data.size();
  if (total > kMaxEntrySize) return Status(Errc::too_large, "entry larger than 4 GiB");
  raw.resize(total, '\0');
  for (size_t i = 0; i < artifacts_.size(); ++i)
    std::memcpy(raw.data() + offsets[i], artifacts_[i].data.data(), artifacts_[i].data.size());

  uint32_t flags = 0;
  std::string stored;
#if KCACHE_HAVE_ZSTD
  bool try_zstd =
      compression_ == Compression::zstd || (compression_ == Compression::automatic && raw.size() >= 64 * 1024);
  if (try_zstd) {
    std::string z;
    z.resize(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compress(z.data(), z.size(), raw.data(), raw.size(), 1);
    size_t keep_below = compression_ == Compression::zstd ? raw.size() - raw.size() / 8 : raw.size() - raw.size() / 4;
    if (!ZSTD_isError(n) && n < keep_below) {
      z.resize(n);
      stored = std::move(z);
      flags |= kFlagZstd;
    }
  }
#endif
  std::string_view payload = (flags & kFlagZstd) ? std::string_view(stored) : std::string_view(raw);

  auto buf = std::make_shared<AlignedBuffer>(kEntryHeaderSize + payload.size());
  char* p = buf->data();
  std::memcpy(p, kMagic, 8);
  std::string h;
  util::put_u32(h, kEntryFormatVersion);
  util::put_u32(h, flags);
  h.append(reinterpret_cast<const char*>(key_.bytes.data()), 16);
  util::put_u64(h, payload.size());
  util::put_u64(h, raw.size());
  std::memcpy(p + 8, h.data(), h.size());  // bytes 8..48
  std::memcpy(p + kEntryHeaderSize, payload.data(), payload.size());
  Digest sum = checksum(p, payload);
  std::memcpy(p + 48, sum.bytes.data(), 16);
  return Entry::decode(std::move(buf), &key_);
}

}  // namespace kcache

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
#include <numeric>

#include "entry/access.h"
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

// checksum=false: everything but the checksum pass (an entry whose
// checksum its reader already verified: EntryAccess::decode_verified).
Expected<Header> verify_header(std::string_view enc, const Key* expected, bool with_checksum = true) {
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
  if (!with_checksum) return h;
  Digest sum = checksum(p, enc.substr(kEntryHeaderSize));
  if (std::memcmp(sum.bytes.data(), p + 48, 16) != 0) return corrupt("checksum mismatch");
  return h;
}

// Little-endian writes into memory sized for them up front (build()).
class Writer {
 public:
  explicit Writer(char* p) : p_(p) {}
  void u8(uint8_t v) { *p_++ = static_cast<char>(v); }
  void u16(uint16_t v) {
    p_[0] = static_cast<char>(v & 0xff);
    p_[1] = static_cast<char>(v >> 8);
    p_ += 2;
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) p_[i] = static_cast<char>(v >> (8 * i));
    p_ += 4;
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) p_[i] = static_cast<char>(v >> (8 * i));
    p_ += 8;
  }
  void bytes(const void* d, size_t n) {
    if (n) std::memcpy(p_, d, n);
    p_ += n;
  }
  void str16(std::string_view s) {
    u16(static_cast<uint16_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void str32(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  char* pos() const { return p_; }

 private:
  char* p_;
};

constexpr uint64_t align64(uint64_t n) { return (n + 63) & ~uint64_t(63); }

// What the extension stores: the label and each readable value, cut.
std::string_view ext_label(const EntryMeta& meta) { return std::string_view(meta.label).substr(0, kMaxLabel); }
std::string_view ext_value(const std::string& v) { return std::string_view(v).substr(0, 65535); }

// Where each part of raw goes, computed before a byte is written:
//   head (metadata, manifest, artifact count) | table | ext | pad | artifacts
struct Layout {
  uint64_t head = 0;        // up to and including the artifact count
  uint64_t table = 0;       // the artifact table
  uint64_t ext = 0;         // the extension; 0 when there is none
  uint32_t ext_values = 0;  // manifest items whose value the extension keeps
  uint64_t first = 0;       // offset of the first artifact
  uint64_t total = 0;       // raw_len
};

Layout layout_of(const EntryMeta& meta, const Manifest& m, const std::vector<Artifact>& arts) {
  Layout l;
  l.head = 8 + 8 + 4 + meta.producer.size() + 4 + m.ns.size() + 4 + 4;
  uint64_t values = 0;
  for (const auto& it : m.items) {
    l.head += 2 + it.name.size() + 1 + 16;
    if (it.value) {
      ++l.ext_values;
      values += 4 + 2 + ext_value(*it.value).size();
    }
  }
  if (!meta.label.empty() || l.ext_values) l.ext = 4 + 4 + 2 + ext_label(meta).size() + 4 + values;
  for (const auto& a : arts) l.table += 2 + a.name.size() + 16;
  l.total = l.head + l.table + l.ext;
  l.first = align64(l.total);
  uint64_t off = l.first;
  for (const auto& a : arts) {
    l.total = off + a.data.size();
    off = align64(l.total);
  }
  return l;
}

// Writes raw (l.total bytes, padding zeroed) at `out`.
void write_raw(char* out, const Layout& l, const EntryMeta& meta, const Manifest& m,
               const std::vector<Artifact>& arts) {
  Writer w(out);
  w.u64(meta.created_unix_ms);
  w.u64(meta.compile_cost_us);
  w.str32(meta.producer);
  w.str32(m.ns);
  w.u32(static_cast<uint32_t>(m.items.size()));
  for (const auto& it : m.items) {
    w.str16(it.name);
    w.u8(static_cast<uint8_t>(it.type));
    w.bytes(it.digest.bytes.data(), 16);
  }
  w.u32(static_cast<uint32_t>(arts.size()));
  uint64_t off = l.first;
  for (const auto& a : arts) {
    w.str16(a.name);
    w.u64(off);
    w.u64(a.data.size());
    off = align64(off + a.data.size());
  }
  if (l.ext) {
    w.bytes(kExtMagic, 4);
    w.u32(static_cast<uint32_t>(l.ext));
    w.str16(ext_label(meta));
    w.u32(l.ext_values);
    for (size_t i = 0; i < m.items.size(); ++i) {
      if (!m.items[i].value) continue;
      w.u32(static_cast<uint32_t>(i));
      w.str16(ext_value(*m.items[i].value));
    }
  }
  uint64_t at = static_cast<uint64_t>(w.pos() - out);
  off = l.first;
  for (const auto& a : arts) {
    std::memset(out + at, 0, off - at);
    if (!a.data.empty()) std::memcpy(out + off, a.data.data(), a.data.size());
    at = off + a.data.size();
    off = align64(at);
  }
}

// The first problem with the artifact names, in the order they were added
// (an empty or over-long name, or one added before), or an empty message.
// Few artifacts are compared pairwise; many through a sorted index.
std::string name_problem(const std::vector<Artifact>& arts) {
  auto bad_length = [](const std::string& n) { return n.empty() || n.size() > 255; };
  static const std::string kBadLength = "artifact name must be 1 to 255 bytes";
  auto twice = [](const std::string& n) { return "artifact '" + n + "' added twice"; };
  const size_t n = arts.size();
  if (n <= 16) {
    for (size_t i = 0; i < n; ++i) {
      if (bad_length(arts[i].name)) return kBadLength;
      for (size_t j = 0; j < i; ++j)
        if (arts[j].name == arts[i].name) return twice(arts[i].name);
    }
    return std::string();
  }
  size_t first_bad = n;
  for (size_t i = 0; i < n && first_bad == n; ++i)
    if (bad_length(arts[i].name)) first_bad = i;
  // The earliest index whose name an earlier index has: in each run of
  // equal names sorted by (name, index), the run's second index.
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    int c = arts[a].name.compare(arts[b].name);
    return c != 0 ? c < 0 : a < b;
  });
  size_t first_dup = n;
  for (size_t k = 1; k < n; ++k)
    if (arts[order[k]].name == arts[order[k - 1]].name && (k < 2 || arts[order[k - 2]].name != arts[order[k]].name))
      first_dup = std::min<size_t>(first_dup, order[k]);
  if (first_bad < first_dup) return kBadLength;
  if (first_dup < n) return twice(arts[first_dup].name);
  return std::string();
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
  return EntryAccess::decode(std::move(buf), expected, /*checksum=*/true);
}

Expected<Entry> EntryAccess::decode_verified(std::shared_ptr<const Buffer> buf, const Key* expected) {
  return decode(std::move(buf), expected, /*checksum=*/false);
}

Expected<Entry> EntryAccess::decode(std::shared_ptr<const Buffer> buf, const Key* expected, bool checksum) {
  if (!buf) return corrupt("no bytes");
  std::string_view enc = buf->bytes();
  KCACHE_TRY(Header h, verify_header(enc, expected, checksum));

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
    e.artifacts_.push_back(Entry::ArtifactRef{std::string(s), raw.substr(off, size)});
  }
  e.lazy_ = std::make_shared<Entry::Lazy>();
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

Expected<Entry> Entry::detach() const {
  if (!buffer_) return *this;
  auto copy = std::make_shared<AlignedBuffer>(buffer_->bytes().size());
  if (!util::copy_guarded(copy->data(), buffer_->bytes().data(), copy->size()))
    return Status(Errc::unavailable, "the entry's file shrank under this process while its bytes were copied");
  return decode(copy);
}

EntryBuilder& EntryBuilder::add(std::string name, std::string data) {
  artifacts_.push_back(Artifact{std::move(name), std::move(data)});
  return *this;
}

// Lays the entry out from lengths computed first and writes it once: into
// its final buffer, or (when zstd is tried) into a staging string that the
// compressed form replaces. The Entry is then made from the layout it was
// just given: decode's checks (the checksum, the walk) would only find
// what build() wrote.
Expected<Entry> EntryBuilder::build() const {
  if (std::string why = name_problem(artifacts_); !why.empty()) return Status(Errc::invalid_argument, why);
  if (meta_.producer.size() > (1u << 20) || manifest_.ns.size() > (1u << 20))
    return Status(Errc::invalid_argument, "producer or namespace too long");
  for (const auto& it : manifest_.items)
    if (it.name.size() > 65535) return Status(Errc::invalid_argument, "manifest name too long");
  const Layout l = layout_of(meta_, manifest_, artifacts_);
  if (l.total > kMaxEntrySize) return Status(Errc::too_large, "entry larger than 4 GiB");

  uint32_t flags = 0;
  std::shared_ptr<AlignedBuffer> buf;
  std::shared_ptr<std::string> staged;  // raw, when the payload is compressed
#if KCACHE_HAVE_ZSTD
  bool try_zstd = compression_ == Compression::zstd || (compression_ == Compression::automatic && l.total >= 64 * 1024);
  if (try_zstd) {
    auto raw = std::make_shared<std::string>(l.total, '\0');
    write_raw(raw->data(), l, meta_, manifest_, artifacts_);
    std::string z;
    z.resize(ZSTD_compressBound(raw->size()));
    size_t n = ZSTD_compress(z.data(), z.size(), raw->data(), raw->size(), 1);
    size_t keep_below =
        compression_ == Compression::zstd ? raw->size() - raw->size() / 8 : raw->size() - raw->size() / 4;
    const bool kept = !ZSTD_isError(n) && n < keep_below;
    buf = std::make_shared<AlignedBuffer>(kEntryHeaderSize + (kept ? n : raw->size()));
    if (kept) {
      std::memcpy(buf->data() + kEntryHeaderSize, z.data(), n);
      flags |= kFlagZstd;
      staged = std::move(raw);  // the Entry's raw_: decode would decompress it again
    } else {
      std::memcpy(buf->data() + kEntryHeaderSize, raw->data(), raw->size());
    }
  }
#endif
  if (!buf) {
    buf = std::make_shared<AlignedBuffer>(kEntryHeaderSize + l.total);
    write_raw(buf->data() + kEntryHeaderSize, l, meta_, manifest_, artifacts_);
  }

  char* p = buf->data();
  const uint64_t stored_len = buf->size() - kEntryHeaderSize;
  Writer w(p);
  w.bytes(kMagic, 8);
  w.u32(kEntryFormatVersion);
  w.u32(flags);
  w.bytes(key_.bytes.data(), 16);
  w.u64(stored_len);
  w.u64(l.total);
  Digest sum = checksum(p, std::string_view(p + kEntryHeaderSize, stored_len));
  std::memcpy(p + 48, sum.bytes.data(), 16);

  Entry e;
  e.key_ = key_;
  std::string_view raw = staged ? std::string_view(*staged) : std::string_view(p + kEntryHeaderSize, l.total);
  e.artifacts_.reserve(artifacts_.size());
  uint64_t off = l.first;
  for (const auto& a : artifacts_) {
    e.artifacts_.push_back(Entry::ArtifactRef{a.name, raw.substr(off, a.data.size())});
    off = align64(off + a.data.size());
  }
  e.lazy_ = std::make_shared<Entry::Lazy>();
  e.lazy_->ext_at = l.head + l.table;
  e.compressed_ = staged != nullptr;
  e.raw_ = std::move(staged);
  e.buffer_ = std::move(buf);
  return e;
}

}  // namespace kcache

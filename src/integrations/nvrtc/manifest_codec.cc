// The encoding of NVRTC manifests (manifest.h, encode_manifest and
// decode_manifest): a version byte, then each list as a count and fields.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "integrations/nvrtc/manifest.h"
#include "util/util.h"

namespace kcache::nvrtc::detail {

namespace {

// Record encoding: a version byte, then counts and fields.
constexpr uint8_t kRecordVersion = 3;

void put_str(std::string& out, std::string_view s) {
  util::put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
void put_id(std::string& out, const FileId& id) {
  util::put_u64(out, static_cast<uint64_t>(id.dev));
  util::put_u64(out, static_cast<uint64_t>(id.ino));
  util::put_u64(out, static_cast<uint64_t>(id.size));
  util::put_u64(out, static_cast<uint64_t>(id.mtime_ns));
  util::put_u64(out, static_cast<uint64_t>(id.ctime_ns));
}

struct Reader {
  std::string_view s;
  bool ok = true;
  uint64_t u64() {
    if (s.size() < 8) return ok = false, 0;
    uint64_t v = util::get_u64(s.data());
    s.remove_prefix(8);
    return v;
  }
  uint32_t u32() {
    if (s.size() < 4) return ok = false, 0;
    uint32_t v = util::get_u32(s.data());
    s.remove_prefix(4);
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    if (!ok || s.size() < n) return ok = false, std::string();
    std::string v(s.substr(0, n));
    s.remove_prefix(n);
    return v;
  }
  FileId id() {
    FileId f;
    f.dev = static_cast<dev_t>(u64());
    f.ino = static_cast<ino_t>(u64());
    f.size = static_cast<off_t>(u64());
    f.mtime_ns = static_cast<int64_t>(u64());
    f.ctime_ns = static_cast<int64_t>(u64());
    return f;
  }
};

void put_answers(std::string& out, const std::vector<DepManifest::Answer>& v) {
  util::put_u32(out, static_cast<uint32_t>(v.size()));
  for (const auto& a : v) {
    put_str(out, a.path);
    out.push_back(a.found ? 1 : 0);
    put_str(out, a.value);
  }
}

void put_digest(std::string& out, const Digest& d) {
  out.append(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
}

bool get_digest(Reader& r, Digest* d) {
  if (r.s.size() < d->bytes.size()) return r.ok = false;
  std::copy(r.s.begin(), r.s.begin() + d->bytes.size(), reinterpret_cast<char*>(d->bytes.data()));
  r.s.remove_prefix(d->bytes.size());
  return true;
}

bool get_byte(Reader& r) {
  if (r.s.empty()) return r.ok = false;
  bool b = r.s[0] != 0;
  r.s.remove_prefix(1);
  return b;
}

// A count no larger than the bytes left (each element takes at least one).
uint32_t get_count(Reader& r) {
  uint32_t n = r.u32();
  if (n > r.s.size()) r.ok = false;
  return r.ok ? n : 0;
}

bool get_answers(Reader& r, std::vector<DepManifest::Answer>* v) {
  v->resize(get_count(r));
  for (auto& a : *v) {
    a.path = r.str();
    a.found = get_byte(r);
    a.value = r.str();
  }
  return r.ok;
}

}  // namespace

std::string encode_manifest(const DepManifest& m) {
  std::string out;
  out.push_back(static_cast<char>(kRecordVersion));
  util::put_u32(out, static_cast<uint32_t>(m.files.size()));
  for (const auto& f : m.files) {
    put_str(out, f.path);
    put_id(out, f.id);
    put_digest(out, f.digest);
  }
  util::put_u32(out, static_cast<uint32_t>(m.present.size()));
  for (const auto& p : m.present) {
    put_str(out, p.path);
    util::put_u32(out, p.mode);
  }
  util::put_u32(out, static_cast<uint32_t>(m.absent.size()));
  for (const auto& s : m.absent) put_str(out, s);
  util::put_u32(out, static_cast<uint32_t>(m.dirs.size()));
  for (const auto& d : m.dirs) {
    put_str(out, d.path);
    out.push_back(d.exists ? 1 : 0);
    put_id(out, d.id);
  }
  put_answers(out, m.links);
  put_answers(out, m.resolved);
  put_answers(out, m.listings);
  util::put_u32(out, static_cast<uint32_t>(m.libs.size()));
  for (const auto& l : m.libs) {
    put_str(out, l.name);
    put_str(out, l.path);
    put_id(out, l.id);
    put_digest(out, l.digest);
  }
  put_answers(out, m.env);
  put_str(out, m.cwd);
  return out;
}

std::optional<DepManifest> decode_manifest(std::string_view bytes) {
  if (bytes.empty() || static_cast<uint8_t>(bytes[0]) != kRecordVersion) return std::nullopt;
  Reader r{bytes.substr(1)};
  DepManifest m;
  m.files.resize(get_count(r));
  for (auto& f : m.files) {
    f.path = r.str();
    f.id = r.id();
    get_digest(r, &f.digest);
  }
  m.present.resize(get_count(r));
  for (auto& p : m.present) {
    p.path = r.str();
    p.mode = r.u32();
  }
  m.absent.resize(get_count(r));
  for (auto& s : m.absent) s = r.str();
  m.dirs.resize(get_count(r));
  for (auto& d : m.dirs) {
    d.path = r.str();
    d.exists = get_byte(r);
    d.id = r.id();
  }
  get_answers(r, &m.links);
  get_answers(r, &m.resolved);
  get_answers(r, &m.listings);
  m.libs.resize(get_count(r));
  for (auto& l : m.libs) {
    l.name = r.str();
    l.path = r.str();
    l.id = r.id();
    get_digest(r, &l.digest);
  }
  get_answers(r, &m.env);
  m.cwd = r.str();
  if (!r.ok || !r.s.empty()) return std::nullopt;
  return m;
}

}  // namespace kcache::nvrtc::detail

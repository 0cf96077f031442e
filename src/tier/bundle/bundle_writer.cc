// The bundle writer: selects entries of a tier (all, a namespace, a list of
// keys, or what was created or used since a mark), lays them out behind a
// header and a sorted index (bundle_format.h), and signs header and index
// digests with Ed25519 when a private key is given.
#include <algorithm>
#include <cstring>
#include <set>

#include "kcache/bundle.h"
#include "tier/bundle/bundle_format.h"
#include "util/util.h"

namespace kcache::bundle {

namespace {

void put_at(std::string& s, size_t at, const void* p, size_t n) { std::memcpy(s.data() + at, p, n); }
void put_u32_at(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}
void put_u64_at(std::string& s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}
uint64_t align(uint64_t n) { return (n + kAlign - 1) & ~uint64_t(kAlign - 1); }

struct Picked {
  Key key;
  uint64_t offset;  // within the data section
  uint64_t length;
  Sha256 sha;
};

Expected<std::string> build(Tier& from, const BundleSelection& sel, const BundleWriteOptions& opt, BundleInfo* info) {
  // Candidates: the listed store filtered by mark and key list, or the key
  // list itself when no mark needs the recency records.
  std::set<Key> wanted(sel.keys.begin(), sel.keys.end());
  std::vector<Key> keys;
  if (!wanted.empty() && !sel.since) {
    keys.assign(wanted.begin(), wanted.end());
  } else {
    KCACHE_RETURN_IF_ERROR(from.list([&](const ListItem& it) {
      if (sel.since && it.last_use_ms < *sel.since) return true;
      if (!wanted.empty() && !wanted.count(it.key)) return true;
      keys.push_back(it.key);
      return true;
    }));
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  std::set<std::string, std::less<>> spaces(sel.namespaces.begin(), sel.namespaces.end());

  std::string data;
  std::vector<Picked> picked;
  uint64_t unreadable = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto r = from.get(keys[i], MissCount::uncounted);
    if (!r) ++unreadable;
    if (r && r->has_value() && (spaces.empty() || spaces.count((*r)->manifest().ns))) {
      std::string_view enc = (*r)->encoded();
      data.resize(align(data.size()), '\0');
      picked.push_back(Picked{keys[i], data.size(), enc.size(), sha256(enc)});
      data += enc;
    }
    if (opt.progress && (i % 256 == 255 || i + 1 == keys.size())) opt.progress(i + 1, keys.size());
  }
  if (unreadable)
    KCACHE_LOG(LogLevel::warn, "bundle: %llu selected entries could not be read and were left out",
               static_cast<unsigned long long>(unreadable));

  const uint64_t count = picked.size(), blocks = (count + kBlockRecords - 1) / kBlockRecords;
  const bool sign = !opt.sign_key_file.empty();
  const uint64_t index_off = kHeaderSize, blocks_off = index_off + count * kRecordSize;
  const uint64_t sig_off = blocks_off + blocks * 32;
  const uint64_t data_off = align(sig_off + (sign ? kSigSize : 0));
  const uint64_t file_size = data_off + data.size();
  std::string out(data_off, '\0');
  for (uint64_t i = 0; i < count; ++i) {
    size_t at = index_off + i * kRecordSize;
    put_at(out, at + r_key, picked[i].key.bytes.data(), 16);
    put_u64_at(out, at + r_offset, data_off + picked[i].offset);
    put_u64_at(out, at + r_length, picked[i].length);
    put_at(out, at + r_sha, picked[i].sha.data(), 32);
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    uint64_t first = b * kBlockRecords, n = std::min<uint64_t>(kBlockRecords, count - first);
    Sha256 h = sha256(std::string_view(out).substr(index_off + first * kRecordSize, n * kRecordSize));
    put_at(out, blocks_off + b * 32, h.data(), 32);
  }
  put_at(out, 0, kMagic, 8);
  put_u32_at(out, h_version, kVersion);
  put_u32_at(out, h_flags, sign ? kFlagSigned : 0);
  put_u32_at(out, h_entry_version, kEntryFormatVersion);
  put_u32_at(out, h_block_records, kBlockRecords);
  put_u64_at(out, h_count, count);
  put_u64_at(out, h_index_offset, index_off);
  put_u64_at(out, h_blocks_offset, blocks_off);
  put_u64_at(out, h_sig_offset, sig_off);
  put_u64_at(out, h_data_offset, data_off);
  put_u64_at(out, h_file_size, file_size);
  uint64_t created = util::now_unix_ms();
  put_u64_at(out, h_created, created);
  auto isum = xxh128(std::string_view(out).substr(index_off, sig_off - index_off));
  put_at(out, h_index_checksum, isum.data(), 16);
  auto hsum = xxh128(std::string_view(out).substr(0, h_header_checksum));
  put_at(out, h_header_checksum, hsum.data(), 16);

  info->version = kVersion;
  info->entry_version = kEntryFormatVersion;
  info->entries = count;
  info->bytes = file_size;
  info->created_unix_ms = created;
  info->is_signed = sign;
  if (sign) {
    std::string msg(kSignContext);
    msg.append(out, 0, kHeaderSize);
    msg.append(out, blocks_off, blocks * 32);
    PublicKey pub;
    KCACHE_TRY(auto sig, bundle::sign(opt.sign_key_file, msg, &pub));
    put_at(out, sig_off, kSigMagic, 8);
    put_u32_at(out, sig_off + 8, kAlgEd25519);
    put_at(out, sig_off + 16, pub.data(), 32);
    put_at(out, sig_off + 48, sig.data(), 64);
    info->signer = fingerprint(pub);
  }
  out += data;
  return out;
}

}  // namespace

}  // namespace kcache::bundle

namespace kcache {

Expected<std::string> save_bundle(Tier& from, const BundleSelection& selection, const BundleWriteOptions& options) {
  BundleInfo info;
  return bundle::build(from, selection, options, &info);
}

Expected<BundleInfo> write_bundle(Tier& from, const BundleSelection& selection, const std::string& path,
                                  const BundleWriteOptions& options) {
  if (path.empty()) return Status(Errc::invalid_argument, "no bundle file named");
  BundleInfo info;
  KCACHE_TRY(std::string bytes, bundle::build(from, selection, options, &info));
  // Shipped to others: readable by all, like any file one ships.
  KCACHE_RETURN_IF_ERROR(util::write_file_atomic_via(path + ".tmp", path, bytes, true, 0644));
  return info;
}

}  // namespace kcache

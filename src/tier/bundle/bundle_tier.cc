// The bundle reader: maps a bundle file (or holds bundle bytes), checks its
// header, index checksum and signature, and serves entries as a read-only
// tier (TierKind::bundle) by binary search in the index. Also bundle_info,
// verify_bundle and import_bundle, which read through the same checks.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "entry/buffer.h"
#include "kcache/bundle.h"
#include "tier/bundle/bundle_format.h"
#include "tier/bundle/bundle_reader.h"
#include "tier/core/atomic_stats.h"
#include "util/fd.h"
#include "util/util.h"

namespace kcache::bundle {

namespace {

// A bundle file, read with pread. The file may be replaced in place or
// truncated under a running process (a deploy step that copies over it):
// each read first compares the file's size and modification time with
// those it had when opened, and a changed file is unavailable from then on
// (the Cache logs that once and treats the bundle as a miss); a change
// between that check and the read gives a short read or bytes that fail
// their checks, never a signal.
class FileImage final : public Image {
 public:
  FileImage(std::shared_ptr<Env> env, util::Fd fd, const struct stat& st, std::string path)
      : env_(std::move(env)), fd_(std::move(fd)), st_(st), path_(std::move(path)) {}
  uint64_t size() const noexcept override { return static_cast<uint64_t>(st_.st_size); }
  Expected<std::shared_ptr<const Buffer>> read(uint64_t off, uint64_t len) const override {
    if (changed_.load(std::memory_order_relaxed)) return changed_error();
    struct stat now;
    if (env_->fstat(fd_.get(), &now) != 0) return util::errno_status(errno, "stat bundle " + path_);
    if (now.st_size != st_.st_size || now.st_mtim.tv_sec != st_.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != st_.st_mtim.tv_nsec) {
      changed_.store(true, std::memory_order_relaxed);
      return changed_error();
    }
    std::shared_ptr<AlignedBuffer> buf;
    try {
      buf = std::make_shared<AlignedBuffer>(static_cast<size_t>(len));
    } catch (const std::bad_alloc&) {
      return Status(Errc::too_large, "no memory for " + std::to_string(len) + " bytes of bundle " + path_);
    }
    uint64_t got = 0;
    while (got < len) {
      ssize_t n =
          env_->pread(fd_.get(), buf->data() + got, static_cast<size_t>(len - got), static_cast<off_t>(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return util::errno_status(errno, "read bundle " + path_);
      if (n == 0) return Status(Errc::corrupt, "bundle " + path_ + " is shorter than when it was opened");
      got += static_cast<uint64_t>(n);
    }
    return std::shared_ptr<const Buffer>(std::move(buf));
  }

 private:
  Status changed_error() const {
    return Status(Errc::unavailable, "bundle " + path_ +
                                         " changed on disk since it was mounted (rewritten or truncated in place); "
                                         "not used until mounted again (replace a bundle by renaming a new file "
                                         "over it)");
  }
  const std::shared_ptr<Env> env_;  // never null; outlives fd_
  const util::Fd fd_;
  const struct stat st_;
  const std::string path_;
  mutable std::atomic<bool> changed_{false};
};

// An entry's bytes inside a heap image; keeps the image alive.
class Slice final : public Buffer {
 public:
  Slice(std::shared_ptr<const Image> img, std::string_view v) : img_(std::move(img)), v_(v) {}
  std::string_view bytes() const noexcept override { return v_; }

 private:
  std::shared_ptr<const Image> img_;
  std::string_view v_;
};

class HeapImage final : public Image, public std::enable_shared_from_this<HeapImage> {
 public:
  explicit HeapImage(std::string_view s) : buf_(s.size()) { std::memcpy(buf_.data(), s.data(), s.size()); }
  uint64_t size() const noexcept override { return buf_.size(); }
  Expected<std::shared_ptr<const Buffer>> read(uint64_t off, uint64_t len) const override {
    return std::shared_ptr<const Buffer>(std::make_shared<Slice>(shared_from_this(), buf_.bytes().substr(off, len)));
  }

 private:
  AlignedBuffer buf_;
};

Status refused(const std::string& what, const std::string& why) {
  return Status(Errc::corrupt, "bundle " + what + " refused: " + why);
}

bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

}  // namespace

Expected<std::shared_ptr<Reader>> Reader::open(std::shared_ptr<const Image> img, std::string name,
                                               const std::vector<std::string>& trusted_keys) {
  const uint64_t size = img->size();
  if (size < kHeaderSize) return refused(name, "shorter than its header");
  KCACHE_TRY(std::shared_ptr<const Buffer> head, img->read(0, kHeaderSize));
  std::string_view all = head->bytes();
  const char* p = all.data();
  if (std::memcmp(p, kMagic, 8) != 0) return refused(name, "not a kcache bundle (bad magic)");
  auto hsum = xxh128(all.substr(0, h_header_checksum));
  if (std::memcmp(hsum.data(), p + h_header_checksum, 16) != 0) return refused(name, "header checksum mismatch");
  auto r = std::shared_ptr<Reader>(new Reader);
  r->img_ = img;
  r->name_ = std::move(name);
  r->info_.version = util::get_u32(p + h_version);
  if (r->info_.version != kVersion)
    return Status(Errc::stale_format, "bundle " + r->name_ + " refused: bundle format version " +
                                          std::to_string(r->info_.version) + " (this build reads " +
                                          std::to_string(kVersion) + ")");
  uint32_t flags = util::get_u32(p + h_flags);
  if (flags & ~kFlagSigned) return refused(r->name_, "unknown flags");
  r->signed_ = flags & kFlagSigned;
  r->info_.entry_version = util::get_u32(p + h_entry_version);
  uint32_t block_records = util::get_u32(p + h_block_records);
  r->count_ = util::get_u64(p + h_count);
  uint64_t index_off = util::get_u64(p + h_index_offset), blocks_off = util::get_u64(p + h_blocks_offset);
  uint64_t sig_off = util::get_u64(p + h_sig_offset), data_off = util::get_u64(p + h_data_offset);
  uint64_t file_size = util::get_u64(p + h_file_size);
  r->info_.created_unix_ms = util::get_u64(p + h_created);
  if (file_size != size)
    return refused(r->name_, "size " + std::to_string(size) + " differs from the " + std::to_string(file_size) +
                                 " bytes its header gives (truncated or extended)");
  // The layout is fixed by the count; every offset must be what it implies.
  if (block_records != kBlockRecords || index_off != kHeaderSize || r->count_ > (size / kRecordSize))
    return refused(r->name_, "index does not fit the file");
  r->blocks_ = (r->count_ + kBlockRecords - 1) / kBlockRecords;
  uint64_t sig_end = sig_off + (r->signed_ ? kSigSize : 0);
  if (blocks_off != index_off + r->count_ * kRecordSize || sig_off != blocks_off + r->blocks_ * 32 ||
      data_off < sig_end || data_off % kAlign != 0 || data_off > size)
    return refused(r->name_, "inconsistent layout");
  // Everything before the entries, read once and kept: the checks below
  // and every lookup read this copy.
  KCACHE_TRY(head, img->read(0, data_off));
  all = head->bytes();
  p = all.data();
  if (xxh128(all.substr(0, h_header_checksum)) != hsum || std::memcmp(hsum.data(), p + h_header_checksum, 16) != 0)
    return refused(r->name_, "header changed while it was read");
  r->head_ = head;
  auto isum = xxh128(all.substr(index_off, sig_off - index_off));
  if (std::memcmp(isum.data(), p + h_index_checksum, 16) != 0) return refused(r->name_, "index checksum mismatch");
  r->index_ = p + index_off;
  r->block_sums_ = p + blocks_off;
  r->data_off_ = data_off;
  r->info_.entries = r->count_;
  r->info_.bytes = size;

  std::vector<PublicKey> trusted;
  for (const auto& f : trusted_keys) {
    auto k = read_public_key(f);
    if (!k) return refused(r->name_, "trusted key " + k.error().message());
    trusted.push_back(*k);
  }
  if (r->signed_) {
    const char* s = p + sig_off;
    static constexpr char kZero[16] = {};
    if (std::memcmp(s, kSigMagic, 8) != 0 || util::get_u32(s + 8) != kAlgEd25519 || util::get_u32(s + 12) != 0 ||
        std::memcmp(s + 112, kZero, 16) != 0)
      return refused(r->name_, "unknown signature block");
    PublicKey pub;
    std::memcpy(pub.data(), s + 16, 32);
    r->info_.is_signed = true;
    r->info_.signer = fingerprint(pub);
    bool known = false;
    for (const auto& t : trusted) known = known || t == pub;
    if (!trusted.empty() && !known) return refused(r->name_, "signed by an untrusted key " + r->info_.signer);
    std::string msg(kSignContext);
    msg.append(p, kHeaderSize);
    msg.append(r->block_sums_, r->blocks_ * 32);
    if (!verify_signature(pub, msg, reinterpret_cast<const unsigned char*>(s + 48)))
      return refused(r->name_, "signature does not verify");
    r->info_.trusted = known;
    r->block_ok_ = std::make_unique<std::atomic<uint8_t>[]>(r->blocks_);
    r->entry_ok_ = std::make_unique<std::atomic<uint8_t>[]>(r->count_);
  } else if (!trusted.empty()) {
    return refused(r->name_, "not signed, and trusted keys are configured");
  }
  return r;
}

// 0: unchecked, 1: good, 2: bad. Checked once per process.
bool Reader::block_good(uint64_t b) const {
  uint8_t s = block_ok_[b].load(std::memory_order_acquire);
  if (s == 0) {
    uint64_t first = b * kBlockRecords, n = std::min<uint64_t>(kBlockRecords, count_ - first);
    Sha256 h = sha256(std::string_view(index_ + first * kRecordSize, n * kRecordSize));
    s = std::memcmp(h.data(), block_sums_ + b * 32, 32) == 0 ? 1 : 2;
    block_ok_[b].store(s, std::memory_order_release);
  }
  return s == 1;
}

Expected<int64_t> Reader::find(const Key& key) const {
  uint64_t lo = 0, hi = count_;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (signed_ && !block_good(mid / kBlockRecords))
      return Status(Errc::corrupt, "index block " + std::to_string(mid / kBlockRecords) + " fails its signed digest");
    int c = std::memcmp(index_ + mid * kRecordSize + r_key, key.bytes.data(), 16);
    if (c == 0) return static_cast<int64_t>(mid);
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return int64_t(-1);
}

Key Reader::key_at(uint64_t i) const {
  Key k;
  std::memcpy(k.bytes.data(), index_ + i * kRecordSize + r_key, 16);
  return k;
}

Expected<std::shared_ptr<const Buffer>> Reader::bytes_at(uint64_t i, bool check_sha) const {
  const char* rec = index_ + i * kRecordSize;
  uint64_t off = util::get_u64(rec + r_offset), len = util::get_u64(rec + r_length), end;
  if (off < data_off_ || off % kAlign != 0 || add_overflows(off, len, &end) || end > img_->size())
    return Status(Errc::corrupt, "index record points outside the bundle");
  if (signed_ && !block_good(i / kBlockRecords)) return Status(Errc::corrupt, "index block fails its signed digest");
  KCACHE_TRY(std::shared_ptr<const Buffer> buf, img_->read(off, len));
  std::string_view v = buf->bytes();
  bool need = check_sha || (signed_ && entry_ok_[i].load(std::memory_order_acquire) == 0);
  if (need) {
    Sha256 h = sha256(v);
    if (std::memcmp(h.data(), rec + r_sha, 32) != 0) return Status(Errc::corrupt, "SHA-256 mismatch");
    if (signed_) entry_ok_[i].store(1, std::memory_order_release);
  }
  return buf;
}

Expected<Entry> Reader::entry_at(uint64_t i, bool check_sha) const {
  KCACHE_TRY(std::shared_ptr<const Buffer> buf, bytes_at(i, check_sha));
  Key k = key_at(i);
  return Entry::decode(std::move(buf), &k);
}

namespace {

class BundleTier final : public Tier, public StoreAdmin {
 public:
  explicit BundleTier(std::shared_ptr<Reader> r) : r_(std::move(r)) {}
  std::string_view name() const noexcept override { return "bundle"; }
  TierKind kind() const noexcept override { return TierKind::bundle; }
  bool writable() const noexcept override { return false; }
  StoreAdmin* admin() noexcept override { return this; }

  Status list(const std::function<bool(const ListItem&)>& fn) override {
    for (uint64_t i = 0; i < r_->count(); ++i)
      if (!fn(ListItem{r_->key_at(i), r_->length_at(i), 0})) break;
    return Status();
  }
  Expected<VerifyReport> verify(bool fix) override {
    if (fix) return refuse("verify --fix");
    VerifyReport rep;
    for (uint64_t i = 0; i < r_->count(); ++i) {
      ++rep.checked;
      auto e = r_->entry_at(i, true);
      if (!e && e.error().code() != Errc::stale_format) rep.bad.emplace_back(r_->key_at(i), e.error().message());
    }
    return rep;
  }
  Expected<uint64_t> trim(uint64_t) override { return refuse("trim"); }
  Status clear() override { return refuse("clear"); }

 protected:
  std::string_view admin_name() const noexcept override { return name(); }

  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override {
    const bool counts = access != Access::peek;
    auto i = r_->find(key);
    if (i && *i >= 0) {
      auto e = r_->entry_at(static_cast<uint64_t>(*i), false);
      if (e) {
        if (counts) counts_.add(&TierStats::hits);
        return std::optional<Entry>(std::move(e).value());
      }
      if (e.error().code() == Errc::unavailable || e.error().code() == Errc::io_error ||
          e.error().code() == Errc::too_large) {
        // The file changed under the mount, or could not be read: not the
        // entry's fault.
        if (counts) counts_.add(&TierStats::errors);
        return e.error();
      }
      if (e.error().code() != Errc::stale_format) {
        if (counts) counts_.add(&TierStats::corrupt);
        return Status(Errc::corrupt, r_->name() + " entry " + key.hex() + ": " + e.error().message());
      }
    } else if (!i) {
      if (counts) counts_.add(&TierStats::corrupt);
      return Status(Errc::corrupt, r_->name() + ": " + i.error().message());
    }
    if (access == Access::counted) counts_.add(&TierStats::misses);
    return std::optional<Entry>();
  }
  Status do_put(const Entry&) override { return refuse("put"); }
  Status do_remove(const Key&) override { return refuse("remove"); }
  TierStats do_stats() override {
    TierStats s = counts_.snapshot();
    s.entries = r_->count();
    s.bytes = r_->info().bytes;
    return s;
  }

 private:
  Status refuse(const char* what) {
    counts_.add(&TierStats::rejected);
    return Status(Errc::read_only, std::string(what) + " refused: a bundle is read-only");
  }
  std::shared_ptr<Reader> r_;
  AtomicTierStats counts_;  // this process's lookups
};

}  // namespace

uint64_t Reader::length_at(uint64_t i) const { return util::get_u64(index_ + i * kRecordSize + r_length); }

Expected<std::shared_ptr<Reader>> open_file(const std::string& path, const std::vector<std::string>& trusted_keys,
                                            std::shared_ptr<Env> env) {
  if (!env) env = Env::posix();
  util::Fd fd(env->open(path, O_RDONLY | O_CLOEXEC), *env);
  if (!fd) return util::errno_status(errno, "open bundle " + path);
  struct stat st;
  if (env->fstat(fd.get(), &st) != 0) return util::errno_status(errno, "stat bundle " + path);
  if (!S_ISREG(st.st_mode)) return Status(Errc::invalid_argument, "bundle " + path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) < kHeaderSize) return refused(path, "shorter than its header");
  util::note_store_file(fd.get());
  return Reader::open(std::make_shared<FileImage>(std::move(env), std::move(fd), st, path), path, trusted_keys);
}

Expected<std::shared_ptr<Reader>> open_bytes(std::string_view bytes, const std::vector<std::string>& trusted_keys) {
  std::shared_ptr<const Image> img;
  try {
    img = std::make_shared<HeapImage>(bytes);
  } catch (const std::bad_alloc&) {
    return Status(Errc::too_large, "no memory for a bundle of " + std::to_string(bytes.size()) + " bytes");
  }
  return Reader::open(std::move(img), "(bytes)", trusted_keys);
}

std::shared_ptr<Tier> make_tier(std::shared_ptr<Reader> r) { return std::make_shared<BundleTier>(std::move(r)); }

}  // namespace kcache::bundle

namespace kcache {

Expected<std::shared_ptr<Tier>> open_bundle(const std::string& path, const std::vector<std::string>& trusted_keys) {
  KCACHE_TRY(auto r, bundle::open_file(path, trusted_keys));
  return bundle::make_tier(std::move(r));
}

Expected<std::shared_ptr<Tier>> open_bundle_bytes(std::string bytes, const std::vector<std::string>& trusted_keys) {
  KCACHE_TRY(auto r, bundle::open_bytes(bytes, trusted_keys));
  return bundle::make_tier(std::move(r));
}

Expected<BundleInfo> bundle_info(const std::string& path, const std::vector<std::string>& trusted_keys) {
  KCACHE_TRY(auto r, bundle::open_file(path, trusted_keys));
  return r->info();
}

Expected<BundleVerifyReport> verify_bundle(const std::string& path, const std::vector<std::string>& trusted_keys,
                                           const BundleProgress& progress) {
  KCACHE_TRY(auto r, bundle::open_file(path, trusted_keys));
  BundleVerifyReport rep;
  rep.info = r->info();
  Key prev{};
  for (uint64_t i = 0; i < r->count(); ++i) {
    ++rep.checked;
    Key k = r->key_at(i);
    if (i > 0 && !(prev < k)) rep.bad.emplace_back(k, "index out of order");
    prev = k;
    auto e = r->entry_at(i, true);
    if (!e && e.error().code() == Errc::stale_format)
      ++rep.other_format;
    else if (!e)
      rep.bad.emplace_back(k, e.error().message());
    if (progress && (i % 256 == 255 || i + 1 == r->count())) progress(i + 1, r->count());
  }
  return rep;
}

Expected<uint64_t> import_bundle(const std::string& path, Tier& to, const std::vector<std::string>& trusted_keys,
                                 const BundleProgress& progress) {
  KCACHE_TRY(auto r, bundle::open_file(path, trusted_keys));
  uint64_t stored = 0, skipped = 0;
  for (uint64_t i = 0; i < r->count(); ++i) {
    auto e = r->entry_at(i, true);
    if (e) {
      KCACHE_RETURN_IF_ERROR(to.put(*e));
      ++stored;
    } else {
      ++skipped;
    }
    if (progress && (i % 256 == 255 || i + 1 == r->count())) progress(i + 1, r->count());
  }
  if (skipped)
    KCACHE_LOG(LogLevel::warn, "bundle import %s: %llu damaged or other-format entries skipped", path.c_str(),
               static_cast<unsigned long long>(skipped));
  return stored;
}

std::optional<uint64_t> parse_mark(std::string_view s) noexcept {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace kcache

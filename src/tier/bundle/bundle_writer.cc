// The bundle writer: selects entries of a tier (all, a namespace, a list of
// keys, or what was created or used since a mark), lays them out behind a
// header and a sorted index (bundle_format.h), and signs header and index
// digests with Ed25519 when a private key is given.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>

#include "kcache/bundle.h"
#include "tier/bundle/bundle_format.h"
#include "util/fd.h"
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

// Where the entries go while the bundle is made: memory (bytes) or a temp
// file (a bundle file), so a large bundle is never held in memory whole.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual Status append(std::string_view bytes) = 0;
  uint64_t size = 0;
};

class StringSink final : public DataSink {
 public:
  Status append(std::string_view bytes) override {
    data += bytes;
    size += bytes.size();
    return Status();
  }
  std::string data;
};

Status write_at(Env& env, int fd, std::string_view bytes, uint64_t at, const std::string& what) {
  if (int e = util::pwrite_all(env, fd, bytes, static_cast<off_t>(at))) return util::errno_status(e, "write " + what);
  return Status();
}

class FileSink final : public DataSink {
 public:
  FileSink(Env& env, int fd, std::string what) : env_(env), fd_(fd), what_(std::move(what)) {}
  Status append(std::string_view bytes) override {
    KCACHE_RETURN_IF_ERROR(write_at(env_, fd_, bytes, size, what_));
    size += bytes.size();
    return Status();
  }

 private:
  Env& env_;
  int fd_;
  std::string what_;
};

struct Picked {
  Key key;
  uint64_t offset;  // within the data section
  uint64_t length;
  Sha256 sha;
};

// Selects and writes the entries to `data`; returns everything before them
// (header, index, block digests, signature, padding up to data_offset).
Expected<std::string> build(Tier& from, const BundleSelection& sel, const BundleWriteOptions& opt, DataSink& data,
                            BundleInfo* info) {
  // Candidates: the listed store filtered by mark and key list, or the key
  // list itself when no mark needs the recency records.
  std::set<Key> wanted(sel.keys.begin(), sel.keys.end());
  std::vector<Key> keys;
  if (!wanted.empty() && !sel.since) {
    keys.assign(wanted.begin(), wanted.end());
  } else {
    StoreAdmin* admin = from.admin();
    if (!admin) return Status(Errc::unavailable, std::string(from.name()) + " tier cannot list its entries");
    KCACHE_RETURN_IF_ERROR(admin->list([&](const ListItem& it) {
      if (sel.since && it.last_use_ms < *sel.since) return true;
      if (!wanted.empty() && !wanted.count(it.key)) return true;
      keys.push_back(it.key);
      return true;
    }));
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  std::set<std::string, std::less<>> spaces(sel.namespaces.begin(), sel.namespaces.end());

  std::vector<Picked> picked;
  uint64_t unreadable = 0;
  static constexpr char kZeros[kAlign] = {};
  for (size_t i = 0; i < keys.size(); ++i) {
    // Making a bundle is not a use: no counter, recency record or repair.
    auto r = from.get(keys[i], Access::peek);
    if (!r) ++unreadable;
    if (r && r->has_value() && (spaces.empty() || spaces.count((*r)->manifest().ns))) {
      std::string_view enc = (*r)->encoded();
      KCACHE_RETURN_IF_ERROR(data.append(std::string_view(kZeros, align(data.size) - data.size)));
      picked.push_back(Picked{keys[i], data.size, enc.size(), sha256(enc)});
      KCACHE_RETURN_IF_ERROR(data.append(enc));
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
  const uint64_t file_size = data_off + data.size;
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
  return out;
}

}  // namespace

}  // namespace kcache::bundle

namespace kcache {

Expected<std::string> save_bundle(Tier& from, const BundleSelection& selection, const BundleWriteOptions& options) {
  BundleInfo info;
  bundle::StringSink data;
  KCACHE_TRY(std::string out, bundle::build(from, selection, options, data, &info));
  out += data.data;
  return out;
}

namespace {

// Where a bundle named `path` goes: a regular file or a missing path as
// named, a symbolic link's target (the link stays). Anything else (a device
// such as /dev/full, a FIFO, a folder, a link to a missing file) is refused:
// the writer's rename would replace it with a regular file.
Expected<std::string> bundle_target(Env& env, const std::string& path) {
  struct stat st;
  if (env.stat(path, &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return Status(Errc::io_error, path + " is not a regular file; a bundle is written to a file, not replaced");
    char* real = ::realpath(path.c_str(), nullptr);
    if (!real) return util::errno_status(errno, "resolving " + path);
    std::string t = real;
    std::free(real);
    return t;
  }
  if (errno != ENOENT) return util::errno_status(errno, path);
  if (env.statat(AT_FDCWD, path, &st) == 0 && S_ISLNK(st.st_mode))
    return Status(Errc::io_error, path + " is a symbolic link to a missing file; not replaced");
  return path;
}

// The bundle writer's temp files are "NAME.tmp.<16 hex>" beside NAME.
constexpr std::string_view kBundleTemp = ".tmp.";
constexpr time_t kStaleTempSeconds = 3600;

bool is_bundle_temp(std::string_view name, std::string_view prefix) {
  if (name.size() != prefix.size() + 16 || name.substr(0, prefix.size()) != prefix) return false;
  for (char ch : name.substr(prefix.size()))
    if (!std::isxdigit(static_cast<unsigned char>(ch))) return false;
  return true;
}

// Removes the temp files of writers of `target` that were killed before
// their rename: this user's plain files an hour old or more (a writer that
// is still going keeps its file's mtime fresh).
void collect_stale_temps(Env& env, const std::string& target) {
  size_t slash = target.rfind('/');
  std::string folder = slash == std::string::npos ? std::string(".") : target.substr(0, slash ? slash : 1);
  std::string prefix = (slash == std::string::npos ? target : target.substr(slash + 1)) + std::string(kBundleTemp);
  util::Fd d(env.open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC), env);
  std::vector<std::string> names;
  if (!d || env.list_dir_at(d.get(), ".", &names) != 0) return;
  const time_t now = static_cast<time_t>(env.now_unix_ms() / 1000);
  uint64_t removed = 0;
  for (const auto& name : names) {
    if (!is_bundle_temp(name, prefix)) continue;
    struct stat st;
    if (env.statat(d.get(), name, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
        now - st.st_mtime < kStaleTempSeconds)
      continue;
    if (env.unlinkat(d.get(), name) == 0) ++removed;
  }
  if (removed)
    KCACHE_LOG(LogLevel::info, "removed %llu stale temp files of %s", static_cast<unsigned long long>(removed),
               target.c_str());
}

// The writer's messages name its temp files ("NAME.tmp.<hex>", "temp file
// in FOLDER"); the caller named `path`.
Status naming(Status st, const std::string& target, const std::string& path) {
  std::string m = st.message(), prefix = target + std::string(kBundleTemp);
  size_t slash = target.rfind('/');
  std::string unnamed =
      "temp file in " + (slash == std::string::npos ? std::string(".") : target.substr(0, slash ? slash : 1));
  if (m.starts_with(unnamed) && (m.size() == unnamed.size() || m[unnamed.size()] == ':'))
    m.replace(0, unnamed.size(), path);
  for (size_t at = m.find(prefix); at != std::string::npos; at = m.find(prefix, at + path.size())) {
    size_t end = at + prefix.size();
    while (end < m.size() && std::isxdigit(static_cast<unsigned char>(m[end]))) ++end;
    m.replace(at, end - at, path);
  }
  return Status(st.code(), m);
}

Expected<BundleInfo> write_file(Tier& from, const BundleSelection& selection, const std::string& path,
                                const BundleWriteOptions& options) {
  if (path.empty()) return Status(Errc::invalid_argument, "no bundle file named");
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? std::string(".") : path.substr(0, slash ? slash : 1);
  // The entries go to an unnamed temp file beside the bundle first (the
  // index comes before them and is known only at the end); then header,
  // index and entries are copied into a named temp file renamed into place.
  Env& env = Env::or_posix(options.env);
  util::Fd data_file(env.open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600), env);
  if (!data_file) return util::errno_status(errno, "temp file in " + dir);
  const int data_fd = data_file.get();
  bundle::FileSink data(env, data_fd, "temp file in " + dir);
  BundleInfo info;
  KCACHE_TRY(std::string head, bundle::build(from, selection, options, data, &info));

  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(util::random_u64()));
  std::string tmp = path + ".tmp." + suffix;
  // Shipped to others: readable by all, like any file one ships.
  util::Fd file(env.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), env);
  if (!file) return util::errno_status(errno, "create " + tmp);
  const int fd = file.get();
  Status st = bundle::write_at(env, fd, head, 0, tmp);
  loff_t in = 0, out = static_cast<loff_t>(head.size());
  uint64_t left = data.size;
  while (st.is_ok() && left > 0) {
    // In the kernel where it can (not through the Env: the bytes were
    // written through it once already).
    ssize_t n = ::copy_file_range(data_fd, &in, fd, &out, left, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // No in-kernel copy here: read and write.
      std::string buf(std::min<uint64_t>(left, 1 << 20), '\0');
      ssize_t r = env.pread(data_fd, buf.data(), buf.size(), in);
      if (r <= 0) {
        st = util::errno_status(r < 0 ? errno : EIO, "read back " + tmp);
        break;
      }
      st = bundle::write_at(env, fd, std::string_view(buf.data(), static_cast<size_t>(r)), static_cast<uint64_t>(out),
                            tmp);
      n = r;
      in += r;
      out += r;
    }
    left -= static_cast<uint64_t>(n);
  }
  if (st.is_ok() && env.fdatasync(fd) != 0) st = util::errno_status(errno, "fsync " + tmp);
  if (file.close() != 0 && st.is_ok()) st = util::errno_status(errno, "close " + tmp);
  if (st.is_ok() && env.rename(tmp, path) != 0) st = util::errno_status(errno, "rename " + tmp);
  if (!st.is_ok()) {
    env.unlink(tmp);
    return st;
  }
  return info;
}

}  // namespace

Expected<BundleInfo> write_bundle(Tier& from, const BundleSelection& selection, const std::string& path,
                                  const BundleWriteOptions& options) {
  if (path.empty()) return Status(Errc::invalid_argument, "no bundle file named");
  Env& env = Env::or_posix(options.env);
  KCACHE_TRY(std::string target, bundle_target(env, path));
  collect_stale_temps(env, target);
  auto info = write_file(from, selection, target, options);
  if (!info) return naming(std::move(info).error(), target, path);
  return info;
}

}  // namespace kcache

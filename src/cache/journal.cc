// The miss journal (its writer, MissJournal, and its reader,
// read_miss_journal of kcache/miss_journal.h), the nearest stored entry and
// the miss explainer (cache/journal.h). The journal's byte format is in
// docs/format.md.
#include "cache/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "util/util.h"

namespace kcache {

namespace {

constexpr char kMagic[8] = {'K', 'C', 'M', 'I', 'S', 'S', '1', '\n'};
constexpr size_t kHeader = 24;             // magic, count:u64, end:u64
constexpr uint32_t kMaxRecord = 1u << 20;  // larger records are not journaled
// How long an append or a read waits for the journal's lock
// (MissJournal::kLockBound). Appends hold it for microseconds; a holder past
// this is stopped or stuck, and a diagnostic record is not worth a hung
// compile or close.
constexpr uint64_t kLockBoundMs = std::chrono::milliseconds(MissJournal::kLockBound).count();

void put_str16(std::string& out, std::string_view s) {
  s = s.substr(0, 65535);
  out.push_back(static_cast<char>(s.size() & 0xff));
  out.push_back(static_cast<char>(s.size() >> 8));
  out += s;
}

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool u8(uint8_t& v) {
    if (s_.size() - pos_ < 1) return false;
    v = static_cast<uint8_t>(s_[pos_++]);
    return true;
  }
  bool u32(uint32_t& v) {
    if (s_.size() - pos_ < 4) return false;
    v = util::get_u32(s_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t& v) {
    if (s_.size() - pos_ < 8) return false;
    v = util::get_u64(s_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool bytes(size_t n, std::string_view& out) {
    if (s_.size() - pos_ < n) return false;
    out = s_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool str16(std::string& out) {
    std::string_view b;
    if (!bytes(2, b)) return false;
    size_t n = static_cast<uint8_t>(b[0]) | (static_cast<size_t>(static_cast<uint8_t>(b[1])) << 8);
    if (!bytes(n, b)) return false;
    out = std::string(b);
    return true;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

uint32_t record_check(std::string_view body) {
  Digest d = hash_bytes(body);
  return util::get_u32(reinterpret_cast<const char*>(d.bytes.data()));
}

//   record := len:u32 check:u32 body(len)
//   body   := time_ms:u64 pid:u32 key:16 process:str16 label:str16 ns:str16
//             n:u32 (name:str16 type:u8 digest:16 has_value:u8 [value:str16]){n}
std::string encode_record(const MissRecord& r) {
  std::string b;
  util::put_u64(b, r.time_ms);
  util::put_u32(b, r.pid);
  b.append(reinterpret_cast<const char*>(r.key.bytes.data()), 16);
  put_str16(b, r.process);
  put_str16(b, r.label);
  put_str16(b, r.manifest.ns);
  util::put_u32(b, static_cast<uint32_t>(r.manifest.items.size()));
  for (const auto& it : r.manifest.items) {
    put_str16(b, it.name);
    b.push_back(static_cast<char>(it.type));
    b.append(reinterpret_cast<const char*>(it.digest.bytes.data()), 16);
    b.push_back(it.value ? 1 : 0);
    if (it.value) put_str16(b, *it.value);
  }
  std::string out;
  util::put_u32(out, static_cast<uint32_t>(b.size()));
  util::put_u32(out, record_check(b));
  return out + b;
}

std::optional<MissRecord> decode_body(std::string_view body) {
  Reader rd(body);
  MissRecord r;
  std::string_view k;
  uint32_t n;
  if (!rd.u64(r.time_ms) || !rd.u32(r.pid) || !rd.bytes(16, k) || !rd.str16(r.process) || !rd.str16(r.label) ||
      !rd.str16(r.manifest.ns) || !rd.u32(n) || n > body.size() / 20)
    return std::nullopt;
  std::memcpy(r.key.bytes.data(), k.data(), 16);
  for (uint32_t i = 0; i < n; ++i) {
    ManifestItem it;
    uint8_t type, has;
    std::string_view d;
    if (!rd.str16(it.name) || !rd.u8(type) || !rd.bytes(16, d) || !rd.u8(has) || has > 1) return std::nullopt;
    it.type = static_cast<ComponentType>(type);
    if (!parse_component_type(component_type_name(it.type))) return std::nullopt;  // not a type kcache writes
    std::memcpy(it.digest.bytes.data(), d.data(), 16);
    if (has) {
      std::string v;
      if (!rd.str16(v)) return std::nullopt;
      it.value = std::move(v);
    }
    r.manifest.items.push_back(std::move(it));
  }
  return r;
}

// Every committed record of one journal file, oldest first. A file that
// does not exist, or is empty, holds none. What cannot be read is counted in
// `skipped`: a record that does not verify or decode; the rest of the file
// past a record whose length is impossible, and a file without a valid
// header, as one.
void read_records(int fd, std::vector<MissRecord>& out, uint64_t& skipped) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size == 0) return;
  char h[kHeader];
  if (st.st_size < static_cast<off_t>(kHeader) || ::pread(fd, h, kHeader, 0) != static_cast<ssize_t>(kHeader) ||
      std::memcmp(h, kMagic, 8) != 0) {
    ++skipped;
    return;
  }
  uint64_t end = std::min<uint64_t>(util::get_u64(h + 16), static_cast<uint64_t>(st.st_size));
  if (end <= kHeader) return;
  std::string data(end - kHeader, '\0');
  if (::pread(fd, data.data(), data.size(), kHeader) != static_cast<ssize_t>(data.size())) {
    ++skipped;
    return;
  }
  size_t pos = 0;
  while (data.size() - pos >= 8) {
    uint32_t len = util::get_u32(data.data() + pos), check = util::get_u32(data.data() + pos + 4);
    if (len > kMaxRecord || data.size() - pos - 8 < len) {
      ++skipped;  // below `end` only on a disk that lies, or a file someone else wrote
      return;
    }
    std::string_view body(data.data() + pos + 8, len);
    pos += 8 + len;
    std::optional<MissRecord> r;
    if (record_check(body) == check) r = decode_body(body);
    if (r)
      out.push_back(std::move(*r));
    else
      ++skipped;
  }
  if (pos != data.size()) ++skipped;  // a few bytes too few for a record
}

bool same_file(Env& env, int fd, const std::string& path) {
  struct stat a, b;
  return env.fstat(fd, &a) == 0 && env.stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

Status write_all_at(Env& env, int fd, std::string_view s, off_t at, const std::string& path) {
  if (int e = util::pwrite_all(env, fd, s, at)) return util::errno_status(e, path);
  return Status();
}

std::string header_bytes(uint64_t count, uint64_t end) {
  std::string h(kMagic, 8);
  util::put_u64(h, count);
  util::put_u64(h, end);
  return h;
}

}  // namespace

// ---- the journal ---------------------------------------------------------------

MissJournal::MissJournal(const std::string& store_path, size_t keep, bool shared, std::shared_ptr<Env> env)
    : path_(path_for(store_path)),
      keep_(std::max<size_t>(keep, 1)),
      mode_(shared ? 0660 : 0600),
      env_(env ? std::move(env) : Env::posix()) {}

MissJournal::~MissJournal() {
  renew_after_fork();
  {
    std::lock_guard lk(writer_.mu());
    stop_ = true;
  }
  writer_.cv().notify_all();
  writer_.join();  // after it has written what was posted
  if (fd_ >= 0 && fd_pid_ == ::getpid()) env_->close(fd_);
}

// A child of fork() leaves its parent's posted records to the parent. The
// inherited vector may be mid-update by a parent thread: leaked, not freed.
void MissJournal::renew_after_fork() {
  if (!writer_.renewed()) return;
  util::abandon(mu_.release());
  mu_ = std::make_unique<std::mutex>();
  inherited_ = true;
  util::abandon(new std::vector<MissRecord>(std::move(posted_)));
  posted_ = {};
  n_posted_ = n_done_ = 0;
  flushing_ = 0;
  stop_ = false;
}

void MissJournal::post(MissRecord r) {
  renew_after_fork();
  if (inherited_) {
    // A child of fork() using its parent's Cache appends in the caller's
    // thread instead of starting one (as the committer does).
    Status st = append(r);
    if (!st.is_ok()) KCACHE_LOG(LogLevel::info, "miss journal: %s", st.to_string().c_str());
    return;
  }
  std::lock_guard lk(writer_.mu());
  if (posted_.size() >= kMaxPosted) return;
  posted_.push_back(std::move(r));
  ++n_posted_;
  writer_.start([this] { write_posted(); });
  // The first record wakes the writer, which lets more gather before it
  // writes; later ones cost the compiling thread no wake-up (a system call).
  if (posted_.size() == 1 || posted_.size() == kMaxPosted / 2)
    writer_.cv().notify_all();  // notify_all: flush() waits on it too
}

void MissJournal::flush() {
  renew_after_fork();
  std::unique_lock lk(writer_.mu());
  const uint64_t target = n_posted_;
  if (n_done_ >= target) return;
  ++flushing_;
  writer_.cv().notify_all();  // no lingering
  writer_.cv().wait(lk, [&] { return n_done_ >= target; });
  --flushing_;
}

void MissJournal::write_posted() {
  std::unique_lock lk(writer_.mu());
  for (;;) {
    writer_.cv().wait(lk, [&] { return stop_ || !posted_.empty(); });
    if (posted_.empty()) return;  // stopped, nothing left
    writer_.cv().wait_for(lk, kLinger, [&] { return stop_ || flushing_ > 0 || posted_.size() >= kMaxPosted / 2; });
    std::vector<MissRecord> batch;
    batch.swap(posted_);
    lk.unlock();
    std::vector<std::string> recs;
    recs.reserve(batch.size());
    for (const auto& r : batch) {
      recs.push_back(encode_record(r));
      if (recs.back().size() - 8 > kMaxRecord) {
        recs.pop_back();
        KCACHE_LOG(LogLevel::info, "miss journal: manifest too large for the miss journal; record dropped");
      }
    }
    // The whole batch under one hold of the lock, with one header write.
    size_t appended = 0;
    Status st = recs.empty() ? Status() : append_encoded(recs.data(), recs.size(), &appended);
    if (!st.is_ok())
      KCACHE_LOG(LogLevel::info, "miss journal: %s; %zu record(s) dropped", st.to_string().c_str(),
                 recs.size() - appended);
    lk.lock();
    n_done_ += batch.size();
    writer_.cv().notify_all();
  }
}

Status MissJournal::open_locked() {
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (fd_ >= 0 && fd_pid_ != ::getpid()) fd_ = -1;  // the parent's: its lock would be shared with us
    if (fd_ < 0) {
      fd_ = env_->open(path_, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode_);
      if (fd_ < 0) return util::errno_status(errno, path_);
      fd_pid_ = ::getpid();
      if (mode_ != 0600) (void)env_->fchmod(fd_, mode_);  // the group's write, whatever the umask (owner only)
    }
    int rc = util::flock_within(fd_, LOCK_EX, kLockBoundMs, *env_);
    if (rc == ETIMEDOUT) {
      skip_until_us_.store(env_->now_mono_us() + std::chrono::microseconds(kSkipAfterTimeout).count());
      return Status(Errc::timeout, path_ + ": locked by another process for over 1 s");
    }
    if (rc != 0) return util::errno_status(rc, path_);
    if (same_file(*env_, fd_, path_)) return Status();
    // Rotated (or removed) since we opened it: open the current one.
    env_->flock(fd_, LOCK_UN);
    env_->close(fd_);
    fd_ = -1;
  }
  return Status(Errc::unavailable, path_ + ": changes too often to be locked");
}

Status MissJournal::append(const MissRecord& r) {
  std::string rec = encode_record(r);
  if (rec.size() - 8 > kMaxRecord) return Status(Errc::too_large, "manifest too large for the miss journal");
  return append_encoded(&rec, 1, nullptr);
}

Status MissJournal::append_encoded(const std::string* recs, size_t n, size_t* appended) {
  if (env_->now_mono_us() < skip_until_us_.load())
    return Status(Errc::timeout, path_ + ": its lock timed out less than 10 s ago; record dropped");
  std::lock_guard<std::mutex> g(*mu_);
  // Each round holds the lock once: it appends as many records as the
  // current file has room for, or, when it is full, rotates it. A batch
  // larger than a generation rotates more than once; another process
  // filling the files as fast ends it after a bounded number of rounds.
  size_t none = 0;
  size_t& done = appended ? *appended : none;
  done = 0;
  for (size_t rotations = 0; done < n;) {
    KCACHE_RETURN_IF_ERROR(open_locked());
    struct stat st;
    if (env_->fstat(fd_, &st) != 0) {
      Status s = util::errno_status(errno, path_);
      env_->flock(fd_, LOCK_UN);
      return s;
    }
    uint64_t count = 0, end = kHeader;
    char h[kHeader];
    if (st.st_size >= static_cast<off_t>(kHeader) && env_->pread(fd_, h, kHeader, 0) == static_cast<ssize_t>(kHeader) &&
        std::memcmp(h, kMagic, 8) == 0) {
      count = util::get_u64(h + 8);
      end = std::clamp<uint64_t>(util::get_u64(h + 16), kHeader, static_cast<uint64_t>(st.st_size));
    }
    if (count >= keep_) {
      if (rotations++ > n / keep_ + 1) {
        env_->flock(fd_, LOCK_UN);
        return Status(Errc::unavailable, path_ + ": could not rotate");
      }
      // Full: this generation becomes the previous one; a fresh file with
      // its header in place is renamed in, and the next round locks that one.
      std::string tmp = path_ + ".tmp" + std::to_string(::getpid());
      int t = env_->open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode_);
      if (t >= 0 && mode_ != 0600) (void)env_->fchmod(t, mode_);
      Status s = t < 0 ? util::errno_status(errno, tmp) : write_all_at(*env_, t, header_bytes(0, kHeader), 0, tmp);
      if (t >= 0) env_->close(t);
      // The current name never goes missing: another process opening it
      // in a gap would create a file of its own there and append to it
      // under a lock no one else takes. So the previous generation is made
      // by a hard link (a rename only where links are not supported), and
      // the fresh file replaces the current one in a single rename.
      const std::string prev = path_ + ".1";
      if (s.is_ok()) {
        (void)env_->unlink(prev);
        if (env_->linkat(AT_FDCWD, path_, prev) != 0 && env_->rename(path_, prev) != 0)
          s = util::errno_status(errno, path_);
      }
      if (s.is_ok() && env_->rename(tmp, path_) != 0) s = util::errno_status(errno, path_);
      if (!s.is_ok()) env_->unlink(tmp);
      env_->flock(fd_, LOCK_UN);
      if (!s.is_ok()) return s;
      continue;  // open_locked() finds the new file
    }
    // The records first, then the header that commits them: a crash
    // between the two leaves bytes past `end` that the next append
    // overwrites.
    size_t take = std::min<size_t>(n - done, keep_ - count);
    std::string joined;
    std::string_view blob = recs[done];
    if (take > 1) {
      for (size_t i = done; i < done + take; ++i) joined += recs[i];
      blob = joined;
    }
    Status s = write_all_at(*env_, fd_, blob, static_cast<off_t>(end), path_);
    if (s.is_ok()) s = write_all_at(*env_, fd_, header_bytes(count + take, end + blob.size()), 0, path_);
    env_->flock(fd_, LOCK_UN);
    if (!s.is_ok()) return s;
    done += take;
  }
  return Status();
}

// ---- reading the journal (kcache/miss_journal.h) --------------------------------------

std::string miss_journal_path(const std::string& store_path) { return store_path + ".misses"; }

Expected<std::vector<MissRecord>> read_miss_journal(const std::string& store_path, size_t limit, uint64_t* skipped) {
  const std::string path = miss_journal_path(store_path);
  uint64_t unread = 0;
  std::vector<MissRecord> out;
  int fd = -1;
  for (int attempt = 0; attempt < 8; ++attempt) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT) break;
      return util::errno_status(errno, path);
    }
    // A file system without flock is read unlocked, as before; a lock held
    // past the bound is an error, never a hang.
    if (util::flock_within(fd, LOCK_SH, kLockBoundMs) == ETIMEDOUT) {
      ::close(fd);
      return Status(Errc::timeout, path + ": locked by another process for over 1 s");
    }
    if (same_file(*Env::posix(), fd, path)) break;
    ::close(fd);
    fd = -1;
  }
  // Under the current file's lock no append or rotation runs.
  int old = ::open((path + ".1").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (old >= 0) {
    read_records(old, out, unread);
    ::close(old);
  }
  if (fd >= 0) {
    read_records(fd, out, unread);
    ::close(fd);  // drops the lock
  }
  if (skipped) *skipped = unread;
  if (out.size() > limit) out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(limit));
  return out;
}

// ---- the nearest stored entry -------------------------------------------------------

Status StoredManifests::load(Tier& tier, uint64_t* unreadable) {
  StoreAdmin* admin = tier.admin();
  if (!admin) return Status(Errc::unavailable, std::string(tier.name()) + " tier cannot list its entries");
  std::vector<ListItem> items;
  Status st = admin->list([&](const ListItem& it) {
    items.push_back(it);
    return true;
  });
  if (!st.is_ok()) return st;
  std::unordered_map<Key, StoredManifest> next;
  next.reserve(items.size());
  for (const auto& it : items) {
    if (auto known = by_key_.find(it.key); known != by_key_.end()) {
      known->second.last_use_ms = it.last_use_ms;
      next.emplace(it.key, std::move(known->second));
      continue;
    }
    // A diagnostic: counts nothing, refreshes no recency, removes nothing.
    auto e = tier.get(it.key, Access::peek);
    if (!e || !e->has_value()) {
      if (unreadable) ++*unreadable;  // corrupt, or removed meanwhile
      continue;
    }
    const Entry& entry = **e;
    if (entry.manifest().ns.empty() && entry.manifest().items.empty()) continue;  // nothing to compare
    next.emplace(it.key, StoredManifest{it.key, entry.meta().label, entry.manifest(), entry.meta().created_unix_ms,
                                        it.last_use_ms});
  }
  by_key_ = std::move(next);
  return Status();
}

NearestSearch StoredManifests::nearest(const Manifest& want, const std::string& label, const Key& self,
                                       uint64_t before_ms) const {
  NearestSearch n;
  std::vector<const StoredManifest*> cands;
  bool same_label = false;
  for (const auto& [k, s] : by_key_) {
    if (s.manifest.ns != want.ns) {
      ++n.other_namespaces[s.manifest.ns];
      continue;
    }
    if (k == self || (before_ms && s.created_ms > before_ms)) continue;
    cands.push_back(&s);
    same_label |= !label.empty() && s.label == label;
  }
  n.compared = cands.size();
  // The fewest differing components (diff_manifests, as the report counts
  // them), then the most recently created, then used.
  const StoredManifest* best = nullptr;
  size_t best_diff = 0;
  for (const StoredManifest* s : cands) {
    if (same_label && s->label != label) continue;
    size_t d = diff_manifests(s->manifest, want).size();
    bool better =
        !best || d < best_diff ||
        (d == best_diff &&
         (s->created_ms > best->created_ms ||
          (s->created_ms == best->created_ms &&
           (s->last_use_ms > best->last_use_ms || (s->last_use_ms == best->last_use_ms && s->key < best->key)))));
    if (better) {
      best = s;
      best_diff = d;
    }
  }
  if (best) n.entry = *best;
  return n;
}

// ---- the explainer ------------------------------------------------------------------

MissExplainer::MissExplainer(std::shared_ptr<Tier> disk, std::unique_ptr<MissJournal> journal, bool explain)
    : disk_(std::move(disk)), journal_(std::move(journal)), explain_(explain) {}

void MissExplainer::miss(const KeyInfo& key) {
  if (key.manifest.ns.empty() && key.manifest.items.empty()) return;  // nothing to explain with
  MissRecord rec{key.key,
                 key.label,
                 key.manifest,
                 util::now_unix_ms(),
                 static_cast<uint32_t>(::getpid()),
                 program_invocation_short_name};
  if (!explain_ || !disk_) {
    if (journal_) journal_->post(std::move(rec));
    return;
  }
  if (journal_) journal_->post(rec);
  std::lock_guard<std::mutex> g(mu_);
  Status st = stored_.load(*disk_);
  if (!st.is_ok()) {
    KCACHE_LOG(LogLevel::info, "explain: listing the store: %s", st.to_string().c_str());
    return;
  }
  MissReport r = stored_.explain(rec);
  if (!r.nearest) return;  // nothing of this namespace is stored
  KCACHE_LOG(LogLevel::warn, "%s", to_text(r, TextForm::line).c_str());
}

}  // namespace kcache

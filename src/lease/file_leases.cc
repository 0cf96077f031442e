// Lease files for the file-per-entry engine: <dir>/leases/<key hex>.lease
// holds a holder record (lease/holder.h).
//
//  * acquire: create the file with O_EXCL and write the record. If it
//    exists and is stale, rename it to a unique name and try once more; of
//    several processes taking over at once only one rename succeeds.
//  * a file whose record is unreadable (its creator died between create and
//    write) counts as stale once its mtime is older than kPartialGraceMs.
//  * renew: rewrite through a temp file and rename, if the record is ours.
// No flock(2): on network file systems it is not reliable.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "kcache/lease.h"
#include "lease/holder.h"
#include "util/util.h"

namespace kcache {
namespace {

constexpr uint64_t kPartialGraceMs = 2000;

class FileLeases final : public Leases {
 public:
  explicit FileLeases(std::string dir) : dir_(std::move(dir)), token_(lease::new_token()) {}
  std::string_view name() const noexcept override { return "files"; }
  uint64_t takeovers() const noexcept override { return takeovers_.load(); }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    std::string p = path(key);
    for (int attempt = 0; attempt < 2; ++attempt) {
      int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0) {
        std::string rec = lease::encode(lease::self(token_, ttl_ms));
        bool ok = ::write(fd, rec.data(), rec.size()) == static_cast<ssize_t>(rec.size());
        ::close(fd);
        if (!ok) {
          ::unlink(p.c_str());
          return LeaseResult::error;
        }
        if (attempt > 0) takeovers_.fetch_add(1);
        return LeaseResult::acquired;
      }
      if (errno != EEXIST) return LeaseResult::error;
      lease::Holder h;
      int st = read(p, &h);
      if (st == 1 && h.token == token_) return renew(key, ttl_ms) ? LeaseResult::acquired : LeaseResult::error;
      if (st == 1 && lease::alive(h, util::now_unix_ms())) return LeaseResult::busy;
      if (st == 0) return LeaseResult::busy;  // being written right now
      // Stale (st == 1, dead/expired; or st == 2, partial and old): move
      // it aside; only one contender's rename can succeed.
      std::string aside = p + ".stale." + std::to_string(lease::new_token());
      if (::rename(p.c_str(), aside.c_str()) != 0) {
        if (errno == ENOENT) continue;  // someone else took it over
        return LeaseResult::error;
      }
      ::unlink(aside.c_str());
    }
    return LeaseResult::busy;
  }

  bool renew(const Key& key, uint64_t ttl_ms) override {
    std::string p = path(key);
    lease::Holder h;
    if (read(p, &h) != 1 || h.token != token_) return false;
    return util::write_file_atomic(p, lease::encode(lease::self(token_, ttl_ms))).is_ok();
  }

  void release(const Key& key) override {
    std::string p = path(key);
    lease::Holder h;
    if (read(p, &h) == 1 && h.token == token_) ::unlink(p.c_str());
  }

  Status init() { return util::make_dirs(dir_ + "/leases"); }

 private:
  std::string path(const Key& k) const { return dir_ + "/leases/" + k.hex() + ".lease"; }

  // 1: record read; 0: unreadable but young (being written); 2: unreadable
  // and old, or vanished (stale); -1 never.
  int read(const std::string& p, lease::Holder* h) {
    auto s = util::read_file(p, 4096);
    if (s && lease::decode(*s, h)) return 1;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) return 2;
    uint64_t mt = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
    return mt + kPartialGraceMs < util::now_unix_ms() ? 2 : 0;
  }

  std::string dir_;
  const uint64_t token_;
  std::atomic<uint64_t> takeovers_{0};
};

}  // namespace

Expected<std::shared_ptr<Leases>> open_file_leases(const std::string& dir) {
  auto l = std::make_shared<FileLeases>(dir);
  KCACHE_RETURN_IF_ERROR(l->init());
  return std::shared_ptr<Leases>(std::move(l));
}

}  // namespace kcache

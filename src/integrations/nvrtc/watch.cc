// Watched checks of NVRTC manifests (manifest.h, manifest_holds with a
// WatchState): one inotify descriptor a process, the folders each manifest
// depends on watched, and a manifest checked in full again only after an
// event in one of them, or a second after its last full check.
#include <pthread.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include "integrations/nvrtc/identity.h"
#include "integrations/nvrtc/manifest.h"

namespace kcache::nvrtc::detail {

namespace {

// One inotify descriptor for the process. Each folder a manifest depends on
// is watched once; each read of the events stamps the folders that had any
// with a new sequence number.
class Watcher {
 public:
  // The process's watcher. A forked child makes its own: reading the
  // parent's descriptor would take events the parent waits for. The fork
  // handlers hold the lock across fork(), so the child never inherits it
  // held, and drop the child's copy of the parent's watcher (its lock may
  // be held by a thread the child does not have: it is left, never used).
  static Watcher& get() {
    std::lock_guard lk(g_mu);
    pid_t pid = ::getpid();
    if (!g_w || g_owner != pid) {
      if (!g_w) {
        static const int registered = ::pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, &in_child);
        (void)registered;
      }
      g_w = new Watcher(++g_generation);  // never destroyed: used until exit
      g_owner = pid;
    }
    return *g_w;
  }
  bool available() const { return fd_ >= 0; }
  uint64_t generation() const { return generation_; }

  // Watches every folder of `dirs`; false when one cannot be watched.
  bool watch(const std::vector<std::string>& dirs, std::vector<int>* wds) {
    std::lock_guard lk(mu_);
    for (const auto& d : dirs) {
      auto it = wd_of_.find(d);
      if (it == wd_of_.end()) {
        if (!local_fs(d)) return false;
        int wd = ::inotify_add_watch(fd_, d.c_str(),
                                     IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM |
                                         IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF);
        if (wd < 0) return false;
        it = wd_of_.emplace(d, wd).first;
        dir_of_[wd] = d;
      }
      wds->push_back(it->second);
    }
    return true;
  }

  // Reads the pending events; the current sequence number.
  uint64_t drain() {
    std::lock_guard lk(mu_);
    alignas(struct inotify_event) char buf[16384];
    bool any = false;
    for (;;) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      if (!any) ++seq_;
      any = true;
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const struct inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        if (e->mask & IN_Q_OVERFLOW) overflow_seq_ = seq_;
        last_event_[e->wd] = seq_;
        if (e->mask & IN_IGNORED) {  // the folder went: watched anew next time
          auto d = dir_of_.find(e->wd);
          if (d != dir_of_.end()) {
            wd_of_.erase(d->second);
            dir_of_.erase(d);
          }
        }
      }
    }
    return seq_;
  }

  // Whether any of `wds` had an event stamped `seq` or later.
  bool changed_since(const std::vector<int>& wds, uint64_t seq) {
    std::lock_guard lk(mu_);
    if (overflow_seq_ >= seq) return true;
    for (int wd : wds) {
      auto it = last_event_.find(wd);
      if (it != last_event_.end() && it->second >= seq) return true;
      if (!dir_of_.count(wd)) return true;  // no longer watched
    }
    return false;
  }

 private:
  explicit Watcher(uint64_t generation) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)), generation_(generation) {}
  static void in_child() {
    if (g_w && g_w->fd_ >= 0) ::close(g_w->fd_);
    g_w = nullptr;
    g_mu.unlock();
  }
  static inline std::mutex g_mu;
  static inline Watcher* g_w = nullptr;  // GUARDED_BY(g_mu)
  static inline pid_t g_owner = 0;       // GUARDED_BY(g_mu)
  static inline uint64_t g_generation = 0;
  const int fd_;
  const uint64_t generation_;
  std::mutex mu_;
  uint64_t seq_ = 1;                              // GUARDED_BY(mu_)
  uint64_t overflow_seq_ = 0;                     // GUARDED_BY(mu_)
  std::unordered_map<int, uint64_t> last_event_;  // GUARDED_BY(mu_)
  std::unordered_map<std::string, int> wd_of_;    // GUARDED_BY(mu_)
  std::unordered_map<int, std::string> dir_of_;   // GUARDED_BY(mu_)
};

// The folders whose events cover every change `m` depends on: the folder
// of each file, probe, link and library (and of a file's target when it is
// a link), each folder of absent names, and for a folder that does not
// exist its nearest existing ancestor (where it would be created).
std::vector<std::string> watch_dirs(const DepManifest& m) {
  std::set<std::string> dirs;
  auto folder = [](const std::string& path) {
    std::string d = dir_of(path);
    return d.empty() ? std::string("/") : d;
  };
  auto file = [&](const std::string& path) {
    dirs.insert(folder(path));
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      if (auto r = resolved_of(path)) dirs.insert(folder(*r));
  };
  for (const auto& f : m.files) file(f.path);
  for (const auto& l : m.libs)
    if (!l.path.empty()) file(l.path);
  for (const auto& p : m.present) dirs.insert(folder(p.path));
  for (const auto& a : m.links) dirs.insert(folder(a.path));
  for (const auto& d : m.dirs) {
    std::string at = d.path.empty() ? std::string("/") : d.path;
    struct stat st;
    while (::stat(at.c_str(), &st) != 0) {
      at = folder(at);
      if (at == "/") break;
    }
    dirs.insert(at);
  }
  return {dirs.begin(), dirs.end()};
}

constexpr int64_t kRecheckNs = 1'000'000'000;

}  // namespace

bool manifest_holds(const DepManifest& m, WatchState* w) {
  Watcher& watcher = Watcher::get();
  // Listings and resolved paths are not covered by events in the folders
  // of their paths alone: checked in full every time.
  bool watchable = m.listings.empty() && m.resolved.empty();
  if (!watcher.available() || !watchable) return manifest_holds(m);
  const int64_t now = now_real_ns();
  uint64_t seq = watcher.drain();
  if (w->watched && w->generation == watcher.generation() && w->verified_seq != 0 &&
      now - w->verified_ns < kRecheckNs && !watcher.changed_since(w->wds, w->verified_seq) &&
      (m.cwd.empty() || current_dir() == m.cwd) &&
      std::all_of(m.env.begin(), m.env.end(), [](const DepManifest::Answer& a) { return env_holds(a); })) {
    // Which file the loader maps for each library (the process may have
    // loaded another copy since): asked every time.
    bool libs_hold = true;
    for (const auto& l : m.libs) libs_hold = libs_hold && resolve_library(l.name, l.path) == l.path;
    if (libs_hold) return true;
  }
  // The watches first, then the stats: a change after a stat raises an
  // event that the next check sees.
  if (w->generation != watcher.generation()) *w = WatchState{false, false, {}, 0, 0, watcher.generation()};
  if (!w->watched && !w->unwatchable) {
    w->wds.clear();
    w->watched = watcher.watch(watch_dirs(m), &w->wds);
    w->unwatchable = !w->watched;
    seq = watcher.drain();
  }
  w->verified_seq = 0;
  if (!manifest_holds(m)) return false;
  if (w->watched) {
    w->verified_seq = seq + 1;
    w->verified_ns = now;
  }
  return true;
}

}  // namespace kcache::nvrtc::detail

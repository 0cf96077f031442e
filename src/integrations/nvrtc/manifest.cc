// Manifests of NVRTC compiles (manifest.h): built from what the recorder saw
// NVRTC read, and checked against what the paths answer now (identity.h).
// Watched checks are in watch.cc, the encoding in manifest_codec.cc.
#include "integrations/nvrtc/manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "integrations/nvrtc/identity.h"

namespace kcache::nvrtc::detail {

Built build_manifest(const Recording& rec, const std::vector<std::string_view>& outputs,
                     const std::vector<std::string_view>& in_memory) {
  Built out;
  DepManifest& m = out.manifest;
  auto refuse = [&](std::string why) {
    if (out.uncacheable.empty()) out.uncacheable = std::move(why);
  };
  if (rec.hooks_lost)
    refuse("a libnvrtc import slot was rebound while compiling (lazy binding on another thread); patched again");
  if (!rec.unreadable.empty())
    refuse(rec.unreadable + " could not be opened or stat'ed, other than absent (permissions, a loop, ...)");
  if (rec.escaped) refuse(std::string(rec.escaped) + ": what it read there is not seen");
  if (rec.wrote) refuse("NVRTC wrote: opened a file for writing, made a folder or removed a name");
  if (rec.cwd_changed) refuse("NVRTC changed the working folder");
  if (current_dir() != rec.cwd) refuse("the working folder changed while compiling");
  for (std::string_view t : in_memory)
    if (dated(t)) refuse("the program uses __TIME__, __DATE__ or __TIMESTAMP__");

  struct Seen {
    bool opened = false, found = false, missing = false;
    bool has_id = false;
    FileId id;  // the identity NVRTC opened
  };
  std::map<std::string, Seen> seen;
  std::map<std::string, DepManifest::Answer> links, resolved, listings, env;
  for (const Access& a : rec.accesses) {
    switch (a.kind) {
      case Access::Kind::opened:
      case Access::Kind::stated:
      case Access::Kind::probed: {
        Seen& s = seen[a.path];
        if (!a.found) {
          s.missing = true;
          break;
        }
        s.found = true;
        if (a.kind == Access::Kind::opened) s.opened = true;
        if (a.has_id) {
          // A stat and an open of one path that saw two identities: the
          // file changed while NVRTC read it.
          if (s.has_id && !(s.id == a.id) && a.kind == Access::Kind::opened)
            refuse(a.path + " changed while compiling");
          if (a.kind == Access::Kind::opened || !s.has_id) {
            s.has_id = true;
            s.id = a.id;
          }
        }
        break;
      }
      case Access::Kind::linked:
      case Access::Kind::resolved: {
        auto& map = a.kind == Access::Kind::linked ? links : resolved;
        auto [it, fresh] = map.emplace(a.path, DepManifest::Answer{a.path, a.found, a.target});
        if (!fresh && (it->second.found != a.found || it->second.value != a.target))
          refuse(a.path + " changed while compiling");
        break;
      }
      case Access::Kind::env: {
        auto [it, fresh] = env.emplace(a.path, DepManifest::Answer{a.path, a.found, a.target});
        if (!fresh && (it->second.found != a.found || it->second.value != a.target))
          refuse("$" + a.path + " changed while compiling");
        break;
      }
      case Access::Kind::listed:
        listings.emplace(a.path, DepManifest::Answer{a.path, a.found, std::string()});
        break;
    }
  }
  const int64_t now = now_real_ns();
  // A file changed within one timestamp tick before the compile began (or
  // after) could have been rewritten, after NVRTC read it, without its
  // identity changing: too new to vouch for what NVRTC read.
  const int64_t began = rec.start_ns ? std::min(rec.start_ns, now) : now;
  std::set<std::string> absent_dirs;
  struct stat st;
  for (auto& [path, s] : seen) {
    if (s.found && s.missing) {
      refuse(path + " appeared or went while compiling");
      continue;
    }
    if (s.missing) {
      if (!absent_now(path)) refuse(path + " appeared while compiling");
      m.absent.push_back(path);
      absent_dirs.insert(dir_of(path));
      continue;
    }
    if (!s.opened) {
      if (::stat(path.c_str(), &st) != 0) {
        refuse(path + " went while compiling");
        continue;
      }
      m.present.push_back({path, mode_of(st)});
      continue;
    }
    if (::stat(path.c_str(), &st) != 0) {
      refuse(path + " went while compiling");
      continue;
    }
    if (S_ISDIR(st.st_mode)) {  // opened as a folder: existence only
      m.present.push_back({path, mode_of(st)});
      continue;
    }
    // /proc, a device, a FIFO: its bytes have no identity (and a FIFO
    // blocks a read).
    if (!S_ISREG(st.st_mode) || pseudo_fs(path, st.st_dev)) {
      refuse(path + " is not a regular file");
      continue;
    }
    FileId id = id_of(st);
    if (s.has_id && !(id == s.id)) {
      refuse(path + " changed while compiling");
      continue;
    }
    if (young(path, id, began)) {
      refuse(path + " is too new (changed within the file system's timestamp granularity of the compile)");
      continue;
    }
    auto d = digest_file(path, st, now);
    if (!d) {
      refuse(path + " changed while it was read");
      continue;
    }
    if (d->dated) refuse(path + " uses __TIME__, __DATE__ or __TIMESTAMP__");
    m.files.push_back({path, id, d->digest});
  }
  for (const auto& dir : absent_dirs) {
    DepManifest::Dir d;
    d.path = dir;
    d.exists = ::stat(dir.empty() ? "/" : dir.c_str(), &st) == 0;
    if (d.exists) {
      FileId id = id_of(st);
      if (!young(dir, id, now)) d.id = id;  // else zero: its absent names are stat'ed every check
    }
    m.dirs.push_back(std::move(d));
  }
  for (auto& [path, a] : links) {
    auto now_target = link_of(path);
    if (now_target.has_value() != a.found || (a.found && *now_target != a.value))
      refuse(path + " changed while compiling");
    m.links.push_back(a);
  }
  for (auto& [path, a] : resolved) {
    auto now_target = resolved_of(path);
    if (now_target.has_value() != a.found || (a.found && *now_target != a.value))
      refuse(path + " changed while compiling");
    m.resolved.push_back(a);
  }
  for (auto& [path, a] : listings) {
    // The names are taken now, not when NVRTC read them: a folder changed
    // since the compile began (or within a tick before) may have listed
    // otherwise for NVRTC.
    if (a.found && ::stat(path.c_str(), &st) == 0 && young(path, id_of(st), began))
      refuse(path + " is too new (a folder NVRTC listed changed within the timestamp granularity of the compile)");
    auto d = listing_digest(path);
    if (d.has_value() != a.found) refuse(path + " changed while compiling");
    if (d) a.value = d->hex();
    m.listings.push_back(a);
  }
  // Variables NVRTC asked for in an earlier compile of this process only
  // (once per process): their values now.
  for (const auto& name : nvrtc_env_names()) {
    if (env.count(name)) continue;
    const char* v = std::getenv(name.c_str());
    env.emplace(name, DepManifest::Answer{name, v != nullptr, v ? std::string(v) : std::string()});
  }
  for (auto& [name, a] : env) {
    // PWD names the working folder, which is keyed when NVRTC uses it;
    // kept only when an output names its value (a shell that did not
    // follow a chdir leaves it stale, and a stale one should not miss).
    if (name == "PWD") {
      bool named = false;
      if (a.found && a.value.size() > 1)
        for (std::string_view o : outputs) named = named || o.find(a.value) != std::string_view::npos;
      if (!named) continue;
    }
    if (!env_holds(a)) refuse("$" + name + " changed while compiling");
    m.env.push_back(a);
  }
  for (const Load& l : nvrtc_loads()) {
    DepManifest::Lib lib{l.name, l.path, {}, {}};
    if (!l.path.empty()) {
      if (::stat(l.path.c_str(), &st) != 0) {
        refuse(l.path + " went while compiling");
        continue;
      }
      auto d = digest_file(l.path, st, now);
      if (!d) {
        refuse(l.path + " changed while it was read");
        continue;
      }
      lib.id = id_of(st);
      lib.digest = d->digest;
    }
    m.libs.push_back(std::move(lib));
  }
  // The working folder, when NVRTC asked for it or resolved a relative
  // path against it, or when an output names it (debug and line info name
  // the folder of the source).
  if (rec.cwd_used) m.cwd = rec.cwd;
  if (!rec.cwd.empty() && rec.cwd != "/") {
    for (std::string_view o : outputs)
      if (o.find(rec.cwd) != std::string_view::npos) m.cwd = rec.cwd;
  }
  return out;
}

bool manifest_holds(const DepManifest& m) {
  if (!m.cwd.empty() && current_dir() != m.cwd) return false;
  for (const auto& a : m.env)
    if (!env_holds(a)) return false;
  const int64_t now = now_real_ns();
  struct stat st;
  for (const auto& l : m.libs) {
    if (resolve_library(l.name, l.path) != l.path) return false;
    if (l.path.empty()) continue;
    if (!files_hold({DepManifest::File{l.path, l.id, l.digest}}, now)) return false;
  }
  // Folders of absent names: one whose identity is as recorded vouches for
  // every absent name in it; the others' names are stat'ed one by one.
  std::set<std::string> unvouched;
  for (const auto& d : m.dirs) {
    bool exists = ::stat(d.path.empty() ? "/" : d.path.c_str(), &st) == 0;
    if (!exists && !d.exists) continue;
    if (exists && d.exists && id_of(st) == d.id && d.id != FileId{} && !young(d.path, d.id, now)) continue;
    unvouched.insert(d.path);
  }
  if (!unvouched.empty()) {
    for (const auto& a : m.absent)
      if (unvouched.count(dir_of(a)) && !absent_now(a)) return false;
  }
  if (!files_hold(m.files, now)) return false;
  FolderStat fs;
  for (const auto& p : m.present)
    if (!fs.stat(p.path, &st) || mode_of(st) != p.mode) return false;
  for (const auto& a : m.links) {
    auto t = link_of(a.path);
    if (t.has_value() != a.found || (a.found && *t != a.value)) return false;
  }
  for (const auto& a : m.resolved) {
    auto t = resolved_of(a.path);
    if (t.has_value() != a.found || (a.found && *t != a.value)) return false;
  }
  for (const auto& a : m.listings) {
    auto d = listing_digest(a.path);
    if (d.has_value() != a.found || (d && d->hex() != a.value)) return false;
  }
  return true;
}

}  // namespace kcache::nvrtc::detail

// What a path answers now, as the manifests of NVRTC compiles (manifest.h)
// record and check it: file identities and the timestamp granularity that
// decides when one vouches for a file's bytes, the digest memo that reads a
// file only when its identity is new, and the answers of folders, links,
// resolved paths and environment variables.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "integrations/nvrtc/manifest.h"
#include "integrations/nvrtc/observe.h"
#include "kcache/key.h"

namespace kcache::nvrtc::detail {

int64_t now_real_ns();
// The folder of `path`: "/" for a name in the root, empty for a bare name.
std::string dir_of(const std::string& path);
std::string current_dir();

// ---- timestamp granularity ---------------------------------------------------

// File systems whose inotify events cover every change (local ones). On
// others (NFS, FUSE, ...) a change made elsewhere raises no event.
bool local_fs(const std::string& dir);

// Whether the file system of `path` (device `dev`) makes its files' bytes
// as they are read (/proc, /sys, ...): identities there vouch for nothing.
bool pseudo_fs(const std::string& path, dev_t dev);

// Changed so recently that it could change again within the same tick
// without its identity changing (ccache's "file too new").
bool young(const std::string& path, const FileId& id, int64_t now);

// ---- the digest memo ---------------------------------------------------------

struct Digested {
  FileId id;
  Digest digest;
  bool dated = false;  // holds __TIME__, __DATE__ or __TIMESTAMP__
};

// Whether `text` uses __TIME__, __DATE__ or __TIMESTAMP__.
bool dated(std::string_view text);

// The digest of the file at `path` whose stat is `st`, read only when its
// identity is new; nullopt when it cannot be read or changed while read.
std::optional<Digested> digest_file(const std::string& path, const struct stat& st, int64_t now);

// ---- answers -----------------------------------------------------------------

std::optional<Digest> listing_digest(const std::string& path);
std::optional<std::string> link_of(const std::string& path);
std::optional<std::string> resolved_of(const std::string& path);
// The type and permission bits of a file.
inline uint32_t mode_of(const struct stat& st) { return static_cast<uint32_t>(st.st_mode & (S_IFMT | 07777)); }
// Whether the environment variable `a.path` is as recorded.
bool env_holds(const DepManifest::Answer& a);
bool absent_now(const std::string& path);

// stat() of paths given in runs of the same folder, through a descriptor of
// the folder (O_PATH) kept while the folder repeats.
class FolderStat {
 public:
  FolderStat() = default;
  FolderStat(const FolderStat&) = delete;
  FolderStat& operator=(const FolderStat&) = delete;
  ~FolderStat();
  bool stat(const std::string& path, struct stat* st);

 private:
  int fd_ = -1;
  std::string dir_;
};

// Whether each of `files` is as recorded: by identity, and by digest when
// its identity changed or is too young to vouch. Checked in order of their
// folder: each folder looked up once.
bool files_hold(const std::vector<DepManifest::File>& files, int64_t now);

}  // namespace kcache::nvrtc::detail

// The manifests of NVRTC programs: what one compile of a program read, as
// the recorder (observe.h) saw NVRTC read it, in a form a later key checks
// by file identity instead of compiling again (as ccache's direct mode does
// with a compiler's dependency list).
//
// A manifest lists each path NVRTC opened with the digest of the bytes it
// read; each path it stat'ed or probed and found (existence, and its type
// and permission bits); each path it
// looked for and did not find (absence, checked through the identity of the
// folder it would be in); each folder it listed (the names in it); each
// link it read and each path it resolved (the answer); each library it
// loaded (the file the loader maps now for that name, and its digest); each
// environment variable it asked for (its value); and the working folder
// when the output depends on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "integrations/nvrtc/observe.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache::nvrtc::detail {

// ---- options as NVRTC reads them (options.cc) ------------------------------

// Every spelling NVRTC accepts, parsed: -D X, -DX, -D" X", --define-macro X,
// --define-macro=X (same for -U / --undefine-macro), -I X, -IX, -I=X,
// --include-path X, --include-path=X, -include X, -include=X,
// --pre-include X, --pre-include=X. One-string forms NVRTC rejects
// ("--define-macro X", "-include X", "-includeX") stay in `other` as given.
struct ParsedOptions {
  std::vector<std::string> other;         // everything else, given order
  std::vector<std::string> macros;        // "-DNAME=VALUE" / "-UNAME": the last operation per name, sorted by name
  std::vector<std::string> include_dirs;  // in order
  std::vector<std::string> pre_includes;  // in order
};
ParsedOptions parse_options(const std::vector<std::string>& options);

// ---- the manifest ------------------------------------------------------------
//
// Built and checked in manifest.cc, against what paths answer now
// (identity.h); watched checks in watch.cc, the encoding in manifest_codec.cc.

struct DepManifest {
  struct File {
    std::string path;
    FileId id;  // when the digest was taken
    Digest digest;
  };
  struct Dir {
    std::string path;
    bool exists = false;
    FileId id;  // when exists; all zero when it was too young to vouch for its absent names
  };
  struct Present {
    std::string path;
    uint32_t mode = 0;  // type and permission bits (st_mode): whether NVRTC could read it counts
  };
  struct Answer {
    std::string path;
    bool found = false;
    std::string value;  // readlink's target, realpath's result, a listing's digest (hex)
  };
  struct Lib {
    std::string name;  // as NVRTC passed it to dlopen
    std::string path;  // the file mapped; empty when the load failed
    FileId id;
    Digest digest;
  };
  std::vector<File> files;          // opened: their bytes
  std::vector<Present> present;     // stat'ed / probed and found
  std::vector<std::string> absent;  // looked for and not found
  std::vector<Dir> dirs;            // the folders of `absent`
  std::vector<Answer> links;        // readlink
  std::vector<Answer> resolved;     // realpath
  std::vector<Answer> listings;     // opendir
  std::vector<Lib> libs;            // dlopen
  std::vector<Answer> env;          // getenv: name, set, value
  std::string cwd;                  // the working folder when NVRTC used it or an output names it; else empty
};

// Why a compile's result is not stored (empty: it may be).
struct Built {
  DepManifest manifest;
  std::string uncacheable;  // the reason, for the one log line
};

// The manifest of a finished compile from its recording. `outputs` are the
// artifacts' bytes (a working folder named in them is recorded);
// `in_memory` the source and named headers (checked for __TIME__ & co).
Built build_manifest(const Recording& rec, const std::vector<std::string_view>& outputs,
                     const std::vector<std::string_view>& in_memory);

// Whether every path of `m` still answers as recorded: files by identity,
// read again (only they) when it changed, compared by digest; folders of
// absent paths by identity; libraries by what the loader maps now.
bool manifest_holds(const DepManifest& m);

// The same for a manifest checked again and again in one process: when
// every folder it depends on is watched (inotify, a local file system) and
// no event came since the last full check, less than a second ago, it holds
// without a stat.
struct WatchState {
  bool watched = false;
  bool unwatchable = false;
  std::vector<int> wds;
  uint64_t verified_seq = 0;
  int64_t verified_ns = 0;
  uint64_t generation = 0;
};
bool manifest_holds(const DepManifest& m, WatchState* state);

std::string encode_manifest(const DepManifest& m);
std::optional<DepManifest> decode_manifest(std::string_view bytes);

// Files read to digest them (not answered from the identity memo) since the
// process began; for tests and benchmarks.
uint64_t header_reads() noexcept;

// Whether a file changed `ns_ago` nanoseconds ago may change again within
// the same timestamp tick on the file system holding `path`.
int64_t timestamp_granularity_ns(const std::string& path);

}  // namespace kcache::nvrtc::detail

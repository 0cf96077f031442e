// The files on disk that can reach an NVRTC compile: the #include closure of
// a program over NVRTC's include search, what each __has_include probe asked,
// and a record of both that a later key checks by file identity instead of
// reading the headers again.
//
// Search order, as NVRTC follows it (checked against its file accesses):
//   "name"  the folder of the including file on disk; for the source and
//           named headers, the folder of the program name (the working
//           folder when the name has none), unless -no-source-include;
//           then every -I / --include-path folder in order;
//   <name>  every -I / --include-path folder in order.
// -include / --pre-include headers are searched as "name" from the source.
//
// The closure follows the preprocessor, over-approximated where it cannot
// know (a superset only costs a miss):
//   * every directive counts whatever #if surrounds it;
//   * #include / #import take the first candidate along the search that
//     exists, and record every candidate before it as absent, so a header
//     that appears earlier in the search changes the key; #include_next
//     follows every existing candidate on the -I folders;
//   * __has_include / __has_include_next (and any macro wrapping them, as
//     `#if WRAPPER(<name>)`) are existence probes: the record says which
//     candidates exist, not what they hold;
//   * `#include MACRO`, `#include <MACRO/x.h>`-style names and probes of a
//     macro are resolved by expanding the object-like macros every scanned
//     file and every -D defines, with every definition a conditional could
//     select (a bounded set of alternatives);
//   * digraphs (`%:include`) and line splices are read as the preprocessor
//     reads them; directives are read from the text with comments removed
//     and from the raw text too, so a misread comment only adds names.
// Only an include that still cannot be resolved (a function-like macro, too
// many alternatives) keys whole folders: every file under each -I folder,
// never the working folder, at most kMaxFallbackFiles files (more: the
// program is compiled without the cache), with one log line naming the
// include and the folders.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/key.h"
#include "kcache/nvrtc.h"
#include "kcache/status.h"

namespace kcache::nvrtc::detail {

// ---- options as NVRTC reads them -------------------------------------------

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
  bool source_dir_searched = true;        // false with -no-source-include
  std::vector<std::pair<std::string, std::string>> defines;  // object-like -D macros in effect: name, body
};
ParsedOptions parse_options(const std::vector<std::string>& options);

// ---- scanning one text -----------------------------------------------------

struct Directive {
  enum class Kind : uint8_t { include, include_next, probe, probe_next };
  Kind kind = Kind::include;
  std::string name;       // the header name, or the macro text when computed
  bool quoted = false;    // "name" (else <name>)
  bool computed = false;  // a macro names the file: `name` is its text
};
struct Define {
  std::string name;
  std::string body;  // trimmed
};
struct Scan {
  std::vector<Directive> directives;
  std::vector<Define> defines;  // object-like #defines (function-like ones are not used)
};
Scan scan_includes(std::string_view text);

// ---- the closure and its record --------------------------------------------

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileId&) const = default;
};

// What one walk of the include search found: enough to build the key's disk
// components and to check, by identity alone, that a new walk would find
// the same. Lists are sorted by path.
struct Closure {
  struct File {
    std::string path;
    FileId id;
    Digest digest;
  };
  struct Dir {
    std::string path;
    bool exists = false;
    FileId id;  // when exists
  };
  std::vector<File> files;            // read: their bytes are keyed
  std::vector<std::string> present;   // probed and found (existence keyed)
  std::vector<std::string> absent;    // looked for and not found
  std::vector<Dir> dirs;              // the folders of `absent` paths, and fallback folders
  std::vector<std::string> fallback;  // "include X: folder Y", one per unresolved include and folder
  std::string cwd;                    // the working folder, when a path above is relative; else empty
  // No file or folder was changed within the last seconds (a younger one
  // could change again within one timestamp tick): the record may be kept.
  bool settled = true;
};

// Most files one program may bring in; past it the program is compiled
// without the cache (Errc::too_large), never with a partial key.
inline constexpr size_t kMaxDiskInputs = 20000;
// Most files keyed for unresolvable includes, all folders together.
inline constexpr size_t kMaxFallbackFiles = 5000;

// Walks the include search (reading only files whose identity is new to
// this process).
Expected<Closure> walk_closure(const Program& program, const ParsedOptions& options);

// True when every file, probe and folder of `c` is as recorded (one stat
// each; absent paths through their folder's identity) and none is young.
bool closure_still_valid(const Closure& c);

// The same for a closure checked again and again in one process: when every
// folder it depends on is watched (inotify, on a local file system) and no
// event came since the last full check, less than a second ago, it holds
// without a stat; otherwise the full check runs and `state` is renewed.
struct WatchState {
  bool watched = false;
  bool unwatchable = false;   // a folder could not be watched (not a local file system)
  std::vector<int> wds;       // the watches of its folders
  uint64_t verified_seq = 0;  // events stamped at or after this mean a change; 0: not verified
  int64_t verified_ns = 0;    // wall clock of the last full check
  uint64_t generation = 0;    // the process's watcher these belong to (a forked child has its own)
};
bool closure_still_valid(const Closure& c, WatchState* state);

// The record in bytes (stored in the cache for other processes), and back.
std::string encode_closure(const Closure& c);
std::optional<Closure> decode_closure(std::string_view bytes);

// Files read (not answered from the identity memo) since the process began;
// for tests and benchmarks.
uint64_t header_reads() noexcept;
// Walks of the include search since the process began (a key answered from
// a record does none); for tests and benchmarks.
uint64_t closure_walks() noexcept;

}  // namespace kcache::nvrtc::detail

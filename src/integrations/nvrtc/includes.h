// The files on disk that can reach an NVRTC compile: the #include closure of
// a program over NVRTC's include search, with file digests remembered by
// file identity so a warm process pays a stat per header, not a read.
//
// Search order, as NVRTC follows it (checked against its file accesses):
//   "name"  the folder of the including file on disk; for the source and
//           named headers, the folder of the program name (the working
//           folder when the name has none), unless -no-source-include;
//           then every -I / --include-path folder in order;
//   <name>  every -I / --include-path folder in order.
// -include / --pre-include headers are searched as "name" from the source.
//
// The closure over-approximates on purpose (a superset only costs a miss):
// every directive is taken whatever #if surrounds it, and directives are
// read both from the text with comments removed and from the raw text, so
// a comment or literal the scanner misreads can only add names; for each
// name every existing candidate along
// the search is recorded and followed, not only the first, so #include_next
// and files that appear earlier in the search are covered. A name that
// matches a named header also scans that header. A computed include
// (#include MACRO, __has_include(MACRO)) puts every file under every search
// folder into the set.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/key.h"
#include "kcache/nvrtc.h"
#include "kcache/status.h"

namespace kcache::nvrtc::detail {

// One #include / #include_next / #import / __has_include of a text.
struct Directive {
  std::string name;
  bool quoted = false;    // "name" (else <name>)
  bool computed = false;  // neither: a macro names the file
};
// The directives of `text` (see the top for what is taken).
std::vector<Directive> scan_includes(std::string_view text);

// Where NVRTC looks for headers, from the options and program name.
struct IncludeSearch {
  std::vector<std::string> dirs;          // -I / --include-path, in order
  std::string source_dir;                 // folder of the program name; "" = working folder
  bool source_dir_searched = true;        // false with -no-source-include
  std::vector<std::string> pre_includes;  // -include / --pre-include
};
IncludeSearch include_search(const std::vector<std::string>& options, std::string_view program_name);

// Every file on disk that can reach the compile, as "path\tdigest-hex",
// sorted. `whole_folders` says a computed include put the search folders in.
struct DiskInputs {
  std::vector<std::string> files;
  bool whole_folders = false;
};
// Most files one program may bring in; past it the program is compiled
// without the cache (Errc::too_large), never with a partial key.
inline constexpr size_t kMaxDiskInputs = 20000;
Expected<DiskInputs> disk_inputs(const Program& program);

// Files read (not answered from the identity memo) since the process began;
// for tests and benchmarks.
uint64_t header_reads() noexcept;

}  // namespace kcache::nvrtc::detail

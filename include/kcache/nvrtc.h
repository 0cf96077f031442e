// kcache/nvrtc.h — cached NVRTC compiles of CUDA C++ source.
//
// A `nvrtc::Compiler` turns a `Program` (source, options, named headers,
// name expressions) into what NVRTC produces for it: PTX, CUBIN (a real
// architecture, `-arch=sm_XX` in any spelling) and LTO-IR (`-dlto`) — the
// compiler asks NVRTC which outputs it made rather than guessing from the
// options — plus the lowered (mangled) names of the name expressions. The
// first compile of a program runs NVRTC and stores one kcache Entry with the
// artifacts "ptx" (with its terminating NUL), "cubin", "ltoir",
// "lowered_names" and "log" (only those produced); every later compile of
// the same program, in this process or another one sharing the cache, is a
// lookup.
//
// What the key covers (namespace "kcache.nvrtc/2"):
//   * the NVRTC build: nvrtcVersion() and a digest of the libnvrtc file that
//     is loaded in this process (found with dladdr on an NVRTC symbol) and of
//     the libnvrtc-builtins file beside it, so a patched library with the
//     same version number is a miss;
//   * the options in canonical form (see below);
//   * every named header: its include name and its contents;
//   * every file on disk the compile can read: the #include closure of the
//     source, the named headers and the -include / --pre-include headers
//     over NVRTC's search (for "name": the including file's folder, or the
//     program name's folder for the source; then each -I / --include-path
//     folder in order; <name>: the -I folders), each by path and digest.
//     The closure is a superset: every directive counts whatever #if
//     surrounds it, and every existing candidate along the search counts,
//     not only the first, so a header that appears earlier in the search
//     is a miss too. A computed include (`#include MACRO`) puts every file
//     under every search folder into the key. A program whose search holds
//     more than 20,000 files is compiled without the cache (one log line).
//     Digests are remembered per process by file identity (device, inode,
//     size, mtime and ctime in ns), so a warm compile pays a stat per header,
//     not a read; a file changed in the last 2 s is read every time, since
//     it could change again within one timestamp tick;
//   * the source and the program name (it appears in diagnostics);
//   * the name expressions, in the order given;
//   * which outputs are produced (ptx / cubin / ltoir);
//   * `Program::extra_key`: anything else the caller knows decides the output.
//
// Canonical options. Options are kept in the order given, because for NVRTC
// order can matter (a repeated option: the last one wins; include paths are
// searched in order). The one exception is macro definitions: `-D`/`-U`
// (and their long spellings `--define-macro=`, `--undefine-macro=`, which
// are rewritten to the short ones) are taken out of the list and sorted
// when every macro is named once, since then their order cannot change the
// result; when one macro is defined or undefined more than once, all macro
// options keep their given order. So `-DA=1 -DB=2` and `-DB=2 -DA=1` hit
// the same entry, while `-DA -UA` and `-UA -DA` do not.
//
// Failures. A failed compile returns Errc::compile_failed whose message is
// the full NVRTC log. Failures are never stored in the cache tiers, so a
// fixed header or option is picked up by the very next call. With
// `CompilerOptions::remember_failures`, failures are also remembered in
// memory for the life of the Compiler (bounded), which saves recompiling a
// program that is known to fail; the key covers all inputs, so a change to
// any of them is still compiled.
//
// Caveats:
//   * Environment variables NVRTC may read are not in the key.
//   * Headers built into libnvrtc-builtins are covered by the library
//     digest, not by the disk closure.
//   * The first compile in a process hashes the NVRTC library (about 110 MB
//     for CUDA 13); the digest is remembered in the cache under the file's
//     identity (device, inode, size, mtime, ctime), so later processes pay a
//     stat, not a read.
//
// Thread-safety: a Compiler may be used by many threads at once; concurrent
// compiles of one program run NVRTC once (the Cache's single-flight).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache::nvrtc {

inline constexpr std::string_view kNamespace = "kcache.nvrtc/2";

struct Header {
  std::string name;  // the name the source #includes it by
  std::string contents;
};

struct Program {
  std::string source;
  // Program name shown in diagnostics; empty means "default_program".
  std::string name;
  std::vector<std::string> options;
  std::vector<Header> headers;  // REQUIRES: names distinct and non-empty
  // C++ expressions naming __global__ functions or __device__ variables,
  // e.g. "reduce<float, 256>"; their lowered names are in the result.
  std::vector<std::string> name_expressions;
  // Extra key components decided by the caller (anything outside the
  // program that decides the output). Names are prefixed with "extra." in
  // the manifest.
  std::map<std::string, std::string> extra_key;
};

// Which outputs the options ask for, read from the options (a key
// component; what a compile returns is what NVRTC reports it made).
struct Outputs {
  bool ptx = true;     // false only with -dlto (NVRTC then emits no PTX)
  bool cubin = false;  // any -arch naming sm_XX: -arch=sm_XX, -arch sm_XX, --gpu-architecture[=| ]sm_XX
  bool ltoir = false;  // -dlto / --dlink-time-opt
};
Outputs outputs_for(const std::vector<std::string>& options);

// The options in the canonical form hashed into the key (see top).
struct CanonicalOptions {
  std::vector<std::string> options;  // non-macro options, given order
  std::vector<std::string> macros;   // -D/-U options, sorted when safe
  bool macros_sorted = false;
};
CanonicalOptions canonical_options(const std::vector<std::string>& options);

// The identity of the NVRTC library loaded in this process.
struct Identity {
  int major = 0;
  int minor = 0;
  std::string library_path;  // empty when dladdr could not name it
  Digest library_digest;     // of libnvrtc and libnvrtc-builtins; zero if unknown
};

// The result of a compile. The views point into `entry` and stay valid as
// long as this Result (or a copy) lives.
struct Result {
  Entry entry;
  Key key;
  Source source = Source::compiled;  // where it came from
  // PTX text without its terminating NUL, which is nonetheless there:
  // ptx.data()[ptx.size()] == '\0', so ptx_cstr() (or ptx.data()) can go
  // straight to cuModuleLoadData. Empty when NVRTC made none (-dlto).
  std::string_view ptx;
  std::string_view cubin;                                          // empty unless NVRTC made one (a real arch)
  std::string_view ltoir;                                          // empty unless NVRTC made it (-dlto)
  std::string_view log;                                            // NVRTC's warnings (may be empty)
  std::vector<std::pair<std::string, std::string>> lowered_names;  // expression, lowered

  // The PTX as a NUL-terminated string ("" when there is none), valid as
  // long as `ptx`: what cuModuleLoadData and cuLinkAddData expect.
  const char* ptx_cstr() const noexcept { return ptx.empty() ? "" : ptx.data(); }

  // The lowered name of `expression`, or nullopt if it was not requested.
  std::optional<std::string_view> lowered(std::string_view expression) const noexcept;
};

struct CompilerOptions {
  // Remember failed compiles in memory for the Compiler's lifetime, so a
  // program known to fail is not compiled again. Default false.
  bool remember_failures = false;
  // Most failures remembered; 0 means 1024. Oldest are dropped first.
  size_t max_remembered_failures = 0;
  // Hash the libnvrtc file into the key (recommended). When false only
  // nvrtcVersion() identifies the compiler. Default true.
  bool hash_library = true;
};

class Compiler {
 public:
  // REQUIRES: `cache` outlives the Compiler.
  explicit Compiler(Cache& cache, CompilerOptions options = {});
  ~Compiler();
  Compiler(const Compiler&) = delete;
  Compiler& operator=(const Compiler&) = delete;

  // The cached compile. Errors: invalid_argument (bad headers),
  // compile_failed (message: NVRTC's error and full log), internal (NVRTC
  // could not be called). Cache faults are never errors here.
  Expected<Result> compile(const Program& program);

  // The key `compile` would use (for explain/tests).
  Expected<KeyInfo> key(const Program& program);

  // The NVRTC library identity (computed once per Compiler).
  const Identity& identity();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs NVRTC directly, without any cache (the baseline for benchmarks and
// what Compiler runs on a miss). The artifacts are named as in the Entry;
// "ptx" ends with its NUL.
Expected<std::vector<Artifact>> compile_uncached(const Program& program);

}  // namespace kcache::nvrtc

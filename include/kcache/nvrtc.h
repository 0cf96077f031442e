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
// What the key covers. A program's own inputs make its inputs key
// (namespace "kcache.nvrtc.inputs/1"):
//   * the NVRTC build: nvrtcVersion() and a digest of the libnvrtc file that
//     is loaded in this process (found with dladdr on an NVRTC symbol), so a
//     patched library with the same version number is a miss;
//   * the options in canonical form (see below);
//   * every named header: its include name and its contents;
//   * the source and the program name (it appears in diagnostics);
//   * the name expressions, in the order given;
//   * which outputs are produced (ptx / cubin / ltoir);
//   * the working folder, with -G / --device-debug / -lineinfo /
//     --generate-line-info (debug and line info name it);
//   * `Program::extra_key`: anything else the caller knows decides the output.
// What NVRTC reads from disk is not guessed: the first compile of a program
// runs NVRTC with a recorder on (src/integrations/nvrtc/observe.h) that sees
// every file NVRTC opens, stats, probes, lists, resolves or loads on the
// compiling thread, and stores a manifest of it under the inputs key (as
// ccache's direct mode does): each file read with the digest of its bytes,
// each path found or not found, each library loaded (libnvrtc-builtins: the
// copy the loader mapped, and its digest), and the working folder when
// NVRTC asked for it or an output names it. A program keeps up to 8
// manifests (one per include configuration seen). A later compile checks
// them by file identity (device, inode, size, mtime, ctime; a file whose
// identity changed is read again and compared by digest) and, when one
// holds, its entry's key (namespace "kcache.nvrtc/4": the inputs and one
// component per file, "file:PATH", "probe:PATH", "probes.absent",
// "library:NAME") is looked up. When none holds, NVRTC runs (once across
// threads and processes sharing the store) and a new manifest is stored.
// In a process, a manifest whose folders are all watched (inotify, local
// file systems) is trusted without a stat until an event comes, and is
// checked in full at least once a second.
//
// Not stored (the result is returned, one log line): a compile during which
// a file it read changed (identity at the access and at the end differ, or
// a path appeared or went), that read a file changed within the file
// system's timestamp granularity of the compile's start (50 ms on local
// file systems with nanosecond times, 2 s elsewhere: a later rewrite in the
// same tick could keep its identity), that read a file using __TIME__,
// __DATE__ or __TIMESTAMP__, in which NVRTC wrote a file or changed the
// working folder.
//
// Canonical options, as NVRTC reads them: -D and -U in every spelling it
// accepts (-DX, -D X as two entries, "-D X" as one, --define-macro X,
// --define-macro=X; likewise -U / --undefine-macro) become "-DNAME=VALUE"
// ("-DX" is "-DX=1") or "-UNAME"; only the last operation on each macro
// counts (NVRTC's result: `-DA=1 -DA=2` is `-DA=2`, `-DA -UA` is `-UA`),
// and they are sorted by macro name, since operations on different macros
// commute. -I / --include-path (-IX, -I X, -I=X, --include-path=X, two
// entries) become "-IX" and -include / --pre-include (two entries or =)
// "--pre-include=X", each kept in its given order (the search order).
// Other options keep their given order (a repeated option: the last one
// wins). One-string forms NVRTC rejects ("--define-macro X", "-include X")
// stay as given. A -U of a macro nothing defined is kept: NVRTC predefines
// names such as NULL and CUDART_VERSION, so no -U is dropped.
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
//   * The environment variables NVRTC asks for on the compiling thread
//     (NVRTC 13: NVRTC_APPEND_FLAGS, EDG_BASE, ...) are in the key, as
//     NVRTC saw them; PWD only when an output names its value.
//   * Where libnvrtc's import table cannot be rewritten (not Linux x86-64,
//     or a libnvrtc that reads files through functions the recorder does
//     not cover), programs compile without the cache (one log line).
//   * In a process, a watched manifest is trusted for up to a second: a
//     change made through a hard link in another folder is seen within
//     that second.
//   * The first compile in a process hashes the NVRTC library (about 110 MB
//     for CUDA 13); the digest is remembered in the cache under the file's
//     identity (device, inode, size, mtime, ctime), so later processes pay a
//     stat, not a read.
//
// Thread-safety: a Compiler may be used by many threads at once; concurrent
// compiles of one program run NVRTC once (the Cache's single flight, over
// threads and processes). compile_all compiles a list on worker threads,
// what no other process holds first.
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

inline constexpr std::string_view kNamespace = "kcache.nvrtc/4";

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
  std::vector<std::string> options;  // other options in given order, then -IX in order, then --pre-include=X in order
  std::vector<std::string> macros;   // "-DNAME=VALUE" / "-UNAME", the last per name, sorted by name
};
CanonicalOptions canonical_options(const std::vector<std::string>& options);

// The identity of the NVRTC library loaded in this process.
struct Identity {
  int major = 0;
  int minor = 0;
  std::string library_path;  // empty when dladdr could not name it
  Digest library_digest;     // of libnvrtc (libnvrtc-builtins is in each manifest); zero if unknown
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
  // Most failures remembered per program (each is checked on every lookup
  // of it); 0 means 8. Oldest are dropped first. The memory of programs as
  // a whole is bounded (64 MiB, least recently used dropped first).
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

  // Compiles a list of programs, cooperatively across threads and
  // processes: every program is looked up first (hits are returned without
  // compiling); then a pool of `threads` workers (0: $KCACHE_JOBS, else the
  // number of CPUs) compiles the misses, each first without waiting for
  // another process (Cache::try_begin): a program another process is
  // compiling is set aside and waited for only once nothing else is left
  // (a holder that died is taken over, as compile() does). N processes
  // given overlapping lists in any order so share the compiles out, each
  // program still compiled once in all. Results are in request order, each
  // what compile() would return: a program's error (compile_failed, ...)
  // stays in its slot and the others are compiled; cache faults are never
  // errors. NVRTC runs on the workers, one program each.
  std::vector<Expected<Result>> compile_all(const std::vector<Program>& programs, unsigned threads = 0);

  // The key `compile` would look up now: the entry key of the program's
  // stored manifest that holds for the files as they are; when none holds
  // (never compiled, or something it read changed), the program's inputs
  // key (manifest.ns == "kcache.nvrtc.inputs/1"), which names no file.
  // Never runs NVRTC.
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

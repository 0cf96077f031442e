// What the LLVM integration's files share (include/kcache/llvm.h is the
// interface): keys.cc makes object and front-end keys and reads the module
// tags, objects.cc turns stored entries into object buffers (and is the
// MCJIT ObjectCache), caching_compiler.cc is the ORC IRCompiler, lljit.cc
// builds LLJITs and loads bitcode into them, and counters.cc times and
// counts what they do.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "kcache/key.h"
#include "kcache/llvm.h"

#include <llvm/IR/Module.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>

namespace kcache::llvm::detail {

// ---- counters (counters.cc) ----------------------------------------------

// A moment on the clocks a step is timed on: the wall clock, and the
// thread's CPU time when `cpu` (else 0, read without a system call).
struct Clocks {
  uint64_t wall = 0;
  uint64_t cpu = 0;
  static Clocks now(bool cpu);
  // The time from `start` to `end`.
  friend Clocks operator-(const Clocks& end, const Clocks& start) {
    return {end.wall - start.wall, end.cpu - start.cpu};
  }
  Clocks& operator+=(const Clocks& d) {
    wall += d.wall;
    cpu += d.cpu;
    return *this;
  }
};

// What one call (a lookup, a compile, a load) adds to a CompileCounters:
// gathered while it runs and added, all in one place, when it ends. Null
// counters count nothing. CompileCounters::cpu_times is read once, so both
// ends of every step agree.
class Tally {
 public:
  explicit Tally(CompileCounters* counters)
      : counters_(counters), cpu_(counters && counters->cpu_times.load(std::memory_order_relaxed)) {}
  ~Tally();
  Tally(const Tally&) = delete;
  Tally& operator=(const Tally&) = delete;

  Clocks now() const { return Clocks::now(cpu_); }
  // Adds the time since `start` to `step`; returns now.
  Clocks charge(Clocks& step, const Clocks& start) const {
    Clocks t = now();
    step += t - start;
    return t;
  }

  uint64_t lookups = 0, hits = 0, misses = 0, codegen_runs = 0, bad_objects = 0, frontend_hits = 0, links_stored = 0,
           set_hits = 0, sets_stored = 0;
  Clocks key, lookup, compile;

 private:
  CompileCounters* counters_;
  bool cpu_;
};

// ---- keys (keys.cc) ---------------------------------------------------------

// Module tags: the IR digest (set_ir_digest) and the front-end key
// (set_frontend_key).
inline constexpr char kIrDigestMd[] = "kcache.ir_digest";
inline constexpr char kFrontMd[] = "kcache.front";

// Reads the digest tag `name`; nullopt when absent or malformed.
std::optional<Digest> read_digest_md(const ::llvm::Module& m, const char* name);
// Reads and removes the digest tag `name`.
std::optional<Digest> take_digest_md(::llvm::Module& m, const char* name);
// The IR digest in an object key's manifest ("ir" or "ir_digest").
Digest ir_of(const KeyInfo& k);

// Every component of an object key but the IR: the same for each key a
// compiler makes, so it keeps one and copies it.
KeyBuilder target_part(const TargetDesc& t, const KeyOptions& options);

// The key of a module the JIT compiles: from its IR digest tag when it has
// one (then with the module's label, so that a miss is compared with the
// previous version of the same module), else from its bitcode.
// `target` is target_part() of the compiler's target and options.
kcache::Expected<KeyInfo> key_of_module(::llvm::Module& m, const std::optional<Digest>& ird, const KeyBuilder& target);

// What a front-end key covers besides the client's input: the target and
// option components, hashed once per FrontendKeys (and per compiler).
Digest front_target_digest(const TargetDesc& target, const KeyOptions& options);

// The key a front-end key's stage link is stored under: the front-end key
// bound to the target and options of the compiler that stored it. Found
// only by FrontendKeys of those same settings, so keys made for other
// settings than the JIT's (a loader at -O0 over a JIT at -O3) leave links
// no correctly configured run ever reads.
Key bound_link_front(const Key& front, const Digest& compiler_target);

// ---- stored objects (objects.cc) ------------------------------------------

// The stored object as a MemoryBuffer, or null when it is not an object
// file for `arch` (a bad entry: the caller recompiles; `why` says what is
// wrong). The buffer is a view of the entry's own bytes when `zero_copy`
// (and they are 8-byte aligned, as a parser wants), else a copy. `check`
// false hands on an object this thread's code generator just made without
// parsing it (the linker parses it anyway, as it would without the cache).
std::unique_ptr<::llvm::MemoryBuffer> object_buffer(Entry&& e, ::llvm::Triple::ArchType arch, bool zero_copy,
                                                    std::string* why, bool check = true);

// An object's bytes as the artifacts of its entry.
std::vector<Artifact> object_artifacts(::llvm::StringRef obj);

::llvm::Error make_error(const std::string& msg);

// ---- combined objects (combine.cc) ----------------------------------------

// `objects` (relocatable ELF objects of one target) joined into one
// relocatable object, in `out`: each input section kept as a section of
// its own, each global name one symbol (its definition, if any). False,
// with `why`, when they cannot be joined without a linker's judgement
// (a name defined twice, COMDAT groups, common symbols, another format).
bool combine_objects(const std::vector<::llvm::MemoryBufferRef>& objects, std::string& out, std::string* why);

}  // namespace kcache::llvm::detail

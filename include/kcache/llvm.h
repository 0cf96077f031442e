// kcache/llvm.h — cached LLVM code generation for MCJIT and ORC.
//
// Three ways in, from the least to the most work done for you:
//
//  * kcache::llvm::ObjectCache is an `llvm::ObjectCache`. Give it to MCJIT
//    (ExecutionEngine::setObjectCache) or to ORC's SimpleCompiler /
//    ConcurrentIRCompiler. getObject() only computes the key, looks it up and
//    hands out the stored bytes; notifyObjectCompiled() stores what the JIT
//    compiled. It cannot make concurrent compiles of one module wait for each
//    other (the interface has no "compile failed" callback to release them).
//
//  * kcache::llvm::CachingCompiler is an ORC IRCompileLayer::IRCompiler that
//    runs the IR optimisation pipeline *and* code generation only on a miss,
//    through Cache::get_or_compile, so N threads compiling one module run
//    codegen once (single-flight), and a hit skips the optimiser too.
//
//  * make_cached_lljit() builds an ORC LLJIT whose compile layer is a
//    CachingCompiler: the one call most JITs need.
//
// The key (object_key) covers the module's bitcode, the LLVM version and the
// build id of the LLVM library actually loaded, the target triple, CPU,
// features, codegen optimisation level, code model, relocation model, the
// TargetOptions that change code (float ABI, FP fusion, fast-math flags,
// sections, TLS), the IR optimisation level run inside the compile, and any
// components the client adds. Components are named, so `kcache explain` can
// say which one changed.
//
// The key's label (KeyInfo::label, not part of the key) is the last path
// component of the module identifier (a module read from /x/lapi.bc is
// "lapi.bc", from any folder), else the name of the module's first defined
// function, so that a miss is compared with the previous version of the
// same module.
//
// Normalised (not part of the key; docs/design.md, "What an LLVM key sets
// aside"): the module identifier, the source file name and `!srcloc`
// metadata. They change no instruction: a hit may carry another module's
// STT_FILE symbol name, which nothing at run time reads, and `!srcloc` (the
// source offset of an inline asm, which any -D moves when the asm is in a
// header) is read only by diagnostics.
// Caveat — not normalised: symbol names. A front end that names functions or
// private globals from a process-wide counter (`kernel_17`, `.str.3`) makes
// equal code hash differently. Exported names must stay (the JIT looks them
// up); name kernels by their content or a stable id, and leave private
// globals unnamed (LLVM numbers them by position).
//
// Keys from what the client has. Serialising a module to bitcode is most of
// what a warm start spends on keys, and a JIT that read the module from a
// file, or generated it from source it still holds, already has cheaper
// bytes to hash:
//
//  * BitcodeLoader: the way in for a JIT that loads bitcode (a file or a
//    buffer). Keyed on the bytes as read; nothing is parsed on a hit.
//
//  * object_key(Digest, ...) keys on a digest the caller supplies (of the
//    bitcode file it read, say). set_ir_digest() puts one on a module so the
//    CachingCompiler keys on it instead of serialising the module.
//  * object_key_of_bitcode(bytes, ...) hashes bitcode bytes as they are.
//    The module identifier is not part of bitcode; the source file name is
//    (see that function).
//  * FrontendKeys: stage keys (kcache/stage.h) for make_cached_lljit users.
//    A key on the front end's input (source text, front-end version) finds
//    the object without running the front end or building IR (find(), then
//    LLJIT::addObjectFile); a module tagged with set_frontend_key() gets its
//    link stored when the CachingCompiler has its object, and a new source
//    that lowers to IR seen before skips code generation.
//
// A cache fault never fails a compile: a corrupt or unreadable entry, or a
// stored object that does not parse as an object file for this target, is a
// miss (counted in CompileCounters::bad_objects and logged once per event)
// and the module is compiled as if the cache were empty.
//
// Thread-safety: ObjectCache and CachingCompiler may be called from many
// compile threads at once. A Module is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kcache/cache.h"
#include "kcache/key.h"
#include "kcache/llvm_compat.h"
#include "kcache/stage.h"
#include "kcache/status.h"

#include <llvm/ADT/SmallVector.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/ObjectCache.h>
#include <llvm/ExecutionEngine/Orc/IRCompileLayer.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/RuntimeDyld.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Target/TargetMachine.h>

// Whether arena_jitlink_memory_manager (below) is built: JITLink's memory
// manager interface as LLVM 19 has it.
#define KCACHE_ARENA_JITLINK (LLVM_VERSION_MAJOR >= 19)

namespace llvm::jitlink {
class JITLinkMemoryManager;
}  // namespace llvm::jitlink

namespace kcache::llvm {

// Everything about the target that decides the object code.
struct TargetDesc {
  std::string triple;
  std::string cpu;
  std::string features;
  unsigned codegen_opt_level = 2;  // the code generator's level, 0 (None) to 3 (Aggressive)
  std::string code_model;          // "small", "kernel", "medium", "large", "tiny"
  std::string reloc_model;         // "static", "pic", "dynamic-no-pic", ...
  std::map<std::string, std::string> target_options;

  static TargetDesc of(const ::llvm::TargetMachine& tm);
};

struct KeyOptions {
  // The IR optimisation level run on the module inside the compile
  // (CachingCompiler); -1 when the module arrives already optimised.
  int ir_opt_level = -1;
  // Components the client adds: its own version, flags that shaped the IR.
  std::map<std::string, std::string> extra;
};

// Namespace of every key made here; bump the suffix when the key's meaning
// changes so old entries stop matching.
inline constexpr const char* kKeyNamespace = "kcache-llvm-obj/1";

// "14.0.6 c660b6b6..." — the LLVM version and the GNU build id of the
// library (or executable) that holds LLVM's code, read once per process.
const std::string& llvm_identity();

// The key of `m`'s object code for `target`. The module identifier and the
// source file name are set aside while the bitcode is hashed and restored
// before returning, hence the non-const module.
// REQUIRES: no other thread uses `m` during the call.
kcache::Expected<KeyInfo> object_key(::llvm::Module& m, const TargetDesc& target, const KeyOptions& options = {});

// The key of a module whose IR the caller has hashed already: `ir` must
// change whenever the module would (e.g. hash_bytes of the bitcode file it
// was read from). Same target and option components as above; the "ir"
// component is a digest, so these keys never equal keys of the module's
// own bitcode.
kcache::Expected<KeyInfo> object_key(const Digest& ir, const TargetDesc& target, const KeyOptions& options = {});

// The key of the module that `bitcode` (a .bc file's bytes) holds, without
// parsing or re-serialising it: object_key(hash_bytes(bitcode), ...). The
// module identifier is not part of bitcode. Caveat: the source file name
// is; two files that differ only in it key apart (a miss, never a wrong
// object), unlike object_key(Module&), which sets it aside.
kcache::Expected<KeyInfo> object_key_of_bitcode(std::string_view bitcode, const TargetDesc& target,
                                                const KeyOptions& options = {});

// The digest of `m`'s IR: of its bitcode, with the module identifier and the
// source file name set aside, as object_key(Module&) takes it. For a front
// end that builds a module and hands it to the JIT to compile later: hashed
// here, while the module is fresh in the CPU's caches, and tagged with
// set_ir_digest(m, ir_digest(m)), it costs a fraction of what serialising it
// inside the compile costs (docs/benchmarks.md), and the key is as exact.
// REQUIRES: no other thread uses `m` during the call.
Digest ir_digest(::llvm::Module& m);

// Tags `m` with the digest of its IR, so the CachingCompiler (and
// ObjectCache) key it with object_key(ir, ...) and do not serialise it. The
// tag is named metadata ("kcache.ir_digest"), which the compiler removes
// before compiling. REQUIRES: `ir` changes whenever the module would.
void set_ir_digest(::llvm::Module& m, const Digest& ir);

// Tags `m` with the front-end key it was made under (FrontendKeys::key):
// once the CachingCompiler has the module's object (compiled or found), it
// stores the stage link front -> object key. Named metadata
// ("kcache.front"), removed before the module is keyed or compiled, so it
// never changes the object key.
void set_frontend_key(::llvm::Module& m, const Key& front);

struct CompileCounters;
struct JitOptions;

// Front-end keys for the modules of one JIT configuration (see the header
// comment). A front-end key covers the caller's digest of the front end's
// input and everything object_key covers besides the IR: LLVM, target, IR
// optimisation level, the client's extra components.
class FrontendKeys {
 public:
  FrontendKeys(const TargetDesc& target, const KeyOptions& options);
  // For the LLJIT that make_cached_lljit(cache, options) builds.
  static kcache::Expected<FrontendKeys> for_jit(const JitOptions& options);
  // For `jit` as it is: every keyed setting (target, IR optimisation level,
  // extra components) taken from its CachingCompiler, so the keys cannot
  // disagree with the objects it makes. invalid_argument when its compile
  // layer has no CachingCompiler (CachingCompiler::of).
  static kcache::Expected<FrontendKeys> for_jit(::llvm::orc::LLJIT& jit);

  // The front-end key of `input` (the caller's digest of the source text
  // and of whatever else decides the IR its front end makes).
  KeyInfo key(const Digest& input) const;
  // The object stored for `front`, through its stage link, ready for
  // LLJIT::addObjectFile (the buffer holds the entry); null on a miss, a bad
  // link or an object that is not for this target. `counters`, when given,
  // count the time and a hit (lookups and hits); a miss is not counted as a
  // lookup here: the module then goes to the compiler, which counts it, so
  // each module is one lookup.
  //
  // A link is stored by the CachingCompiler that compiled (or found) the
  // object, bound to that compiler's own target and options: found only
  // by FrontendKeys of the same ones. A module tagged with the key of
  // FrontendKeys made for other settings than its JIT's (for_jit with
  // options unlike the JIT's) gets its object, but the link it leaves is
  // never found by these keys: a miss, never another configuration's object.
  std::unique_ptr<::llvm::MemoryBuffer> find(Cache& cache, const Key& front, CompileCounters* counters = nullptr) const;
  // The key the stage link of `front` is stored under by a CachingCompiler
  // of this configuration (kcache::find_stage_link(cache, link_front(front))
  // reads it): `front` bound to the target and options.
  Key link_front(const Key& front) const;

  // ---- Sets of modules loaded together: one combined object ----
  // A warm start that adds N stored objects links N objects: N link graphs,
  // N symbol lookups through the session, N allocations and protections.
  // A set of modules the host always loads together can be stored once
  // more, as one relocatable object that holds every module's sections and
  // symbols (docs/design.md, "Combined objects"), and linked as one. The
  // per-module objects stay, so a set with one module changed costs one
  // compile and one new combined object; the set's key holds every
  // module's front-end key, so a combined object is never found for a set
  // in which one module changed, was added or left out.
  //
  // The key of the combined object of the modules whose front-end keys are
  // `fronts`, in any order; nullopt for fewer than two modules or a key
  // given twice.
  std::optional<KeyInfo> set_key(std::vector<Key> fronts) const;
  // The combined object stored for `set` (set_key), ready for
  // LLJIT::addObjectFile in place of the set's objects; null on a miss, a
  // bad entry (counted in bad_objects, logged) or a set recorded as not
  // combinable. `counters`: set_hits and the lookup time; the modules'
  // own lookups are the caller's to count.
  std::unique_ptr<::llvm::MemoryBuffer> find_set(Cache& cache, const Key& set,
                                                 CompileCounters* counters = nullptr) const;
  // Combines the objects stored for `fronts` (each found through its
  // stage link, as find() finds it), stores the result under
  // set_key(fronts) and returns it; null when a module's object is not
  // stored, the set has fewer than two modules, or the objects cannot be
  // joined without a linker's judgement (a name defined in two modules, C++
  // COMDAT groups, common symbols, a format other than 64-bit
  // little-endian ELF): that answer is stored too, so later starts do not
  // try again, and said once per process in the log.
  std::unique_ptr<::llvm::MemoryBuffer> store_set(Cache& cache, const std::vector<Key>& fronts,
                                                  CompileCounters* counters = nullptr) const;

 private:
  friend class BitcodeLoader;
  // find_set, telling a set recorded as not combinable (`*refused`).
  std::unique_ptr<::llvm::MemoryBuffer> find_set(Cache& cache, const Key& set, CompileCounters* counters,
                                                 bool* refused) const;
  // store_set with the objects in hand (objects[i] is the object of the
  // module whose front-end key is fronts[i], as found or compiled for it);
  // joined in the order of their keys, whatever the caller's.
  std::unique_ptr<::llvm::MemoryBuffer> store_set(Cache& cache, const KeyInfo& set, const std::vector<Key>& fronts,
                                                  const std::vector<::llvm::MemoryBufferRef>& objects,
                                                  CompileCounters* counters) const;

  Digest backend_;  // digest of the target and option components
  ::llvm::Triple::ArchType arch_;
};

// What the integration did; every field only grows. Times in nanoseconds.
struct CompileCounters {
  std::atomic<uint64_t> lookups{0};        // modules asked for, each once (hits + misses)
  std::atomic<uint64_t> hits{0};           // answered from the cache
  std::atomic<uint64_t> misses{0};         // compiled here (or waited for a compile)
  std::atomic<uint64_t> codegen_runs{0};   // optimiser + code generator runs
  std::atomic<uint64_t> bad_objects{0};    // stored objects rejected (then recompiled)
  std::atomic<uint64_t> frontend_hits{0};  // of the hits, found by front-end key (FrontendKeys::find)
  std::atomic<uint64_t> links_stored{0};   // stage links stored for tagged modules
  std::atomic<uint64_t> set_hits{0};       // sets of modules answered by one combined object (FrontendKeys::find_set)
  std::atomic<uint64_t> sets_stored{0};    // combined objects stored (FrontendKeys::store_set)
  std::atomic<uint64_t> key_ns{0};         // bitcode + hashing
  std::atomic<uint64_t> lookup_ns{0};      // cache lookup + read (+ store on a miss)
  std::atomic<uint64_t> compile_ns{0};     // optimiser + code generator
  // The same three in CPU time of the compiling thread (CLOCK_THREAD_CPUTIME_ID):
  // unlike wall time, not inflated when other processes take the cores.
  std::atomic<uint64_t> key_cpu_ns{0};
  std::atomic<uint64_t> lookup_cpu_ns{0};
  std::atomic<uint64_t> compile_cpu_ns{0};
  // Whether the three CPU times are counted. Each step they time reads the
  // thread's CPU clock twice, and each read is a system call (about 0.35 µs
  // here, 3 % of kcache-demo's warm start); false leaves them 0 (null in
  // to_json). Set it before the counters are first used.
  std::atomic<bool> cpu_times{true};
  std::string to_json() const;
};

struct ObjectCacheOptions {
  KeyOptions key;
  // Hand out views into the entry's bytes instead of copies when they are
  // 8-byte aligned. Default true.
  bool zero_copy = true;
  // Set when the consumer frees each object buffer right after linking it
  // (ORC's object layers do). MCJIT keeps every buffer for its lifetime, so
  // by default bytes pinned by an LMDB read transaction are copied.
  bool short_lived_buffers = false;
  // Counters to update; null means the ObjectCache's own.
  std::shared_ptr<CompileCounters> counters;
};

class ObjectCache final : public ::llvm::ObjectCache {
 public:
  // `cache` must outlive this object.
  ObjectCache(Cache& cache, TargetDesc target, ObjectCacheOptions options = {});
  ~ObjectCache() override;

  std::unique_ptr<::llvm::MemoryBuffer> getObject(const ::llvm::Module* m) override;
  void notifyObjectCompiled(const ::llvm::Module* m, ::llvm::MemoryBufferRef obj) override;

  const CompileCounters& counters() const noexcept { return *counters_; }

 private:
  struct Pending {
    KeyInfo key;
    uint64_t start_us = 0;
  };
  Cache& cache_;
  TargetDesc target_;
  ::llvm::Triple::ArchType arch_;
  ObjectCacheOptions opt_;
  KeyBuilder key_base_;  // every key component but the IR
  std::shared_ptr<CompileCounters> counters_;
  std::mutex mu_;
  // Keys of modules that missed, until the JIT reports their object. The
  // code generator changes the module in between, so the key cannot be
  // recomputed at notify time.
  std::unordered_map<const ::llvm::Module*, Pending> pending_;  // GUARDED_BY(mu_)
};

struct CompilerOptions {
  // IR pipeline level (0-3) run before codegen on a miss; -1: none.
  int ir_opt_level = 2;
  std::map<std::string, std::string> key_extra;
  bool zero_copy = true;
  std::shared_ptr<CompileCounters> counters;
};

// An IRCompiler for ORC's IRCompileLayer: key, get_or_compile (optimise +
// codegen on a miss), hand the object to the linking layer.
class CachingCompiler final : public ::llvm::orc::IRCompileLayer::IRCompiler {
 public:
  // `cache` must outlive the compiler.
  static ::llvm::Expected<std::unique_ptr<CachingCompiler>> create(Cache& cache,
                                                                   ::llvm::orc::JITTargetMachineBuilder jtmb,
                                                                   CompilerOptions options = {});
  // The same with a machine the caller already made from `jtmb` (for the
  // JIT's data layout, say): the compiler takes its target description
  // from it and compiles with it, instead of making one more.
  static ::llvm::Expected<std::unique_ptr<CachingCompiler>> create(Cache& cache,
                                                                   ::llvm::orc::JITTargetMachineBuilder jtmb,
                                                                   CompilerOptions options,
                                                                   std::unique_ptr<::llvm::TargetMachine> machine);

  ::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> operator()(::llvm::Module& m) override;

  ~CachingCompiler() override;

  const TargetDesc& target() const noexcept { return target_; }
  const CompileCounters& counters() const noexcept { return *counters_; }
  // The key options every object key of this compiler has besides the
  // target: its IR optimisation level and extra components.
  KeyOptions key_options() const { return KeyOptions{opt_.ir_opt_level, opt_.key_extra}; }

  // The CachingCompiler of `jit`'s IR compile layer (make_cached_lljit's, or
  // one the caller set up), or null when that layer compiles otherwise.
  static CachingCompiler* of(::llvm::orc::LLJIT& jit);

 private:
  friend class BitcodeLoader;
  CachingCompiler(Cache& cache, ::llvm::orc::JITTargetMachineBuilder jtmb, TargetDesc target,
                  ::llvm::orc::IRSymbolMapper::ManglingOptions mo, CompilerOptions options);
  // Optimises and compiles `m` (changing it). Thread-safe: each call has a
  // TargetMachine of its own while it runs, taken from machines_.
  kcache::Expected<::llvm::SmallVector<char, 0>> compile(::llvm::Module& m);

  // One module on its way through the compiler (caching_compiler.cc): the
  // same steps for operator() and compile_all.
  struct Job;
  // Takes the module's tags off and keys it (no key when the cache is
  // disabled or the module cannot be keyed: it is compiled uncached).
  void open_job(Job& job);
  // compile() on the job's module, timed.
  kcache::Expected<::llvm::SmallVector<char, 0>> run_job(Job& job);
  // run_job's object as the artifacts of its entry: the compile function
  // the cache runs on a miss.
  kcache::Expected<std::vector<Artifact>> job_artifacts(Job& job);
  // The object the JIT links, from what the cache answered for the job's
  // key (or, with no key, from a compile here); a stored object that is no
  // object for this target is compiled again and replaced.
  ::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> close_job(Job& job, kcache::Expected<Entry> entry);
  // The objects of `modules` (each in a context of its own, used by no
  // other thread meanwhile), in order: every module keyed first, then
  // looked up, and the misses compiled on `threads` workers through
  // Cache::get_or_compile_batch, which compiles first what no other process
  // is compiling and waits for the rest last.
  std::vector<::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>>> compile_all(
      const std::vector<::llvm::Module*>& modules, unsigned threads);

  Cache& cache_;
  ::llvm::orc::JITTargetMachineBuilder jtmb_;
  TargetDesc target_;
  ::llvm::Triple::ArchType arch_;
  CompilerOptions opt_;
  KeyBuilder key_base_;  // every key component but the IR
  Digest front_target_;  // FrontendKeys' digest of this target and options: stage links are bound to it
  std::shared_ptr<CompileCounters> counters_;
  // Target machines no compile is using. A machine keeps the subtarget it
  // built for its first function, which costs about as much again as a
  // small kernel's code generation; there are as many as compiles ever ran
  // at once.
  std::mutex machines_mu_;
  std::vector<std::unique_ptr<::llvm::TargetMachine>> machines_;  // GUARDED_BY(machines_mu_)
};

struct JitOptions {
  // IR optimisation and codegen level, 0-3.
  unsigned opt_level = 2;
  // Empty: the host's CPU / features.
  std::string cpu;
  std::string features;
  // Extra key components (the client's version, options that shaped the IR).
  std::map<std::string, std::string> key_extra;
  // ORC compile threads; 0 compiles on the thread that looks a symbol up.
  unsigned compile_threads = 0;
  // Resolve undefined symbols (libm's tanh, ...) from the host process.
  bool process_symbols = true;
  bool zero_copy = true;
  // Counters the compiler updates (it keeps a reference).
  std::shared_ptr<CompileCounters> counters;
  // Link and compile as a plain LLJIT of this LLVM would for the target:
  // where LLJIT links with JITLink (LLVM 19 on x86-64 ELF, say), so does
  // this JIT, and its machines use the small code model and PIC that LLJIT
  // asks for (with RuntimeDyld's large code model, code generation costs
  // several percent more and makes larger code). false: RuntimeDyld
  // always, with the large code model (into the arena, below).
  bool lljit_linker = true;
  // Link objects into memory from one arena shared by the JIT's objects
  // instead of a mapping per object. Where the JIT links with RuntimeDyld
  // (as LLJIT does on LLVM 14 for x86-64 ELF, or with lljit_linker false):
  // arena_memory_managers instead of LLVM's SectionMemoryManager; where it
  // links with JITLink (LLVM 19 and later): arena_jitlink_memory_manager
  // instead of InProcessMemoryManager. ELF targets only; elsewhere LLJIT's
  // own choice stands.
  bool arena_memory = true;
};

// Memory managers for ORC's RTDyldObjectLinkingLayer (one per object, as the
// layer asks) that share one arena: each object's code, read-only and
// read-write sections are page-aligned regions of three ranges of address
// space reserved once, and its code and read-only data are protected in
// place when it is finalised (code RX, read-only data R: never writable and
// executable at once). Linking a warm start's objects then costs no mapping
// per object, and neighbouring objects' code stays one kernel mapping. A
// removed object's pages go back to the system; its address space is reused
// only when its whole slab is free. Thread-safe: the arena is shared and
// locked.
std::function<std::unique_ptr<::llvm::RuntimeDyld::MemoryManager>()> arena_memory_managers();

#if KCACHE_ARENA_JITLINK
// The same arena as JITLink's memory manager, for an ORC ObjectLinkingLayer
// (make_cached_lljit's where LLJIT links with JITLink, LLVM 19 and later):
// one manager for the layer, whose objects' segments are regions of one
// arena, laid out as above. LLJIT's default (InProcessMemoryManager) maps,
// zero-fills and unmaps a block for every object. A removed object's pages
// go back to the system, those of a whole JITDylib as a few ranges.
// Finalize-lifetime segments stay until their object is removed.
std::unique_ptr<::llvm::jitlink::JITLinkMemoryManager> arena_jitlink_memory_manager();
#endif

// Bitcode as the JIT read it (a .bc file, a buffer): the way in for a JIT
// that loads bitcode into a make_cached_lljit LLJIT. Each module is keyed
// on the bytes it came in, without parsing or re-serialising them: the
// bytes' digest is a front-end key (FrontendKeys), so a warm start hashes
// each file once (XXH3, a few GB/s) and hands the stored object to the JIT
// (addObjectFile) without parsing the bitcode. A miss parses it and adds
// the module, tagged with that front-end key; the compiler keys the module
// on its own IR (object_key(Module&): identifier, source file name and
// !srcloc set aside), compiles it or finds it, and stores the link. So
// bitcode that changed only where no code reads it (a -D nothing uses
// moves every inline asm's !srcloc) costs a parse and a key, never a code
// generation. Modules built in memory keep using addIRModule (keyed on
// their re-serialised bitcode, or on set_ir_digest).
//
//   auto jit = make_cached_lljit(*cache, jo);
//   auto loader = BitcodeLoader::for_jit(**jit);
//   for (auto& path : files) if (auto err = loader->add_file(path)) ...
//   // or all at once, the misses compiled now and shared out with other
//   // processes loading the same files (add_files, below):
//   if (auto err = loader->add_files(files)) ...
//
// The label of each module's entries (what `kcache misses` and
// KCACHE_EXPLAIN compare a miss with) is the buffer identifier's last path
// component: a file's name, whichever folder it was read from; a host that
// adds buffers names them. Thread-safe: add() and add_all() may be called
// from several threads at once (LLJIT's own adds are).
class BitcodeLoader {
 public:
  // For `jit`, which make_cached_lljit built (or any LLJIT whose compile
  // layer is a CachingCompiler); `jit` must outlive the loader. Everything
  // the keys cover (target, CPU, features, levels, extra components), the
  // Cache and the counters are the JIT's own, taken from its
  // CachingCompiler, so a loader cannot key files for settings its JIT does
  // not compile with. A JIT without a CachingCompiler, or over a disabled
  // cache (KCACHE_DISABLE), gets a loader that only parses and adds, as a
  // JIT without kcache would (the former said once in the log).
  static kcache::Expected<BitcodeLoader> for_jit(::llvm::orc::LLJIT& jit);
  // The same; `cache` and `options` are not read for keys (the JIT's are
  // used; settings in `options` unlike the JIT's are said once in the log).
  static kcache::Expected<BitcodeLoader> for_jit(Cache& cache, ::llvm::orc::LLJIT& jit, const JitOptions& options);

  // Adds the module `bitcode` holds to `jd` (null: the JIT's main
  // JITDylib), or its stored object. Errors are the JIT's and the bitcode
  // reader's; a cache fault is a miss.
  ::llvm::Error add(std::unique_ptr<::llvm::MemoryBuffer> bitcode, ::llvm::orc::JITDylib* jd = nullptr);
  // The same for the file at `path`.
  ::llvm::Error add_file(const std::string& path, ::llvm::orc::JITDylib* jd = nullptr);

  // Adds many modules at once, compiling the missing ones before it
  // returns, shared out with the other processes (and threads) that load
  // overlapping lists: every buffer is keyed and looked up first; the
  // misses are parsed, keyed on their IR and compiled, largest first,
  // through Cache::get_or_compile_batch on `threads` workers (0:
  // $KCACHE_JOBS, else the number of CPUs; each module has an LLVMContext of
  // its own), which compiles first the modules no other process is
  // compiling and only then waits for those another process is (taking over
  // from one that died).
  // Still one compile per module across processes and threads; N processes
  // given the same list, in any order, each compile about 1/N of it. Where
  // add() leaves code generation to the JIT's first lookup of a symbol,
  // these compile every missing module now and hand the JIT objects.
  // All or nothing for input errors: a buffer that cannot be read or parsed
  // fails the call before anything is added. A module that does not compile
  // is left out (its error returned, joined with any others); the rest are
  // added. Without keys (a JIT with no CachingCompiler, or a disabled
  // cache) the modules are parsed and added as add() adds them (compiled
  // at their first lookup), again only once every buffer parsed.
  ::llvm::Error add_all(std::vector<std::unique_ptr<::llvm::MemoryBuffer>> bitcode, ::llvm::orc::JITDylib* jd = nullptr,
                        unsigned threads = 0);
  // The same for the files at `paths`.
  ::llvm::Error add_files(const std::vector<std::string>& paths, ::llvm::orc::JITDylib* jd = nullptr,
                          unsigned threads = 0);

  // Whether add_all and add_files link a list of two or more modules as
  // one combined object (FrontendKeys::set_key): found whole on a warm
  // start, made and stored from the modules' objects otherwise (then linked
  // in their place too). Every module of the list is then materialised at
  // the first lookup of any of its symbols, as one object is. On by
  // default; add() and add_file() never combine.
  void set_combine(bool on) { combine_ = on; }

 private:
  BitcodeLoader(Cache* cache, ::llvm::orc::LLJIT& jit, std::optional<FrontendKeys> keys,
                std::shared_ptr<CompileCounters> counters, CachingCompiler* compiler)
      : cache_(cache), jit_(&jit), keys_(std::move(keys)), counters_(std::move(counters)), compiler_(compiler) {}
  // The front-end key of `bitcode`'s bytes (timed as key work).
  Key front_key(const ::llvm::MemoryBuffer& bitcode);
  Cache* cache_;  // the JIT's compiler's; null without keys
  ::llvm::orc::LLJIT* jit_;
  std::optional<FrontendKeys> keys_;           // none when the cache is disabled or the JIT has no CachingCompiler
  std::shared_ptr<CompileCounters> counters_;  // the JIT's compiler's, or null
  CachingCompiler* compiler_;                  // the JIT's; null without keys
  bool combine_ = true;
};

// An ORC LLJIT whose IR compile layer is a CachingCompiler over `cache`.
// REQUIRES: the native target was initialised (InitializeNativeTarget,
// InitializeNativeTargetAsmPrinter, and InitializeNativeTargetAsmParser
// when any module has inline asm: without the asm parser the code
// generator aborts the process on it, as it does under a plain LLJIT);
// `cache` outlives the LLJIT.
::llvm::Expected<std::unique_ptr<::llvm::orc::LLJIT>> make_cached_lljit(Cache& cache, JitOptions options = {});

}  // namespace kcache::llvm

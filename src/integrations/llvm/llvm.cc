// LLVM integration: keys for object code, an llvm::ObjectCache, a caching
// ORC IRCompiler and the one-call LLJIT set-up (see include/kcache/llvm.h).
//
// The hit path is: bitcode of the unoptimised module -> key -> Cache lookup
// -> check the bytes parse as an object file for our architecture -> a
// MemoryBuffer over the entry's bytes (the buffer owns a copy of the Entry,
// which keeps the tier's bytes alive until the linking layer drops it). A
// module tagged with its IR digest skips the bitcode; FrontendKeys::find
// skips the module altogether (front-end key -> stage link -> object).
#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include <llvm-c/Core.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/RTDyldObjectLinkingLayer.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/SmallVectorMemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include "util/util.h"

namespace kcache::llvm {

namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

uint64_t cpu_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The thread's CPU time when `on`, else 0 (no system call). Callers read
// CompileCounters::cpu_times once per step, so both ends agree.
uint64_t cpu_ns(bool on) { return on ? cpu_ns() : 0; }

const char* code_model_name(::llvm::CodeModel::Model m) {
  switch (m) {
    case ::llvm::CodeModel::Tiny:
      return "tiny";
    case ::llvm::CodeModel::Small:
      return "small";
    case ::llvm::CodeModel::Kernel:
      return "kernel";
    case ::llvm::CodeModel::Medium:
      return "medium";
    case ::llvm::CodeModel::Large:
      return "large";
  }
  return "?";
}

const char* reloc_model_name(::llvm::Reloc::Model m) {
  switch (m) {
    case ::llvm::Reloc::Static:
      return "static";
    case ::llvm::Reloc::PIC_:
      return "pic";
    case ::llvm::Reloc::DynamicNoPIC:
      return "dynamic-no-pic";
    case ::llvm::Reloc::ROPI:
      return "ropi";
    case ::llvm::Reloc::RWPI:
      return "rwpi";
    case ::llvm::Reloc::ROPI_RWPI:
      return "ropi-rwpi";
  }
  return "?";
}

// GNU build id of the loaded object whose code holds `addr`, as hex; empty
// when it has none.
std::string build_id_at(const void* addr) {
  struct Ctx {
    uintptr_t addr;
    std::string id;
  } ctx{reinterpret_cast<uintptr_t>(addr), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) -> int {
        auto* c = static_cast<Ctx*>(p);
        bool holds = false;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && c->addr >= lo && c->addr < lo + ph.p_memsz) holds = true;
        }
        if (!holds) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* p0 = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = p0 + ph.p_memsz;
          while (p0 + sizeof(ElfW(Nhdr)) <= end) {
            ElfW(Nhdr) n;
            std::memcpy(&n, p0, sizeof n);
            const char* name = p0 + sizeof n;
            const char* desc = name + ((n.n_namesz + 3) & ~3u);
            const char* next = desc + ((n.n_descsz + 3) & ~3u);
            if (next > end) break;
            if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
              static const char* hex = "0123456789abcdef";
              for (unsigned k = 0; k < n.n_descsz; ++k) {
                auto b = static_cast<uint8_t>(desc[k]);
                c->id.push_back(hex[b >> 4]);
                c->id.push_back(hex[b & 15]);
              }
              return 1;
            }
            p0 = next;
          }
        }
        return 1;
      },
      &ctx);
  return ctx.id;
}

// An object file in a cache entry's bytes. Holding the Entry keeps the
// tier's memory (heap, or an LMDB read transaction) alive while ORC links.
class EntryObjectBuffer final : public ::llvm::MemoryBuffer {
 public:
  EntryObjectBuffer(Entry entry, std::string_view bytes) : entry_(std::move(entry)) {
    init(bytes.data(), bytes.data() + bytes.size(), /*RequiresNullTerminator=*/false);
  }
  BufferKind getBufferKind() const override { return MemoryBuffer_Malloc; }
  // Made on demand: the hit path should not pay for a name nobody reads.
  ::llvm::StringRef getBufferIdentifier() const override {
    if (id_.empty()) id_ = "kcache:" + entry_.key().hex();
    return id_;
  }

 private:
  Entry entry_;
  mutable std::string id_;
};

// The stored object as a MemoryBuffer, or null when it is not an object file
// for `arch` (a bad entry: the caller recompiles).
// The entry's object as a buffer: the entry's own bytes when zero_copy
// (and they are 8-byte aligned, as a parser wants), else a copy.
std::unique_ptr<::llvm::MemoryBuffer> buffer_of(Entry&& e, std::string_view obj, bool zero_copy) {
  bool aligned = (reinterpret_cast<uintptr_t>(obj.data()) & 7) == 0;
  if (zero_copy && aligned) return std::make_unique<EntryObjectBuffer>(std::move(e), obj);
  return ::llvm::MemoryBuffer::getMemBufferCopy(::llvm::StringRef(obj.data(), obj.size()), "kcache:" + e.key().hex());
}

std::unique_ptr<::llvm::MemoryBuffer> object_buffer(Entry&& e, ::llvm::Triple::ArchType arch, bool zero_copy,
                                                    std::string* why, bool check = true) {
  auto obj = e.artifact("obj");
  if (!obj) {
    *why = "entry has no 'obj' artifact";
    return nullptr;
  }
  // An object this thread's code generator just made is handed on as it
  // is (the linker parses it anyway, as it would without the cache).
  if (!check) return buffer_of(std::move(e), *obj, zero_copy);
  auto parsed = ::llvm::object::ObjectFile::createObjectFile(
      ::llvm::MemoryBufferRef(::llvm::StringRef(obj->data(), obj->size()), "kcache"));
  if (!parsed) {
    *why = ::llvm::toString(parsed.takeError());
    return nullptr;
  }
  if ((*parsed)->getArch() != arch) {
    *why = "object is for another architecture";
    return nullptr;
  }
  return buffer_of(std::move(e), *obj, zero_copy);
}

::llvm::Error make_error(const std::string& msg) {
  return ::llvm::make_error<::llvm::StringError>(msg, ::llvm::inconvertibleErrorCode());
}

}  // namespace

// ---- keys ------------------------------------------------------------------

TargetDesc TargetDesc::of(const ::llvm::TargetMachine& tm) {
  TargetDesc d;
  d.triple = tm.getTargetTriple().str();
  d.cpu = tm.getTargetCPU().str();
  d.features = tm.getTargetFeatureString().str();
  d.codegen_opt_level = static_cast<unsigned>(tm.getOptLevel());
  d.code_model = code_model_name(tm.getCodeModel());
  d.reloc_model = reloc_model_name(tm.getRelocationModel());
  const ::llvm::TargetOptions& o = tm.Options;
  auto b = [](bool v) { return std::string(v ? "1" : "0"); };
  d.target_options = {
      {"unsafe_fp_math", b(o.UnsafeFPMath)},
      {"no_infs_fp_math", b(o.NoInfsFPMath)},
      {"no_nans_fp_math", b(o.NoNaNsFPMath)},
      {"no_trapping_fp_math", b(o.NoTrappingFPMath)},
      {"no_signed_zeros_fp_math", b(o.NoSignedZerosFPMath)},
      {"approx_func_fp_math", b(o.ApproxFuncFPMath)},
      {"fp_op_fusion", std::to_string(static_cast<int>(o.AllowFPOpFusion))},
      {"float_abi", std::to_string(static_cast<int>(o.FloatABIType))},
      {"function_sections", b(o.FunctionSections)},
      {"data_sections", b(o.DataSections)},
      {"emulated_tls", b(o.EmulatedTLS)},
      {"exception_model", std::to_string(static_cast<int>(o.ExceptionModel))},
      {"thread_model", std::to_string(static_cast<int>(o.ThreadModel))},
      {"guaranteed_tail_call_opt", b(o.GuaranteedTailCallOpt)},
  };
  return d;
}

// The label of a module's entries: the last path component of its
// identifier (a module read from /a/b/lapi.bc is "lapi.bc" whichever
// folder it was read from), else its first defined function's name
// (explaining a miss compares it with the same module first).
static std::string module_label(const ::llvm::Module& m, const std::string& module_id) {
  if (!module_id.empty()) {
    auto slash = module_id.find_last_of('/');
    if (slash == std::string::npos || slash + 1 == module_id.size()) return module_id;
    return module_id.substr(slash + 1);
  }
  for (const auto& f : m.functions())
    if (!f.isDeclaration()) return f.getName().str();
  return std::string();
}

const std::string& llvm_identity() {
  static const std::string id = [] {
    // Taken through the GOT (the project builds PIC), so this is the
    // address inside whichever object holds LLVM: libLLVM or the executable.
    std::string bid = build_id_at(reinterpret_cast<const void*>(&LLVMContextCreate));
    return std::string(LLVM_VERSION_STRING) + " " + (bid.empty() ? "no-build-id" : bid);
  }();
  return id;
}

namespace {

// The components every object key has besides the IR.
void add_target(KeyBuilder& kb, const TargetDesc& t, const KeyOptions& options) {
  kb.add_string("llvm", llvm_identity())
      .add_string("triple", t.triple)
      .add_string("cpu", t.cpu)
      .add_string("features", t.features)
      .add_u64("codegen_opt_level", t.codegen_opt_level)
      .add_i64("ir_opt_level", options.ir_opt_level)
      .add_string("code_model", t.code_model)
      .add_string("reloc_model", t.reloc_model)
      .add_map("target_options", t.target_options);
  if (!options.extra.empty()) kb.add_map("extra", options.extra);
}

constexpr char kIrDigestMd[] = "kcache.ir_digest";
constexpr char kFrontMd[] = "kcache.front";

void set_digest_md(::llvm::Module& m, const char* name, const Digest& d) {
  if (auto* old = m.getNamedMetadata(name)) m.eraseNamedMetadata(old);
  auto* md = m.getOrInsertNamedMetadata(name);
  md->addOperand(::llvm::MDNode::get(m.getContext(), {::llvm::MDString::get(m.getContext(), d.hex())}));
}

// Reads the digest tag `name`; nullopt when absent or malformed.
std::optional<Digest> read_digest_md(const ::llvm::Module& m, const char* name) {
  auto* md = m.getNamedMetadata(name);
  if (!md) return std::nullopt;
  std::optional<Digest> d;
  if (md->getNumOperands() == 1 && md->getOperand(0)->getNumOperands() == 1)
    if (auto* s = ::llvm::dyn_cast<::llvm::MDString>(md->getOperand(0)->getOperand(0)))
      d = Digest::from_hex(s->getString().str());
  if (!d) KCACHE_LOG(LogLevel::warn, "llvm: module tag %s is malformed (ignored)", name);
  return d;
}

// Reads and removes the digest tag `name`.
std::optional<Digest> take_digest_md(::llvm::Module& m, const char* name) {
  auto d = read_digest_md(m, name);
  if (auto* md = m.getNamedMetadata(name)) m.eraseNamedMetadata(md);
  return d;
}

// The IR digest in an object key's manifest ("ir" or "ir_digest").
Digest ir_of(const KeyInfo& k) {
  for (const auto& it : k.manifest.items)
    if (it.name == "ir" || it.name == "ir_digest") return it.digest;
  return Digest{};
}

}  // namespace

namespace {

// Metadata that cannot change code, taken off the module's instructions
// while its bitcode is written for a key, and put back after
// (docs/design.md, "What an LLVM key sets aside"): `!srcloc`, the source
// location clang attaches to inline asm (and to calls of functions marked
// `error`/`warning`) for the code generator's diagnostics only. Its value
// is a byte offset into clang's buffer, predefines included, so any `-D`
// moves it.
class SetAside {
 public:
  explicit SetAside(::llvm::Module& m) : srcloc_(m.getContext().getMDKindID("srcloc")) {
    for (auto& f : m)
      for (auto& bb : f)
        for (auto& i : bb) {
          if (!i.hasMetadata()) continue;
          if (auto* md = i.getMetadata(srcloc_)) {
            taken_.emplace_back(&i, md);
            i.setMetadata(srcloc_, nullptr);
          }
        }
  }
  ~SetAside() {
    for (auto& [i, md] : taken_) i->setMetadata(srcloc_, md);
  }
  SetAside(const SetAside&) = delete;
  SetAside& operator=(const SetAside&) = delete;

 private:
  unsigned srcloc_;
  std::vector<std::pair<::llvm::Instruction*, ::llvm::MDNode*>> taken_;
};

// Calls `f` with the module's bitcode, its identifier and source file name
// and the metadata SetAside takes set aside (see the header): what the IR
// part of a key covers.
template <typename F>
void with_bitcode(::llvm::Module& m, F&& f) {
  std::string module_id = m.getModuleIdentifier();
  std::string source_file = m.getSourceFileName();
  m.setModuleIdentifier("");
  m.setSourceFileName("");
  std::optional<SetAside> aside(std::in_place, m);
  // One buffer a thread, kept (up to 1 MiB): a module's bitcode is written
  // into memory that is already there, not into fresh pages grown a
  // doubling at a time.
  thread_local ::llvm::SmallVector<char, 0> bc;
  bc.clear();
  {
    // Module and string table only: the symbol table that
    // WriteBitcodeToFile adds is derived from the module and costs time.
    ::llvm::BitcodeWriter w(bc);
    w.writeModule(m);
    w.writeStrtab();
  }
  aside.reset();
  m.setModuleIdentifier(module_id);
  m.setSourceFileName(source_file);
  f(std::string_view(bc.data(), bc.size()), module_id);
  // A rare huge module does not keep its buffer for the thread's life.
  if (bc.capacity() > (1u << 20)) bc = ::llvm::SmallVector<char, 0>();
}

}  // namespace

namespace {

// Every component of an object key but the IR: the same for each key a
// compiler makes, so it keeps one and copies it.
KeyBuilder target_part(const TargetDesc& t, const KeyOptions& options) {
  KeyBuilder kb(kKeyNamespace);
  add_target(kb, t, options);
  return kb;
}

kcache::Expected<KeyInfo> key_of_bitcode(KeyBuilder kb, ::llvm::Module& m) {
  with_bitcode(m, [&](std::string_view bc, const std::string& module_id) {
    kb.add_bytes("ir", bc).add_string("module_triple", m.getTargetTriple());
    kb.label(module_label(m, module_id));
  });
  return std::move(kb).finish();
}

kcache::Expected<KeyInfo> key_of_digest(KeyBuilder kb, const Digest& ir) {
  kb.add_digest("ir_digest", ir);
  return std::move(kb).finish();
}

}  // namespace

kcache::Expected<KeyInfo> object_key(::llvm::Module& m, const TargetDesc& t, const KeyOptions& options) {
  return key_of_bitcode(target_part(t, options), m);
}

Digest ir_digest(::llvm::Module& m) {
  Digest d;
  // The triple is in the bitcode; object_key(Digest, ...) adds no
  // "module_triple" of its own.
  with_bitcode(m, [&](std::string_view bc, const std::string&) { d = hash_bytes(bc); });
  return d;
}

kcache::Expected<KeyInfo> object_key(const Digest& ir, const TargetDesc& t, const KeyOptions& options) {
  return key_of_digest(target_part(t, options), ir);
}

namespace {

// The key of a module the JIT compiles: from its IR digest tag when it has
// one (then with the module's label, so that a miss is compared with the
// previous version of the same module), else from its bitcode.
// `target` is target_part() of the compiler's target and options.
kcache::Expected<KeyInfo> key_of_module(::llvm::Module& m, const std::optional<Digest>& ird, const KeyBuilder& target) {
  if (!ird) return key_of_bitcode(target, m);
  auto key = key_of_digest(target, *ird);
  if (key) key->label = module_label(m, m.getModuleIdentifier());
  return key;
}

}  // namespace

kcache::Expected<KeyInfo> object_key_of_bitcode(std::string_view bitcode, const TargetDesc& t,
                                                const KeyOptions& options) {
  return object_key(hash_bytes(bitcode), t, options);
}

void set_ir_digest(::llvm::Module& m, const Digest& ir) { set_digest_md(m, kIrDigestMd, ir); }

namespace {

// What a front-end key covers besides the client's input: the target and
// option components, hashed once per FrontendKeys (and per compiler).
Digest front_target_digest(const TargetDesc& target, const KeyOptions& options) {
  KeyBuilder kb("kcache-llvm-front-target/1");
  add_target(kb, target, options);
  auto k = kb.finish();
  return k ? k->key : Digest{};
}

// The key a front-end key's stage link is stored under: the front-end key
// bound to the target and options of the compiler that stored it. Found
// only by FrontendKeys of those same settings, so keys made for other
// settings than the JIT's (a loader at -O0 over a JIT at -O3) leave links
// no correctly configured run ever reads.
Key bound_link_front(const Key& front, const Digest& compiler_target) {
  char buf[4 + 16 + 16];
  std::memcpy(buf, "KCLF", 4);
  std::memcpy(buf + 4, front.bytes.data(), 16);
  std::memcpy(buf + 20, compiler_target.bytes.data(), 16);
  return hash_bytes(std::string_view(buf, sizeof buf));
}

// Every CachingCompiler alive in the process (the build has no RTTI to
// tell one from another IRCompiler): CachingCompiler::of looks a JIT's
// compiler up here. Never destroyed.
struct LiveCompilers {
  std::mutex mu;
  std::unordered_set<const void*> live;  // GUARDED_BY(mu)
};
LiveCompilers& live_compilers() {
  static auto* l = new LiveCompilers;
  return *l;
}

}  // namespace

void set_frontend_key(::llvm::Module& m, const Key& front) { set_digest_md(m, kFrontMd, front); }

FrontendKeys::FrontendKeys(const TargetDesc& target, const KeyOptions& options) {
  // The target part is the same for every key: hash it once.
  backend_ = front_target_digest(target, options);
  arch_ = ::llvm::Triple(target.triple).getArch();
}

KeyInfo FrontendKeys::key(const Digest& input) const {
  // Cannot fail: two fixed, distinct names.
  return *KeyBuilder("kcache-llvm-front/1").add_digest("frontend", input).add_digest("target", backend_).finish();
}

Key FrontendKeys::link_front(const Key& front) const { return bound_link_front(front, backend_); }

std::unique_ptr<::llvm::MemoryBuffer> FrontendKeys::find(Cache& cache, const Key& front,
                                                         CompileCounters* counters) const {
  const bool cpu = counters && counters->cpu_times.load(std::memory_order_relaxed);
  uint64_t t0 = now_ns(), u0 = cpu_ns(cpu);
  std::unique_ptr<::llvm::MemoryBuffer> buf;
  if (auto e = get_staged(cache, link_front(front))) {
    std::string why;
    Key k = e->key();
    // ORC frees an object buffer once it is linked, so a pinned view is fine.
    buf = object_buffer(std::move(*e), arch_, /*zero_copy=*/true, &why);
    if (!buf) {
      if (counters) counters->bad_objects.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::warn, "llvm: stored object %s rejected: %s", k.hex().c_str(), why.c_str());
    }
  }
  if (counters) {
    // A miss is counted by the compiler the module goes to next.
    if (buf) {
      counters->lookups.fetch_add(1, std::memory_order_relaxed);
      counters->hits.fetch_add(1, std::memory_order_relaxed);
      counters->frontend_hits.fetch_add(1, std::memory_order_relaxed);
    }
    counters->lookup_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    counters->lookup_cpu_ns.fetch_add(cpu_ns(cpu) - u0, std::memory_order_relaxed);
  }
  return buf;
}

std::string CompileCounters::to_json() const {
  auto cpu = [&](const std::atomic<uint64_t>& ns) {
    if (!cpu_times.load(std::memory_order_relaxed)) return std::string("null");
    char b[32];
    std::snprintf(b, sizeof b, "%.6f", ns.load() / 1e9);
    return std::string(b);
  };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"lookups\":%llu,\"hits\":%llu,\"misses\":%llu,\"codegen_runs\":%llu,\"bad_objects\":%llu,"
                "\"frontend_hits\":%llu,\"links_stored\":%llu,"
                "\"key_s\":%.6f,\"lookup_s\":%.6f,\"compile_s\":%.6f,\"key_cpu_s\":%s,\"lookup_cpu_s\":%s,"
                "\"compile_cpu_s\":%s}",
                (unsigned long long)lookups.load(), (unsigned long long)hits.load(), (unsigned long long)misses.load(),
                (unsigned long long)codegen_runs.load(), (unsigned long long)bad_objects.load(),
                (unsigned long long)frontend_hits.load(), (unsigned long long)links_stored.load(), key_ns.load() / 1e9,
                lookup_ns.load() / 1e9, compile_ns.load() / 1e9, cpu(key_cpu_ns).c_str(), cpu(lookup_cpu_ns).c_str(),
                cpu(compile_cpu_ns).c_str());
  return buf;
}

// ---- ObjectCache -------------------------------------------------------------

ObjectCache::ObjectCache(Cache& cache, TargetDesc target, ObjectCacheOptions options)
    : cache_(cache), target_(std::move(target)), opt_(std::move(options)), key_base_(target_part(target_, opt_.key)) {
  arch_ = ::llvm::Triple(target_.triple).getArch();
  counters_ = opt_.counters ? opt_.counters : std::make_shared<CompileCounters>();
}

ObjectCache::~ObjectCache() = default;

std::unique_ptr<::llvm::MemoryBuffer> ObjectCache::getObject(const ::llvm::Module* cm) {
  if (!cm) return nullptr;
  CompileCounters& C = *counters_;
  const bool cpu = C.cpu_times.load(std::memory_order_relaxed);
  C.lookups.fetch_add(1, std::memory_order_relaxed);
  uint64_t t0 = now_ns(), u0 = cpu_ns(cpu);
  // The JIT owns the module and is compiling it on this thread; the key
  // function renames and restores two fields (see object_key). A module
  // tagged with its IR digest is keyed on that (the tag stays: this
  // interface may not change the module).
  auto ird = cm->getNamedMetadata(kIrDigestMd) ? read_digest_md(*cm, kIrDigestMd) : std::nullopt;
  auto key = key_of_module(const_cast<::llvm::Module&>(*cm), ird, key_base_);
  uint64_t t1 = now_ns(), u1 = cpu_ns(cpu);
  C.key_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
  C.key_cpu_ns.fetch_add(u1 - u0, std::memory_order_relaxed);
  if (!key) {
    KCACHE_LOG(LogLevel::warn, "llvm: no key for module: %s (compiling uncached)", key.error().to_string().c_str());
    C.misses.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  std::unique_ptr<::llvm::MemoryBuffer> buf;
  if (auto e = cache_.get(*key)) {  // a miss is journaled with the key's manifest
    std::string why;
    bool zero_copy = opt_.zero_copy && (!e->pinned() || opt_.short_lived_buffers);
    buf = object_buffer(std::move(*e), arch_, zero_copy, &why);
    if (!buf) {
      C.bad_objects.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::warn, "llvm: stored object %s rejected: %s (recompiling)", key->key.hex().c_str(),
                 why.c_str());
    }
  }
  C.lookup_ns.fetch_add(now_ns() - t1, std::memory_order_relaxed);
  C.lookup_cpu_ns.fetch_add(cpu_ns(cpu) - u1, std::memory_order_relaxed);
  if (buf) {
    C.hits.fetch_add(1, std::memory_order_relaxed);
    return buf;
  }
  C.misses.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(mu_);
  pending_[cm] = Pending{std::move(key).value(), util::now_mono_us()};
  return nullptr;
}

void ObjectCache::notifyObjectCompiled(const ::llvm::Module* cm, ::llvm::MemoryBufferRef obj) {
  if (!cm) return;
  CompileCounters& C = *counters_;
  const bool cpu = C.cpu_times.load(std::memory_order_relaxed);
  C.codegen_runs.fetch_add(1, std::memory_order_relaxed);
  Pending p;
  bool found = false;
  {
    std::lock_guard lk(mu_);
    auto it = pending_.find(cm);
    if (it != pending_.end()) {
      p = std::move(it->second);
      pending_.erase(it);
      found = true;
    }
  }
  if (!found) {
    // The JIT compiled without asking first. Code generation has changed
    // the module since, so its key now is not the key of its input: storing
    // under it could never hit and only wastes space.
    KCACHE_LOG(LogLevel::info, "llvm: object for a module never looked up; not stored");
    return;
  }
  uint64_t t0 = now_ns(), u0 = cpu_ns(cpu);
  uint64_t cost = util::now_mono_us() - p.start_us;
  std::vector<Artifact> arts;
  arts.push_back({"obj", std::string(obj.getBufferStart(), obj.getBufferSize())});
  cache_.put(p.key, std::move(arts), cost);
  C.lookup_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  C.lookup_cpu_ns.fetch_add(cpu_ns(cpu) - u0, std::memory_order_relaxed);
}

// ---- CachingCompiler -----------------------------------------------------------

CachingCompiler::CachingCompiler(Cache& cache, ::llvm::orc::JITTargetMachineBuilder jtmb, TargetDesc target,
                                 ::llvm::orc::IRSymbolMapper::ManglingOptions mo, CompilerOptions options)
    : IRCompiler(std::move(mo)),
      cache_(cache),
      jtmb_(std::move(jtmb)),
      target_(std::move(target)),
      opt_(std::move(options)),
      key_base_(target_part(target_, KeyOptions{opt_.ir_opt_level, opt_.key_extra})),
      front_target_(front_target_digest(target_, KeyOptions{opt_.ir_opt_level, opt_.key_extra})) {
  arch_ = ::llvm::Triple(target_.triple).getArch();
  counters_ = opt_.counters ? opt_.counters : std::make_shared<CompileCounters>();
  auto& l = live_compilers();
  std::lock_guard lk(l.mu);
  l.live.insert(static_cast<const ::llvm::orc::IRCompileLayer::IRCompiler*>(this));
}

CachingCompiler::~CachingCompiler() {
  auto& l = live_compilers();
  std::lock_guard lk(l.mu);
  l.live.erase(static_cast<const ::llvm::orc::IRCompileLayer::IRCompiler*>(this));
}

CachingCompiler* CachingCompiler::of(::llvm::orc::LLJIT& jit) {
  ::llvm::orc::IRCompileLayer::IRCompiler* c = &jit.getIRCompileLayer().getCompiler();
  auto& l = live_compilers();
  std::lock_guard lk(l.mu);
  if (!l.live.count(c)) return nullptr;
  return static_cast<CachingCompiler*>(c);
}

::llvm::Expected<std::unique_ptr<CachingCompiler>> CachingCompiler::create(Cache& cache,
                                                                           ::llvm::orc::JITTargetMachineBuilder jtmb,
                                                                           CompilerOptions options) {
  // One TargetMachine up front gives the exact target description (the
  // builder does not expose its codegen level); the first compile uses it.
  auto tm = jtmb.createTargetMachine();
  if (!tm) return tm.takeError();
  return create(cache, std::move(jtmb), std::move(options), std::move(*tm));
}

::llvm::Expected<std::unique_ptr<CachingCompiler>> CachingCompiler::create(
    Cache& cache, ::llvm::orc::JITTargetMachineBuilder jtmb, CompilerOptions options,
    std::unique_ptr<::llvm::TargetMachine> machine) {
  if (!machine) return make_error("CachingCompiler::create: no TargetMachine");
  TargetDesc desc = TargetDesc::of(*machine);
  auto mo = ::llvm::orc::irManglingOptionsFromTargetOptions(machine->Options);
  std::unique_ptr<CachingCompiler> c(
      new CachingCompiler(cache, std::move(jtmb), std::move(desc), std::move(mo), std::move(options)));
  c->machines_.push_back(std::move(machine));  // the first compile's
  return c;
}

kcache::Expected<::llvm::SmallVector<char, 0>> CachingCompiler::compile(::llvm::Module& m) {
  // A machine of this thread's own until the compile ends, then back to the
  // pool: compiles on one TargetMachine must not overlap, and one after
  // another they produce the bytes a fresh machine would, with one
  // exception. LLVM 14's ELF object-file lowering remembers the globals a
  // module lists in @llvm.used in its machine and never forgets them
  // (TargetLoweringObjectFileELF::Used); a later module's global at a
  // reused address would then get a retained section of its own. A machine
  // that generated code for such a module is dropped, not kept (checked on
  // the module code generation reads: after the IR pipeline).
  std::unique_ptr<::llvm::TargetMachine> tm;
  {
    std::lock_guard lk(machines_mu_);
    if (!machines_.empty()) {
      tm = std::move(machines_.back());
      machines_.pop_back();
    }
  }
  if (!tm) {
    auto made = jtmb_.createTargetMachine();
    if (!made) return Status(Errc::compile_failed, ::llvm::toString(made.takeError()));
    tm = std::move(*made);
  }
  struct GiveBack {
    CachingCompiler& c;
    std::unique_ptr<::llvm::TargetMachine>& tm;
    bool keep = true;
    ~GiveBack() {
      if (!keep) return;
      try {
        std::lock_guard lk(c.machines_mu_);
        c.machines_.push_back(std::move(tm));
      } catch (...) {
        // Not kept: the next compile makes a machine again.
      }
    }
  } give_back{*this, tm};
  if (m.getDataLayout().isDefault()) m.setDataLayout(tm->createDataLayout());
  if (opt_.ir_opt_level >= 0) {
    ::llvm::PassBuilder pb(tm.get());
    ::llvm::LoopAnalysisManager lam;
    ::llvm::FunctionAnalysisManager fam;
    ::llvm::CGSCCAnalysisManager cgam;
    ::llvm::ModuleAnalysisManager mam;
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    ::llvm::OptimizationLevel level = ::llvm::OptimizationLevel::O0;
    switch (opt_.ir_opt_level) {
      case 0:
        level = ::llvm::OptimizationLevel::O0;
        break;
      case 1:
        level = ::llvm::OptimizationLevel::O1;
        break;
      case 2:
        level = ::llvm::OptimizationLevel::O2;
        break;
      default:
        level = ::llvm::OptimizationLevel::O3;
        break;
    }
    ::llvm::ModulePassManager mpm = level == ::llvm::OptimizationLevel::O0 ? pb.buildO0DefaultPipeline(level)
                                                                           : pb.buildPerModuleDefaultPipeline(level);
    mpm.run(m, mam);
  }
  ::llvm::SmallVector<char, 0> out;
  {
    ::llvm::raw_svector_ostream os(out);
    ::llvm::legacy::PassManager pm;
    ::llvm::MCContext* ctx = nullptr;
    if (tm->addPassesToEmitMC(pm, ctx, os)) return Status(Errc::compile_failed, "target cannot emit machine code");
    if (m.getNamedGlobal("llvm.used") || m.getNamedGlobal("llvm.compiler.used")) give_back.keep = false;
    pm.run(m);
  }
  counters_->codegen_runs.fetch_add(1, std::memory_order_relaxed);
  return out;
}

::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> CachingCompiler::operator()(::llvm::Module& m) {
  CompileCounters& C = *counters_;
  const bool cpu = C.cpu_times.load(std::memory_order_relaxed);
  C.lookups.fetch_add(1, std::memory_order_relaxed);
  auto compile_here = [&]() -> ::llvm::Expected<std::unique_ptr<::llvm::MemoryBuffer>> {
    uint64_t c0 = now_ns(), v0 = cpu_ns(cpu);
    auto obj = compile(m);
    C.compile_ns.fetch_add(now_ns() - c0, std::memory_order_relaxed);
    C.compile_cpu_ns.fetch_add(cpu_ns(cpu) - v0, std::memory_order_relaxed);
    if (!obj) return make_error(obj.error().to_string());
    // The code generator's own buffer, as LLJIT's compiler hands it on: no
    // copy.
    return std::make_unique<::llvm::SmallVectorMemoryBuffer>(std::move(*obj), m.getModuleIdentifier() + "-jitted",
                                                             /*RequiresNullTerminator=*/false);
  };
  uint64_t t0 = now_ns(), u0 = cpu_ns(cpu);
  // Tags come off before anything else sees the module: they never reach
  // the object key or the code generator.
  std::optional<Digest> front = take_digest_md(m, kFrontMd);
  std::optional<Digest> ird = take_digest_md(m, kIrDigestMd);
  if (cache_.options().disabled) {
    // Nothing would be looked up or stored: a key would be pure cost.
    C.misses.fetch_add(1, std::memory_order_relaxed);
    return compile_here();
  }
  auto key = key_of_module(m, ird, key_base_);
  uint64_t t1 = now_ns(), u1 = cpu_ns(cpu);
  C.key_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
  C.key_cpu_ns.fetch_add(u1 - u0, std::memory_order_relaxed);
  auto link = [&] {
    if (!front) return;
    if (put_stage_link(cache_, bound_link_front(*front, front_target_), ir_of(*key), key->key))
      C.links_stored.fetch_add(1, std::memory_order_relaxed);
  };

  if (!key) {
    KCACHE_LOG(LogLevel::warn, "llvm: no key for module: %s (compiling uncached)", key.error().to_string().c_str());
    C.misses.fetch_add(1, std::memory_order_relaxed);
    return compile_here();
  }

  uint64_t compile_ns = 0, compile_cpu = 0;
  bool compiled_here = false;
  Source src = Source::compiled;
  auto entry = cache_.get_or_compile(
      *key,
      [&]() -> kcache::Expected<std::vector<Artifact>> {
        uint64_t c0 = now_ns(), v0 = cpu_ns(cpu);
        compiled_here = true;
        auto obj = compile(m);
        compile_ns = now_ns() - c0;
        compile_cpu = cpu_ns(cpu) - v0;
        if (!obj) return obj.error();
        std::vector<Artifact> arts;
        arts.push_back({"obj", std::string(obj->data(), obj->size())});
        return arts;
      },
      &src);
  // The only error get_or_compile returns is the compile's own.
  if (!entry) {
    C.compile_ns.fetch_add(compile_ns, std::memory_order_relaxed);
    C.compile_cpu_ns.fetch_add(compile_cpu, std::memory_order_relaxed);
    return make_error(entry.error().to_string());
  }
  std::string why;
  auto buf = object_buffer(std::move(*entry), arch_, opt_.zero_copy, &why, /*check=*/!compiled_here);
  uint64_t t2 = now_ns(), u2 = cpu_ns(cpu);
  C.compile_ns.fetch_add(compile_ns, std::memory_order_relaxed);
  C.compile_cpu_ns.fetch_add(compile_cpu, std::memory_order_relaxed);
  C.lookup_ns.fetch_add(t2 - t1 - compile_ns, std::memory_order_relaxed);
  C.lookup_cpu_ns.fetch_add(u2 - u1 - compile_cpu, std::memory_order_relaxed);
  if (buf) {
    (src == Source::compiled || src == Source::waited ? C.misses : C.hits).fetch_add(1, std::memory_order_relaxed);
    link();
    return buf;
  }
  if (compiled_here) return make_error("code generator produced no usable object: " + why);
  // A stored object we cannot use: never the caller's problem. The module
  // is still unoptimised (another thread compiled, or it came from a tier),
  // so compile it and replace the bad entry.
  C.bad_objects.fetch_add(1, std::memory_order_relaxed);
  C.misses.fetch_add(1, std::memory_order_relaxed);
  KCACHE_LOG(LogLevel::warn, "llvm: stored object %s rejected: %s (recompiling)", key->key.hex().c_str(), why.c_str());
  uint64_t c0 = now_ns(), v0 = cpu_ns(cpu);
  auto obj = compile(m);
  uint64_t dt = now_ns() - c0;
  C.compile_ns.fetch_add(dt, std::memory_order_relaxed);
  C.compile_cpu_ns.fetch_add(cpu_ns(cpu) - v0, std::memory_order_relaxed);
  if (!obj) return make_error(obj.error().to_string());
  std::vector<Artifact> arts;
  arts.push_back({"obj", std::string(obj->data(), obj->size())});
  cache_.put(*key, std::move(arts), dt / 1000);
  link();
  return std::make_unique<::llvm::SmallVectorMemoryBuffer>(std::move(*obj), "kcache:" + key->key.hex(),
                                                           /*RequiresNullTerminator=*/false);
}

// ---- LLJIT -----------------------------------------------------------------------

namespace {

// The target machine builder make_cached_lljit uses for `options`.
::llvm::Expected<::llvm::orc::JITTargetMachineBuilder> jit_tmb(const JitOptions& options) {
  auto jtmb = ::llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) return jtmb.takeError();
  if (!options.cpu.empty()) jtmb->setCPU(options.cpu);
  if (!options.features.empty()) jtmb->getFeatures() = ::llvm::SubtargetFeatures(options.features);
  jtmb->setCodeGenOptLevel(compat::codegen_opt_level(options.opt_level));
  return jtmb;
}

// jit_tmb(options) as LLJIT configures it for its own linker when
// options.lljit_linker: where LLJIT links with JITLink (LLVM 19 on x86-64
// ELF, say) it asks for the small code model and PIC, which compile faster
// and make smaller code than RuntimeDyld's large code model. `b`, when
// given, is the builder to configure (make_cached_lljit's own).
::llvm::Expected<::llvm::orc::JITTargetMachineBuilder> configured_tmb(const JitOptions& options,
                                                                      ::llvm::orc::LLJITBuilder* b = nullptr) {
  auto jtmb = jit_tmb(options);
  if (!jtmb || !options.lljit_linker) return jtmb;
  ::llvm::orc::LLJITBuilder own;
  if (!b) b = &own;
  b->setJITTargetMachineBuilder(std::move(*jtmb));
  if (auto err = b->prepareForConstruction()) return err;
  return *b->JTMB;
}

// The target description of the machines jit_tmb(options) makes. It
// depends only on the host and the options jit_tmb reads, so the process
// remembers it: FrontendKeys::for_jit after make_cached_lljit, or a second
// JIT like the first, makes no TargetMachine just to learn it (about 0.1 ms).
class JitTargets {
 public:
  static JitTargets& get() {
    static auto* t = new JitTargets();  // never destroyed: used until exit
    return *t;
  }
  std::optional<TargetDesc> find(const JitOptions& o) {
    std::lock_guard lk(mu_);
    auto it = known_.find(key(o));
    if (it == known_.end()) return std::nullopt;
    return it->second;
  }
  void remember(const JitOptions& o, const TargetDesc& d) {
    std::lock_guard lk(mu_);
    known_.emplace(key(o), d);
  }

 private:
  static std::tuple<std::string, std::string, unsigned, bool> key(const JitOptions& o) {
    return {o.cpu, o.features, std::min(o.opt_level, 3u), o.lljit_linker};
  }
  std::mutex mu_;
  std::map<std::tuple<std::string, std::string, unsigned, bool>, TargetDesc> known_;  // GUARDED_BY(mu_)
};

}  // namespace

kcache::Expected<FrontendKeys> FrontendKeys::for_jit(const JitOptions& options) {
  KeyOptions ko;
  ko.ir_opt_level = static_cast<int>(std::min(options.opt_level, 3u));
  ko.extra = options.key_extra;
  if (auto known = JitTargets::get().find(options)) return FrontendKeys(*known, ko);
  auto jtmb = configured_tmb(options);
  if (!jtmb) return Status(Errc::invalid_argument, ::llvm::toString(jtmb.takeError()));
  auto tm = jtmb->createTargetMachine();
  if (!tm) return Status(Errc::invalid_argument, ::llvm::toString(tm.takeError()));
  TargetDesc desc = TargetDesc::of(**tm);
  JitTargets::get().remember(options, desc);
  return FrontendKeys(desc, ko);
}

kcache::Expected<FrontendKeys> FrontendKeys::for_jit(::llvm::orc::LLJIT& jit) {
  CachingCompiler* cc = CachingCompiler::of(jit);
  if (!cc)
    return Status(Errc::invalid_argument, "FrontendKeys::for_jit: the JIT's compile layer is no CachingCompiler");
  return FrontendKeys(cc->target(), cc->key_options());
}

kcache::Expected<BitcodeLoader> BitcodeLoader::for_jit(::llvm::orc::LLJIT& jit) {
  CachingCompiler* cc = CachingCompiler::of(jit);
  if (!cc) {
    KCACHE_LOG(LogLevel::warn,
               "llvm: BitcodeLoader over a JIT whose compile layer is no CachingCompiler: files are parsed and "
               "added uncached");
    return BitcodeLoader(nullptr, jit, std::nullopt, nullptr);
  }
  if (cc->cache_.options().disabled) return BitcodeLoader(nullptr, jit, std::nullopt, cc->counters_);
  return BitcodeLoader(&cc->cache_, jit, FrontendKeys(cc->target(), cc->key_options()), cc->counters_);
}

kcache::Expected<BitcodeLoader> BitcodeLoader::for_jit(Cache& cache, ::llvm::orc::LLJIT& jit,
                                                       const JitOptions& options) {
  if (CachingCompiler* cc = CachingCompiler::of(jit)) {
    // Said, never obeyed: keys for settings the JIT does not compile with
    // would only ever miss.
    KeyOptions ko = cc->key_options();
    if (&cache != &cc->cache_ || static_cast<int>(std::min(options.opt_level, 3u)) != ko.ir_opt_level ||
        options.key_extra != ko.extra || (!options.cpu.empty() && options.cpu != cc->target().cpu) ||
        (options.counters && options.counters != cc->counters_)) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        KCACHE_LOG(LogLevel::info,
                   "llvm: BitcodeLoader::for_jit given a cache or options unlike its JIT's: the JIT's are used");
    }
  }
  return for_jit(jit);
}

::llvm::Error BitcodeLoader::add(std::unique_ptr<::llvm::MemoryBuffer> bitcode, ::llvm::orc::JITDylib* jd) {
  if (!bitcode) return make_error("BitcodeLoader::add: no buffer");
  ::llvm::orc::JITDylib& dylib = jd ? *jd : jit_->getMainJITDylib();
  std::optional<Key> front;
  if (keys_ && cache_) {
    CompileCounters* C = counters_.get();
    const bool cpu = C && C->cpu_times.load(std::memory_order_relaxed);
    uint64_t t0 = now_ns(), u0 = cpu_ns(cpu);
    ::llvm::StringRef bytes = bitcode->getBuffer();
    front = keys_->key(hash_bytes(std::string_view(bytes.data(), bytes.size()))).key;
    if (C) {
      C->key_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
      C->key_cpu_ns.fetch_add(cpu_ns(cpu) - u0, std::memory_order_relaxed);
    }
    if (auto obj = keys_->find(*cache_, *front, C)) return jit_->addObjectFile(dylib, std::move(obj));
  }
  auto ctx = std::make_unique<::llvm::LLVMContext>();
  auto m = ::llvm::parseBitcodeFile(bitcode->getMemBufferRef(), *ctx);
  if (!m) return m.takeError();
  // The module identifier is the buffer's (parseBitcodeFile sets it): the
  // label comes from it, the key never does.
  if (front) set_frontend_key(**m, *front);
  return jit_->addIRModule(dylib, ::llvm::orc::ThreadSafeModule(std::move(*m), std::move(ctx)));
}

::llvm::Error BitcodeLoader::add_file(const std::string& path, ::llvm::orc::JITDylib* jd) {
  auto buf = ::llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buf) return ::llvm::errorCodeToError(buf.getError());
  return add(std::move(*buf), jd);
}

::llvm::Expected<std::unique_ptr<::llvm::orc::LLJIT>> make_cached_lljit(Cache& cache, JitOptions options) {
  auto jtmb = jit_tmb(options);
  if (!jtmb) return jtmb.takeError();

  CompilerOptions co;
  co.ir_opt_level = static_cast<int>(std::min(options.opt_level, 3u));
  co.key_extra = options.key_extra;
  co.zero_copy = options.zero_copy;
  co.counters = options.counters;

  const bool jtmb_triple_is_elf = jtmb->getTargetTriple().isOSBinFormatELF();
  ::llvm::orc::LLJITBuilder b;
  if (options.compile_threads) b.setNumCompileThreads(options.compile_threads);
  // LLJIT's own choice of linker and of the machine configuration that goes
  // with it, unless RuntimeDyld is asked for: the code a plain LLJIT makes.
  bool rtdyld = true;
  if (options.lljit_linker) {
    auto configured = configured_tmb(options, &b);
    if (!configured) return configured.takeError();
    jtmb = std::move(*configured);
    rtdyld = !b.CreateObjectLinkingLayer;
  } else {
    b.setJITTargetMachineBuilder(*jtmb);
  }
  // One machine gives the JIT its data layout (LLJIT would make a machine
  // of its own for that) and the compiler its target description and first
  // compile: a warm start that compiles nothing makes just this one.
  auto tm = jtmb->createTargetMachine();
  if (!tm) return tm.takeError();
  b.setDataLayout((*tm)->createDataLayout());
  Cache* c = &cache;
  auto first = std::make_shared<std::unique_ptr<::llvm::TargetMachine>>(std::move(*tm));
  b.setCompileFunctionCreator([c, co, first, options](::llvm::orc::JITTargetMachineBuilder j)
                                  -> ::llvm::Expected<std::unique_ptr<::llvm::orc::IRCompileLayer::IRCompiler>> {
    auto cc = *first ? CachingCompiler::create(*c, std::move(j), co, std::move(*first))
                     : CachingCompiler::create(*c, std::move(j), co);
    if (!cc) return cc.takeError();
    // The description the compiler took from its machine, for for_jit.
    JitTargets::get().remember(options, (*cc)->target());
    return std::unique_ptr<::llvm::orc::IRCompileLayer::IRCompiler>(std::move(*cc));
  });
  if (rtdyld && options.arena_memory && jtmb_triple_is_elf) {
    b.setObjectLinkingLayerCreator(
        [](::llvm::orc::ExecutionSession& es,
           const ::llvm::Triple&) -> ::llvm::Expected<std::unique_ptr<::llvm::orc::ObjectLayer>> {
          return std::make_unique<::llvm::orc::RTDyldObjectLinkingLayer>(es, arena_memory_managers());
        });
  }
  auto jit = b.create();
  if (!jit) return jit.takeError();
  if (options.process_symbols) {
    auto gen =
        ::llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess((*jit)->getDataLayout().getGlobalPrefix());
    if (!gen) return gen.takeError();
    (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
  }
  return jit;
}

}  // namespace kcache::llvm

// LLVM integration, keys: what an object key covers (the module's IR with
// the parts that cannot change code set aside, LLVM's identity, the target
// and the options), the module tags that stand for the IR (set_ir_digest)
// or for the front end's input (set_frontend_key), and front-end keys and
// the stage links they are found through (FrontendKeys).

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <llvm-c/Core.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/Module.h>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"
#include "util/object_id.h"
#include "util/util.h"

namespace kcache::llvm {

namespace detail {

namespace {

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

// The label of a module's entries: the last path component of its
// identifier (a module read from /a/b/lapi.bc is "lapi.bc" whichever
// folder it was read from), else its first defined function's name
// (explaining a miss compares it with the same module first).
std::string module_label(const ::llvm::Module& m, const std::string& module_id) {
  if (!module_id.empty()) {
    auto slash = module_id.find_last_of('/');
    if (slash == std::string::npos || slash + 1 == module_id.size()) return module_id;
    return module_id.substr(slash + 1);
  }
  for (const auto& f : m.functions())
    if (!f.isDeclaration()) return f.getName().str();
  return std::string();
}

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

void set_digest_md(::llvm::Module& m, const char* name, const Digest& d) {
  if (auto* old = m.getNamedMetadata(name)) m.eraseNamedMetadata(old);
  auto* md = m.getOrInsertNamedMetadata(name);
  md->addOperand(::llvm::MDNode::get(m.getContext(), {::llvm::MDString::get(m.getContext(), d.hex())}));
}

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

std::optional<Digest> take_digest_md(::llvm::Module& m, const char* name) {
  auto d = read_digest_md(m, name);
  if (auto* md = m.getNamedMetadata(name)) m.eraseNamedMetadata(md);
  return d;
}

Digest ir_of(const KeyInfo& k) {
  for (const auto& it : k.manifest.items)
    if (it.name == "ir" || it.name == "ir_digest") return it.digest;
  return Digest{};
}

KeyBuilder target_part(const TargetDesc& t, const KeyOptions& options) {
  KeyBuilder kb(kKeyNamespace);
  add_target(kb, t, options);
  return kb;
}

kcache::Expected<KeyInfo> key_of_module(::llvm::Module& m, const std::optional<Digest>& ird, const KeyBuilder& target) {
  if (!ird) return key_of_bitcode(target, m);
  auto key = key_of_digest(target, *ird);
  if (key) key->label = module_label(m, m.getModuleIdentifier());
  return key;
}

Digest front_target_digest(const TargetDesc& target, const KeyOptions& options) {
  KeyBuilder kb("kcache-llvm-front-target/1");
  add_target(kb, target, options);
  auto k = kb.finish();
  return k ? k->key : Digest{};
}

Key bound_link_front(const Key& front, const Digest& compiler_target) {
  char buf[4 + 16 + 16];
  std::memcpy(buf, "KCLF", 4);
  std::memcpy(buf + 4, front.bytes.data(), 16);
  std::memcpy(buf + 20, compiler_target.bytes.data(), 16);
  return hash_bytes(std::string_view(buf, sizeof buf));
}

}  // namespace detail

using namespace detail;

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

const std::string& llvm_identity() {
  static const std::string id = [] {
    // Taken through the GOT (the project builds PIC), so this is the
    // address inside whichever object holds LLVM: libLLVM or the executable.
    std::string bid = util::build_id_at(reinterpret_cast<const void*>(&LLVMContextCreate));
    return std::string(LLVM_VERSION_STRING) + " " + (bid.empty() ? "no-build-id" : bid);
  }();
  return id;
}

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

kcache::Expected<KeyInfo> object_key_of_bitcode(std::string_view bitcode, const TargetDesc& t,
                                                const KeyOptions& options) {
  return object_key(hash_bytes(bitcode), t, options);
}

void set_ir_digest(::llvm::Module& m, const Digest& ir) { set_digest_md(m, kIrDigestMd, ir); }

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

}  // namespace kcache::llvm

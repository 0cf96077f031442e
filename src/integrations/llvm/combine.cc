// LLVM integration, combined objects: the relocatable objects of a set of
// modules joined into one relocatable object (what `ld -r` makes, for the
// objects a JIT's code generator writes), so that a warm start links one
// object instead of one per module.
//
// Every input section is kept as a section of its own (a linker that meets
// two sections of one name treats them as it would in two objects), but
// for .eh_frame, whose parts are joined into one (RuntimeDyld registers
// the first section of that name only), every
// local symbol is kept, and each global name gets one symbol: its
// definition, which the other objects' references now point at. What has
// no single answer without a linker's judgement makes combine_objects say
// no, and the caller links the objects one by one as before: a name
// defined twice (weak or not), COMDAT groups, common symbols, extended
// section indices, section kinds this file does not know, or same-named
// sections with different permissions.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <llvm/BinaryFormat/ELF.h>
#include <llvm/Object/ELF.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/SwapByteOrder.h>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"
#include "kcache/stage.h"
#include "util/util.h"

namespace kcache::llvm::detail {

namespace {

namespace elf = ::llvm::ELF;
using File = ::llvm::object::ELFFile<::llvm::object::ELF64LE>;
using Shdr = File::Elf_Shdr;
using Sym = File::Elf_Sym;

constexpr uint32_t kNone = ~0u;
// Bounds on what is joined (a JIT's object never comes near them).
constexpr uint64_t kMaxAlign = uint64_t{1} << 16;
constexpr uint64_t kMaxSize = uint64_t{1} << 32;

// A string table being written: each name once.
class Strings {
 public:
  Strings() { bytes_.push_back('\0'); }
  uint32_t add(std::string_view s) {
    if (s.empty()) return 0;
    auto it = at_.find(std::string(s));
    if (it != at_.end()) return it->second;
    auto off = static_cast<uint32_t>(bytes_.size());
    bytes_.append(s.data(), s.size());
    bytes_.push_back('\0');
    at_.emplace(std::string(s), off);
    return off;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
  std::unordered_map<std::string, uint32_t> at_;
};

struct OutSection {
  std::string name;
  uint32_t type = 0;
  uint64_t flags = 0;
  uint32_t link = 0;  // output index (sections with SHF_LINK_ORDER, relocations)
  uint32_t info = 0;  // output index of a relocation section's target
  uint64_t align = 1;
  uint64_t entsize = 0;
  uint64_t size = 0;
  uint64_t addr = 0;
  std::string_view data;  // input bytes (empty for NOBITS)
  std::string own;        // rewritten bytes (relocations), when not empty used instead of data
  size_t from = 0;        // input object
};

struct OutSymbol {
  std::string_view name;
  std::string renamed;  // when not empty, the name written (a local another object's name would shadow)
  size_t from = 0;      // input object
  uint8_t info = 0;
  uint8_t other = 0;
  uint16_t shndx = 0;
  uint64_t value = 0;
  uint64_t size = 0;
};

// Sections a combined object leaves out: they only guide a static
// linker's choices (address-significance for identical code folding, call
// graph profiles for ordering), and they name symbols by index.
bool droppable(uint32_t type) { return type == elf::SHT_LLVM_ADDRSIG || type == elf::SHT_LLVM_CALL_GRAPH_PROFILE; }

bool copied_as_is(uint32_t type, uint16_t machine) {
  if (type == elf::SHT_X86_64_UNWIND) return machine == elf::EM_X86_64;  // .eh_frame there
  switch (type) {
    case elf::SHT_PROGBITS:
    case elf::SHT_NOBITS:
    case elf::SHT_NOTE:
    case elf::SHT_INIT_ARRAY:
    case elf::SHT_FINI_ARRAY:
    case elf::SHT_PREINIT_ARRAY:
      return true;
    default:
      return false;
  }
}

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void pad_to(std::string& out, uint64_t align) {
  if (align > 1) out.resize((out.size() + align - 1) / align * align, '\0');
}

class Combiner {
 public:
  std::string why;

  bool run(const std::vector<::llvm::MemoryBufferRef>& objects, std::string& out) {
    if (!::llvm::sys::IsLittleEndianHost) return no("a big-endian host");
    files_.reserve(objects.size());
    for (const auto& o : objects) {
      auto f = File::create(o.getBuffer());
      if (!f) return no(::llvm::toString(f.takeError()));
      files_.push_back(std::move(*f));
    }
    for (size_t j = 0; j < files_.size(); ++j)
      if (!header_ok(j) || !read_sections(j)) return false;
    for (size_t j = 0; j < files_.size(); ++j)
      if (!read_symbols(j)) return false;
    if (!resolve_names()) return false;
    for (size_t j = 0; j < files_.size(); ++j)
      if (!read_relocations(j)) return false;
    if (!same_named_sections_agree()) return false;
    if (sections_.size() + relocations_.size() + 4 >= elf::SHN_LORESERVE) return no("too many sections");
    write(out);
    return true;
  }

 private:
  bool no(std::string reason) {
    why = std::move(reason);
    return false;
  }

  // `o` named, typed and flagged as input section `s` of object j.
  bool open_section(const File& f, const Shdr& s, size_t j, OutSection& o) {
    auto name = f.getSectionName(s);
    if (!name) return no(::llvm::toString(name.takeError()));
    o.name = name->str();
    o.type = s.sh_type;
    o.flags = s.sh_flags;
    o.from = j;
    return true;
  }

  bool header_ok(size_t j) {
    const auto& h = files_[j].getHeader();
    if (std::memcmp(h.e_ident, elf::ElfMagic, 4) != 0) return no("not an ELF object");
    if (h.e_ident[elf::EI_CLASS] != elf::ELFCLASS64 || h.e_ident[elf::EI_DATA] != elf::ELFDATA2LSB)
      return no("not a 64-bit little-endian ELF object");
    if (h.e_type != elf::ET_REL) return no("not a relocatable object");
    const auto& first = files_[0].getHeader();
    if (h.e_machine != first.e_machine || h.e_flags != first.e_flags ||
        h.e_ident[elf::EI_OSABI] != first.e_ident[elf::EI_OSABI])
      return no("objects for different machines");
    return true;
  }

  bool read_sections(size_t j) {
    const File& f = files_[j];
    auto secs = f.sections();
    if (!secs) return no(::llvm::toString(secs.takeError()));
    if (secs->size() >= elf::SHN_LORESERVE) return no("extended section numbering");
    section_map_.emplace_back(secs->size(), kNone);
    section_bias_.emplace_back(secs->size(), 0);
    symtab_.push_back(nullptr);
    for (uint32_t i = 1; i < secs->size(); ++i) {
      const Shdr& s = (*secs)[i];
      switch (s.sh_type) {
        case elf::SHT_SYMTAB:
          if (symtab_[j]) return no("two symbol tables");
          symtab_[j] = &s;
          continue;
        case elf::SHT_STRTAB:  // written anew
        case elf::SHT_RELA:    // read_relocations
        case elf::SHT_REL:
          continue;
        case elf::SHT_GROUP:
          return no("a COMDAT group");
        case elf::SHT_SYMTAB_SHNDX:
          return no("extended section indices");
        default:
          break;
      }
      if (droppable(s.sh_type)) continue;
      if (!copied_as_is(s.sh_type, f.getHeader().e_machine))
        return no("a section of type " + std::to_string(s.sh_type));
      OutSection o;
      if (!open_section(f, s, j, o)) return false;
      o.align = std::max<uint64_t>(s.sh_addralign, 1);
      if ((o.align & (o.align - 1)) || o.align > kMaxAlign)
        return no("a section aligned to " + std::to_string(o.align));
      if (s.sh_size > kMaxSize) return no("a section of " + std::to_string(s.sh_size) + " bytes");
      o.entsize = s.sh_entsize;
      o.size = s.sh_size;
      if (s.sh_type != elf::SHT_NOBITS) {
        auto bytes = f.getSectionContents(s);
        if (!bytes) return no(::llvm::toString(bytes.takeError()));
        o.data = std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      }
      if (s.sh_flags & elf::SHF_LINK_ORDER) o.link = s.sh_link;  // an input index until mapped below
      if (o.name == ".eh_frame" && eh_frame_ != kNone) {
        // One .eh_frame for all: RuntimeDyld registers the first section
        // of that name only. Its records (CIEs, FDEs that point at their
        // CIE relative to themselves) are 4-byte aligned and need no
        // padding between objects: zeros there would end the section.
        OutSection& e = sections_[eh_frame_ - 1];
        if (e.type != o.type || e.flags != o.flags) return no("two kinds of .eh_frame");
        if (e.own.empty()) e.own.assign(e.data.data(), e.data.size());
        if (e.own.size() % 4 || o.data.size() % 4) return no("an .eh_frame of odd size");
        section_bias_[j][i] = e.own.size();
        e.own.append(o.data.data(), o.data.size());
        e.size = e.own.size();
        section_map_[j][i] = eh_frame_;
        continue;
      }
      section_map_[j][i] = static_cast<uint32_t>(sections_.size() + 1);
      if (o.name == ".eh_frame") eh_frame_ = section_map_[j][i];
      sections_.push_back(std::move(o));
    }
    // Sections ordered after another one point at its output index.
    for (auto& o : sections_) {
      if (o.from != j || !(o.flags & elf::SHF_LINK_ORDER)) continue;
      if (o.link >= section_map_[j].size() || section_map_[j][o.link] == kNone)
        return no("a section linked to one that is left out");
      o.link = section_map_[j][o.link];
    }
    if (!symtab_[j]) return no("no symbol table");
    return true;
  }

  // The output index of input section `shndx` of object j, or kNone.
  uint32_t section_of(size_t j, uint32_t shndx) const {
    return shndx < section_map_[j].size() ? section_map_[j][shndx] : kNone;
  }

  bool read_symbols(size_t j) {
    const File& f = files_[j];
    auto syms = f.symbols(symtab_[j]);
    if (!syms) return no(::llvm::toString(syms.takeError()));
    auto strtab = f.getStringTableForSymtab(*symtab_[j]);
    if (!strtab) return no(::llvm::toString(strtab.takeError()));
    if (syms->empty()) return no("an empty symbol table");
    symbol_map_.emplace_back(syms->size(), kNone);
    globals_of_.emplace_back(syms->size(), kNone);
    symbol_map_[j][0] = 0;
    for (uint32_t k = 1; k < syms->size(); ++k) {
      const Sym& s = (*syms)[k];
      auto name = s.getName(*strtab);
      if (!name) return no(::llvm::toString(name.takeError()));
      OutSymbol o;
      o.name = std::string_view(name->data(), name->size());
      o.from = j;
      o.info = s.st_info;
      o.other = s.st_other;
      o.value = s.st_value + (s.st_shndx < section_bias_[j].size() ? section_bias_[j][s.st_shndx] : 0);
      o.size = s.st_size;
      uint16_t shndx = s.st_shndx;
      if (shndx == elf::SHN_COMMON) return no("a common symbol");
      if (shndx == elf::SHN_XINDEX) return no("extended section indices");
      if (shndx != elf::SHN_UNDEF && shndx != elf::SHN_ABS) {
        uint32_t m = section_of(j, shndx);
        if (m == kNone) {
          // A symbol in a section left out (its address-significance
          // table, say): kept out too; a relocation naming it says no.
          if (s.getBinding() == elf::STB_LOCAL) continue;
          return no("a global symbol in a section left out");
        }
        shndx = static_cast<uint16_t>(m);
      }
      o.shndx = shndx;
      if (s.getBinding() == elf::STB_LOCAL) {
        if (s.st_shndx == elf::SHN_UNDEF) return no("an undefined local symbol");
        symbol_map_[j][k] = static_cast<uint32_t>(locals_.size() + 1);
        locals_.push_back(o);
        continue;
      }
      if (s.getBinding() != elf::STB_GLOBAL && s.getBinding() != elf::STB_WEAK)
        return no("a symbol of binding " + std::to_string(s.getBinding()));
      auto [it, fresh] = global_index_.emplace(o.name, static_cast<uint32_t>(globals_.size()));
      if (fresh) globals_.push_back({});
      Global& g = globals_[it->second];
      globals_of_[j][k] = it->second;
      if (o.shndx != elf::SHN_UNDEF) {
        if (g.defined) return no("'" + std::string(o.name) + "' defined in two objects");
        g.defined = true;
        g.sym = o;
      } else if (!g.defined) {
        // An undefined reference: strong when any reference is.
        uint8_t bind = (g.seen && (g.sym.info >> 4) == elf::STB_GLOBAL) ? uint8_t{elf::STB_GLOBAL} : s.getBinding();
        uint8_t type = (g.seen && (g.sym.info & 0xf) != elf::STT_NOTYPE) ? (g.sym.info & 0xf) : s.getType();
        g.sym = o;
        g.sym.info = static_cast<uint8_t>((bind << 4) | type);
      }
      g.seen = true;
    }
    return true;
  }

  struct Global {
    OutSymbol sym;
    bool defined = false;
    bool seen = false;
  };

  // Every object's global symbols now point at the one symbol of their
  // name, which follows the locals. A local whose name is another object's
  // local or any global's gets a name of its own: RuntimeDyld resolves by
  // name, and in one object a module's `static helper` would answer
  // another module's call of an outside `helper`, or shadow a global.
  // Relocations name symbols by index, so nothing else changes.
  bool resolve_names() {
    for (const auto& g : globals_) {
      // A section's bounds (__start_S, __stop_S) would span every
      // module's part of S, where each module saw its own.
      if (g.defined) continue;
      if (g.sym.name.rfind("__start_", 0) == 0 || g.sym.name.rfind("__stop_", 0) == 0)
        return no("a section bound symbol " + std::string(g.sym.name));
    }
    std::unordered_map<std::string_view, size_t> local_owner;  // name -> object, or kShared
    constexpr size_t kShared = ~size_t{0};
    for (const auto& l : locals_) {
      if (!renameable(l)) continue;
      auto [it, fresh] = local_owner.emplace(l.name, l.from);
      if (!fresh && it->second != l.from) it->second = kShared;
    }
    for (auto& l : locals_) {
      if (!l.name.empty() && l.name[0] == '$' && global_index_.count(l.name))
        return no("a mapping symbol named as a global: " + std::string(l.name));
      if (!renameable(l)) continue;
      if (local_owner[l.name] != kShared && !global_index_.count(l.name)) continue;
      l.renamed = std::string(l.name) + ".kcache." + std::to_string(l.from);
      if (global_index_.count(l.renamed) || local_owner.count(l.renamed)) return no("no unique name for " + l.renamed);
    }
    const auto first_global = static_cast<uint32_t>(locals_.size() + 1);
    for (size_t j = 0; j < files_.size(); ++j)
      for (size_t k = 1; k < globals_of_[j].size(); ++k)
        if (globals_of_[j][k] != kNone) symbol_map_[j][k] = first_global + globals_of_[j][k];
    return true;
  }

  // Named locals that a linker can look up: not sections or files, nor
  // AArch64's and ARM's mapping symbols ($x, $d: markers no relocation
  // names, which keep their names to mean what they mean).
  static bool renameable(const OutSymbol& l) {
    uint8_t type = l.info & 0xf;
    return !l.name.empty() && l.name[0] != '$' && type != elf::STT_SECTION && type != elf::STT_FILE;
  }

  bool read_relocations(size_t j) {
    const File& f = files_[j];
    auto secs = f.sections();
    if (!secs) return no(::llvm::toString(secs.takeError()));
    for (uint32_t i = 1; i < secs->size(); ++i) {
      const Shdr& s = (*secs)[i];
      if (s.sh_type != elf::SHT_RELA && s.sh_type != elf::SHT_REL) continue;
      if (s.sh_info >= secs->size()) return no("a relocation section for no section");
      const Shdr& target = (*secs)[s.sh_info];
      uint32_t t = section_of(j, s.sh_info);
      if (t == kNone) {
        if (droppable(target.sh_type)) continue;
        return no("relocations for a section left out");
      }
      if (s.sh_link >= secs->size() || &(*secs)[s.sh_link] != symtab_[j]) return no("relocations of another table");
      OutSection o;
      if (!open_section(f, s, j, o)) return false;
      o.info = t;
      o.align = 8;
      o.entsize = s.sh_type == elf::SHT_RELA ? sizeof(elf::Elf64_Rela) : sizeof(elf::Elf64_Rel);
      auto bytes = f.getSectionContents(s);
      if (!bytes) return no(::llvm::toString(bytes.takeError()));
      if (o.entsize == 0 || bytes->size() % o.entsize) return no("a relocation section of odd size");
      o.own.assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      const uint64_t bias = section_bias_[j][s.sh_info];
      for (size_t off = 0; off < o.own.size(); off += o.entsize) {
        // r_offset, then r_info ((symbol << 32) | type) in both kinds; the
        // offset moves with a section appended to another (.eh_frame).
        uint64_t r_offset;
        std::memcpy(&r_offset, o.own.data() + off, 8);
        r_offset += bias;
        std::memcpy(o.own.data() + off, &r_offset, 8);
        uint64_t r_info;
        std::memcpy(&r_info, o.own.data() + off + 8, 8);
        uint64_t sym = r_info >> 32;
        uint32_t mapped = sym < symbol_map_[j].size() ? symbol_map_[j][sym] : kNone;
        if (mapped == kNone) return no("a relocation against a symbol left out");
        r_info = (static_cast<uint64_t>(mapped) << 32) | (r_info & 0xffffffffu);
        std::memcpy(o.own.data() + off + 8, &r_info, 8);
      }
      o.size = o.own.size();
      relocations_.push_back(std::move(o));
    }
    return true;
  }

  // A linker merges sections by name and wants one set of permissions each.
  bool same_named_sections_agree() {
    constexpr uint64_t kPerm = elf::SHF_ALLOC | elf::SHF_WRITE | elf::SHF_EXECINSTR | elf::SHF_TLS;
    std::unordered_map<std::string, uint64_t> perm;
    for (const auto& o : sections_) {
      auto [it, fresh] = perm.emplace(o.name, o.flags & kPerm);
      if (!fresh && it->second != (o.flags & kPerm)) return no("sections named " + o.name + " differ in permissions");
    }
    return true;
  }

  void write(std::string& out) {
    // Output sections: [0] null, the copied ones, the relocations, then the
    // symbol table, its strings and the section names.
    const auto n_copied = static_cast<uint32_t>(sections_.size());
    const uint32_t first_rel = 1 + n_copied;
    const auto symtab_index = static_cast<uint32_t>(first_rel + relocations_.size());
    const uint32_t strtab_index = symtab_index + 1, shstrtab_index = symtab_index + 2;
    const uint32_t count = shstrtab_index + 1;

    Strings names, shnames;
    std::string symtab;
    put(symtab, elf::Elf64_Sym{});
    auto add_symbol = [&](const OutSymbol& s) {
      elf::Elf64_Sym e{};
      e.st_name = names.add(s.renamed.empty() ? s.name : std::string_view(s.renamed));
      e.st_info = s.info;
      e.st_other = s.other;
      e.st_shndx = s.shndx;
      e.st_value = s.value;
      e.st_size = s.size;
      put(symtab, e);
    };
    for (const auto& s : locals_) add_symbol(s);
    for (const auto& g : globals_) add_symbol(g.sym);

    std::vector<elf::Elf64_Shdr> headers(count);
    std::memset(headers.data(), 0, headers.size() * sizeof(elf::Elf64_Shdr));
    out.assign(sizeof(elf::Elf64_Ehdr), '\0');
    auto emit = [&](elf::Elf64_Shdr& h, const OutSection& o) {
      h.sh_name = shnames.add(o.name);
      h.sh_type = o.type;
      h.sh_flags = o.flags;
      h.sh_link = o.link;
      h.sh_info = o.info;
      h.sh_addralign = o.align;
      h.sh_entsize = o.entsize;
      h.sh_size = o.size;
      h.sh_addr = o.addr;
      pad_to(out, o.align);
      h.sh_offset = out.size();
      if (o.type == elf::SHT_NOBITS) return;
      if (!o.own.empty())
        out += o.own;
      else
        out.append(o.data.data(), o.data.size());
    };
    // A relocatable object's sections all start at 0, and a linker that
    // joins same-named sections into one (JITLink) places each by its
    // address: every copied section gets a range of its own.
    uint64_t cursor = 0;
    for (auto& o : sections_) {
      o.addr = (cursor + o.align - 1) / o.align * o.align;
      cursor = o.addr + std::max<uint64_t>(o.size, 1);  // an empty one too
    }
    for (uint32_t i = 0; i < n_copied; ++i) emit(headers[1 + i], sections_[i]);
    for (size_t i = 0; i < relocations_.size(); ++i) {
      relocations_[i].link = symtab_index;
      emit(headers[first_rel + i], relocations_[i]);
    }
    OutSection st;
    st.name = ".symtab";
    st.type = elf::SHT_SYMTAB;
    st.link = strtab_index;
    st.info = static_cast<uint32_t>(locals_.size() + 1);
    st.align = 8;
    st.entsize = sizeof(elf::Elf64_Sym);
    st.own = std::move(symtab);
    st.size = st.own.size();
    emit(headers[symtab_index], st);
    OutSection str;
    str.name = ".strtab";
    str.type = elf::SHT_STRTAB;
    str.own = names.bytes();
    str.size = str.own.size();
    emit(headers[strtab_index], str);
    OutSection shstr;
    shstr.name = ".shstrtab";
    shstr.type = elf::SHT_STRTAB;
    uint32_t shstr_name = shnames.add(shstr.name);
    shstr.own = shnames.bytes();  // complete: every name was added above
    shstr.size = shstr.own.size();
    emit(headers[shstrtab_index], shstr);
    headers[shstrtab_index].sh_name = shstr_name;

    pad_to(out, 8);
    const uint64_t shoff = out.size();
    for (const auto& h : headers) put(out, h);

    elf::Elf64_Ehdr eh{};
    const auto& first = files_[0].getHeader();
    std::memcpy(eh.e_ident, first.e_ident, elf::EI_NIDENT);
    eh.e_type = elf::ET_REL;
    eh.e_machine = first.e_machine;
    eh.e_version = first.e_version;
    eh.e_flags = first.e_flags;
    eh.e_ehsize = sizeof(elf::Elf64_Ehdr);
    eh.e_shentsize = sizeof(elf::Elf64_Shdr);
    eh.e_shnum = static_cast<uint16_t>(count);
    eh.e_shstrndx = static_cast<uint16_t>(shstrtab_index);
    eh.e_shoff = shoff;
    std::memcpy(out.data(), &eh, sizeof eh);
  }

  std::vector<File> files_;
  std::vector<const Shdr*> symtab_;
  std::vector<std::vector<uint32_t>> section_map_;   // [object][input section] -> output index
  std::vector<std::vector<uint64_t>> section_bias_;  // [object][input section] -> its offset in the output section
  uint32_t eh_frame_ = kNone;                        // the output .eh_frame
  std::vector<std::vector<uint32_t>> symbol_map_;    // [object][input symbol] -> output index
  std::vector<std::vector<uint32_t>> globals_of_;    // [object][input symbol] -> globals_ index
  std::vector<OutSection> sections_;                 // copied sections, output 1..n
  std::vector<OutSection> relocations_;
  std::vector<OutSymbol> locals_;
  std::vector<Global> globals_;
  std::unordered_map<std::string_view, uint32_t> global_index_;
};

}  // namespace

bool combine_objects(const std::vector<::llvm::MemoryBufferRef>& objects, std::string& out, std::string* why) {
  Combiner c;
  bool ok = objects.size() >= 1 && c.run(objects, out);
  if (!ok) {
    if (why) *why = objects.empty() ? "no objects" : c.why;
    out.clear();
    return false;
  }
  // What comes out must read as an object, as every stored object must.
  auto parsed = ::llvm::object::ObjectFile::createObjectFile(::llvm::MemoryBufferRef(out, "kcache-combined"));
  if (!parsed) {
    if (why) *why = "the combined object does not read back: " + ::llvm::toString(parsed.takeError());
    out.clear();
    return false;
  }
  return true;
}

}  // namespace kcache::llvm::detail

namespace kcache::llvm {

using namespace detail;

namespace {

// What a set's entry holds when its objects cannot be combined: the reason,
// in place of the object.
constexpr char kRefusedArtifact[] = "not-combined";

void say_not_combined(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    KCACHE_LOG(LogLevel::info, "llvm: a set of modules is linked one object at a time: %s", why.c_str());
}

}  // namespace

std::optional<KeyInfo> FrontendKeys::set_key(std::vector<Key> fronts) const {
  if (fronts.size() < 2) return std::nullopt;
  auto less = [](const Key& a, const Key& b) { return a.bytes < b.bytes; };
  std::sort(fronts.begin(), fronts.end(), less);
  if (std::adjacent_find(fronts.begin(), fronts.end(), [](const Key& a, const Key& b) { return a.bytes == b.bytes; }) !=
      fronts.end())
    return std::nullopt;
  std::string bytes;
  bytes.reserve(fronts.size() * sizeof(Key::bytes));
  for (const auto& f : fronts) bytes.append(reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size());
  // The front-end keys cover the JIT's target and options already; the
  // target is here as well so that the digest names the configuration.
  // Bump the namespace whenever what combine_objects makes changes.
  auto k = KeyBuilder("kcache-llvm-set/1")
               .add_digest("modules", hash_bytes(bytes))
               .add_u64("count", fronts.size())
               .add_digest("target", backend_)
               .finish();
  if (!k) return std::nullopt;
  k->label = "module set";
  return std::move(*k);
}

std::unique_ptr<::llvm::MemoryBuffer> FrontendKeys::find_set(Cache& cache, const Key& set,
                                                             CompileCounters* counters) const {
  bool refused = false;
  return find_set(cache, set, counters, &refused);
}

std::unique_ptr<::llvm::MemoryBuffer> FrontendKeys::find_set(Cache& cache, const Key& set, CompileCounters* counters,
                                                             bool* refused) const {
  Tally tally(counters);
  Clocks t0 = tally.now();
  std::unique_ptr<::llvm::MemoryBuffer> buf;
  *refused = false;
  if (auto e = cache.get(set)) {
    if (e->artifact(kRefusedArtifact)) {
      *refused = true;
    } else {
      std::string why;
      buf = object_buffer(std::move(*e), arch_, /*zero_copy=*/true, &why);
      if (!buf) {
        tally.bad_objects = 1;
        KCACHE_LOG(LogLevel::warn, "llvm: stored combined object %s rejected: %s", set.hex().c_str(), why.c_str());
      }
    }
  }
  if (buf) tally.set_hits = 1;
  tally.charge(tally.lookup, t0);
  return buf;
}

std::unique_ptr<::llvm::MemoryBuffer> FrontendKeys::store_set(Cache& cache, const std::vector<Key>& fronts,
                                                              CompileCounters* counters) const {
  auto set = set_key(fronts);
  if (!set) return nullptr;
  bool refused = false;
  if (auto found = find_set(cache, set->key, nullptr, &refused)) return found;
  if (refused) return nullptr;
  // Each module's object as find() finds it: the entries stay alive while
  // their bytes are read.
  std::vector<Entry> entries;
  std::vector<::llvm::MemoryBufferRef> objects;
  entries.reserve(fronts.size());
  for (const auto& f : fronts) {
    auto e = get_staged(cache, link_front(f));
    if (!e) return nullptr;
    entries.push_back(std::move(*e));
    auto obj = entries.back().artifact("obj");
    if (!obj) return nullptr;
    objects.emplace_back(::llvm::StringRef(obj->data(), obj->size()), "kcache");
  }
  return store_set(cache, *set, fronts, objects, counters);
}

std::unique_ptr<::llvm::MemoryBuffer> FrontendKeys::store_set(Cache& cache, const KeyInfo& set,
                                                              const std::vector<Key>& fronts,
                                                              const std::vector<::llvm::MemoryBufferRef>& objects,
                                                              CompileCounters* counters) const {
  Tally tally(counters);
  Clocks t0 = tally.now();
  const uint64_t start_us = util::now_mono_us();
  // In the order of the modules' keys: one set, one object, whichever
  // order its first host listed the modules in.
  std::vector<size_t> order(objects.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return fronts[x].bytes < fronts[y].bytes; });
  std::vector<::llvm::MemoryBufferRef> sorted;
  sorted.reserve(objects.size());
  for (size_t i : order) sorted.push_back(objects[i]);
  std::string combined, why;
  std::unique_ptr<::llvm::MemoryBuffer> buf;
  if (fronts.size() == objects.size() && combine_objects(sorted, combined, &why)) {
    uint64_t cost = util::now_mono_us() - start_us;
    // Handed out as stored (checked once, above, by reading it back).
    if (auto e = cache.put(set, object_artifacts(combined), cost)) {
      buf = object_buffer(std::move(*e), arch_, /*zero_copy=*/true, &why, /*check=*/false);
      if (buf) tally.sets_stored = 1;
    }
    // A cache that stores nothing (read-only, say) still links it once.
    if (!buf) buf = ::llvm::MemoryBuffer::getMemBufferCopy(combined, "kcache:combined");
  } else {
    say_not_combined(why);
    std::vector<Artifact> arts;
    arts.push_back({kRefusedArtifact, why});
    cache.put(set, std::move(arts), util::now_mono_us() - start_us);
  }
  tally.charge(tally.lookup, t0);
  return buf;
}

}  // namespace kcache::llvm

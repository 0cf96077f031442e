// Found through dl_iterate_phdr: the object whose PT_LOAD segments cover
// the address, then its PT_NOTE segments for NT_GNU_BUILD_ID.
#include "util/object_id.h"

#include <elf.h>
#include <link.h>

#include <cstdint>
#include <cstring>

namespace kcache::util {
namespace {

bool covers(const dl_phdr_info* info, uintptr_t addr) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && addr >= lo && addr < lo + ph.p_memsz) return true;
  }
  return false;
}

std::string build_id_of(const dl_phdr_info* info) {
  static const char* hex = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) n;
      std::memcpy(&n, p, sizeof n);
      const char* name = p + sizeof n;
      const char* desc = name + ((n.n_namesz + 3) & ~3u);
      const char* next = desc + ((n.n_descsz + 3) & ~3u);
      if (next > end) break;
      if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (unsigned k = 0; k < n.n_descsz; ++k) {
          auto b = static_cast<uint8_t>(desc[k]);
          id.push_back(hex[b >> 4]);
          id.push_back(hex[b & 15]);
        }
        return id;
      }
      p = next;
    }
  }
  return id;
}

struct Found {
  uintptr_t addr = 0;
  std::string build_id, path;
};

Found find(const void* addr) {
  Found f;
  f.addr = reinterpret_cast<uintptr_t>(addr);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) -> int {
        auto* f = static_cast<Found*>(p);
        if (!covers(info, f->addr)) return 0;
        f->build_id = build_id_of(info);
        f->path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
        return 1;
      },
      &f);
  return f;
}

}  // namespace

std::string build_id_at(const void* addr) { return find(addr).build_id; }

std::string object_path_at(const void* addr) { return find(addr).path; }

}  // namespace kcache::util

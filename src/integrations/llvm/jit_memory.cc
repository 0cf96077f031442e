// Memory for the objects an ORC LLJIT links in: one arena of address space
// shared by every object of a JIT, for RuntimeDyld (arena_memory_managers in
// kcache/llvm.h) and for JITLink (arena_jitlink_memory_manager, LLVM 19 and
// later, where JITLink's InProcessMemoryManager maps, zero-fills and unmaps
// a block for every object and a warm start's linking was a quarter system
// calls and page faults).
//
// LLVM's SectionMemoryManager maps fresh pages for each object's code,
// read-only data and read-write data, faults each page in, and unmaps them
// all at the end: three mappings and their faults for every object, which on
// a warm start (every object from the cache, nothing compiled) is a good
// part of linking. Here an arena reserves a slab of address space up front
// (PROT_NONE, nothing committed) with one range for each kind of section,
// makes it writable a megabyte at a time, and each object takes
// page-aligned regions from the three ranges in turn. An object's code and
// read-only data are then protected (RX, R) in place: successive objects'
// code pages sit side by side with the same protection, so the kernel keeps
// them as one mapping instead of one or more per object.
//
//  * An object's regions come from one slab (a slab is 3 x 64 MiB, or
//    larger for a larger object), so its sections are within 2 GiB of each
//    other whatever the code model (make_cached_lljit's JIT uses the large
//    one, which needs no such reach).
//  * RuntimeDyld says up front what an object needs
//    (reserveAllocationSpace); a section that does not fit what it said (on
//    x86-64, LLVM 14 counts no GOT entries for its PLT stubs) gets a region
//    of its own, from the object's slab while that has room.
//  * An object that is removed gives its pages back (MADV_DONTNEED, then
//    PROT_NONE); its address space is not reused, and a slab is unmapped once
//    none of its objects is left and the arena has moved on to another.
//  * EH frames are registered and deregistered as SectionMemoryManager does
//    (RTDyldMemoryManager's in-process registration); under JITLink by the
//    layer's EHFrameRegistrationPlugin, as LLJIT sets it up.
//  * Pages are faulted in ahead, 256 KiB at a time, by one madvise
//    (MADV_POPULATE_WRITE) instead of a fault per page as the linker copies
//    sections in.
//  * JITLink hands back a whole JITDylib's objects at once: their regions,
//    neighbours in each range, go back as a few ranges.
//  * No code region holds an address whose low 32 bits are zero (a 4 GiB
//    boundary): libgcc's unwinder takes an FDE for a function starting
//    there for one of a discarded link-once section (it looks only at the
//    bits the 4-byte pc-relative encoding holds) and skips it, so an
//    exception thrown through that function would end the process. A slab
//    often starts on such a boundary (mappings here are 64 MiB-aligned);
//    the page there is left unused (code_region_start).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <llvm/ExecutionEngine/RTDyldMemoryManager.h>
#include <llvm/Support/Memory.h>

#include "integrations/llvm/jit_memory.h"
#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"

#if KCACHE_ARENA_JITLINK
#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/JITLink/JITLinkMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/Shared/AllocationActions.h>
#endif

namespace kcache::llvm {
namespace {

enum Kind : unsigned { kCode = 0, kReadOnly = 1, kReadWrite = 2, kKinds = 3 };

constexpr size_t kSpan = size_t{64} << 20;           // address space of one kind in a slab
constexpr size_t kCommitStep = size_t{1} << 20;      // made writable at a time
constexpr size_t kPopulateStep = size_t{256} << 10;  // faulted in at a time (MADV_POPULATE_WRITE)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

size_t page_size() {
  static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Where a region of kind `k` and `size` bytes starts when the next free
// byte of its range is `at`.
uint8_t* region_start(unsigned k, uint8_t* at, size_t size) {
  return k == kCode ? code_region_start(at, size, page_size()) : at;
}

struct Slab {
  uint8_t* base = nullptr;
  size_t span = 0;                  // bytes of address space of each kind
  uint8_t* used[kKinds] = {};       // next free byte of each kind's range
  uint8_t* committed[kKinds] = {};  // end of its writable part
  uint8_t* populated[kKinds] = {};  // end of its part faulted in ahead
  size_t live = 0;                  // regions in use
};

struct Region {
  uint8_t* at = nullptr;
  size_t size = 0;  // a multiple of the page size
  Kind kind = kCode;
  Slab* slab = nullptr;
};

class Arena {
 public:
  ~Arena() {
    for (auto& s : slabs_) ::munmap(s->base, s->span * kKinds);
  }

  // Writable page-aligned regions of sizes[k] bytes (page multiples; 0 for
  // none) of each kind, all from one slab; false when the system refuses
  // address space or memory.
  // `prefer` (an object's own slab, for a section beyond its reservation)
  // is used when it has room.
  bool take(const size_t sizes[kKinds], Region out[kKinds], Slab* prefer = nullptr) {
    std::lock_guard lk(mu_);
    if (prefer && fits(*prefer, sizes)) return carve(*prefer, sizes, out);
    if (!current_ || !fits(*current_, sizes)) {
      size_t span = kSpan;
      // A page more than the largest region: code may start a page past a
      // 4 GiB boundary at the slab's base (region_start).
      for (unsigned k = 0; k < kKinds; ++k) span = std::max(span, round_up(sizes[k] + page_size(), kCommitStep));
      void* p = ::mmap(nullptr, span * kKinds, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return false;
      auto s = std::make_unique<Slab>();
      s->base = static_cast<uint8_t*>(p);
      s->span = span;
      for (unsigned k = 0; k < kKinds; ++k) s->used[k] = s->committed[k] = s->populated[k] = s->base + k * span;
      Slab* old = current_;
      current_ = s.get();
      slabs_.push_back(std::move(s));
      if (old && old->live == 0) drop(old);
      if (!fits(*current_, sizes)) {
        errno = ENOMEM;
        return false;
      }
    }
    return carve(*current_, sizes, out);
  }

  // Regions no longer used by anything. Neighbouring regions (successive
  // objects' code, say, when a whole JITDylib goes) are given back as one
  // range: two system calls for the lot instead of two per region.
  void give_back(std::vector<Region> regions) {
    std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) { return a.at < b.at; });
    for (size_t i = 0; i < regions.size();) {
      uint8_t* at = regions[i].at;
      uint8_t* end = at + regions[i].size;
      for (++i; i < regions.size() && regions[i].at == end; ++i) end += regions[i].size;
      if (!at) continue;
      (void)::madvise(at, static_cast<size_t>(end - at), MADV_DONTNEED);
      (void)::mprotect(at, static_cast<size_t>(end - at), PROT_NONE);
    }
    std::lock_guard lk(mu_);
    for (const Region& r : regions)
      if (r.at && --r.slab->live == 0 && r.slab != current_) drop(r.slab);
  }

 private:
  // REQUIRES: mu_ held; fits(s, sizes).
  bool carve(Slab& s, const size_t sizes[kKinds], Region out[kKinds]) {
    uint8_t* from[kKinds];
    for (unsigned k = 0; k < kKinds; ++k) from[k] = region_start(k, s.used[k], sizes[k]);
    for (unsigned k = 0; k < kKinds; ++k) {
      uint8_t* end = from[k] + sizes[k];
      if (end <= s.committed[k]) continue;
      uint8_t* to = std::min(s.base + (k + 1) * s.span,
                             s.committed[k] + round_up(static_cast<size_t>(end - s.committed[k]), kCommitStep));
      if (::mprotect(s.committed[k], static_cast<size_t>(to - s.committed[k]), PROT_READ | PROT_WRITE) != 0)
        return false;
      s.committed[k] = to;
    }
    // The pages about to be written (the linker copies each section in),
    // and the next few, faulted in by one system call instead of a fault
    // each; where the kernel cannot (before 5.14), they fault as before.
    for (unsigned k = 0; k < kKinds && populate_; ++k) {
      uint8_t* end = from[k] + sizes[k];
      if (end <= s.populated[k]) continue;
      uint8_t* to = std::min(s.committed[k], std::max(end, s.populated[k] + kPopulateStep));
      if (::madvise(s.populated[k], static_cast<size_t>(to - s.populated[k]), MADV_POPULATE_WRITE) != 0)
        populate_ = false;
      s.populated[k] = to;
    }
    for (unsigned k = 0; k < kKinds; ++k) {
      out[k] = Region{sizes[k] ? from[k] : nullptr, sizes[k], static_cast<Kind>(k), &s};
      s.used[k] = from[k] + sizes[k];
      s.live += sizes[k] ? 1 : 0;
    }
    return true;
  }

  bool fits(const Slab& s, const size_t sizes[kKinds]) const {
    for (unsigned k = 0; k < kKinds; ++k)
      if (region_start(k, s.used[k], sizes[k]) + sizes[k] > s.base + (k + 1) * s.span) return false;
    return true;
  }
  // REQUIRES: mu_ held; `s` has no live object and is not current_.
  void drop(Slab* s) {
    ::munmap(s->base, s->span * kKinds);
    slabs_.erase(std::find_if(slabs_.begin(), slabs_.end(), [s](const auto& p) { return p.get() == s; }));
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<Slab>> slabs_;  // GUARDED_BY(mu_)
  Slab* current_ = nullptr;                   // GUARDED_BY(mu_)
  bool populate_ = true;                      // GUARDED_BY(mu_)
};

// One object's memory: what RuntimeDyld asked for, from the arena.
class ArenaMemoryManager final : public ::llvm::RTDyldMemoryManager {
 public:
  explicit ArenaMemoryManager(std::shared_ptr<Arena> arena) : arena_(std::move(arena)) {}
  ~ArenaMemoryManager() override {
    // The layer deregisters an object's EH frames when the object is
    // removed, but not when linking it failed after they were registered
    // (finalizeMemory or the emit notification failing): frames left
    // registered over pages given back would crash the next unwind.
    // Deregistering twice is harmless (the list is cleared).
    deregisterEHFrames();
    arena_->give_back(regions_);
  }

  bool needsToReserveAllocationSpace() override { return true; }

  void reserveAllocationSpace(uintptr_t code, compat::ReserveAlign code_align, uintptr_t ro,
                              compat::ReserveAlign ro_align, uintptr_t rw, compat::ReserveAlign rw_align) override {
    // The sizes already hold each section rounded up to its kind's largest
    // alignment; a region starts on a page, which covers any alignment up
    // to a page.
    const uintptr_t need[kKinds] = {code, ro, rw};
    const uint64_t align[kKinds] = {compat::align_value(code_align), compat::align_value(ro_align),
                                    compat::align_value(rw_align)};
    size_t sizes[kKinds];
    for (unsigned k = 0; k < kKinds; ++k)
      sizes[k] = need[k] ? round_up(need[k] + (align[k] > page_size() ? align[k] : 0), page_size()) : 0;
    (void)take(sizes);  // on failure, allocate() tries again per section
  }

  uint8_t* allocateCodeSection(uintptr_t size, unsigned align, unsigned, ::llvm::StringRef) override {
    return allocate(kCode, size, align);
  }
  uint8_t* allocateDataSection(uintptr_t size, unsigned align, unsigned, ::llvm::StringRef, bool read_only) override {
    return allocate(read_only ? kReadOnly : kReadWrite, size, align);
  }

  bool finalizeMemory(std::string* err) override {
    for (Region& r : regions_) {
      if (!r.at || r.kind == kReadWrite) continue;
      int prot = r.kind == kCode ? PROT_READ | PROT_EXEC : PROT_READ;
      if (::mprotect(r.at, r.size, prot) != 0) {
        if (err) *err = std::string("mprotect: ") + std::strerror(errno);
        return true;  // LLVM's convention: true is an error
      }
      if (r.kind == kCode) ::llvm::sys::Memory::InvalidateInstructionCache(r.at, r.size);
    }
    return false;
  }

 private:
  bool take(const size_t sizes[kKinds]) {
    Region got[kKinds];
    if (!arena_->take(sizes, got, regions_.empty() ? nullptr : regions_.front().slab)) return false;
    for (unsigned k = 0; k < kKinds; ++k) {
      if (!got[k].at) continue;
      regions_.push_back(got[k]);
      next_[k] = got[k].at;
      end_[k] = got[k].at + got[k].size;
    }
    return true;
  }

  uint8_t* allocate(Kind k, uintptr_t size, unsigned align) {
    const uintptr_t a = align ? align : 1;
    auto bump = [&]() -> uint8_t* {
      if (!next_[k]) return nullptr;
      uintptr_t p = (reinterpret_cast<uintptr_t>(next_[k]) + a - 1) & ~(a - 1);
      if (p + size > reinterpret_cast<uintptr_t>(end_[k])) return nullptr;
      next_[k] = reinterpret_cast<uint8_t*>(p + size);
      return reinterpret_cast<uint8_t*>(p);
    };
    if (uint8_t* p = bump()) return p;
    size_t sizes[kKinds] = {0, 0, 0};
    sizes[k] = round_up(std::max<uintptr_t>(size, 1) + a, page_size());
    // Null only when the system refuses memory, which RuntimeDyld treats as
    // fatal, as it does when SectionMemoryManager's mapping fails.
    if (!take(sizes)) return nullptr;
    return bump();
  }

  std::shared_ptr<Arena> arena_;
  std::vector<Region> regions_;
  uint8_t* next_[kKinds] = {};
  uint8_t* end_[kKinds] = {};
};

#if KCACHE_ARENA_JITLINK
namespace jl = ::llvm::jitlink;

bool has(::llvm::orc::MemProt prot, ::llvm::orc::MemProt bit) {
  return (static_cast<unsigned>(prot) & static_cast<unsigned>(bit)) != 0;
}

Kind kind_of(::llvm::orc::MemProt prot) {
  if (has(prot, ::llvm::orc::MemProt::Exec)) return kCode;
  if (has(prot, ::llvm::orc::MemProt::Write)) return kReadWrite;
  return kReadOnly;
}

// What a finalised object holds: its regions and the actions that undo its
// finalisation (JITLink's dealloc actions).
struct ArenaAlloc {
  std::vector<Region> regions;
  std::vector<::llvm::orc::shared::WrapperFunctionCall> dealloc_actions;
};

// One object's memory, laid out and not yet finalised.
class ArenaInFlight final : public jl::JITLinkMemoryManager::InFlightAlloc {
 public:
  ArenaInFlight(std::shared_ptr<Arena> arena, jl::LinkGraph& g, jl::BasicLayout bl, std::vector<Region> regions)
      : arena_(std::move(arena)), g_(&g), bl_(std::move(bl)), regions_(std::move(regions)) {}
  ~ArenaInFlight() override {
    if (!regions_.empty()) arena_->give_back(std::move(regions_));
  }

  void finalize(OnFinalizedFunction on_finalized) override {
    // Code RX, read-only data R, in place; read-write data is already
    // writable. Each segment is whole pages of its own.
    for (auto& [ag, seg] : bl_.segments()) {
      const auto prot = ag.getMemProt();
      if (kind_of(prot) == kReadWrite && has(prot, ::llvm::orc::MemProt::Read)) continue;
      const size_t size = round_up(seg.ContentSize + seg.ZeroFillSize, page_size());
      ::llvm::sys::MemoryBlock mb(seg.WorkingMem, size);
      const auto flags = ::llvm::orc::toSysMemoryProtectionFlags(prot);
      if (auto ec = ::llvm::sys::Memory::protectMappedMemory(mb, flags))
        return on_finalized(::llvm::errorCodeToError(ec));
      if (flags & ::llvm::sys::Memory::MF_EXEC) ::llvm::sys::Memory::InvalidateInstructionCache(mb.base(), size);
    }
    auto dealloc = ::llvm::orc::shared::runFinalizeActions(g_->allocActions());
    if (!dealloc) return on_finalized(dealloc.takeError());
    // Finalize-lifetime segments (none in x86-64 ELF objects today) stay
    // with the object's standard ones until it is removed.
    auto* done = new ArenaAlloc{std::move(regions_), std::move(*dealloc)};
    regions_.clear();
    on_finalized(jl::JITLinkMemoryManager::FinalizedAlloc(::llvm::orc::ExecutorAddr::fromPtr(done)));
  }

  void abandon(OnAbandonedFunction on_abandoned) override {
    arena_->give_back(std::move(regions_));
    regions_.clear();
    on_abandoned(::llvm::Error::success());
  }

 private:
  std::shared_ptr<Arena> arena_;
  jl::LinkGraph* g_;
  jl::BasicLayout bl_;
  std::vector<Region> regions_;
};

// JITLink's memory manager over an arena: each object's segments are
// regions of the arena's three ranges (by protection), all from one slab.
class ArenaJITLinkMemoryManager final : public jl::JITLinkMemoryManager {
 public:
  ArenaJITLinkMemoryManager() : arena_(std::make_shared<Arena>()) {}

  void allocate(const jl::JITLinkDylib*, jl::LinkGraph& g, OnAllocatedFunction on_allocated) override {
    jl::BasicLayout bl(g);
    size_t sizes[kKinds] = {0, 0, 0};
    for (auto& [ag, seg] : bl.segments()) {
      if (seg.Alignment.value() > page_size())
        return on_allocated(make_error("kcache arena: segment alignment greater than a page in " + g.getName()));
      sizes[kind_of(ag.getMemProt())] += round_up(seg.ContentSize + seg.ZeroFillSize, page_size());
    }
    Region got[kKinds];
    if (!arena_->take(sizes, got))
      return on_allocated(make_error("kcache arena: no memory for " + g.getName() + ": " + std::strerror(errno)));
    // Fresh pages, never handed out before: already zero, as the layout's
    // zero-fill and padding expect.
    uint8_t* next[kKinds] = {got[0].at, got[1].at, got[2].at};
    for (auto& [ag, seg] : bl.segments()) {
      uint8_t*& at = next[kind_of(ag.getMemProt())];
      seg.WorkingMem = reinterpret_cast<char*>(at);
      seg.Addr = ::llvm::orc::ExecutorAddr::fromPtr(at);
      at += round_up(seg.ContentSize + seg.ZeroFillSize, page_size());
    }
    std::vector<Region> regions;
    for (const Region& r : got)
      if (r.at) regions.push_back(r);
    if (auto err = bl.apply()) {
      arena_->give_back(std::move(regions));
      return on_allocated(std::move(err));
    }
    on_allocated(std::make_unique<ArenaInFlight>(arena_, g, std::move(bl), std::move(regions)));
  }
  using jl::JITLinkMemoryManager::allocate;

  void deallocate(std::vector<FinalizedAlloc> allocs, OnDeallocatedFunction on_deallocated) override {
    ::llvm::Error errors = ::llvm::Error::success();
    std::vector<Region> regions;
    for (auto it = allocs.rbegin(); it != allocs.rend(); ++it) {
      std::unique_ptr<ArenaAlloc> a(it->release().toPtr<ArenaAlloc*>());
      if (auto err = ::llvm::orc::shared::runDeallocActions(a->dealloc_actions))
        errors = ::llvm::joinErrors(std::move(errors), std::move(err));
      regions.insert(regions.end(), a->regions.begin(), a->regions.end());
    }
    arena_->give_back(std::move(regions));
    on_deallocated(std::move(errors));
  }
  using jl::JITLinkMemoryManager::deallocate;

 private:
  static ::llvm::Error make_error(const std::string& msg) {
    return ::llvm::make_error<::llvm::StringError>(msg, ::llvm::inconvertibleErrorCode());
  }
  std::shared_ptr<Arena> arena_;
};
#endif

}  // namespace

std::function<std::unique_ptr<::llvm::RuntimeDyld::MemoryManager>()> arena_memory_managers() {
  auto arena = std::make_shared<Arena>();
  return [arena] { return std::make_unique<ArenaMemoryManager>(arena); };
}

#if KCACHE_ARENA_JITLINK
std::unique_ptr<::llvm::jitlink::JITLinkMemoryManager> arena_jitlink_memory_manager() {
  return std::make_unique<ArenaJITLinkMemoryManager>();
}
#endif

}  // namespace kcache::llvm

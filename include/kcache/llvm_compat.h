// kcache/llvm_compat.h — what differs between the LLVM releases kcache's
// LLVM code builds against (LLVM 14 to 19), in one place.
//
// Every version test of the integration, its tests, examples and
// benchmarks is here; the rest of the code is written once, against these
// names. Each entry says which release changed what.
//
// Depends on llvm/Support only (and, for SubtargetFeatures, on the header
// that holds it), so a host that builds kcache's FileCache
// (kcache/llvm_file_cache.h) with its own LLVM can include it too.
//
// Thread-safety: nothing here has state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <llvm/ADT/Twine.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/Support/Alignment.h>
#include <llvm/Support/Caching.h>
#include <llvm/Support/CodeGen.h>
#include <llvm/Support/MemoryBuffer.h>

// LLVM 17 moved SubtargetFeatures from MC/ to TargetParser/.
#if LLVM_VERSION_MAJOR >= 17
#include <llvm/TargetParser/SubtargetFeature.h>
#else
#include <llvm/MC/SubtargetFeature.h>
#endif

#if LLVM_VERSION_MAJOR < 14
#error "kcache's LLVM integration needs LLVM 14 or later"
#endif

namespace kcache::llvm::compat {

// The code generator's optimisation level: `enum CodeGenOpt::Level` up to
// LLVM 17, `enum class CodeGenOptLevel` from LLVM 18.
#if LLVM_VERSION_MAJOR >= 18
using CodeGenOptLevel = ::llvm::CodeGenOptLevel;
#else
using CodeGenOptLevel = ::llvm::CodeGenOpt::Level;
#endif

// 0 None, 1 Less, 2 Default, 3 and above Aggressive.
inline CodeGenOptLevel codegen_opt_level(unsigned level) {
  switch (level) {
    case 0:
      return CodeGenOptLevel::None;
    case 1:
      return CodeGenOptLevel::Less;
    case 2:
      return CodeGenOptLevel::Default;
    default:
      return CodeGenOptLevel::Aggressive;
  }
}

// The alignments RuntimeDyld::MemoryManager::reserveAllocationSpace is
// given: `uint32_t` up to LLVM 15, `llvm::Align` from LLVM 16.
#if LLVM_VERSION_MAJOR >= 16
using ReserveAlign = ::llvm::Align;
inline uint64_t align_value(::llvm::Align a) { return a.value(); }
#else
using ReserveAlign = uint32_t;
inline uint64_t align_value(uint32_t a) { return a; }
#endif

// Whether `Symbol` has toPtr<T>() (ExecutorAddr, LLVM 15 and later).
template <typename T, typename Symbol, typename = void>
inline constexpr bool kHasToPtr = false;
template <typename T, typename Symbol>
inline constexpr bool kHasToPtr<T, Symbol, std::void_t<decltype(std::declval<const Symbol&>().template toPtr<T>())>> =
    true;

// The address a JIT symbol lookup (LLJIT::lookup) returned, as a `T`:
// LLVM 14 returns a JITEvaluatedSymbol, LLVM 15 and later an ExecutorAddr.
template <typename T, typename Symbol>
T jit_pointer(const Symbol& s) {
  if constexpr (kHasToPtr<T, Symbol>)
    return s.template toPtr<T>();
  else
    return reinterpret_cast<T>(static_cast<uintptr_t>(s.getAddress()));
}

// llvm/Support/Caching.h: from LLVM 16 the FileCache, its AddStreamFn and
// the AddBufferFn take the module's name after their other arguments
// (`const Twine& ModuleName`); up to LLVM 15 they do not. Callbacks written
// as `(unsigned task, ..., const auto&... name)` fit both; module_name(name...)
// turns what they got into a string (empty up to LLVM 15). The call_*
// functions call the three with or without the name, as the release asks.
inline constexpr bool kCacheCallbacksHaveModuleName = LLVM_VERSION_MAJOR >= 16;
inline std::string module_name() { return std::string(); }
inline std::string module_name(const ::llvm::Twine& name) { return name.str(); }

inline ::llvm::Expected<::llvm::AddStreamFn> call_cache(const ::llvm::FileCache& cache, unsigned task,
                                                        ::llvm::StringRef key, const ::llvm::Twine& name = "") {
#if LLVM_VERSION_MAJOR >= 16
  return cache(task, key, name);
#else
  (void)name;
  return cache(task, key);
#endif
}

inline ::llvm::Expected<std::unique_ptr<::llvm::CachedFileStream>> call_add_stream(const ::llvm::AddStreamFn& add,
                                                                                   unsigned task,
                                                                                   const ::llvm::Twine& name = "") {
#if LLVM_VERSION_MAJOR >= 16
  return add(task, name);
#else
  (void)name;
  return add(task);
#endif
}

inline void call_add_buffer(const ::llvm::AddBufferFn& add, unsigned task, const ::llvm::Twine& name,
                            std::unique_ptr<::llvm::MemoryBuffer> buffer) {
#if LLVM_VERSION_MAJOR >= 16
  add(task, name, std::move(buffer));
#else
  (void)name;
  add(task, std::move(buffer));
#endif
}

// CachedFileStream: up to LLVM 20 its destruction commits what was written
// (localCache renames the file into place); LLVM 21 adds `virtual Error
// commit()`, which the host must call. A stream class declares
// `::llvm::Error commit() KCACHE_LLVM_COMMIT_OVERRIDE` to fit both.
#if LLVM_VERSION_MAJOR >= 21
#define KCACHE_LLVM_COMMIT_OVERRIDE override
#else
#define KCACHE_LLVM_COMMIT_OVERRIDE
#endif

// An AddBufferFn calling `f(unsigned task, std::string module_name,
// std::unique_ptr<MemoryBuffer>)` (the name empty up to LLVM 15).
template <typename F>
::llvm::AddBufferFn make_add_buffer(F f) {
  return [f](unsigned task, auto&&... rest) mutable {
    auto args = std::forward_as_tuple(std::forward<decltype(rest)>(rest)...);
    if constexpr (sizeof...(rest) == 2)
      f(task, std::get<0>(args).str(), std::move(std::get<1>(args)));
    else
      f(task, std::string(), std::move(std::get<0>(args)));
  };
}

}  // namespace kcache::llvm::compat

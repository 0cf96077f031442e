// The placement rule of the JIT memory arena (jit_memory.cc), on its own so
// that tests can hold it to every address it may meet.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kcache::llvm {

// Where a code region of `size` bytes (size > 0) may start when the next
// free byte is `at` (page-aligned): `at`, or when [at, at + size) holds an
// address whose low 32 bits are zero, one page (`page` bytes) past that
// address. libgcc's unwinder skips an FDE whose function starts at such an
// address (it takes it for a discarded link-once function), so an
// exception thrown through that function would end the process. Regions
// that come back hold no such address: a region is far smaller than 4 GiB.
inline uint8_t* code_region_start(uint8_t* at, size_t size, size_t page) {
  if (size == 0) return at;
  constexpr uint64_t kLow = 0xffffffffu;
  const uint64_t a = reinterpret_cast<uintptr_t>(at);
  const uint64_t boundary = (a + kLow) & ~kLow;  // the first at or after `at`
  return boundary - a < size ? at + (boundary - a) + page : at;
}

}  // namespace kcache::llvm

// Private: XXH3 with the fastest vector code this CPU has.
//
// libxxhash's plain entry points use its baseline (SSE2) code. On x86-64 the
// *_dispatch entry points pick AVX2 or AVX-512 at run time; the digests are
// the same, so keys and checksums do not depend on the machine. Measured
// here: 1 MiB hashing 14 -> 69 GB/s, a 16 KiB LMDB hit 1.4 -> 0.9 us.
#pragma once

#include <xxhash.h>

#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

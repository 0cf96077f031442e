// Private: the layout of the lease table file (docs/format.md, "Lease
// table"), for table_leases.cc and the tests that reach into it.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>

#include <memory>
#include <string>

#include "kcache/lease.h"
#include "lease/holder.h"

namespace kcache::lease::table {

inline constexpr char kFileName[] = "leases2.tab";
inline constexpr char kMagic[8] = {'K', 'C', 'L', 'E', 'A', 'S', 'E', '2'};
inline constexpr uint32_t kVersion = 2;

inline constexpr size_t kHeaderSize = 64;
inline constexpr size_t kLockSize = 64;                // a bucket's lock: a pthread_mutex_t, zero padded
inline constexpr size_t kSlotSize = 16 + kHolderSize;  // key | holder record
inline constexpr size_t kSlots = 8;                    // per bucket
inline constexpr size_t kBucketSize = kLockSize + kSlots * kSlotSize;  // 576 bytes
inline constexpr size_t kBuckets = 256;
inline constexpr size_t kTableSize = kHeaderSize + kBuckets * kBucketSize;  // 147,520 bytes
// Where a slot's holder keeps its expiry (holder.h's record at 16 + 24):
// zeroed first and stored last, so a slot torn by a writer that died is
// an expired one.
inline constexpr size_t kExpiryAt = 16 + 24;

static_assert(kSlotSize == 64);
static_assert(sizeof(pthread_mutex_t) <= kLockSize);
static_assert(kExpiryAt % 8 == 0 && kBucketSize % 64 == 0 && kHeaderSize % 64 == 0);

// Header: magic[8] | version:u32 | buckets:u32 | slots:u32 | lock_size:u32
// (sizeof(pthread_mutex_t) of the process that made it) | lock_kind:u32 |
// ready:u32 (1 once every lock is initialised) | zeros to 64.
inline constexpr size_t kReadyAt = 28;

inline constexpr size_t bucket_at(size_t b) { return kHeaderSize + b * kBucketSize; }
inline constexpr size_t slot_at(size_t b, size_t i) { return bucket_at(b) + kLockSize + i * kSlotSize; }

// What `kcache verify` and `kcache doctor` say of the lease table of `dir`:
// ok (also when there is none yet: the first process to use the store
// makes it), or why cross-process single-flight is degraded while the
// table is as it is: a damaged header, a table cut short, a table being
// made by a process that died, another layout or C library. fix: the
// table is opened as a process using the store opens it, which rewrites
// a damaged header and finishes a short or unfinished table under the
// header lock; then it is checked again (another layout is left alone:
// a process of that build may be using it).
Status check(const std::string& dir, bool fix);

// The table of `dir` read and written with pread/pwrite under fcntl locks,
// as on a copy-on-write file system, whatever the file system (tests).
Expected<std::shared_ptr<Leases>> open_unmapped(const std::string& dir);

}  // namespace kcache::lease::table

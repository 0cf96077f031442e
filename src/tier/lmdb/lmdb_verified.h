// Private: the entries of one LMDB store whose checksum this process has
// verified, so that a later hit on the same bytes skips the checksum pass.
//
// A hit on an entry that is in the memo still reads its 64-byte header and
// makes every check of the header and layout but the checksum pass; it is
// taken as verified only when the value LMDB found is where it was (the
// same address in the map, which never moves in a process), as long, and
// its whole header (magic, version, flags, key, lengths and the checksum of
// the payload) byte for byte as it was when verified. Anything that writes
// the entry anew (a put by this or another process, a salvage into a fresh
// store) changes one of these unless it writes the very same bytes to the
// very same place; LMDB writes a value's pages copy-on-write and reuses a
// page only after the value on it was deleted and no reader still sees it.
// Deletes of this process (remove, eviction, clear, a corrupt entry's
// removal) also forget the key at once.
//
// What it cannot see: payload bytes that change in place after their
// verification, with the header left as it was (a write into data.mdb by
// something other than LMDB, or a page the kernel evicted and read back
// damaged from the disk). Such an entry is caught by the next process that
// reads it, by `kcache verify`, and by a process that sets
// DiskTierOptions::verify_every_hit (docs/design.md, "Verified once per
// process").
//
// A fixed table of kSets sets of kWays slots (about 2.6 MiB of address
// space), a key's set chosen by its low bits (a key is a hash): up to four
// keys of one set are remembered; a fifth takes a slot in turn, and the key
// it displaced is verified in full on its next hit, never answered wrongly.
// Sized so that the keys of a working set of tens of thousands of entries
// rarely meet five in a set: with 1024 sets, 4,096 keys cycling left more
// than half of them in full sets, each verified again at every hit. The
// table is zeroed pages until used (calloc of a large block maps them).
#pragma once

#include <array>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "kcache/key.h"

namespace kcache {

class VerifiedEntries {
 public:
  static constexpr size_t kSets = 8192, kWays = 4;
  static constexpr size_t kHeader = 64;

  VerifiedEntries();
  ~VerifiedEntries();
  VerifiedEntries(const VerifiedEntries&) = delete;
  VerifiedEntries& operator=(const VerifiedEntries&) = delete;

  // Whether `key`'s entry at `at`, `size` bytes long and whose first 64
  // bytes are `header` (a copy of the bytes at `at`, or `at` itself), is
  // the one this process verified. REQUIRES: size >= kHeader.
  bool contains(const Key& key, const void* at, uint64_t size, const char* header) const noexcept;
  // Records that `key`'s entry at `at` verified, with its header `header`.
  void add(const Key& key, const void* at, uint64_t size, const char* header) noexcept;
  // Forgets `key` (its entry was deleted or replaced by this process).
  void forget(const Key& key) noexcept;
  // Forgets every key (the store was cleared).
  void clear() noexcept;

 private:
  struct Slot {
    const void* at;  // null: empty
    uint64_t size;
    char header[kHeader];
    bool holds(const Key& key) const noexcept;
  };
  struct Set {
    Slot ways[kWays];
    uint32_t next;  // the way a full set gives up next
  };
  static constexpr size_t kStripes = 16;
  static size_t set_of(const Key& key) noexcept;
  std::mutex& stripe(size_t set) const noexcept { return mu_[set % kStripes]; }

  mutable std::array<std::mutex, kStripes> mu_;
  Set* sets_;  // kSets of them, each GUARDED_BY(stripe(its index))
};

}  // namespace kcache

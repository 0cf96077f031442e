// The memo of verified entries (lmdb_verified.h).
#include "tier/lmdb/lmdb_verified.h"

#include <cstring>
#include <new>

#include "util/util.h"

namespace kcache {

VerifiedEntries::VerifiedEntries() : sets_(static_cast<Set*>(std::calloc(kSets, sizeof(Set)))) {
  if (!sets_) throw std::bad_alloc();
}

VerifiedEntries::~VerifiedEntries() { std::free(sets_); }

size_t VerifiedEntries::set_of(const Key& key) noexcept {
  return util::get_u64(reinterpret_cast<const char*>(key.bytes.data())) % kSets;
}

bool VerifiedEntries::Slot::holds(const Key& key) const noexcept {
  return at && std::memcmp(header + 16, key.bytes.data(), 16) == 0;
}

bool VerifiedEntries::contains(const Key& key, const void* at, uint64_t size, const char* header) const noexcept {
  // The key is bytes 16..31 of the header: an equal header is the same key.
  if (std::memcmp(header + 16, key.bytes.data(), 16) != 0) return false;
  const size_t set = set_of(key);
  std::lock_guard lk(stripe(set));
  for (const Slot& s : sets_[set].ways)
    if (s.at == at && s.size == size && std::memcmp(s.header, header, kHeader) == 0) return true;
  return false;
}

void VerifiedEntries::add(const Key& key, const void* at, uint64_t size, const char* header) noexcept {
  const size_t set = set_of(key);
  std::lock_guard lk(stripe(set));
  Set& st = sets_[set];
  // The key's own slot, else an empty one, else the next in turn.
  Slot* to = nullptr;
  for (Slot& s : st.ways)
    if (s.holds(key)) to = &s;
  for (Slot& s : st.ways)
    if (!to && !s.at) to = &s;
  if (!to) to = &st.ways[st.next++ % kWays];
  to->at = at;
  to->size = size;
  std::memcpy(to->header, header, kHeader);
}

void VerifiedEntries::forget(const Key& key) noexcept {
  const size_t set = set_of(key);
  std::lock_guard lk(stripe(set));
  for (Slot& s : sets_[set].ways)
    if (s.holds(key)) s.at = nullptr;
}

void VerifiedEntries::clear() noexcept {
  for (size_t first = 0; first < kStripes; ++first) {
    std::lock_guard lk(stripe(first));
    for (size_t i = first; i < kSets; i += kStripes)
      for (Slot& s : sets_[i].ways) s.at = nullptr;
  }
}

}  // namespace kcache

// Private: what the files engine's walks cost, for tests that check that a
// put does not scan the store.
#pragma once

#include <cstdint>

namespace kcache {

// Entry files that this process's walks of a store (list, verify, evict,
// recount) have visited so far.
uint64_t files_entries_visited() noexcept;

}  // namespace kcache

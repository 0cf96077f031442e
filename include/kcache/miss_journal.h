// kcache/miss_journal.h — reading a store's miss journal.
//
// A Cache with a disk store appends each counted miss of a key with a
// manifest that the caller then compiles (one that waited for another
// compile of the key and got its entry is not journaled) to the store's
// miss journal (Options::miss_journal, `<dir>/<engine>.misses` and its
// previous generation `.misses.1`; docs/format.md, "Miss journal"),
// shared by every process of the store.
// read_miss_journal gives its records back, to explain them
// (kcache/explain.h) as `kcache misses` does:
//
//   auto misses = read_miss_journal(disk_store_path, 100);
//   for (const MissRecord& m : *misses) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kcache/explain.h"
#include "kcache/status.h"

namespace kcache {

// The journal of the disk store at `store_path` (the cache folder + "/" +
// engine_name(engine), e.g. ~/.cache/kcache/lmdb): store_path + ".misses".
std::string miss_journal_path(const std::string& store_path);

// The last `limit` committed records of the journal at `store_path`, oldest
// first. A journal that does not exist reads as empty; so does a file
// without a valid header. A record that does not verify or decode is
// skipped and counted in *skipped (when given); a record torn by a crash is
// past the committed end and never read. A journal whose lock another
// process holds for over a second is Errc::timeout; a file that cannot be
// opened, its errno.
Expected<std::vector<MissRecord>> read_miss_journal(const std::string& store_path, size_t limit = SIZE_MAX,
                                                    uint64_t* skipped = nullptr);

}  // namespace kcache

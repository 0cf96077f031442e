// Private: the structural checks of an LMDB data file (lmdb_check.cc) that
// make a damaged store a corrupt error instead of a fault in LMDB.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <string>

#include "kcache/status.h"

namespace kcache {

// Before LMDB maps the file: both meta pages readable and sane, and the
// pages the newer one claims present in the file. A missing file is OK (a
// new store).
Status check_metas_before_open(const std::string& data_path);

// After mdb_env_open, before the first transaction that reads the tree:
// every page reachable from the free list, the main database and the named
// databases is in bounds and shaped as LMDB writes it. Reads through `map`
// (LMDB's map of the file, `map_len` bytes) when given, else through a map
// of its own.
Status check_tree(MDB_env* env, const std::string& data_path, const unsigned char* map = nullptr, uint64_t map_len = 0);

}  // namespace kcache

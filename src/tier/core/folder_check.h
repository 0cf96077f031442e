// The folders above a disk store, checked as ssh's StrictModes checks the
// folders above a key file: whoever can rename or replace any of them can
// swap the store for one of their own.
//
// A store folder is trusted when it, and every folder above it up to the
// first that ends the walk, is owned by this user or root (or, for a store
// shared with a group, by a member of that group) and writable by no one
// else (a shared store's group may write). The walk ends, accepted, at
// * a sticky folder (such as /tmp) owned by this user or root: in it only
//   the owner of an entry (or of the folder) may rename or remove it, and
//   the folder below it was just checked;
// * a folder owned by root that passed the check: above it nobody but root
//   decides (for root itself, the first root-owned folder above the store);
// * the root of the file system tree.
// The folders are reached from the store folder through "..", each opened
// relative to the one below it (O_PATH where there is one), so a folder
// renamed while the walk runs cannot make it check another chain than the
// one the store is in. The folders are opened and judged (fstat) through
// `env` (kcache/env.h).
#pragma once

#include <string>

#include "kcache/status.h"
#include "util/util.h"

namespace kcache {

// Ok when `folder` and the folders above it may be trusted as described
// above. not_found when `folder` does not exist; unavailable with one
// sentence naming the refused folder, its owner or mode, otherwise.
Status check_store_folders(const std::string& folder, const util::StoreTrust& trust, Env& env = *Env::posix());

}  // namespace kcache

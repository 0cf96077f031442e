// Private: the key of a program's compile flight, on which NVRTC runs once
// across threads and processes (Cache::begin / try_begin): the program's
// inputs key, the digest of the manifest list stored under it when it was
// looked up (zero: none stored) and the entry key that list gave (null:
// none held). Processes that saw the same stored list share one flight;
// its committed entry holds the owner's manifest.
#pragma once

#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache::nvrtc::detail {

Expected<KeyInfo> flight_key(const Key& inputs, const Digest& stored, const Key* entry);

}  // namespace kcache::nvrtc::detail

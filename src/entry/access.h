// Private: what the library's own readers may do with an Entry that a
// caller may not.
#pragma once

#include <memory>

#include "kcache/entry.h"

namespace kcache {

struct EntryAccess {
  // Entry::decode without the checksum pass: every other check of the
  // header (size, magic, version, flags, lengths, key) and of the layout is
  // made. Only for bytes whose checksum this process has already verified
  // and that it can tell are the same bytes (the LMDB engine's memo of
  // verified entries, tier/lmdb/lmdb_verified.h).
  static Expected<Entry> decode_verified(std::shared_ptr<const Buffer> bytes, const Key* expected);

  // Entry::decode, with the checksum pass or without it.
  static Expected<Entry> decode(std::shared_ptr<const Buffer> bytes, const Key* expected, bool checksum);
};

}  // namespace kcache

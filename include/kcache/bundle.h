// kcache/bundle.h — bundles: shipped, optionally signed, read-only sets of entries.
//
// A bundle is one file (docs/format.md, "Bundle") holding entries in the
// ordinary entry format behind a header and a sorted index. It is made from
// a store (the whole store, a namespace, a list of keys, or what was created
// or used since a mark) and mounted read-only as a tier (TierKind::bundle)
// between the memory tier and the disk store: KCACHE_BUNDLES=FILE[:FILE...]
// or Options::bundles.
//
// Precompilation in three steps:
//
//   uint64_t m = *cache->mark();          // or `kcache mark`
//   ... compile what the package needs (in any process using the store) ...
//   write_bundle(*cache, bundle_since(m), "pkg.kcb", {.sign_key_file = "key"});
//
// Opening a bundle maps the file and reads its header and index only; a
// lookup is a binary search in the index and the entry's own verification.
// A bundle whose header or index fails its checksum, whose signature does not
// verify, or that is unsigned or signed by an untrusted key while trusted
// keys are configured (KCACHE_BUNDLE_TRUST) is refused: left out, said once
// in the log. A damaged entry is a miss (counted corrupt), never wrong bytes.
//
// Signatures are Ed25519 (OpenSSL) over the header and the index's block
// digests; the index holds each entry's SHA-256, checked at its first hit in
// a signed bundle, so every byte a signed bundle hands out is covered.
//
// Thread-safety: a bundle tier is safe for concurrent use. load_bundle()
// belongs to a Cache's set-up, like Cache::add_tier.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kcache/key.h"
#include "kcache/status.h"
#include "kcache/tier.h"

namespace kcache {

class Cache;

// Bundles a Cache mounts (Options::bundles).
struct BundleOptions {
  // Bundle files, mounted in this order after the memory tier.
  // KCACHE_BUNDLES=FILE[:FILE...].
  std::vector<std::string> files;
  // Public key files (written by bundle_keygen as KEYFILE.pub). Empty: any
  // bundle is accepted (a signed one must still carry a valid signature).
  // Set: only bundles signed by one of these keys are mounted; a key file
  // that cannot be read refuses every bundle. KCACHE_BUNDLE_TRUST=PUB[:PUB...].
  std::vector<std::string> trusted_keys;
};

// Which entries of a store go into a bundle. The conditions combine (AND);
// the default selects the whole store.
struct BundleSelection {
  // Only entries created or used at or after this mark (StoreAdmin::mark).
  std::optional<uint64_t> since;
  // Only entries of these key namespaces (empty: any).
  std::vector<std::string> namespaces;
  // Only these keys (empty: any).
  std::vector<Key> keys;
};
inline BundleSelection bundle_since(uint64_t mark) {
  BundleSelection s;
  s.since = mark;
  return s;
}

// Progress of a long operation: items done, items in all.
using BundleProgress = std::function<void(uint64_t done, uint64_t total)>;

struct BundleWriteOptions {
  // Private key file (bundle_keygen). Empty: the bundle is not signed.
  std::string sign_key_file;
  BundleProgress progress;
  // What the writer asks of the system (kcache/env.h); null means the
  // real one (the Cache-level writer passes the cache's Options::env).
  std::shared_ptr<Env> env;
};

struct BundleInfo {
  uint32_t version = 0;        // bundle format version
  uint32_t entry_version = 0;  // entry format version of the writer
  uint64_t entries = 0;
  uint64_t bytes = 0;  // file size
  uint64_t created_unix_ms = 0;
  bool is_signed = false;
  std::string signer;    // hex SHA-256 of the signer's raw public key (empty if unsigned)
  bool trusted = false;  // signed by a trusted key (false when none are configured)
};

// Writes the selected entries of `from` to `path` (atomically: a temp file
// renamed into place). `path` is a regular file, a missing one or a link to
// a regular file (written at its target); a device, FIFO, folder or broken
// link is refused, never replaced. Temp files of writers of `path` killed an
// hour ago or more ("PATH.tmp.<16 hex>") are removed first. A selection by mark, namespace alone or nothing
// lists the store through from.admin() (unavailable when the tier has
// none); one by keys alone reads just those, from any tier. Entries are
// read with Access::peek, so making a bundle counts nothing and changes no
// recency record; the Cache overloads read the cache's disk store.
Expected<BundleInfo> write_bundle(Tier& from, const BundleSelection& selection, const std::string& path,
                                  const BundleWriteOptions& options = {});
Expected<BundleInfo> write_bundle(Cache& from, const BundleSelection& selection, const std::string& path,
                                  const BundleWriteOptions& options = {});
// The same bundle as bytes.
Expected<std::string> save_bundle(Tier& from, const BundleSelection& selection, const BundleWriteOptions& options = {});
Expected<std::string> save_bundle(Cache& from, const BundleSelection& selection,
                                  const BundleWriteOptions& options = {});

// Mounts a bundle file (or bytes) as a read-only tier (TierKind::bundle).
// Refused (an error) when the header or index is damaged, the signature
// fails, or trusted keys are given and the bundle is not signed by one.
Expected<std::shared_ptr<Tier>> open_bundle(const std::string& path, const std::vector<std::string>& trusted_keys = {});
Expected<std::shared_ptr<Tier>> open_bundle_bytes(std::string bytes, const std::vector<std::string>& trusted_keys = {});
// Mounts bundle bytes in `cache`, after its memory tier and other bundles,
// before its disk store; trusted keys are the cache's Options::bundles ones.
Status load_bundle(Cache& cache, std::string bytes);

// Header facts of a bundle (after the same checks as open_bundle).
Expected<BundleInfo> bundle_info(const std::string& path, const std::vector<std::string>& trusted_keys = {});

struct BundleVerifyReport {
  BundleInfo info;
  uint64_t checked = 0;
  uint64_t other_format = 0;                     // entries of another entry format version
  std::vector<std::pair<Key, std::string>> bad;  // key, reason
};
// Checks every entry (checksum, key, and SHA-256 against the index).
Expected<BundleVerifyReport> verify_bundle(const std::string& path, const std::vector<std::string>& trusted_keys = {},
                                           const BundleProgress& progress = {});

// Copies every entry of a bundle into `to` (a disk tier). Returns how many
// were stored; damaged entries are skipped (and counted in the log line).
Expected<uint64_t> import_bundle(const std::string& path, Tier& to, const std::vector<std::string>& trusted_keys = {},
                                 const BundleProgress& progress = {});

// Writes a new Ed25519 key pair: `key_file` (private, PEM, mode 0600) and
// `key_file`.pub (public, PEM). Refuses to overwrite an existing key file.
Status bundle_keygen(const std::string& key_file);

// Marks print as decimal numbers; parse_mark reads one back.
std::optional<uint64_t> parse_mark(std::string_view s) noexcept;

// File name extension used by the tools and docs.
inline constexpr const char* kBundleExtension = ".kcb";

}  // namespace kcache

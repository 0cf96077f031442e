// Bundles at the level of a Cache (kcache/bundle.h): the mark of its disk
// store, bundles made from that store, and bundle bytes mounted in it.
#include "kcache/bundle.h"

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

namespace {

std::shared_ptr<Tier> disk_tier_of(Cache& c) {
  for (const auto& t : c.tiers())
    if (t->kind() == TierKind::disk) return t;
  return nullptr;
}

// The cache's own disk store: the bundle writer reads it with Access::peek,
// so making a bundle is not a use and leaves every recency record as it
// was. This process's recency is flushed first, so marks see it.
Expected<std::shared_ptr<Tier>> bundle_source(Cache& c) {
  (void)c.flush();  // a failed write is in the log; the bundle has what the store has
  auto disk = disk_tier_of(c);
  if (!disk || !disk->admin()) return Status(Errc::unavailable, "the cache has no disk store to make a bundle from");
  return disk;
}

}  // namespace

Expected<uint64_t> Cache::mark() {
  (void)flush();  // a failed write is in the log; the mark is the store's
  auto disk = disk_tier_of(*this);
  if (!disk || !disk->admin()) return Status(Errc::unavailable, "the cache has no disk store to mark");
  return disk->admin()->mark();
}

Expected<BundleInfo> write_bundle(Cache& from, const BundleSelection& selection, const std::string& path,
                                  const BundleWriteOptions& options) {
  KCACHE_TRY(auto src, bundle_source(from));
  return write_bundle(*src, selection, path, options);
}

Expected<std::string> save_bundle(Cache& from, const BundleSelection& selection, const BundleWriteOptions& options) {
  KCACHE_TRY(auto src, bundle_source(from));
  return save_bundle(*src, selection, options);
}

Status load_bundle(Cache& cache, std::string bytes) {
  auto t = open_bundle_bytes(std::move(bytes), cache.options().bundles.trusted_keys);
  if (!t) {
    KCACHE_LOG(LogLevel::warn, "%s", t.error().to_string().c_str());
    return std::move(t).error();
  }
  cache.add_tier(std::move(t).value());
  return Status();
}

}  // namespace kcache

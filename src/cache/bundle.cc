// Bundles at the level of a Cache (kcache/bundle.h): the mark of its disk
// store, bundles made from that store, and bundle bytes mounted in it.
#include "kcache/bundle.h"

#include "kcache/assembly.h"
#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

namespace {

std::shared_ptr<Tier> disk_tier_of(Cache& c) {
  for (const auto& t : c.tiers())
    if (t->kind() == TierKind::disk) return t;
  return nullptr;
}

// A read-only view of the cache's disk store (a second tier object, so the
// cache's own keeps repairing and recording): reads made to build a bundle
// are not uses, and leave every recency record as it was.
Expected<std::shared_ptr<Tier>> bundle_source(Cache& c) {
  c.flush();  // this process's recency first, so marks see it
  if (!disk_tier_of(c)) return Status(Errc::unavailable, "the cache has no disk store to make a bundle from");
  // The store the cache opened, named as the cache named it (its shared
  // group included): only no creating and no leases differ.
  DiskStoreSpec spec = DiskStoreSpec::from(c.options());
  spec.create = false;
  spec.leases = false;
  KCACHE_TRY(DiskStore d, open_disk_store(spec));
  return make_read_only(d.tier);
}

}  // namespace

Expected<uint64_t> Cache::mark() {
  flush();
  auto disk = disk_tier_of(*this);
  if (!disk) return Status(Errc::unavailable, "the cache has no disk store to mark");
  return disk->mark();
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

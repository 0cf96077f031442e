// Removing chosen entries of a disk store, and its compression figures
// (kcache/evict.h).
#include "kcache/evict.h"

#include <functional>
#include <vector>

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

namespace {

Expected<StoreAdmin*> admin_of(Tier& store) {
  StoreAdmin* admin = store.admin();
  if (!admin) return Status(Errc::unavailable, "the " + std::string(store.name()) + " tier has no store to walk");
  return admin;
}

// evict_entries, calling `removed` with each key removed.
Expected<EvictResult> evict_from(Tier& store, const EvictSelection& selection,
                                 const std::function<void(const Key&)>& removed) {
  if (selection.older_than_ms == 0 && !selection.ns)
    return Status(Errc::invalid_argument, "an eviction needs an age or a namespace (clearing the store is clear())");
  KCACHE_TRY(StoreAdmin * admin, admin_of(store));
  if (!store.writable()) return Status(Errc::read_only, "the " + std::string(store.name()) + " store is read-only");
  const uint64_t now = util::now_unix_ms();
  const uint64_t cutoff = selection.older_than_ms >= now ? 0 : now - selection.older_than_ms;
  std::vector<ListItem> items;
  KCACHE_RETURN_IF_ERROR(admin->list([&](const ListItem& it) {
    items.push_back(it);
    return true;
  }));
  EvictResult r;
  for (const auto& it : items) {
    bool match = true;
    uint64_t last_use = it.last_use_ms;
    // The entry itself is read only when its namespace or its creation
    // time (no recency record) decides.
    if (selection.ns || (selection.older_than_ms && last_use == 0)) {
      auto e = store.get(it.key, Access::peek);
      if (!e || !e->has_value()) continue;  // gone meanwhile, or damaged: verify's business
      if (selection.ns) match = (*e)->manifest().ns == *selection.ns;
      if (last_use == 0) last_use = (*e)->meta().created_unix_ms;
    }
    if (selection.older_than_ms) match = match && last_use < cutoff;
    if (!match) {
      ++r.kept;
      continue;
    }
    Status st = store.remove(it.key);
    if (!st.is_ok() && st.code() != Errc::not_found) return st;
    if (removed) removed(it.key);
    ++r.evicted;
    r.bytes += it.size;
  }
  KCACHE_RETURN_IF_ERROR(store.flush());
  return r;
}

}  // namespace

Expected<EvictResult> evict_entries(Tier& store, const EvictSelection& selection) {
  return evict_from(store, selection, nullptr);
}

Expected<EvictResult> evict_entries(Cache& cache, const EvictSelection& selection) {
  (void)cache.flush();  // a failed write is in the log; eviction goes by what is stored
  std::vector<Tier*> memory;
  for (const auto& t : cache.tiers())
    if (t->kind() == TierKind::memory) memory.push_back(t.get());
  // What goes from the store goes from this process's memory tier too, so
  // it is not served from there.
  auto drop = [&](const Key& k) {
    for (Tier* m : memory) (void)m->remove(k);
  };
  for (const auto& t : cache.tiers())
    if (t->kind() == TierKind::disk && t->admin()) return evict_from(*t, selection, drop);
  return Status(Errc::unavailable, "the cache has no disk store");
}

Expected<CompressionStats> compression_stats(Tier& store) {
  KCACHE_TRY(StoreAdmin * admin, admin_of(store));
  std::vector<Key> keys;
  KCACHE_RETURN_IF_ERROR(admin->list([&](const ListItem& it) {
    keys.push_back(it.key);
    return true;
  }));
  CompressionStats s;
  for (const auto& k : keys) {
    auto e = store.get(k, Access::peek);
    if (!e || !e->has_value()) continue;
    ++s.entries;
    if ((*e)->compressed()) ++s.compressed_entries;
    s.stored_bytes += (*e)->encoded().size();
    s.payload_bytes += (*e)->payload_size();
  }
  return s;
}

}  // namespace kcache

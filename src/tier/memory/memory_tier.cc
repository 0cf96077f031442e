// Memory tier: a sharded LRU bounded by encoded bytes.
//
// Sizes are Entry::memory_size(): a compressed entry costs its encoded and
// its decompressed bytes.
//
// Invariants (per shard, under its mutex):
//  * `lru` holds every stored key exactly once, most recently used at front;
//  * `map[k].it` points at k's node in `lru`;
//  * `bytes` is the sum of memory sizes of the entries in `map`, and is at
//    most the shard's budget after every put returns.
// An entry larger than one shard's budget is not stored (counted rejected).
#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kcache/tier.h"
#include "util/util.h"

namespace kcache {
namespace {

class MemoryTier final : public Tier, public StoreAdmin {
 public:
  explicit MemoryTier(const MemoryTierOptions& o) {
    uint64_t total = o.max_bytes ? o.max_bytes : MemoryTierOptions().max_bytes;
    unsigned n = o.shards ? o.shards : 16;
    shards_ = std::vector<Shard>(n);
    per_shard_ = total / n;
    max_entry_ = o.max_entry_bytes ? std::min(o.max_entry_bytes, per_shard_) : per_shard_;
  }
  std::string_view name() const noexcept override { return "memory"; }
  TierKind kind() const noexcept override { return TierKind::memory; }
  StoreAdmin* admin() noexcept override { return this; }

  Status list(const std::function<bool(const ListItem&)>& fn) override {
    for (auto& sh : shards_) {
      std::vector<ListItem> items;
      {
        std::lock_guard lk(sh.mu);
        for (const auto& [k, v] : sh.map) items.push_back(ListItem{k, v.entry.memory_size(), 0});
      }
      for (const auto& it : items)
        if (!fn(it)) return Status();
    }
    return Status();
  }
  // Entries were checked when they were built or read, and live in this
  // process's memory only: there is nothing to find damaged.
  Expected<VerifyReport> verify(bool) override {
    VerifyReport rep;
    for (auto& sh : shards_) {
      std::lock_guard lk(sh.mu);
      rep.checked += sh.map.size();
    }
    return rep;
  }
  Expected<uint64_t> trim(uint64_t max_bytes) override {
    uint64_t per = max_bytes / shards_.size(), evicted = 0;
    for (auto& sh : shards_) {
      std::lock_guard lk(sh.mu);
      evicted += evict_locked(sh, per);
    }
    return evicted;
  }
  Status clear() override {
    for (auto& sh : shards_) {
      std::lock_guard lk(sh.mu);
      sh.map.clear();
      sh.lru.clear();
      sh.st.bytes = 0;
    }
    return Status();
  }

 protected:
  std::string_view admin_name() const noexcept override { return name(); }

  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override {
    Shard& sh = shard(key);
    std::lock_guard lk(sh.mu);
    auto it = sh.map.find(key);
    if (it == sh.map.end()) {
      if (access == Access::counted) ++sh.st.misses;
      return std::optional<Entry>();
    }
    if (access == Access::peek) return std::optional<Entry>(it->second.entry);
    sh.lru.splice(sh.lru.begin(), sh.lru, it->second.it);
    ++sh.st.hits;
    return std::optional<Entry>(it->second.entry);
  }

  Status do_put(const Entry& entry) override {
    Entry e = entry;
    if (e.pinned()) {
      KCACHE_TRY(e, entry.detach());
    }
    uint64_t size = e.memory_size();
    Shard& sh = shard(e.key());
    std::lock_guard lk(sh.mu);
    if (size > max_entry_) {
      ++sh.st.rejected;
      return Status(Errc::too_large, "entry larger than the memory tier's shard budget");
    }
    auto it = sh.map.find(e.key());
    if (it != sh.map.end()) {
      sh.st.bytes -= it->second.entry.memory_size();
      sh.lru.erase(it->second.it);
      sh.map.erase(it);
    }
    sh.lru.push_front(e.key());
    sh.map.emplace(e.key(), Node{std::move(e), sh.lru.begin()});
    sh.st.bytes += size;
    ++sh.st.puts;
    sh.st.evictions += evict_locked(sh, per_shard_);
    return Status();
  }

  Status do_remove(const Key& key) override {
    Shard& sh = shard(key);
    std::lock_guard lk(sh.mu);
    auto it = sh.map.find(key);
    if (it != sh.map.end()) {
      sh.st.bytes -= it->second.entry.memory_size();
      sh.lru.erase(it->second.it);
      sh.map.erase(it);
    }
    return Status();
  }

  TierStats do_stats() override {
    TierStats s;
    for (auto& sh : shards_) {
      std::lock_guard lk(sh.mu);
      sh.st.entries = sh.map.size();
      s += sh.st;
    }
    return s;
  }

 private:
  struct Node {
    Entry entry;
    std::list<Key>::iterator it;
  };
  struct Shard {
    std::mutex mu;
    std::list<Key> lru;                 // GUARDED_BY(mu)
    std::unordered_map<Key, Node> map;  // GUARDED_BY(mu)
    TierStats st;                       // GUARDED_BY(mu): this shard's counts and bytes (entries: set when read)
  };

  Shard& shard(const Key& k) { return shards_[k.bytes[15] % shards_.size()]; }

  // REQUIRES: sh.mu held.
  static uint64_t evict_locked(Shard& sh, uint64_t budget) {
    uint64_t n = 0;
    while (sh.st.bytes > budget && !sh.lru.empty()) {
      auto it = sh.map.find(sh.lru.back());
      sh.st.bytes -= it->second.entry.memory_size();
      sh.map.erase(it);
      sh.lru.pop_back();
      ++n;
    }
    return n;
  }

  std::vector<Shard> shards_;
  uint64_t per_shard_, max_entry_;
};

}  // namespace

std::shared_ptr<Tier> make_memory_tier(const MemoryTierOptions& options) {
  return std::make_shared<MemoryTier>(options);
}

}  // namespace kcache

// Tier base behaviour (argument checks), the defaults of StoreAdmin and the
// read-only wrapper.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>

#include "kcache/tier.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache {

std::string_view tier_kind_name(TierKind k) noexcept {
  switch (k) {
    case TierKind::memory:
      return "memory";
    case TierKind::disk:
      return "disk";
    case TierKind::remote:
      return "remote";
    case TierKind::bundle:
      return "bundle";
    case TierKind::other:
      return "other";
  }
  return "other";
}

std::string_view engine_name(Engine e) noexcept { return e == Engine::files ? "files" : "lmdb"; }

std::optional<Engine> parse_engine(std::string_view name) noexcept {
  // Any case: KCACHE_ENGINE=LMDB means what it says.
  auto is = [&](std::string_view want) {
    if (name.size() != want.size()) return false;
    for (size_t i = 0; i < name.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(name[i])) != want[i]) return false;
    return true;
  };
  if (is("lmdb")) return Engine::lmdb;
  if (is("files")) return Engine::files;
  return std::nullopt;
}

bool engine_built(Engine e) noexcept { return e == Engine::files || KCACHE_HAVE_LMDB; }

Engine default_engine() noexcept { return engine_built(Engine::lmdb) ? Engine::lmdb : Engine::files; }

Status Tier::put(const Entry& entry) {
  if (entry.encoded().size() < kEntryHeaderSize)
    return Status(Errc::invalid_argument, "put of an entry that was not built");
  return do_put(entry);
}

Status Tier::put_unsynced(const Entry& entry) {
  if (entry.encoded().size() < kEntryHeaderSize)
    return Status(Errc::invalid_argument, "put of an entry that was not built");
  return do_put_unsynced(entry);
}

std::vector<Status> Tier::put_many(const std::vector<Entry>& entries) {
  std::vector<Status> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.push_back(put(e));
  return out;
}

Expected<uint64_t> StoreAdmin::trim(uint64_t) {
  return Status(Errc::unavailable, std::string(admin_name()) + " tier cannot trim");
}

Status StoreAdmin::clear() { return Status(Errc::unavailable, std::string(admin_name()) + " tier cannot clear"); }

Status StoreAdmin::zero_counters() {
  return Status(Errc::unavailable, std::string(admin_name()) + " tier keeps no counters to zero");
}

Expected<uint64_t> StoreAdmin::mark() {
  return Status(Errc::unavailable, std::string(admin_name()) + " tier keeps no recency records to mark");
}

namespace {

// Refuses what writes, in front of the tier and of its administration; the
// inner tier is only called for what reads.
class ReadOnlyTier final : public Tier, public StoreAdmin {
 public:
  explicit ReadOnlyTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {
    name_ = std::string(inner_->name()) + "(ro)";
  }
  std::string_view name() const noexcept override { return name_; }
  TierKind kind() const noexcept override { return inner_->kind(); }
  bool writable() const noexcept override { return false; }
  StoreAdmin* admin() noexcept override { return this; }
  Status flush() override { return Status(); }

  Status list(const std::function<bool(const ListItem&)>& fn) override {
    StoreAdmin* a = inner_->admin();
    return a ? a->list(fn) : Status(Errc::unavailable, name_ + " tier cannot list its entries");
  }
  Expected<VerifyReport> verify(bool fix) override {
    if (fix) return refuse("verify --fix");
    StoreAdmin* a = inner_->admin();
    if (!a) return Status(Errc::unavailable, name_ + " tier cannot verify its entries");
    return a->verify(false);
  }
  Expected<uint64_t> trim(uint64_t) override { return refuse("trim"); }
  Status clear() override { return refuse("clear"); }
  Status zero_counters() override { return refuse("zero counters"); }
  Expected<uint64_t> mark() override {
    StoreAdmin* a = inner_->admin();
    return a ? a->mark() : StoreAdmin::mark();
  }

 protected:
  std::string_view admin_name() const noexcept override { return name_; }
  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override { return inner_->get(key, access); }
  Status do_put(const Entry&) override { return refuse("put"); }
  Status do_remove(const Key&) override { return refuse("remove"); }
  TierStats do_stats() override {
    TierStats s = inner_->stats();
    s.rejected += rejected_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  Status refuse(const char* what) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return Status(Errc::read_only, std::string(what) + " refused: tier is read-only");
  }
  std::shared_ptr<Tier> inner_;
  std::string name_;
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace

std::shared_ptr<Tier> make_read_only(std::shared_ptr<Tier> inner) {
  return std::make_shared<ReadOnlyTier>(std::move(inner));
}

DiskLimits effective_limits(const DiskTierOptions& o) noexcept {
  static const DiskTierOptions d;
  DiskLimits l;
  l.max_bytes = util::or_default(o.max_bytes, d.max_bytes);
  l.max_entries = util::or_default(o.max_entries, d.max_entries);
  l.max_entry_bytes = util::or_default(o.max_entry_bytes, std::max<uint64_t>(l.max_bytes / 8, 1));
  l.low_water = o.low_water > 0 && o.low_water < 1 ? o.low_water : d.low_water;
  l.recency_batch = util::or_default(o.recency_batch, d.recency_batch);
  l.stale_temp_ms = util::or_default(o.stale_temp_ms, d.stale_temp_ms);
  return l;
}
uint64_t effective_max_bytes(const DiskTierOptions& o) noexcept { return effective_limits(o).max_bytes; }
uint64_t effective_max_entries(const DiskTierOptions& o) noexcept { return effective_limits(o).max_entries; }

std::vector<std::string> features() {
  std::vector<std::string> f;
#if KCACHE_HAVE_LMDB
  f.push_back("lmdb");
#endif
  f.push_back("files");
#if KCACHE_HAVE_ZSTD
  f.push_back("zstd");
#endif
#if KCACHE_HAVE_REDIS
  f.push_back("redis");
#endif
#if KCACHE_HAVE_LLVM
  f.push_back("llvm");
#endif
#if KCACHE_HAVE_NVRTC
  f.push_back("nvrtc");
#endif
#if KCACHE_HAVE_OPENCL
  f.push_back("opencl");
#endif
  return f;
}

const char* version_string() noexcept { return KCACHE_VERSION_STRING; }

std::string tier_stats_json(const TierStats& s) {
  util::JsonWriter w;
  w.begin_object();
  for (const auto& f : TierStats::kFields) w.field(f.name, s.*f.member);
  return w.end_object().take();
}

}  // namespace kcache

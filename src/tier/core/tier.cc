// Tier base behaviour (argument checks, generic list/verify/trim) and the
// read-only wrapper.
#include <unistd.h>

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

std::vector<Status> Tier::put_many(const std::vector<Entry>& entries) {
  std::vector<Status> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.push_back(put(e));
  return out;
}

Status Tier::list(const std::function<bool(const ListItem&)>&) {
  return Status(Errc::unavailable, std::string(name()) + " tier cannot list its entries");
}

Expected<VerifyReport> Tier::verify(bool fix) {
  // Generic: list, then get each key (get verifies).
  VerifyReport rep;
  std::vector<Key> keys;
  KCACHE_RETURN_IF_ERROR(list([&](const ListItem& it) {
    keys.push_back(it.key);
    return true;
  }));
  for (const auto& k : keys) {
    ++rep.checked;
    auto r = get(k);
    if (!r && r.error().code() == Errc::corrupt) {
      rep.bad.emplace_back(k, r.error().message());
      if (fix && remove(k).is_ok()) ++rep.removed;
    }
  }
  return rep;
}

Expected<uint64_t> Tier::mark() {
  return Status(Errc::unavailable, std::string(name()) + " tier keeps no recency records to mark");
}

Expected<uint64_t> Tier::recency_mark() {
  KCACHE_RETURN_IF_ERROR(flush());
  // Everything recorded so far carries a time <= now; everything recorded
  // from here on carries one > now.
  uint64_t now = util::now_unix_ms();
  while (util::now_unix_ms() <= now) ::usleep(100);
  return now + 1;
}

Expected<uint64_t> Tier::trim(uint64_t) { return Status(Errc::unavailable, std::string(name()) + " tier cannot trim"); }

Status Tier::clear() {
  std::vector<Key> keys;
  KCACHE_RETURN_IF_ERROR(list([&](const ListItem& it) {
    keys.push_back(it.key);
    return true;
  }));
  for (const auto& k : keys) KCACHE_RETURN_IF_ERROR(remove(k));
  return Status();
}

namespace {

class ReadOnlyTier final : public Tier {
 public:
  explicit ReadOnlyTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {
    name_ = std::string(inner_->name()) + "(ro)";
    inner_->set_repair(false);
  }
  std::string_view name() const noexcept override { return name_; }
  TierKind kind() const noexcept override { return inner_->kind(); }
  bool writable() const noexcept override { return false; }
  Status list(const std::function<bool(const ListItem&)>& fn) override { return inner_->list(fn); }
  Expected<VerifyReport> verify(bool fix) override {
    if (fix) return refuse("verify --fix");
    return inner_->verify(false);
  }
  Expected<uint64_t> trim(uint64_t) override { return refuse("trim"); }
  Expected<uint64_t> mark() override { return inner_->mark(); }
  Status clear() override { return refuse("clear"); }
  Status flush() override { return Status(); }

 protected:
  Expected<std::optional<Entry>> do_get(const Key& key, MissCount count) override { return inner_->get(key, count); }
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

uint64_t effective_max_bytes(const DiskTierOptions& o) noexcept {
  return o.max_bytes ? o.max_bytes : (uint64_t(4) << 30);
}
uint64_t effective_max_entries(const DiskTierOptions& o) noexcept { return o.max_entries ? o.max_entries : 200000; }

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
  w.begin_object()
      .field("hits", s.hits)
      .field("misses", s.misses)
      .field("puts", s.puts)
      .field("evictions", s.evictions)
      .field("corrupt", s.corrupt)
      .field("errors", s.errors)
      .field("rejected", s.rejected)
      .field("entries", s.entries)
      .field("bytes", s.bytes)
      .field("skipped", s.skipped)
      .field("dropped", s.dropped);
  return w.end_object().take();
}

}  // namespace kcache

// The Cache's tier chain: ordered lookup with promotion, stores into every
// writable tier, and the fault policy (a fault is a miss, a counter and one
// log line). See tier_chain.h.
#include "cache/tier_chain.h"

#include "util/util.h"

namespace kcache {

Source source_of(const Tier& t) noexcept {
  switch (t.kind()) {
    case TierKind::memory:
      return Source::memory;
    case TierKind::disk:
      return Source::disk;
    case TierKind::remote:
      return Source::remote;
    case TierKind::bundle:
      return Source::bundle;
    case TierKind::other:
      return Source::other;
  }
  return Source::other;
}

void TierChain::add(std::shared_ptr<Tier> t) {
  // A bundle goes after the memory tiers and the bundles already there,
  // before the stores; any other tier after the existing ones.
  size_t at = tiers_.size();
  if (t->kind() == TierKind::bundle) {
    at = 0;
    while (at < tiers_.size() && (tiers_[at]->kind() == TierKind::memory || tiers_[at]->kind() == TierKind::bundle))
      ++at;
  }
  tiers_.insert(tiers_.begin() + static_cast<std::ptrdiff_t>(at), std::move(t));
  no_writes_.insert(no_writes_.begin() + static_cast<std::ptrdiff_t>(at), std::make_unique<Off>());
}

std::optional<Entry> TierChain::lookup(const Key& key, Source* src, Access count) {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    auto r = tiers_[i]->get(key, count);
    if (!r) {
      fault(*tiers_[i], "get", r.error());
      continue;
    }
    if (!r->has_value()) continue;
    Entry e = std::move(**r);
    if (i > 0) {
      // Faster tiers outlive a pinned read: give them heap bytes, and
      // return those too so the caller holds no read transaction.
      if (e.pinned()) {
        auto d = e.detach();
        if (!d) {
          fault(*tiers_[i], "get", d.error());
          continue;
        }
        e = std::move(d).value();
      }
      for (size_t j = 0; j < i; ++j) put_into(j, e);
    }
    hits_.fetch_add(1, std::memory_order_relaxed);
    if (src) *src = source_of(*tiers_[i]);
    return e;
  }
  if (count == Access::counted) misses_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

bool TierChain::store(const Entry& e, Tiers which, bool synced) {
  bool any = false;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    bool memory = tiers_[i]->kind() == TierKind::memory;
    if (which == Tiers::all || (which == Tiers::memory) == memory) any |= put_into(i, e, synced);
  }
  return any;
}

void TierChain::sync() {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i]->kind() == TierKind::memory || !writes_to(i)) continue;
    Status st = tiers_[i]->sync();
    if (!st.is_ok()) fault(*tiers_[i], "sync", st);
  }
}

std::vector<Status> TierChain::store_group(const std::vector<Entry>& es) {
  std::vector<Status> out(es.size());
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i]->kind() == TierKind::memory || !tiers_[i]->writable()) continue;
    if (!writes_to(i)) {
      if (reports(i))
        for (auto& o : out)
          if (o.is_ok()) o = off_status(i);
      continue;
    }
    std::vector<Status> r = tiers_[i]->put_many(es);
    for (size_t k = 0; k < r.size() && k < out.size(); ++k)
      if (!took(i, r[k]) && reports(i) && out[k].is_ok()) out[k] = r[k].is_ok() ? off_status(i) : r[k];
  }
  return out;
}

bool TierChain::has_slow_writable() const {
  // Writes turned off by a full disk or a read-only folder count: the
  // committer then reports each entry as not written (store_group).
  for (size_t i = 0; i < tiers_.size(); ++i)
    if (tiers_[i]->kind() != TierKind::memory && tiers_[i]->writable()) return true;
  return false;
}

bool TierChain::writes_to(size_t i) const {
  if (!tiers_[i]->writable()) return false;
  const Off& off = *no_writes_[i];
  if (!off.on.load(std::memory_order_relaxed)) return true;
  // Turned off by a full disk: tried again once the wait is over.
  uint64_t until = off.until_us.load(std::memory_order_relaxed);
  return until != 0 && util::now_mono_us() >= until;
}

bool TierChain::reports(size_t i) const {
  TierKind k = tiers_[i]->kind();
  return k != TierKind::memory && k != TierKind::remote;
}

Status TierChain::off_status(size_t i) const {
  Errc why = no_writes_[i]->why.load(std::memory_order_relaxed);
  std::string name(tiers_[i]->name());
  if (why == Errc::no_space) return Status(why, "writes to " + name + " are paused: its file system is full");
  return Status(why == Errc::ok ? Errc::read_only : why, "writes to " + name + " are off for this process");
}

Status TierChain::flush() {
  Status first;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    Status st = tiers_[i]->flush();
    if (st.is_ok()) continue;
    fault(*tiers_[i], "flush", st);
    if (first.is_ok() && reports(i)) first = st;
  }
  return first;
}

void TierChain::fault(const Tier& t, const char* op, const Status& st) {
  faults_.fetch_add(1, std::memory_order_relaxed);
  // A remote tier logs its own faults, one line per outage (kcache/remote.h).
  if (t.kind() == TierKind::remote) return;
  if (st.code() == Errc::unavailable) {
    std::lock_guard lk(said_mu_);
    if (!said_unavailable_.insert(&t).second) return;
  }
  if (std::string_view(op) != "get" && (st.code() == Errc::not_found || st.code() == Errc::io_error)) {
    std::lock_guard lk(said_mu_);
    if (!said_.emplace(&t, op, st.code()).second) return;
    in_episode_.store(true, std::memory_order_relaxed);
  }
  KCACHE_LOG(LogLevel::warn, "%.*s %s: %s (treated as a miss)", static_cast<int>(t.name().size()), t.name().data(), op,
             st.to_string().c_str());
}

bool TierChain::put_into(size_t i, const Entry& e, bool synced) {
  if (!writes_to(i)) return false;
  return took(i, synced ? tiers_[i]->put(e) : tiers_[i]->put_unsynced(e));
}

bool TierChain::took(size_t i, const Status& st) {
  Tier& t = *tiers_[i];
  Off& off = *no_writes_[i];
  if (st.is_ok()) {
    if (off.on.load(std::memory_order_relaxed) && off.on.exchange(false))
      KCACHE_LOG(LogLevel::warn, "%.*s put: writes to this tier resumed", static_cast<int>(t.name().size()),
                 t.name().data());
    if (in_episode_.load(std::memory_order_relaxed)) {
      // The tier takes writes again: its next store-wide fault is said.
      std::lock_guard lk(said_mu_);
      for (auto it = said_.begin(); it != said_.end();) it = std::get<0>(*it) == &t ? said_.erase(it) : std::next(it);
      in_episode_.store(!said_.empty(), std::memory_order_relaxed);
    }
    return true;
  }
  if (st.code() == Errc::no_space || st.code() == Errc::read_only) {
    // A full disk pauses writes for a while (a trim, here or in another
    // process, may make room); a read-only store ends them.
    off.why.store(st.code(), std::memory_order_relaxed);
    off.until_us.store(st.code() == Errc::no_space ? util::now_mono_us() + kRetryFullUs : 0, std::memory_order_relaxed);
    if (!off.on.exchange(true)) {
      faults_.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::warn, "%.*s put: %s; %s", static_cast<int>(t.name().size()), t.name().data(),
                 st.to_string().c_str(),
                 st.code() == Errc::no_space ? "writes to this tier are paused, and tried again every 5 s"
                                             : "writes to this tier are off for this process");
    }
    return false;
  }
  if (off.on.load(std::memory_order_relaxed)) return false;
  if (st.code() == Errc::too_large) {
    KCACHE_LOG(LogLevel::info, "%.*s put: %s", static_cast<int>(t.name().size()), t.name().data(),
               st.to_string().c_str());
    return false;
  }
  fault(t, "put", st);
  return false;
}

}  // namespace kcache

// The shared statistics of a remote tier (shared_stats.h).
#include "tier/remote/shared_stats.h"

namespace kcache::remote_stats {

namespace {

std::string_view field_name(uint64_t TierStats::*f) {
  for (const auto& x : TierStats::kFields)
    if (x.member == f) return x.name;
  return {};
}

}  // namespace

std::vector<std::pair<std::string, uint64_t>> Batch::named() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 0; i < totals.size(); ++i)
    if (totals[i]) out.emplace_back(std::string(field_name(RemoteServerStats::kShared[i])), totals[i]);
  for (const auto& [name, c] : ns) {
    if (c.hits) out.emplace_back("ns:" + name + ":hits", c.hits);
    if (c.puts) out.emplace_back("ns:" + name + ":puts", c.puts);
    if (c.put_bytes) out.emplace_back("ns:" + name + ":put_bytes", c.put_bytes);
  }
  return out;
}

void Unsent::add(uint64_t TierStats::*field, uint64_t n) noexcept {
  for (auto f : RemoteServerStats::kShared)
    if (f == field) totals_.add(field, n);
}

void Unsent::note(const Entry& e, bool put, uint64_t value_bytes) {
  const std::string& ns = e.manifest().ns;
  if (ns.empty() || ns.size() > kMaxNamespaceLen) return;
  std::lock_guard g(mu_);
  auto it = ns_.find(ns);
  if (it == ns_.end()) {
    if (ns_.size() >= kMaxNamespaces) return;
    it = ns_.emplace(ns, NsCounts{}).first;
  }
  if (put) {
    ++it->second.puts;
    it->second.put_bytes += value_bytes;
  } else {
    ++it->second.hits;
  }
}

Batch Unsent::take() {
  Batch b;
  for (size_t i = 0; i < b.totals.size(); ++i) b.totals[i] = totals_.take(RemoteServerStats::kShared[i]);
  std::lock_guard g(mu_);
  b.ns.swap(ns_);
  return b;
}

void Unsent::give_back(const Batch& b) {
  for (size_t i = 0; i < b.totals.size(); ++i)
    if (b.totals[i]) totals_.add(RemoteServerStats::kShared[i], b.totals[i]);
  std::lock_guard g(mu_);
  for (const auto& [name, c] : b.ns) {
    auto& to = ns_[name];
    to.hits += c.hits;
    to.puts += c.puts;
    to.put_bytes += c.put_bytes;
  }
}

RemoteServerStats report(const std::vector<std::pair<std::string, uint64_t>>& named, const RemoteStored& stored) {
  RemoteServerStats out;
  out.entries = stored.entries;
  out.bytes = stored.bytes;
  out.complete = stored.complete;
  std::map<std::string, RemoteServerStats::Namespace> ns;
  for (const auto& [name, v] : named) {
    if (name == "since_ms") {
      out.since_unix_ms = v;
    } else if (name.starts_with("ns:")) {
      const size_t colon = name.rfind(':');
      if (colon <= 3) continue;
      std::string n = name.substr(3, colon - 3), what = name.substr(colon + 1);
      auto& to = ns[n];
      to.ns = n;
      if (what == "hits") to.hits = v;
      if (what == "puts") to.puts = v;
      if (what == "put_bytes") to.put_bytes = v;
    } else {
      for (auto f : RemoteServerStats::kShared)
        if (field_name(f) == name) out.counters.*f = v;
    }
  }
  for (auto& [n, c] : ns) out.namespaces.push_back(std::move(c));
  return out;
}

}  // namespace kcache::remote_stats

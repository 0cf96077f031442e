// kcache tool — the commands of the whole store: ls, stats, verify, trim,
// clear. ls, verify, trim and clear act on the disk store only (a remote
// cannot list its entries); stats shows every tier.
#include <ftw.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <optional>

#include "cli.h"
#include "lease/table_layout.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

const Reach kDiskOnly{.create = false, .remote = false, .honour_disable = false};

// Every entry of the disk store; an absent store has none.
Status list_disk(const Ctx& c, std::vector<ListItem>* items) {
  if (!c.store.admin) return Status();
  return c.store.admin->list([&](const ListItem& it) {
    items->push_back(it);
    return true;
  });
}

// A command that acts on the store (verify, trim, clear) and got no disk
// tier: fine when there is no store yet (nothing to do), exit 3 when one
// exists but could not be opened (read-only, another user's, damaged), so
// "all good" or "removed 0 entries" never stands for a store it never saw.
int unopened_store(const Ctx& c, const std::string& nothing_done) {
  struct stat st;
  if (c.store.admin || ::stat(c.store.where.path.c_str(), &st) != 0) return kExitOk;
  return c.fail(kExitError, disk_failure(c) + "; nothing " + nothing_done);
}

}  // namespace

int cmd_ls(Ctx& c) {
  if (int rc = open_tiers(c, {.create = false, .remote = false, .honour_disable = false, .inspect = true})) return rc;
  std::vector<ListItem> items;
  Status st = list_disk(c, &items);
  if (!st.is_ok()) return c.fail(kExitError, "listing " + c.store.where.path + ": " + st.to_string());
  std::sort(items.begin(), items.end(), [](const ListItem& a, const ListItem& b) {
    return a.last_use_ms != b.last_use_ms ? a.last_use_ms > b.last_use_ms : a.key < b.key;
  });
  uint64_t total = 0;
  for (const auto& it : items) total += it.size;
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("count", items.size()).field("bytes", total).key("entries").begin_array();
    for (const auto& it : items)
      w.begin_object()
          .field("key", it.key.hex())
          .field("size", it.size)
          .field("last_use_ms", it.last_use_ms)
          .end_object();
    return c.out(w.end_array().end_object().take() + "\n");
  }
  std::string out = fmt("%-32s  %10s  %s\n", "KEY", "SIZE", "LAST USE");
  for (const auto& it : items)
    out += fmt("%-32s  %10s  %s\n", it.key.hex().c_str(), util::format_size(it.size).c_str(),
               format_time(it.last_use_ms).c_str());
  out += fmt("%zu entr%s, %s\n", items.size(), items.size() == 1 ? "y" : "ies", util::format_size(total).c_str());
  return c.out(out);
}

namespace {

uint64_t g_disk_used = 0;
int add_blocks(const char*, const struct stat* st, int type, struct FTW*) {
  if (type == FTW_F) g_disk_used += static_cast<uint64_t>(st->st_blocks) * 512;
  return 0;
}

// The disk space the store's files take (allocated blocks, as du counts
// them): the store's folder and the miss journal beside it.
uint64_t disk_used(const DiskStore& where) {
  g_disk_used = 0;
  ::nftw(where.path.c_str(), add_blocks, 16, FTW_PHYS);
  struct stat st;
  if (::stat((where.path + ".misses").c_str(), &st) == 0) g_disk_used += static_cast<uint64_t>(st.st_blocks) * 512;
  return g_disk_used;
}

}  // namespace

int cmd_stats(Ctx& c) {
  const bool zero = c.args.has("--zero");
  bool metrics = false;
  if (const std::string* f = c.args.get("--format")) {
    if (*f == "openmetrics" || *f == "prometheus")
      metrics = true;
    else if (*f == "json")
      c.json = true;
    else if (*f != "text")
      return usage_error("stats", "--format '" + *f + "' is not text, json or openmetrics");
    if (metrics && c.json) return usage_error("stats", "--format openmetrics and --json do not go together");
  }
  // --zero writes the store's counters; otherwise stats only looks.
  if (int rc = open_tiers(c, {.create = false, .remote = true, .honour_disable = false, .inspect = !zero})) return rc;
  const Opened& s = c.store;
  TierStats t;
  if (s.disk) t = s.disk->stats();
  const uint64_t used = s.disk ? disk_used(s.where) : 0;
  // The counters as printed are the ones zeroed: counts made meanwhile by
  // other processes are kept.
  if (zero && s.admin) {
    if (Status st = s.admin->zero_counters(); !st.is_ok())
      return c.fail(kExitError, "zeroing the counters of " + s.where.path + ": " + st.to_string());
  }
  const std::string engine(engine_name(s.where.engine));
  uint64_t max_bytes = effective_max_bytes(s.options.disk), max_entries = effective_max_entries(s.options.disk);
  uint64_t lookups = t.hits + t.misses;
  double rate = lookups ? static_cast<double>(t.hits) / static_cast<double>(lookups) : 0.0;
  // Every tier after the disk store: the remote (its counters are this
  // process's own, so mostly zero here; the server keeps none).
  std::vector<std::pair<std::shared_ptr<Tier>, TierStats>> others;
  for (const auto& tier : s.cache->tiers())
    if (tier != s.disk) others.emplace_back(tier, tier->stats());
  // A remote is asked once (a peek), so a refused or unreachable one never
  // looks healthy; one that could not be set up is said too.
  std::optional<RemoteProbe> probe;
  if (s.remote) probe = probe_remote(*s.remote);
  std::string remote_down;
  if (!s.options.remote_url.empty() && !s.remote) remote_down = "not set up: " + s.remote_error.to_string();
  if (probe && !probe->ok) remote_down = "unreachable: " + probe->error;
  if (metrics) {
    MetricsInput m;
    m.store = s.where.path;
    m.store_up = s.disk != nullptr;
    m.disk_used = used;
    m.max_bytes = max_bytes;
    m.max_entries = max_entries;
    if (s.disk) m.tiers.push_back({std::string(s.disk->name()), std::string(tier_kind_name(s.disk->kind())), t});
    for (const auto& [tier, ts] : others) {
      MetricsTier mt{std::string(tier->name()), std::string(tier_kind_name(tier->kind())), ts};
      if (tier == s.remote && probe) {
        mt.probed = true;
        mt.up = probe->ok;
        mt.latency_s = static_cast<double>(probe->rtt_us) / 1e6;
      }
      m.tiers.push_back(std::move(mt));
    }
    // Printed is done: a remote's state is kcache_tier_up, and a scrape
    // file replaced only on success must say when the remote went down.
    return c.out(openmetrics_text(m));
  }
  if (c.json) {
    util::JsonWriter w;
    w.begin_object();
    for (const auto& f : TierStats::kFields) w.field(f.name, t.*f.member);
    w.key("hit_rate")
        .number(rate, 4)
        .field("max_bytes", max_bytes)
        .field("max_entries", max_entries)
        .field("tier", s.disk ? std::string(s.disk->name()) : engine)
        .field("engine", engine)
        .field("dir", s.where.dir)
        .field("path", s.where.path)
        .field("exists", s.disk != nullptr)
        .field("disk_used", used)
        .field("zeroed", zero && s.admin != nullptr)
        .key("tiers")
        .begin_array();
    if (s.disk)
      w.begin_object()
          .field("name", s.disk->name())
          .field("kind", tier_kind_name(s.disk->kind()))
          .key("stats")
          .raw(tier_stats_json(t))
          .end_object();
    for (const auto& [tier, ts] : others) {
      w.begin_object().field("name", tier->name()).field("kind", tier_kind_name(tier->kind()));
      if (tier == s.remote && probe) {
        w.field("reachable", probe->ok).field("rtt_us", probe->rtt_us);
        if (!probe->ok) w.field("error", probe->error);
      }
      w.key("stats").raw(tier_stats_json(ts)).end_object();
    }
    w.end_array();
    if (!remote_down.empty()) w.field("remote_error", remote_down);
    if (int rc = c.out(w.end_object().take() + "\n")) return rc;
    return remote_down.empty() ? kExitOk : c.fail(kExitError, "the remote of KCACHE_REMOTE is " + remote_down);
  }
  std::string out;
  out += fmt("store       %s (%s engine)%s\n", s.where.path.c_str(), engine.c_str(), s.disk ? "" : ", not created yet");
  out += fmt("entries     %" PRIu64 " of %" PRIu64 " allowed\n", t.entries, max_entries);
  out +=
      fmt("size        %s of %s (%.1f%%)\n", util::format_size(t.bytes).c_str(), util::format_size(max_bytes).c_str(),
          100.0 * static_cast<double>(t.bytes) / static_cast<double>(max_bytes));
  out += fmt("disk used   %s (the store's files)\n", util::format_size(used).c_str());
  // Entries and bytes are shown above, against their limits.
  for (const auto& f : TierStats::kFields) {
    if (f.member == &TierStats::entries || f.member == &TierStats::bytes) continue;
    out += fmt("%-11s %" PRIu64 "\n", std::string(f.name).c_str(), t.*f.member);
    if (f.member == &TierStats::misses) out += fmt("hit rate    %.1f%%\n", 100.0 * rate);
  }
  for (const auto& [tier, ts] : others) {
    std::string counts;
    for (const auto& f : TierStats::kFields)
      counts += fmt("%s%" PRIu64 " %s", counts.empty() ? "" : ", ", ts.*f.member, std::string(f.name).c_str());
    std::string state;
    if (tier == s.remote && probe)
      state = probe->ok ? fmt("reachable (round trip %.2f ms); ", static_cast<double>(probe->rtt_us) / 1000.0)
                        : "UNREACHABLE (" + probe->error + "); ";
    out += fmt("%-11s %s: %s%s (this process)\n", std::string(tier_kind_name(tier->kind())).c_str(),
               std::string(tier->name()).c_str(), state.c_str(), counts.c_str());
  }
  if (!s.options.remote_url.empty() && !s.remote)
    out += "remote      NOT SET UP (" + s.remote_error.to_string() + ")\n";
  if (zero && s.admin) out += "counters zeroed\n";
  if (int rc = c.out(out)) return rc;
  // Everything is printed; the status says the cache is not all there.
  return remote_down.empty() ? kExitOk : c.fail(kExitError, "the remote of KCACHE_REMOTE is " + remote_down);
}

int cmd_verify(Ctx& c) {
  bool fix = c.args.has("--fix");
  // Without --fix verify only reads; with it, it removes what fails.
  if (int rc =
          open_tiers(c, {.create = false, .remote = false, .honour_disable = false, .inspect = !fix, .leases = false}))
    return rc;
  if (int rc = unopened_store(c, fix ? "verified or removed" : "verified")) return rc;
  VerifyReport rep;
  if (c.store.admin) {
    auto r = c.store.admin->verify(fix);
    if (!r) return c.fail(kExitError, "verifying " + c.store.where.path + ": " + r.error().to_string());
    rep = std::move(r).value();
  }
  // The lease table beside an LMDB store: damage there degrades
  // cross-process single-flight, and --fix makes it whole.
  Status found, leases;
  if (c.store.disk && c.store.where.engine == Engine::lmdb) {
    found = lease::table::check(c.store.where.path, /*fix=*/false);
    leases = found.is_ok() || !fix ? found : lease::table::check(c.store.where.path, /*fix=*/true);
  }
  std::string out;
  if (c.json) {
    util::JsonWriter w;
    w.begin_object()
        .field("checked", rep.checked)
        .field("bad_count", rep.bad.size())
        .field("removed", rep.removed)
        .field("fix", fix)
        .field("lease_table", found.is_ok() ? std::string("ok") : found.message())
        .field("lease_table_repaired", !found.is_ok() && leases.is_ok())
        .key("bad")
        .begin_array();
    for (const auto& [k, why] : rep.bad) w.begin_object().field("key", k.hex()).field("reason", why).end_object();
    out = w.end_array().end_object().take() + "\n";
  } else {
    for (const auto& [k, why] : rep.bad) out += "bad " + k.hex() + "  " + why + "\n";
    out += "checked " + entries_word(rep.checked) + ": " +
           (rep.bad.empty() ? "all good" : std::to_string(rep.bad.size()) + " bad");
    if (fix && !rep.bad.empty()) out += ", " + std::to_string(rep.removed) + " removed";
    out += "\n";
    if (!found.is_ok()) out += "lease table: " + found.message() + (leases.is_ok() ? "; repaired\n" : "\n");
  }
  if (int rc = c.out(out)) return rc;
  if (fix && rep.removed < rep.bad.size())
    return c.fail(kExitError, std::to_string(rep.bad.size() - rep.removed) + " bad entries could not be removed");
  if (!leases.is_ok() && fix) return c.fail(kExitError, "the lease table could not be repaired: " + leases.message());
  // Bad entries found is exit 1 even when all were removed: scripts notice.
  return rep.bad.empty() && found.is_ok() ? kExitOk : kExitMiss;
}

int cmd_trim(Ctx& c) {
  if (int rc = open_tiers(c, kDiskOnly)) return rc;
  if (int rc = unopened_store(c, "evicted")) return rc;
  uint64_t limit = effective_max_bytes(c.store.options.disk);
  if (const std::string* v = c.args.get("--max-size")) {
    auto s = util::parse_size(*v);
    if (!s) return usage_error("trim", "--max-size '" + *v + "' is not a size (e.g. 500M, 2G)");
    limit = *s;
  }
  uint64_t evicted = 0;
  TierStats t;
  if (c.store.admin) {
    auto r = c.store.admin->trim(limit);
    if (!r) return c.fail(kExitError, "trimming " + c.store.where.path + ": " + r.error().to_string());
    evicted = *r;
    t = c.store.disk->stats();
  }
  if (c.json) {
    util::JsonWriter w;
    w.begin_object()
        .field("evicted", evicted)
        .field("entries", t.entries)
        .field("bytes", t.bytes)
        .field("max_bytes", limit);
    return c.out(w.end_object().take() + "\n");
  }
  return c.out("evicted " + entries_word(evicted) + "; now " + util::format_size(t.bytes) + " in " +
               entries_word(t.entries) + " (limit " + util::format_size(limit) + ")\n");
}

int cmd_clear(Ctx& c) {
  if (int rc = open_tiers(c, kDiskOnly)) return rc;
  if (int rc = unopened_store(c, "removed")) return rc;
  std::vector<ListItem> items;
  Status st = list_disk(c, &items);
  if (st.is_ok() && c.store.admin) st = c.store.admin->clear();
  if (!st.is_ok()) return c.fail(kExitError, "clearing " + c.store.where.path + ": " + st.to_string());
  if (c.json) {
    util::JsonWriter w;
    return c.out(w.begin_object().field("removed", items.size()).end_object().take() + "\n");
  }
  return c.out("removed " + entries_word(items.size()) + "\n");
}

}  // namespace kcache::cli

// kcache tool — the commands of the whole store: ls, stats, verify, trim,
// clear. ls, verify, trim and clear act on the disk store only (a remote
// cannot list its entries); stats shows every tier.
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <optional>

#include "cli.h"
#include "kcache/evict.h"
#include "kcache/remote.h"
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

// Since when the store's counters count: when `stats --zero` last zeroed
// them (written to PATH.zeroed, beside the store's miss journal), else when
// the store was made (its folder's birth time, where the file system keeps
// one). unix_ms 0: not known.
// How long `stats` counts the values a remote stores before it says how
// many it counted so far.
constexpr uint64_t kServerScanBudgetMs = 5000;

struct CountersSince {
  uint64_t unix_ms = 0;
  const char* how = "unknown";  // "zeroed", "created" or "unknown"
};

std::string zeroed_file(const DiskStore& where) { return where.path + ".zeroed"; }

CountersSince counters_since(const DiskStore& where) {
  if (auto t = util::read_file(zeroed_file(where), 64)) {
    uint64_t ms = std::strtoull(t->c_str(), nullptr, 10);
    if (ms) return {ms, "zeroed"};
  }
  struct statx sx;
  if (::statx(AT_FDCWD, where.path.c_str(), 0, STATX_BTIME, &sx) == 0 && (sx.stx_mask & STATX_BTIME))
    return {static_cast<uint64_t>(sx.stx_btime.tv_sec) * 1000 + sx.stx_btime.tv_nsec / 1000000, "created"};
  return {};
}

}  // namespace

int cmd_stats(Ctx& c) {
  const bool zero = c.args.has("--zero");
  bool metrics = false;
  MetricsFormat metrics_format = MetricsFormat::openmetrics;
  if (const std::string* f = c.args.get("--format")) {
    if (*f == "openmetrics" || *f == "prometheus") {
      metrics = true;
      if (*f == "prometheus") metrics_format = MetricsFormat::prometheus;
    } else if (*f == "json") {
      c.json = true;
    } else if (*f != "text") {
      return usage_error("stats", "--format '" + *f + "' is not text, json, openmetrics or prometheus");
    }
    if (metrics && c.json) return usage_error("stats", "--format " + *f + " and --json do not go together");
  }
  // --zero writes the store's counters; otherwise stats only looks.
  if (int rc = open_tiers(
          c, {.create = false, .remote = true, .honour_disable = false, .inspect = !zero, .reports_remote = true}))
    return rc;
  const Opened& s = c.store;
  TierStats t;
  if (s.disk) t = s.disk->stats();
  const uint64_t used = s.disk ? disk_used(s.where) : 0;
  // The counters as printed are the ones zeroed: counts made meanwhile by
  // other processes are kept.
  const CountersSince since = s.disk ? counters_since(s.where) : CountersSince{};
  if (zero && s.admin) {
    if (Status st = s.admin->zero_counters(); !st.is_ok())
      return c.fail(kExitError, "zeroing the counters of " + s.where.path + ": " + st.to_string());
    if (Status st = util::write_file_atomic(zeroed_file(s.where), std::to_string(util::now_unix_ms()) + "\n");
        !st.is_ok())
      return c.fail(kExitError, "recording when the counters of " + s.where.path + " were zeroed: " + st.to_string());
  }
  // What the entries take before and after compression: every entry is
  // read, so only when asked.
  std::optional<CompressionStats> comp;
  if (c.args.has("--compression") && s.disk) {
    auto r = compression_stats(*s.disk);
    if (!r) return c.fail(kExitError, "reading the entries of " + s.where.path + ": " + r.error().to_string());
    comp = *r;
  }
  const std::string engine(engine_name(s.where.engine));
  uint64_t max_bytes = effective_max_bytes(s.options.disk), max_entries = effective_max_entries(s.options.disk);
  uint64_t lookups = t.hits + t.misses;
  double rate = lookups ? static_cast<double>(t.hits) / static_cast<double>(lookups) : 0.0;
  // Every tier after the disk store: the remote (its counters are this
  // process's own, so mostly zero here; what the server keeps for all its
  // clients is `server` below).
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
  // What the server keeps for every client: its counters and a count of
  // its values (read before --zero zeroes the counters).
  std::optional<RemoteServerStats> server;
  std::string server_error;
  bool server_zeroed = false;
  if (auto rt = std::dynamic_pointer_cast<RemoteTier>(s.remote); rt && probe && probe->ok) {
    if (auto r = rt->server_stats(kServerScanBudgetMs))
      server = std::move(r).value();
    else
      server_error = r.error().to_string();
    if (zero && server && rt->writable()) {
      if (Status st = rt->zero_server_stats(); !st.is_ok())
        return c.fail(kExitError, "zeroing the counters of " + std::string(rt->name()) + ": " + st.to_string());
      server_zeroed = true;
    }
  }
  if (metrics) {
    MetricsInput m;
    m.store = s.where.path;
    m.store_up = s.disk != nullptr;
    m.disk_used = used;
    m.max_bytes = max_bytes;
    m.max_entries = max_entries;
    m.counters_since_ms = since.unix_ms;
    if (comp) {
      m.compression = true;
      m.compressed_entries = comp->compressed_entries;
      m.payload_bytes = comp->payload_bytes;
    }
    if (s.disk) m.tiers.push_back({std::string(s.disk->name()), std::string(tier_kind_name(s.disk->kind())), t});
    for (const auto& [tier, ts] : others) {
      MetricsTier mt{std::string(tier->name()), std::string(tier_kind_name(tier->kind())), ts};
      if (tier == s.remote && probe) {
        mt.probed = true;
        mt.up = probe->ok;
        mt.latency_s = static_cast<double>(probe->rtt_us) / 1e6;
      }
      if (tier == s.remote && server) {
        // Every client's counts and the values stored, in place of this
        // process's own (which are about zero).
        for (auto f : RemoteServerStats::kShared) mt.stats.*f = server->counters.*f;
        mt.stats.entries = server->entries;
        mt.stats.bytes = server->bytes;
        mt.shared = true;
        mt.counters_since_ms = server->since_unix_ms;
        mt.namespaces = server->namespaces;
      }
      m.tiers.push_back(std::move(mt));
    }
    // Printed is done: a remote's state is kcache_tier_up, and a scrape
    // file replaced only on success must say when the remote went down.
    return c.out(metrics_text(m, metrics_format));
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
        .field("counters_since_ms", since.unix_ms)
        .field("counters_since", since.how);
    if (comp)
      w.key("compression")
          .begin_object()
          .field("entries", comp->entries)
          .field("compressed_entries", comp->compressed_entries)
          .field("stored_bytes", comp->stored_bytes)
          .field("payload_bytes", comp->payload_bytes)
          .end_object();
    w.key("tiers").begin_array();
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
      if (tier == s.remote && server) {
        w.key("server")
            .begin_object()
            .field("entries", server->entries)
            .field("bytes", server->bytes)
            .field("complete", server->complete)
            .field("counters_since_ms", server->since_unix_ms);
        for (auto f : RemoteServerStats::kShared)
          for (const auto& fd : TierStats::kFields)
            if (fd.member == f) w.field(fd.name, server->counters.*f);
        w.field("zeroed", server_zeroed).key("namespaces").begin_array();
        for (const auto& n : server->namespaces)
          w.begin_object()
              .field("namespace", n.ns)
              .field("hits", n.hits)
              .field("puts", n.puts)
              .field("put_bytes", n.put_bytes)
              .end_object();
        w.end_array().end_object();
      } else if (tier == s.remote && !server_error.empty()) {
        w.field("server_error", server_error);
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
  if (comp)
    out += fmt(
        "compressed  %" PRIu64 " of %" PRIu64 " entries; %s stored for %s of artifacts (%.2fx)\n",
        comp->compressed_entries, comp->entries, util::format_size(comp->stored_bytes).c_str(),
        util::format_size(comp->payload_bytes).c_str(),
        comp->stored_bytes ? static_cast<double>(comp->payload_bytes) / static_cast<double>(comp->stored_bytes) : 1.0);
  if (since.unix_ms)
    out += fmt("counters    since %s (%s)\n", format_time(since.unix_ms).c_str(),
               std::string_view(since.how) == "zeroed" ? "zeroed" : "the store was made");
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
    if (tier != s.remote) continue;
    if (server) {
      const TierStats& sc = server->counters;
      out += fmt("  stored    %s%" PRIu64 " entries, %s (counted on the server)\n", server->complete ? "" : "at least ",
                 server->entries, util::format_size(server->bytes).c_str());
      out += fmt("  clients   %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " puts, %" PRIu64 " corrupt, %" PRIu64
                 " rejected (every client%s)\n",
                 sc.hits, sc.misses, sc.puts, sc.corrupt, sc.rejected,
                 server->since_unix_ms ? (", since " + format_time(server->since_unix_ms)).c_str() : "");
      for (const auto& n : server->namespaces)
        out += fmt("  namespace %s: %" PRIu64 " hits, %" PRIu64 " puts (%s)\n", n.ns.c_str(), n.hits, n.puts,
                   util::format_size(n.put_bytes).c_str());
      if (server_zeroed) out += "  clients' counters zeroed\n";
    } else if (!server_error.empty()) {
      out += "  server statistics not read: " + server_error + "\n";
    }
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
  // --older-than and --namespace choose entries to remove (both: entries
  // matching both); then a size limit applies only when --max-size is
  // given. Without them: least recently used entries down to the limit.
  EvictSelection sel;
  if (const std::string* v = c.args.get("--older-than")) {
    auto ms = parse_duration_ms(*v);
    if (!ms || *ms == 0)
      return usage_error("trim", "--older-than '" + *v + "' is not a duration (e.g. 90s, 30m, 12h, 7d, 2w)");
    sel.older_than_ms = *ms;
  }
  if (const std::string* v = c.args.get("--namespace")) sel.ns = *v;
  const bool selecting = sel.older_than_ms != 0 || sel.ns.has_value();
  std::optional<uint64_t> limit;
  if (const std::string* v = c.args.get("--max-size")) {
    auto s = util::parse_size(*v);
    if (!s) return usage_error("trim", "--max-size '" + *v + "' is not a size (e.g. 500M, 2G)");
    // As `config set max_size 0` is refused: emptying is `kcache clear`.
    if (*s == 0) return usage_error("trim", "--max-size 0 would evict every entry (kcache clear does that)");
    limit = *s;
  }
  if (int rc = open_tiers(c, kDiskOnly)) return rc;
  if (int rc = unopened_store(c, "evicted")) return rc;
  if (!selecting && !limit) limit = effective_max_bytes(c.store.options.disk);
  uint64_t evicted = 0;
  TierStats t;
  if (c.store.admin) {
    if (selecting) {
      auto r = evict_entries(*c.store.disk, sel);
      if (!r) return c.fail(kExitError, "evicting from " + c.store.where.path + ": " + r.error().to_string());
      evicted += r->evicted;
    }
    if (limit) {
      auto r = c.store.admin->trim(*limit);
      if (!r) return c.fail(kExitError, "trimming " + c.store.where.path + ": " + r.error().to_string());
      evicted += *r;
    }
    t = c.store.disk->stats();
  }
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("evicted", evicted).field("entries", t.entries).field("bytes", t.bytes);
    if (limit) w.field("max_bytes", *limit);
    return c.out(w.end_object().take() + "\n");
  }
  return c.out("evicted " + entries_word(evicted) + "; now " + util::format_size(t.bytes) + " in " +
               entries_word(t.entries) + (limit ? " (limit " + util::format_size(*limit) + ")" : std::string()) + "\n");
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

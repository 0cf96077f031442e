// kcache tool — `stats --format openmetrics`: the statistics in the
// OpenMetrics text format (1.0.0): a counter family is named without
// `_total`, its samples with it, and the text ends with "# EOF".
// `stats --format prometheus`: the Prometheus text exposition format
// (0.0.4), where a counter's family is named as its samples (`*_total`) and
// there is no "# EOF". Either is written for node_exporter's textfile
// collector (which reads 0.0.4):
//   kcache stats --format prometheus > /var/lib/node_exporter/kcache.prom.$$ &&
//     mv /var/lib/node_exporter/kcache.prom.$$ /var/lib/node_exporter/kcache.prom
#include <algorithm>
#include <cinttypes>
#include <string>
#include <vector>

#include "cli.h"

namespace kcache::cli {

namespace {

// A label value with \, " and newline escaped, as the format wants.
std::string escape_label(std::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\')
      out += "\\\\";
    else if (ch == '"')
      out += "\\\"";
    else if (ch == '\n')
      out += "\\n";
    else
      out += ch;
  }
  return out;
}

struct Family {
  const char* name;  // without the kcache_ prefix, nor a counter's _total
  const char* type;  // counter or gauge
  const char* help;
};

// Where each TierStats field goes: its family, or none.
struct FieldMetric {
  uint64_t TierStats::*member;
  Family family;
};

const FieldMetric kFieldMetrics[] = {
    {&TierStats::hits, {"hits", "counter", "Lookups the tier answered."}},
    {&TierStats::misses, {"misses", "counter", "Lookups the tier did not answer."}},
    {&TierStats::puts, {"puts", "counter", "Entries written to the tier (each compile that was stored is one put)."}},
    {&TierStats::evictions, {"evictions", "counter", "Entries removed to stay under the limits."}},
    {&TierStats::corrupt, {"corrupt", "counter", "Entries that failed verification (each a miss)."}},
    {&TierStats::errors,
     {"errors", "counter", "Faults other than corrupt entries: I/O, full disk, a remote that did not answer."}},
    {&TierStats::rejected, {"rejected", "counter", "Writes the tier refused."}},
    {&TierStats::skipped,
     {"skipped", "counter", "Remote calls not made while the remote was switched off after failures."}},
    {&TierStats::dropped, {"dropped", "counter", "Background remote writes dropped."}},
    {&TierStats::entries, {"entries", "gauge", "Entries stored now."}},
    {&TierStats::bytes, {"bytes", "gauge", "Encoded bytes of the entries stored now."}},
};

}  // namespace

std::string metrics_text(const MetricsInput& in, MetricsFormat format) {
  std::string out;
  const bool om = format == MetricsFormat::openmetrics;
  // The family's name: a counter's carries _total in 0.0.4 only.
  auto family_name = [&](const Family& f) {
    return std::string(f.name) + (!om && std::string_view(f.type) == "counter" ? "_total" : "");
  };
  auto family = [&](const Family& f) {
    const std::string n = family_name(f);
    out += fmt("# HELP kcache_%s %s\n# TYPE kcache_%s %s\n", n.c_str(), f.help, n.c_str(), f.type);
  };
  // A sample's name: a counter's always ends in _total.
  auto sample_name = [](const Family& f) {
    return std::string(f.name) + (std::string_view(f.type) == "counter" ? "_total" : "");
  };
  auto labels = [&](const MetricsTier& t) {
    return "{tier=\"" + escape_label(t.name) + "\",kind=\"" + escape_label(t.kind) + "\",store=\"" +
           escape_label(in.store) + "\"}";
  };
  for (const auto& fm : kFieldMetrics) {
    family(fm.family);
    const bool counter = std::string_view(fm.family.type) == "counter";
    for (const auto& t : in.tiers) {
      out += fmt("kcache_%s%s %" PRIu64 "\n", sample_name(fm.family).c_str(), labels(t).c_str(), t.stats.*fm.member);
      // OpenMetrics' _created: when the disk store's counters started
      // (made or zeroed), or the server's counters of every client; a
      // remote's own counts are this process's only.
      const bool kept = std::find(RemoteServerStats::kShared.begin(), RemoteServerStats::kShared.end(), fm.member) !=
                        RemoteServerStats::kShared.end();
      const uint64_t created = t.kind == "disk" ? in.counters_since_ms : t.shared && kept ? t.counters_since_ms : 0;
      if (om && counter && created)
        out +=
            fmt("kcache_%s_created%s %.3f\n", fm.family.name, labels(t).c_str(), static_cast<double>(created) / 1000.0);
    }
  }
  // Per key namespace, what the server keeps for every client.
  const struct {
    Family family;
    uint64_t RemoteServerStats::Namespace::*member;
  } kNamespaceMetrics[] = {
      {{"namespace_hits", "counter", "Hits of the namespace's entries, every client of the tier."},
       &RemoteServerStats::Namespace::hits},
      {{"namespace_puts", "counter", "Entries of the namespace written to the tier, every client."},
       &RemoteServerStats::Namespace::puts},
      {{"namespace_put_bytes", "counter", "Bytes of the namespace's entries written to the tier, every client."},
       &RemoteServerStats::Namespace::put_bytes},
  };
  bool any_namespace = false;
  for (const auto& t : in.tiers) any_namespace = any_namespace || !t.namespaces.empty();
  if (any_namespace) {
    for (const auto& nm : kNamespaceMetrics) {
      family(nm.family);
      for (const auto& t : in.tiers)
        for (const auto& n : t.namespaces) {
          std::string l = labels(t);
          l.insert(l.size() - 1, ",namespace=\"" + escape_label(n.ns) + "\"");
          out += fmt("kcache_%s%s %" PRIu64 "\n", sample_name(nm.family).c_str(), l.c_str(), n.*nm.member);
          if (om && t.counters_since_ms)
            out += fmt("kcache_%s_created%s %.3f\n", nm.family.name, l.c_str(),
                       static_cast<double>(t.counters_since_ms) / 1000.0);
        }
    }
  }
  const std::string store = "{store=\"" + escape_label(in.store) + "\"}";
  family({"disk_used_bytes", "gauge", "Disk space the store's files take (allocated blocks)."});
  out += fmt("kcache_disk_used_bytes%s %" PRIu64 "\n", store.c_str(), in.disk_used);
  family({"max_bytes", "gauge", "The store's configured size limit."});
  out += fmt("kcache_max_bytes%s %" PRIu64 "\n", store.c_str(), in.max_bytes);
  family({"max_entries", "gauge", "The store's configured entry limit."});
  out += fmt("kcache_max_entries%s %" PRIu64 "\n", store.c_str(), in.max_entries);
  if (in.compression) {
    family({"payload_bytes", "gauge", "The stored entries' artifact bytes before compression."});
    out += fmt("kcache_payload_bytes%s %" PRIu64 "\n", store.c_str(), in.payload_bytes);
    family({"compressed_entries", "gauge", "Entries stored compressed."});
    out += fmt("kcache_compressed_entries%s %" PRIu64 "\n", store.c_str(), in.compressed_entries);
  }
  family({"store_up", "gauge", "1 when the disk store exists and opened, else 0."});
  out += fmt("kcache_store_up%s %d\n", store.c_str(), in.store_up ? 1 : 0);
  bool any_probe = false;
  for (const auto& t : in.tiers) any_probe = any_probe || t.probed;
  if (any_probe) {
    family({"tier_up", "gauge", "1 when the tier answered a probe lookup, else 0."});
    for (const auto& t : in.tiers)
      if (t.probed) out += fmt("kcache_tier_up%s %d\n", labels(t).c_str(), t.up ? 1 : 0);
    family({"probe_latency_seconds", "gauge", "Round trip of one probe lookup of the tier."});
    for (const auto& t : in.tiers)
      if (t.probed) out += fmt("kcache_probe_latency_seconds%s %.6f\n", labels(t).c_str(), t.latency_s);
  }
  return om ? out + "# EOF\n" : out;
}

}  // namespace kcache::cli

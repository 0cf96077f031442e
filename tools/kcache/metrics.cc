// kcache tool — `stats --format openmetrics`: the statistics in the
// Prometheus text exposition format (version 0.0.4), ending with the
// OpenMetrics "# EOF" line, which the Prometheus parser reads as a comment.
// Written for node_exporter's textfile collector:
//   kcache stats --format openmetrics > /var/lib/node_exporter/kcache.prom.$$ &&
//     mv /var/lib/node_exporter/kcache.prom.$$ /var/lib/node_exporter/kcache.prom
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
  const char* name;  // without the kcache_ prefix
  const char* type;  // counter or gauge
  const char* help;
};

// Where each TierStats field goes: its family, or none.
struct FieldMetric {
  uint64_t TierStats::*member;
  Family family;
};

const FieldMetric kFieldMetrics[] = {
    {&TierStats::hits, {"hits_total", "counter", "Lookups the tier answered."}},
    {&TierStats::misses, {"misses_total", "counter", "Lookups the tier did not answer."}},
    {&TierStats::puts,
     {"puts_total", "counter", "Entries written to the tier (each compile that was stored is one put)."}},
    {&TierStats::evictions, {"evictions_total", "counter", "Entries removed to stay under the limits."}},
    {&TierStats::corrupt, {"corrupt_total", "counter", "Entries that failed verification (each a miss)."}},
    {&TierStats::errors,
     {"errors_total", "counter", "Faults other than corrupt entries: I/O, full disk, a remote that did not answer."}},
    {&TierStats::rejected, {"rejected_total", "counter", "Writes the tier refused."}},
    {&TierStats::skipped,
     {"skipped_total", "counter", "Remote calls not made while the remote was switched off after failures."}},
    {&TierStats::dropped, {"dropped_total", "counter", "Background remote writes dropped."}},
    {&TierStats::entries, {"entries", "gauge", "Entries stored now."}},
    {&TierStats::bytes, {"bytes", "gauge", "Encoded bytes of the entries stored now."}},
};

}  // namespace

std::string openmetrics_text(const MetricsInput& in) {
  std::string out;
  auto family = [&](const Family& f) {
    out += fmt("# HELP kcache_%s %s\n# TYPE kcache_%s %s\n", f.name, f.help, f.name, f.type);
  };
  auto labels = [&](const MetricsTier& t) {
    return "{tier=\"" + escape_label(t.name) + "\",kind=\"" + escape_label(t.kind) + "\",store=\"" +
           escape_label(in.store) + "\"}";
  };
  for (const auto& fm : kFieldMetrics) {
    family(fm.family);
    for (const auto& t : in.tiers)
      out += fmt("kcache_%s%s %" PRIu64 "\n", fm.family.name, labels(t).c_str(), t.stats.*fm.member);
  }
  const std::string store = "{store=\"" + escape_label(in.store) + "\"}";
  family({"disk_used_bytes", "gauge", "Disk space the store's files take (allocated blocks)."});
  out += fmt("kcache_disk_used_bytes%s %" PRIu64 "\n", store.c_str(), in.disk_used);
  family({"max_bytes", "gauge", "The store's configured size limit."});
  out += fmt("kcache_max_bytes%s %" PRIu64 "\n", store.c_str(), in.max_bytes);
  family({"max_entries", "gauge", "The store's configured entry limit."});
  out += fmt("kcache_max_entries%s %" PRIu64 "\n", store.c_str(), in.max_entries);
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
  return out + "# EOF\n";
}

}  // namespace kcache::cli

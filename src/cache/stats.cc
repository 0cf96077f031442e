// CacheStats as a human table and as JSON (`kcache stats`, KCACHE_STATS=1).
#include <cstdio>

#include "kcache/cache.h"
#include "util/util.h"

namespace kcache {

std::string CacheStats::to_string() const {
  std::string out;
  char buf[256];
  std::snprintf(
      buf, sizeof buf, "kcache: %llu hits, %llu misses, %llu compiles (%llu failed, %.3f s), %llu waits, %llu faults\n",
      (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)compiles,
      (unsigned long long)compile_failures, compile_us / 1e6, (unsigned long long)waits, (unsigned long long)faults);
  out += buf;
  for (const auto& t : tiers) {
    std::snprintf(buf, sizeof buf, "  %-10s", t.name.c_str());
    out += buf;
    // Every field, bytes as a size.
    for (const auto& f : TierStats::kFields) {
      if (f.member == &TierStats::bytes)
        std::snprintf(buf, sizeof buf, " %s %s", util::format_size(t.stats.bytes).c_str(), std::string(f.name).c_str());
      else
        std::snprintf(buf, sizeof buf, " %llu %s", (unsigned long long)(t.stats.*f.member),
                      std::string(f.name).c_str());
      out += buf;
    }
    out += "\n";
  }
  return out;
}

std::string CacheStats::to_json() const {
  std::string out = "{";
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "\"hits\":%llu,\"misses\":%llu,\"compiles\":%llu,\"compile_failures\":%llu,\"waits\":%llu,"
                "\"faults\":%llu,\"compile_us\":%llu,\"lease_waits\":%llu,\"lease_timeouts\":%llu,"
                "\"lease_takeovers\":%llu,\"tiers\":[",
                (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)compiles,
                (unsigned long long)compile_failures, (unsigned long long)waits, (unsigned long long)faults,
                (unsigned long long)compile_us, (unsigned long long)lease_waits, (unsigned long long)lease_timeouts,
                (unsigned long long)lease_takeovers);
  out += buf;
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (i) out += ",";
    out += "{\"name\":\"" + util::json_escape(tiers[i].name) + "\",\"stats\":" + tier_stats_json(tiers[i].stats) + "}";
  }
  out += "]}";
  return out;
}

}  // namespace kcache

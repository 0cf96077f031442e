// LLVM integration, counters: the clocks its steps are timed on, the tally
// each call adds to CompileCounters at its end, and the counters as JSON.
#include <time.h>

#include <chrono>
#include <cstdio>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"

namespace kcache::llvm {

namespace detail {

Clocks Clocks::now(bool cpu) {
  Clocks c;
  c.wall = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
  if (cpu) {
    timespec ts;
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    c.cpu = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }
  return c;
}

Tally::~Tally() {
  if (!counters_) return;
  CompileCounters& c = *counters_;
  auto add = [](std::atomic<uint64_t>& counter, uint64_t n) {
    if (n) counter.fetch_add(n, std::memory_order_relaxed);
  };
  add(c.lookups, lookups);
  add(c.hits, hits);
  add(c.misses, misses);
  add(c.codegen_runs, codegen_runs);
  add(c.bad_objects, bad_objects);
  add(c.frontend_hits, frontend_hits);
  add(c.links_stored, links_stored);
  add(c.set_hits, set_hits);
  add(c.sets_stored, sets_stored);
  add(c.key_ns, key.wall);
  add(c.key_cpu_ns, key.cpu);
  add(c.lookup_ns, lookup.wall);
  add(c.lookup_cpu_ns, lookup.cpu);
  add(c.compile_ns, compile.wall);
  add(c.compile_cpu_ns, compile.cpu);
}

}  // namespace detail

std::string CompileCounters::to_json() const {
  auto cpu = [&](const std::atomic<uint64_t>& ns) {
    if (!cpu_times.load(std::memory_order_relaxed)) return std::string("null");
    char b[32];
    std::snprintf(b, sizeof b, "%.6f", ns.load() / 1e9);
    return std::string(b);
  };
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "{\"lookups\":%llu,\"hits\":%llu,\"misses\":%llu,\"codegen_runs\":%llu,\"bad_objects\":%llu,"
                "\"frontend_hits\":%llu,\"links_stored\":%llu,\"set_hits\":%llu,\"sets_stored\":%llu,"
                "\"key_s\":%.6f,\"lookup_s\":%.6f,\"compile_s\":%.6f,\"key_cpu_s\":%s,\"lookup_cpu_s\":%s,"
                "\"compile_cpu_s\":%s}",
                (unsigned long long)lookups.load(), (unsigned long long)hits.load(), (unsigned long long)misses.load(),
                (unsigned long long)codegen_runs.load(), (unsigned long long)bad_objects.load(),
                (unsigned long long)frontend_hits.load(), (unsigned long long)links_stored.load(),
                (unsigned long long)set_hits.load(), (unsigned long long)sets_stored.load(), key_ns.load() / 1e9,
                lookup_ns.load() / 1e9, compile_ns.load() / 1e9, cpu(key_cpu_ns).c_str(), cpu(lookup_cpu_ns).c_str(),
                cpu(compile_cpu_ns).c_str());
  return buf;
}

}  // namespace kcache::llvm

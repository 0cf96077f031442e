// 8 processes start cold on one empty cache and each needs the same 200
// kernels. With cross-process single-flight, each kernel is compiled once;
// without it (how per-process caches behave), every process compiles
// whatever it misses. Reports CPU seconds spent inside compile functions
// (summed over all processes, thread CPU clocks) and wall seconds, for both,
// and their ratios, measured in the same run.
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kcache/cache.h"

using namespace kcache;

namespace {

constexpr int kProcs = 8, kKeys = 200;

double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A deterministic CPU-bound compile of about 10 ms.
std::string compile(uint64_t i) {
  std::string s(8192, static_cast<char>(i));
  for (int r = 0; r < 80000; ++r) {
    Digest d = hash_bytes(s);
    std::memcpy(s.data() + (r * 16) % 8000, d.bytes.data(), 16);
  }
  return s;
}

struct Result {
  double compile_cpu_s = 0, wall_s = 0;
  uint64_t compiles = 0;
};

Result run(bool single_flight) {
  char tmpl[] = "/tmp/kcache-sf-bench-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  int fd[2];
  if (::pipe(fd) != 0) std::abort();
  auto t0 = std::chrono::steady_clock::now();
  for (int p = 0; p < kProcs; ++p) {
    if (::fork() == 0) {
      ::close(fd[0]);
      Options o;
      o.dir = dir;
      o.log_level = LogLevel::error;
      o.process_single_flight = single_flight;
      auto c = Cache::open(o);
      double cpu = 0;
      std::vector<BatchItem> items;
      for (int j = 0; j < kKeys; ++j) {
        uint64_t i = static_cast<uint64_t>(j);  // every process asks in the same order
        items.push_back(
            {*KeyBuilder("bench-sf").add_u64("i", i).finish(), [i, &cpu]() -> Expected<std::vector<Artifact>> {
               double t = thread_cpu_s();
               std::string s = compile(i);
               cpu += thread_cpu_s() - t;  // one worker thread: no race
               return std::vector<Artifact>{{"obj", std::move(s)}};
             }});
      }
      BatchOptions bo;
      bo.threads = 1;
      auto r = c->get_or_compile_batch(items, bo);
      double out[2] = {cpu, static_cast<double>(c->stats().compiles)};
      (void)!::write(fd[1], out, sizeof out);
      c.reset();
      ::_exit(0);
    }
  }
  ::close(fd[1]);
  while (::wait(nullptr) > 0) {}
  Result res;
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double v[2];
  while (::read(fd[0], v, sizeof v) == sizeof v) {
    res.compile_cpu_s += v[0];
    res.compiles += static_cast<uint64_t>(v[1]);
  }
  ::close(fd[0]);
  std::string rm = "rm -rf '" + dir + "'";
  (void)!std::system(rm.c_str());
  return res;
}

void BM_EightProcessesColdStart(benchmark::State& state) {
  Result on, off;
  for (auto _ : state) {
    off = run(false);
    on = run(true);
  }
  state.counters["compiles_on"] = static_cast<double>(on.compiles);
  state.counters["compiles_off"] = static_cast<double>(off.compiles);
  state.counters["compile_cpu_s_on"] = on.compile_cpu_s;
  state.counters["compile_cpu_s_off"] = off.compile_cpu_s;
  state.counters["wall_s_on"] = on.wall_s;
  state.counters["wall_s_off"] = off.wall_s;
  state.counters["cpu_ratio_off_over_on"] = off.compile_cpu_s / on.compile_cpu_s;
  state.counters["wall_ratio_off_over_on"] = off.wall_s / on.wall_s;
}
BENCHMARK(BM_EightProcessesColdStart)->Iterations(1)->Repetitions(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

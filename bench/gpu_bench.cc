// GPU-kernel integrations, each against a baseline measured in the same run.
//
// NVRTC: per kernel of the 25-kernel corpus, an uncached NVRTC compile
// ("cold") versus a kcache hit from the memory tier and from the LMDB tier
// ("warm"). The warm benchmarks report `x_vs_cold`, cold time / warm time.
//
// OpenCL on the installed platform (PoCL): the time a fresh process takes to
// build the 8-program kernel set and run each kernel once, with
//   none   PoCL's kernel cache off (POCL_KERNEL_CACHE=0),
//   pocl   PoCL's own kernel cache (POCL_KERNEL_CACHE=1, POCL_CACHE_DIR temp),
//   kcache kcache's ProgramCache (POCL_KERNEL_CACHE=0),
//   kcache+pocl  both (PoCL's cache keeps the per-kernel machine code that
//          PoCL 3.1 generates at first launch and does not put in the
//          program binary),
// all warm (each cache filled by an untimed first process). PoCL reads its
// variables when the platform starts, so every sample is a child process;
// the benchmark uses the time the child measured from platform start to the
// last result (process start-up is the same in all three). `kcache` reports
// `x_vs_none` and `x_vs_pocl`; `build_ms` is the part spent building
// programs, `first_run_ms` the rest (kernel creation and first launches).
//
// NVRTC on CCCL (CUB, libcu++ and cooperative_groups kernels including the
// toolkit's headers): an uncached compile ("cold"), a warm key
// (Compiler::key: the program's manifest checked by file identity, the
// KeyInfo copied out) and a warm hit from memory, each with `cpu_us` per
// call and `files_keyed`; the CPU of the first key in a new process that
// shares the cache (a child: the manifests come from the cache),
// `first_key_cpu_us` for the process's first key (it also finds the NVRTC
// library's identity) and `next_first_keys_cpu_us` for the first key of
// each other program; and a cold compile through kcache over plain NVRTC,
// both in-process (`cold_over_plain`) and one new process per compile
// (`cold_over_plain_process`: a child compiles one program, through kcache
// into an empty store or plainly, and reports its whole CPU, start-up,
// library loading and the recorder included).
//
// Usage: kcache_bench_gpu [--benchmark_filter=nvrtc|opencl] [google benchmark flags]
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "util/util.h"

#if KCACHE_HAVE_NVRTC
#include "cccl_kernels.h"
#include "gpu_kernels.h"
#include "kcache/nvrtc.h"
#endif
#if KCACHE_HAVE_OPENCL
#include "kcache/opencl.h"
#include "opencl_kernels.h"
#endif

namespace {

std::string g_self;
std::string g_tmp;

std::string make_temp_dir(const char* tag) {
  std::string t = std::string("/tmp/kcache-bench-gpu-") + tag + "-XXXXXX";
  char* p = ::mkdtemp(t.data());
  return p ? p : "";
}

kcache::Options cache_options(const std::string& dir, bool memory) {
  kcache::Options o;
  o.dir = dir;
  o.memory_tier = memory;
  o.log_level = kcache::LogLevel::error;
  return o;
}

#if KCACHE_HAVE_NVRTC
std::map<std::string, double> g_cold_ns;  // kernel -> uncached compile time

struct NvrtcState {
  std::string dir;
  std::unique_ptr<kcache::Cache> mem_cache, disk_cache;
  std::unique_ptr<kcache::nvrtc::Compiler> mem, disk;
  std::vector<kcache::gpu_kernels::CudaKernel> kernels = kcache::gpu_kernels::cuda_kernels();
};
NvrtcState* g_nv = nullptr;

NvrtcState& nv() {
  if (!g_nv) {
    g_nv = new NvrtcState();
    g_nv->dir = g_tmp + "/nvrtc";
    g_nv->mem_cache = kcache::Cache::open(cache_options(g_nv->dir, true));
    g_nv->mem = std::make_unique<kcache::nvrtc::Compiler>(*g_nv->mem_cache);
    for (const auto& k : g_nv->kernels) (void)g_nv->mem->compile(k.program);  // fills both tiers
    (void)g_nv->mem_cache->flush();
    g_nv->disk_cache = kcache::Cache::open(cache_options(g_nv->dir, false));
    g_nv->disk = std::make_unique<kcache::nvrtc::Compiler>(*g_nv->disk_cache);
  }
  return *g_nv;
}

void BM_NvrtcCold(benchmark::State& state, size_t i) {
  const auto& k = nv().kernels[i];
  double total = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = kcache::nvrtc::compile_uncached(k.program);
    total += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    if (!r) state.SkipWithError(r.error().to_string().c_str());
  }
  g_cold_ns[k.name] = total / static_cast<double>(state.iterations());
}

void BM_NvrtcWarm(benchmark::State& state, size_t i, bool memory) {
  auto& s = nv();
  const auto& k = s.kernels[i];
  auto& c = memory ? *s.mem : *s.disk;
  size_t bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto r = c.compile(k.program);
    if (!r || r->source == kcache::Source::compiled) {
      state.SkipWithError("expected a hit");
      break;
    }
    bytes = r->ptx.size() + r->cubin.size();
    benchmark::DoNotOptimize(r->cubin.data());
  }
  double warm_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                   static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["bytes"] = static_cast<double>(bytes);
  // Both sides are wall-clock times of this run.
  if (auto it = g_cold_ns.find(k.name); it != g_cold_ns.end()) state.counters["x_vs_cold"] = it->second / warm_ns;
}

// ---- CCCL kernels from the toolkit (CUB, libcu++, cooperative_groups) ------

kcache::nvrtc::Program cccl_program(size_t i) {
  kcache::nvrtc::Program p;
  p.name = kcache::cccl_kernels::kKernels[i].name;
  p.source = kcache::cccl_kernels::kKernels[i].source;
  p.options = kcache::cccl_kernels::options_for(KCACHE_BENCH_CUDA_INCLUDE);
  return p;
}

struct CcclState {
  std::string dir;
  std::unique_ptr<kcache::Cache> cache;
  std::unique_ptr<kcache::nvrtc::Compiler> compiler;
  std::map<size_t, double> cold_ns;
};
CcclState* g_cccl = nullptr;

CcclState& cccl() {
  if (!g_cccl) {
    g_cccl = new CcclState();
    g_cccl->dir = g_tmp + "/cccl";
    g_cccl->cache = kcache::Cache::open(cache_options(g_cccl->dir, true));
    g_cccl->compiler = std::make_unique<kcache::nvrtc::Compiler>(*g_cccl->cache);
    for (size_t i = 0; i < kcache::cccl_kernels::kKernelCount; ++i) (void)g_cccl->compiler->compile(cccl_program(i));
    (void)g_cccl->cache->flush();
  }
  return *g_cccl;
}

double cpu_ns() {
  struct timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

void BM_CcclCold(benchmark::State& state, size_t i) {
  auto& s = cccl();
  auto p = cccl_program(i);
  double total = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = kcache::nvrtc::compile_uncached(p);
    total += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    if (!r) state.SkipWithError(r.error().to_string().c_str());
  }
  s.cold_ns[i] = total / static_cast<double>(state.iterations());
}

// A cold compile through kcache (a new, empty store each round: key, miss,
// NVRTC, store, flush) against plain NVRTC (compile_uncached), paired in
// each round with the order alternating; the counter is the median of the
// rounds' CPU ratios (process CPU, so kcache's own threads count).

// The median cold / plain CPU ratio of the rounds, with their spread.
void report_ratios(benchmark::State& state, std::vector<double> ratios) {
  std::sort(ratios.begin(), ratios.end());
  if (ratios.empty()) return;
  state.counters["cold_over_plain_cpu"] = ratios[ratios.size() / 2];
  state.counters["min"] = ratios.front();
  state.counters["max"] = ratios.back();
}
void BM_CcclColdOverPlain(benchmark::State& state, size_t i) {
  auto& s = cccl();
  auto p = cccl_program(i);
  std::vector<double> ratios;
  unsigned round = 0;
  for (auto _ : state) {
    std::string dir = s.dir + "-cold-" + std::to_string(i) + "-" + std::to_string(round);
    double plain = 0, cold = 0;
    for (int side = 0; side < 2; ++side) {
      bool cached = (side == 0) == (round % 2 == 0);
      double c0 = cpu_ns();
      if (cached) {
        auto cache = kcache::Cache::open(cache_options(dir, true));
        kcache::nvrtc::Compiler c(*cache);
        auto r = c.compile(p);
        if (!r || r->source != kcache::Source::compiled) state.SkipWithError("expected a compile");
        (void)cache->flush();
        cold = cpu_ns() - c0;
      } else {
        auto r = kcache::nvrtc::compile_uncached(p);
        if (!r) state.SkipWithError(r.error().to_string().c_str());
        plain = cpu_ns() - c0;
      }
    }
    if (plain > 0) ratios.push_back(cold / plain);
    ++round;
  }
  report_ratios(state, ratios);
}

// A warm key (Compiler::key, which also copies the KeyInfo out) or a warm
// hit from the memory tier (Compiler::compile): CPU per call.
void BM_CcclWarm(benchmark::State& state, size_t i, bool hit) {
  auto& s = cccl();
  auto p = cccl_program(i);
  size_t files = 0;
  if (auto k = s.compiler->key(p))
    for (const auto& it : k->manifest.items) files += it.name.starts_with("file:");
  double c0 = cpu_ns();
  auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (hit) {
      auto r = s.compiler->compile(p);
      if (!r || r->source != kcache::Source::memory) {
        state.SkipWithError("expected a hit from memory");
        break;
      }
    } else {
      auto k = s.compiler->key(p);
      benchmark::DoNotOptimize(k);
    }
  }
  double iters = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  double wall = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
  state.counters["cpu_us"] = (cpu_ns() - c0) / iters / 1e3;
  state.counters["files_keyed"] = static_cast<double>(files);
  if (auto it = s.cold_ns.find(i); it != s.cold_ns.end()) state.counters["x_vs_cold"] = it->second / wall;
}

// The first key of each program in a new process that shares the cache:
// printed by a child as "first_us rest_us" (CPU of the process's first key,
// which also finds the NVRTC library's identity; mean CPU of the others).
int cccl_child(const std::string& dir) {
  auto cache = kcache::Cache::open(cache_options(dir, true));
  kcache::nvrtc::Compiler c(*cache);
  double first = 0, rest = 0;
  for (size_t i = 0; i < kcache::cccl_kernels::kKernelCount; ++i) {
    auto p = cccl_program(i);
    double c0 = cpu_ns();
    auto k = c.key(p);
    double us = (cpu_ns() - c0) / 1e3;
    if (!k) return 2;
    (i == 0 ? first : rest) += us;
  }
  std::printf("%.1f %.1f\n", first, rest / double(kcache::cccl_kernels::kKernelCount - 1));
  return 0;
}

// One compile in a new process: through kcache into the empty store `dir`
// (cached = 1) or plain NVRTC (0). Prints the process's CPU in µs.
int cccl_cold_child(size_t i, const std::string& dir, bool cached) {
  auto p = cccl_program(i);
  if (cached) {
    auto cache = kcache::Cache::open(cache_options(dir, true));
    kcache::nvrtc::Compiler c(*cache);
    auto r = c.compile(p);
    if (!r || r->source != kcache::Source::compiled) return 2;
    (void)cache->flush();
  } else if (!kcache::nvrtc::compile_uncached(p)) {
    return 2;
  }
  std::printf("%.1f\n", cpu_ns() / 1e3);
  return 0;
}

void BM_CcclColdOverPlainProcess(benchmark::State& state, size_t i) {
  auto& s = cccl();
  std::vector<double> ratios;
  unsigned round = 0;
  for (auto _ : state) {
    double us[2] = {0, 0};
    for (int side = 0; side < 2; ++side) {
      int cached = (side == 0) == (round % 2 == 0) ? 1 : 0;
      std::string dir = s.dir + "-proc-" + std::to_string(i) + "-" + std::to_string(round);
      std::string cmd =
          "'" + g_self + "' --cccl-cold-child " + std::to_string(i) + " '" + dir + "' " + std::to_string(cached);
      FILE* f = ::popen(cmd.c_str(), "r");
      double v = -1;
      if (!f || std::fscanf(f, "%lf", &v) != 1 || ::pclose(f) != 0 || v <= 0) {
        state.SkipWithError("child failed");
        return;
      }
      us[cached] = v;
    }
    ratios.push_back(us[1] / us[0]);
    ++round;
  }
  report_ratios(state, ratios);
}

void BM_CcclFirstKeyNewProcess(benchmark::State& state) {
  auto& s = cccl();
  std::string cmd = "'" + g_self + "' --cccl-child '" + s.dir + "'";
  double first = 0, rest = 0;
  for (auto _ : state) {
    FILE* f = ::popen(cmd.c_str(), "r");
    double a = -1, b = -1;
    if (!f || std::fscanf(f, "%lf %lf", &a, &b) != 2 || ::pclose(f) != 0 || a < 0) {
      state.SkipWithError("child failed");
      break;
    }
    state.SetIterationTime(a / 1e6);
    first += a;
    rest += b;
  }
  double iters = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["first_key_cpu_us"] = first / iters;
  state.counters["next_first_keys_cpu_us"] = rest / iters;
}
#endif

#if KCACHE_HAVE_OPENCL
// ---- child: one fresh-process pass over the OpenCL kernel set ----------
int opencl_child(const std::string& mode, const std::string& dir) {
  auto t0 = std::chrono::steady_clock::now();
  cl_platform_id platform;
  cl_uint n = 0;
  if (clGetPlatformIDs(1, &platform, &n) != CL_SUCCESS || n == 0) return 3;
  cl_device_id dev;
  if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, &n) != CL_SUCCESS || n == 0) return 3;
  cl_int e;
  kcache::cl_kernels::Env env;
  env.ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &e);
  env.queue = clCreateCommandQueue(env.ctx, dev, 0, &e);
  std::unique_ptr<kcache::Cache> cache;
  std::unique_ptr<kcache::opencl::ProgramCache> pc;
  if (mode.starts_with("kcache")) {
    cache = kcache::Cache::open(cache_options(dir, true));
    pc = std::make_unique<kcache::opencl::ProgramCache>(*cache);
  }
  double build_ms = 0;
  int rc = 0;
  for (const auto& k : kcache::cl_kernels::cl_kernel_set()) {
    auto b0 = std::chrono::steady_clock::now();
    cl_program prog = nullptr;
    if (pc) {
      auto r = pc->build(env.ctx, dev, k.program);
      if (r) prog = r->program;
    } else {
      (void)kcache::opencl::build_from_source(env.ctx, dev, k.program, &prog, nullptr);
    }
    build_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b0).count();
    if (!prog) return 4;
    double err = k.run(env, prog);
    if (err < 0 || err > 1e-2) {
      std::fprintf(stderr, "%s: wrong result (error %g)\n", k.name.c_str(), err);
      rc = 5;
    }
    clReleaseProgram(prog);
  }
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (cache) (void)cache->flush();
  std::printf("%.3f %.3f\n", total_ms, build_ms);
  clReleaseCommandQueue(env.queue);
  clReleaseContext(env.ctx);
  return rc;
}

struct ChildTimes {
  double total_ms = -1, build_ms = -1;
};

ChildTimes run_child(const std::string& mode) {
  std::string dir = g_tmp + "/opencl-" + mode;
  std::string env =
      std::string("POCL_KERNEL_CACHE=") + (mode.ends_with("pocl") ? "1" : "0") + " POCL_CACHE_DIR='" + dir + "/pocl' ";
  std::string cmd = env + "'" + g_self + "' --opencl-child " + mode + " '" + dir + "'";
  ChildTimes t;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return t;
  if (std::fscanf(f, "%lf %lf", &t.total_ms, &t.build_ms) != 2) t.total_ms = -1;
  if (::pclose(f) != 0) t.total_ms = -1;
  return t;
}

std::map<std::string, double> g_cl_ms;

void BM_OpenclWarmProcess(benchmark::State& state, const std::string& mode) {
  ChildTimes warm = run_child(mode);  // fills this mode's cache; not timed
  if (warm.total_ms < 0) {
    state.SkipWithError("OpenCL child failed (no platform?)");
    return;
  }
  double sum = 0, build = 0;
  for (auto _ : state) {
    ChildTimes t = run_child(mode);
    if (t.total_ms < 0) {
      state.SkipWithError("OpenCL child failed");
      break;
    }
    state.SetIterationTime(t.total_ms / 1e3);
    sum += t.total_ms;
    build += t.build_ms;
  }
  double iters = static_cast<double>(state.iterations());
  g_cl_ms[mode] = sum / iters;
  state.counters["build_ms"] = build / iters;
  state.counters["first_run_ms"] = (sum - build) / iters;
  if (mode.starts_with("kcache")) {
    if (g_cl_ms.count("none")) state.counters["x_vs_none"] = g_cl_ms["none"] / g_cl_ms[mode];
    if (g_cl_ms.count("pocl")) state.counters["x_vs_pocl"] = g_cl_ms["pocl"] / g_cl_ms[mode];
  }
}

// ---- the key of a program whose two headers are in memory, or on disk
// through -I (disk_headers reads them, and looks for each name in the
// working folder and in the -I folder); no build --------------------------
std::map<std::string, double> g_cl_key_us;

void BM_OpenclKey(benchmark::State& state, bool on_disk) {
  static const std::string outer = "#include \"inner.h\"\n#define SCALE (INNER * 2.0f)\n";
  static const std::string inner = "#define INNER 1.5f\n";
  kcache::opencl::ProgramSource p;
  p.source = "#include \"scale.h\"\n__kernel void k(__global float* x) { x[0] = SCALE; }\n";
  if (on_disk) {
    std::string dir = g_tmp + "/opencl-headers";
    (void)kcache::util::make_dirs(dir);
    (void)kcache::util::write_file_atomic(dir + "/scale.h", outer);
    (void)kcache::util::write_file_atomic(dir + "/inner.h", inner);
    p.options = "-I " + dir;
  } else {
    p.headers = {{"scale.h", outer}, {"inner.h", inner}};
  }
  kcache::opencl::DeviceDescription d{"Portable Computing Language",
                                      "OpenCL 3.0 PoCL",
                                      "cpu",
                                      "OpenCL 3.0",
                                      "6.0",
                                      "0123456789abcdef0123456789abcdef01234567",
                                      {}};
  for (auto _ : state) {
    auto k = kcache::opencl::program_key(d, p);
    if (!k) {
      state.SkipWithError(k.error().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(k->key);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) benchmark::DoNotOptimize(kcache::opencl::program_key(d, p));
  g_cl_key_us[on_disk ? "disk" : "memory"] =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 2000;
  if (on_disk && g_cl_key_us.count("memory"))
    state.counters["x_vs_memory"] = g_cl_key_us["disk"] / g_cl_key_us["memory"];
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if KCACHE_HAVE_OPENCL
  if (argc == 4 && std::strcmp(argv[1], "--opencl-child") == 0) return opencl_child(argv[2], argv[3]);
#endif
#if KCACHE_HAVE_NVRTC
  if (argc == 3 && std::strcmp(argv[1], "--cccl-child") == 0) return cccl_child(argv[2]);
  if (argc == 5 && std::strcmp(argv[1], "--cccl-cold-child") == 0)
    return cccl_cold_child(std::strtoul(argv[2], nullptr, 10), argv[3], std::strcmp(argv[4], "1") == 0);
#endif
  g_self = argv[0];
  if (g_self.find('/') == std::string::npos) g_self = "./" + g_self;
  g_tmp = make_temp_dir("run");
  if (g_tmp.empty()) return 1;

#if KCACHE_HAVE_NVRTC
  {
    auto kernels = kcache::gpu_kernels::cuda_kernels();
    for (size_t i = 0; i < kernels.size(); ++i) {
      const std::string& n = kernels[i].name;
      benchmark::RegisterBenchmark(("nvrtc/cold/" + n).c_str(), BM_NvrtcCold, i)
          ->Iterations(3)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("nvrtc/warm_memory/" + n).c_str(), BM_NvrtcWarm, i, true)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("nvrtc/warm_lmdb/" + n).c_str(), BM_NvrtcWarm, i, false)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (size_t i = 0; i < kcache::cccl_kernels::kKernelCount; ++i) {
    std::string n = kcache::cccl_kernels::kKernels[i].name;
    benchmark::RegisterBenchmark(("nvrtc_cccl/cold/" + n).c_str(), BM_CcclCold, i)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("nvrtc_cccl/cold_over_plain/" + n).c_str(), BM_CcclColdOverPlain, i)
        ->Iterations(4)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("nvrtc_cccl/cold_over_plain_process/" + n).c_str(), BM_CcclColdOverPlainProcess, i)
        ->Iterations(6)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("nvrtc_cccl/warm_key/" + n).c_str(), BM_CcclWarm, i, false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("nvrtc_cccl/warm_hit/" + n).c_str(), BM_CcclWarm, i, true)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("nvrtc_cccl/first_key_new_process", BM_CcclFirstKeyNewProcess)
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMicrosecond);
#endif
#if KCACHE_HAVE_OPENCL
  benchmark::RegisterBenchmark("opencl/key/headers_in_memory", BM_OpenclKey, false)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("opencl/key/headers_on_disk", BM_OpenclKey, true)->Unit(benchmark::kMicrosecond);
  for (const char* mode : {"none", "pocl", "kcache", "kcache+pocl"})
    benchmark::RegisterBenchmark((std::string("opencl/warm_process/") + mode).c_str(), BM_OpenclWarmProcess,
                                 std::string(mode))
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMillisecond);
#endif

  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#if KCACHE_HAVE_NVRTC
  delete g_nv;
  delete g_cccl;
#endif
  std::string rm = "rm -rf '" + g_tmp + "'";
  (void)::system(rm.c_str());
  return 0;
}

// kcache-gpu-demo: NVRTC and OpenCL builds, cold then warm, on a temporary
// cache. "Cold" is a first process with an empty cache; "warm" is a new
// Cache on the same folder (memory tier empty, hits come from disk), which
// is what the next start of a JIT sees.
//
// Usage: kcache-gpu-demo [--json] [--keep]
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "util/util.h"

#if KCACHE_HAVE_NVRTC
#include "gpu_kernels.h"
#include "kcache/nvrtc.h"
#endif
#if KCACHE_HAVE_OPENCL
#include "kcache/opencl.h"
#include "opencl_kernels.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Row {
  std::string part, kernel;
  double cold_ms = 0, warm_ms = 0;
  std::string warm_source;
  size_t bytes = 0;
  bool ok = true;
};

kcache::Options options_for(const std::string& dir, bool memory) {
  kcache::Options o;
  o.dir = dir;
  o.memory_tier = memory;
  o.log_level = kcache::LogLevel::error;
  return o;
}

#if KCACHE_HAVE_NVRTC
void nvrtc_demo(const std::string& dir, std::vector<Row>& rows) {
  auto kernels = kcache::gpu_kernels::cuda_kernels();
  {
    auto cache = kcache::Cache::open(options_for(dir, true));
    kcache::nvrtc::Compiler c(*cache);
    for (const auto& k : kernels) {
      Row r;
      r.part = "nvrtc";
      r.kernel = k.name;
      auto t0 = Clock::now();
      auto res = c.compile(k.program);
      r.cold_ms = ms_since(t0);
      r.ok = res.has_value() && res->source == kcache::Source::compiled;
      if (res) r.bytes = res->ptx.size() + res->cubin.size();
      rows.push_back(r);
    }
  }
  auto cache = kcache::Cache::open(options_for(dir, true));
  kcache::nvrtc::Compiler c(*cache);
  size_t i = rows.size() - kernels.size();
  for (const auto& k : kernels) {
    Row& r = rows[i++];
    auto t0 = Clock::now();
    auto res = c.compile(k.program);
    r.warm_ms = ms_since(t0);
    r.warm_source = res ? std::string(kcache::source_name(res->source)) : "error";
    r.ok = r.ok && res.has_value() && res->source != kcache::Source::compiled;
  }
}
#endif

#if KCACHE_HAVE_OPENCL
bool opencl_demo(const std::string& dir, std::vector<Row>& rows, std::string& why) {
  cl_platform_id platform;
  cl_uint n = 0;
  cl_device_id dev;
  if (clGetPlatformIDs(1, &platform, &n) != CL_SUCCESS || n == 0) {
    why = "no OpenCL platform";
    return false;
  }
  if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, &n) != CL_SUCCESS || n == 0) {
    why = "no OpenCL device";
    return false;
  }
  cl_int e;
  kcache::cl_kernels::Env env;
  env.ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &e);
  env.queue = clCreateCommandQueue(env.ctx, dev, 0, &e);
  auto kernels = kcache::cl_kernels::cl_kernel_set();
  size_t first = rows.size();
  for (int pass = 0; pass < 2; ++pass) {
    auto cache = kcache::Cache::open(options_for(dir, true));
    kcache::opencl::ProgramCache pc(*cache);
    for (size_t i = 0; i < kernels.size(); ++i) {
      if (pass == 0) {
        rows.emplace_back();
        rows.back().part = "opencl";
        rows.back().kernel = kernels[i].name;
      }
      Row& r = rows[first + i];
      auto t0 = Clock::now();
      auto res = pc.build(env.ctx, dev, kernels[i].program);
      double t = ms_since(t0);
      bool good = res.has_value();
      if (good) {
        double err = kernels[i].run(env, res->program);
        good = err >= 0 && err < 1e-2;
        clReleaseProgram(res->program);
      }
      if (pass == 0) {
        r.cold_ms = t;
        r.ok = good && res->source == kcache::Source::compiled;
      } else {
        r.warm_ms = t;
        r.warm_source = res ? std::string(kcache::source_name(res->source)) : "error";
        r.ok = r.ok && good && res->source != kcache::Source::compiled;
      }
    }
  }
  clReleaseCommandQueue(env.queue);
  clReleaseContext(env.ctx);
  return true;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool json = false, keep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--keep") == 0) {
      keep = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--keep]\n", argv[0]);
      return 2;
    }
  }
  // PoCL's own kernel cache would hide what kcache does; keep it out.
  ::setenv("POCL_KERNEL_CACHE", "0", 0);
  char tmpl[] = "/tmp/kcache-gpu-demo-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::string dir = tmpl;

  std::vector<Row> rows;
  std::string opencl_skipped;
#if KCACHE_HAVE_NVRTC
  nvrtc_demo(dir, rows);
#endif
#if KCACHE_HAVE_OPENCL
  if (!opencl_demo(dir, rows, opencl_skipped)) opencl_skipped = opencl_skipped.empty() ? "unavailable" : opencl_skipped;
#else
  opencl_skipped = "built without OpenCL";
#endif

  bool all_ok = true;
  double cold_sum[2] = {0, 0}, warm_sum[2] = {0, 0};
  size_t count[2] = {0, 0};
  for (const auto& r : rows) {
    all_ok &= r.ok;
    int p = r.part == "nvrtc" ? 0 : 1;
    ++count[p];
    cold_sum[p] += r.cold_ms;
    warm_sum[p] += r.warm_ms;
  }
  if (json) {
    std::printf("{\"cache_dir\":\"%s\",\"ok\":%s,\"kernels\":[", kcache::util::json_escape(dir).c_str(),
                all_ok ? "true" : "false");
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::printf(
          "%s{\"part\":\"%s\",\"kernel\":\"%s\",\"cold_ms\":%.3f,\"warm_ms\":%.4f,\"warm_source\":\"%s\","
          "\"ok\":%s}",
          i ? "," : "", r.part.c_str(), r.kernel.c_str(), r.cold_ms, r.warm_ms, r.warm_source.c_str(),
          r.ok ? "true" : "false");
    }
    std::printf(
        "],\"totals\":{\"nvrtc\":{\"cold_ms\":%.3f,\"warm_ms\":%.3f},\"opencl\":{\"cold_ms\":%.3f,"
        "\"warm_ms\":%.3f}}",
        cold_sum[0], warm_sum[0], cold_sum[1], warm_sum[1]);
    if (!opencl_skipped.empty())
      std::printf(",\"opencl_skipped\":\"%s\"", kcache::util::json_escape(opencl_skipped).c_str());
    std::printf("}\n");
  } else {
    std::printf("kcache GPU demo: cache in %s\n\n", dir.c_str());
    std::printf("%-7s %-24s %10s %10s %8s  %s\n", "part", "kernel", "cold ms", "warm ms", "speedup", "warm from");
    for (const auto& r : rows)
      std::printf("%-7s %-24s %10.2f %10.3f %7.0fx  %s%s\n", r.part.c_str(), r.kernel.c_str(), r.cold_ms, r.warm_ms,
                  r.warm_ms > 0 ? r.cold_ms / r.warm_ms : 0.0, r.warm_source.c_str(), r.ok ? "" : "  FAILED");
    std::printf("\nNVRTC : %zu kernels, cold %.1f ms, warm %.2f ms\n", count[0], cold_sum[0], warm_sum[0]);
    if (opencl_skipped.empty())
      std::printf("OpenCL: %zu programs, cold %.1f ms, warm %.2f ms (builds; every kernel run and checked)\n", count[1],
                  cold_sum[1], warm_sum[1]);
    else
      std::printf("OpenCL: skipped (%s)\n", opencl_skipped.c_str());
  }
  if (!keep) {
    std::string rm = "rm -rf '" + dir + "'";
    (void)::system(rm.c_str());
  }
  return all_ok ? 0 : 1;
}

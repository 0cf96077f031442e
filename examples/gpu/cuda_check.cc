// kcache-cuda-check: runs CUBINs that came out of the kcache NVRTC cache on
// a real GPU and checks the results on the CPU.
//
// The kernels are compiled through kcache::nvrtc for the device's own
// architecture (a cold compile, then a warm one from a fresh Cache on the
// same folder); the warm CUBIN (or PTX, when NVRTC cannot target the device
// directly) is loaded with cuModuleLoadData, kernels are found by name (the
// lowered name for templates) and launched with cuLaunchKernel.
//
// The CUDA driver is opened at run time (dlopen libcuda.so.1), so the
// program starts on machines without a driver and then says
// "no CUDA device: skipped" and exits 0. Not part of ctest.
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_kernels.h"
#include "kcache/cache.h"
#include "kcache/nvrtc.h"

namespace {

// The driver entry points this program uses, resolved from libcuda.
struct Driver {
  decltype(&cuInit) init;
  decltype(&cuDeviceGetCount) device_count;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDeviceGetAttribute) attribute;
  decltype(&cuDevicePrimaryCtxRetain) ctx_retain;
  decltype(&cuCtxSetCurrent) ctx_set;
  decltype(&cuCtxSynchronize) sync;
  decltype(&cuModuleLoadData) module_load;
  decltype(&cuModuleUnload) module_unload;
  decltype(&cuModuleGetFunction) get_function;
  decltype(&cuLaunchKernel) launch;
  decltype(&cuMemAlloc) alloc;
  decltype(&cuMemFree) free;
  decltype(&cuMemcpyHtoD) htod;
  decltype(&cuMemcpyDtoH) dtoh;
  decltype(&cuGetErrorString) error_string;

  bool open(std::string& why) {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      why = "libcuda.so.1 not found";
      return false;
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (!fn) {
        why = std::string("missing driver symbol ") + name;
        ok = false;
      }
    };
    sym(init, "cuInit");
    sym(device_count, "cuDeviceGetCount");
    sym(device_get, "cuDeviceGet");
    sym(attribute, "cuDeviceGetAttribute");
    sym(ctx_retain, "cuDevicePrimaryCtxRetain");
    sym(ctx_set, "cuCtxSetCurrent");
    sym(sync, "cuCtxSynchronize");
    sym(module_load, "cuModuleLoadData");
    sym(module_unload, "cuModuleUnload");
    sym(get_function, "cuModuleGetFunction");
    sym(launch, "cuLaunchKernel");
    sym(alloc, "cuMemAlloc_v2");
    sym(free, "cuMemFree_v2");
    sym(htod, "cuMemcpyHtoD_v2");
    sym(dtoh, "cuMemcpyDtoH_v2");
    sym(error_string, "cuGetErrorString");
    return ok;
  }
};

Driver cu;
int g_failures = 0;

bool check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* s = nullptr;
  cu.error_string(r, &s);
  std::fprintf(stderr, "%s: %s\n", what, s ? s : "unknown CUDA error");
  ++g_failures;
  return false;
}

struct DevBuf {
  CUdeviceptr p = 0;
  size_t bytes;
  explicit DevBuf(size_t n, const void* host = nullptr) : bytes(n) {
    check(cu.alloc(&p, n), "cuMemAlloc");
    if (host) check(cu.htod(p, host, n), "cuMemcpyHtoD");
  }
  ~DevBuf() {
    if (p) cu.free(p);
  }
  template <class T>
  std::vector<T> read(size_t n) const {
    std::vector<T> v(n);
    check(cu.dtoh(v.data(), p, n * sizeof(T)), "cuMemcpyDtoH");
    return v;
  }
};

void report(const char* name, double err, double tol) {
  bool ok = err <= tol;
  std::printf("  %-28s max error %.3g %s\n", name, err, ok ? "ok" : "FAILED");
  if (!ok) ++g_failures;
}

}  // namespace

int main() {
  std::string why;
  int count = 0;
  CUdevice dev = 0;
  if (!cu.open(why) || cu.init(0) != CUDA_SUCCESS || cu.device_count(&count) != CUDA_SUCCESS || count == 0 ||
      cu.device_get(&dev, 0) != CUDA_SUCCESS) {
    std::printf("no CUDA device: skipped%s%s\n", why.empty() ? "" : " (", why.empty() ? "" : (why + ")").c_str());
    return 0;
  }
  int major = 0, minor = 0;
  cu.attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  cu.attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  CUcontext ctx;
  if (!check(cu.ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain") || !check(cu.ctx_set(ctx), "cuCtxSetCurrent"))
    return 1;

  char tmpl[] = "/tmp/kcache-cuda-check-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  kcache::Options o;
  o.dir = tmpl;
  o.log_level = kcache::LogLevel::error;
  std::string arch = "-arch=sm_" + std::to_string(major * 10 + minor);
  std::printf("device sm_%d%d; kernels compiled with %s through kcache in %s\n", major, minor, arch.c_str(), tmpl);

  auto kernels = kcache::gpu_kernels::cuda_kernels(arch);
  auto find = [&](const std::string& n) -> const kcache::gpu_kernels::CudaKernel& {
    for (const auto& k : kernels)
      if (k.name == n) return k;
    return kernels.front();
  };
  std::vector<std::string> wanted = {"vector_add", "saxpy", "reduce_sum", "sgemm_tiled", "softmax"};
  {  // cold: fills the cache
    auto cache = kcache::Cache::open(o);
    kcache::nvrtc::Compiler c(*cache);
    for (const auto& n : wanted) {
      auto r = c.compile(find(n).program);
      if (!r) {
        // NVRTC may not know this device's real arch; fall back to PTX for it.
        arch = "-arch=compute_" + std::to_string(major * 10 + minor);
        kernels = kcache::gpu_kernels::cuda_kernels(arch);
        r = c.compile(find(n).program);
      }
      if (!r) {
        std::fprintf(stderr, "%s: %s\n", n.c_str(), r.error().to_string().c_str());
        return 1;
      }
    }
  }
  auto cache = kcache::Cache::open(o);  // warm: a fresh Cache, hits from disk
  kcache::nvrtc::Compiler c(*cache);
  auto module_for = [&](const std::string& n, kcache::nvrtc::Result* out) -> CUmodule {
    auto r = c.compile(find(n).program);
    if (!r || r->source == kcache::Source::compiled) {
      std::fprintf(stderr, "%s: expected a cache hit\n", n.c_str());
      ++g_failures;
      return nullptr;
    }
    *out = *r;
    std::string image = !r->cubin.empty() ? std::string(r->cubin) : std::string(r->ptx) + '\0';
    CUmodule m = nullptr;
    if (!check(cu.module_load(&m, image.data()), "cuModuleLoadData")) return nullptr;
    return m;
  };
  auto fn = [&](CUmodule m, const std::string& name) {
    CUfunction f = nullptr;
    check(cu.get_function(&f, m, name.c_str()), ("cuModuleGetFunction " + name).c_str());
    return f;
  };
  auto ramp = [](size_t n, float s, float off) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(i * s) + off;
    return v;
  };

  kcache::nvrtc::Result res;
  if (CUmodule m = module_for("vector_add", &res)) {
    int n = 1 << 16;
    auto a = ramp(n, 0.01f, 0), b = ramp(n, 0.02f, 1);
    DevBuf da(n * 4, a.data()), db(n * 4, b.data()), dc(n * 4);
    void* args[] = {&da.p, &db.p, &dc.p, &n};
    check(cu.launch(fn(m, "vector_add"), (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "launch");
    check(cu.sync(), "sync");
    auto c_out = dc.read<float>(n);
    double err = 0;
    for (int i = 0; i < n; ++i) err = std::max(err, std::fabs(double(c_out[i]) - (a[i] + b[i])));
    report("vector_add", err, 1e-6);
    cu.module_unload(m);
  }
  if (CUmodule m = module_for("saxpy", &res)) {
    int n = 100000;
    float alpha = 1.75f;
    auto x = ramp(n, 0.003f, 0), y = ramp(n, 0.007f, 2);
    DevBuf dx(n * 4, x.data()), dy(n * 4, y.data());
    void* args[] = {&alpha, &dx.p, &dy.p, &n};
    check(cu.launch(fn(m, "saxpy"), 64, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "launch");
    check(cu.sync(), "sync");
    auto out = dy.read<float>(n);
    double err = 0;
    for (int i = 0; i < n; ++i) err = std::max(err, std::fabs(double(out[i]) - (alpha * x[i] + y[i])));
    report("saxpy", err, 1e-5);
    cu.module_unload(m);
  }
  if (CUmodule m = module_for("reduce_sum", &res)) {
    int n = 1 << 20;
    auto x = ramp(n, 0.001f, 0.25f);
    float zero = 0;
    DevBuf dx(n * 4, x.data()), dout(4, &zero);
    void* args[] = {&dx.p, &dout.p, &n};
    std::string low(*res.lowered("reduce_sum<float, 256>"));
    check(cu.launch(fn(m, low), 120, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "launch");
    check(cu.sync(), "sync");
    double want = 0;
    for (float v : x) want += v;
    report("reduce_sum<float, 256>", std::fabs(dout.read<float>(1)[0] - want) / std::fabs(want), 1e-4);
    cu.module_unload(m);
  }
  if (CUmodule m = module_for("sgemm_tiled", &res)) {
    int M = 128, N = 96, K = 160;
    float alpha = 1.f, beta = 0.f;
    auto A = ramp(M * K, 0.07f, 0), B = ramp(K * N, 0.05f, 0);
    std::vector<float> C0(M * N, 0.f);
    DevBuf dA(A.size() * 4, A.data()), dB(B.size() * 4, B.data()), dC(C0.size() * 4, C0.data());
    void* args[] = {&M, &N, &K, &alpha, &dA.p, &dB.p, &beta, &dC.p};
    check(cu.launch(fn(m, "sgemm_tiled"), (N + 15) / 16, (M + 15) / 16, 1, 16, 16, 1, 0, nullptr, args, nullptr),
          "launch");
    check(cu.sync(), "sync");
    auto C = dC.read<float>(M * N);
    double err = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double acc = 0;
        for (int k = 0; k < K; ++k) acc += double(A[i * K + k]) * B[k * N + j];
        err = std::max(err, std::fabs(acc - C[i * N + j]));
      }
    report("sgemm_tiled", err, 1e-3);
    cu.module_unload(m);
  }
  if (CUmodule m = module_for("softmax", &res)) {
    int rows = 64, cols = 1000;
    auto x = ramp(rows * cols, 0.37f, 0);
    DevBuf dx(x.size() * 4, x.data()), dy(x.size() * 4);
    void* args[] = {&dx.p, &dy.p, &cols};
    check(cu.launch(fn(m, "softmax_rows"), rows, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "launch");
    check(cu.sync(), "sync");
    auto y = dy.read<float>(x.size());
    double err = 0;
    for (int r = 0; r < rows; ++r) {
      double mx = -1e30, s = 0;
      for (int j = 0; j < cols; ++j) mx = std::max(mx, double(x[r * cols + j]));
      for (int j = 0; j < cols; ++j) s += std::exp(x[r * cols + j] - mx);
      for (int j = 0; j < cols; ++j)
        err = std::max(err, std::fabs(std::exp(x[r * cols + j] - mx) / s - y[r * cols + j]));
    }
    report("softmax_rows", err, 1e-4);
    cu.module_unload(m);
  }
  std::string rm = std::string("rm -rf '") + tmpl + "'";
  (void)::system(rm.c_str());
  std::printf(g_failures ? "FAILED (%d)\n" : "all kernels correct\n", g_failures);
  return g_failures ? 1 : 0;
}

// A realistic OpenCL kernel set with runners and CPU references, shared by
// the OpenCL tests, the GPU benchmark and the demo. Each runner launches the
// kernel on a built program and returns the largest error against a CPU
// reference (or a negative value when an OpenCL call failed).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kcache/opencl.h"

namespace kcache::cl_kernels {

// Minimal RAII for the objects the runners create.
struct Buf {
  cl_mem m = nullptr;
  Buf(cl_context ctx, size_t bytes, const void* host = nullptr) {
    cl_int e;
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes, const_cast<void*>(host), &e);
  }
  ~Buf() {
    if (m) clReleaseMemObject(m);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

struct Env {
  cl_context ctx = nullptr;
  cl_command_queue queue = nullptr;
};

template <class T>
bool read_back(const Env& env, const Buf& b, std::vector<T>& out) {
  return clEnqueueReadBuffer(env.queue, b.m, CL_TRUE, 0, out.size() * sizeof(T), out.data(), 0, nullptr, nullptr) ==
         CL_SUCCESS;
}

inline std::vector<float> ramp(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * scale) + offset;
  return v;
}

// Runs `name` over `global` (and `local`, or none) with buffers bound.
inline bool launch(const Env& env, cl_program prog, const char* name, const std::function<bool(cl_kernel)>& bind,
                   size_t dims, const size_t* global, const size_t* local) {
  cl_int e;
  cl_kernel k = clCreateKernel(prog, name, &e);
  if (e != CL_SUCCESS) return false;
  bool ok = bind(k) &&
            clEnqueueNDRangeKernel(env.queue, k, static_cast<cl_uint>(dims), nullptr, global, local, 0, nullptr,
                                   nullptr) == CL_SUCCESS &&
            clFinish(env.queue) == CL_SUCCESS;
  clReleaseKernel(k);
  return ok;
}

#define KC_ARG(k, i, v) (clSetKernelArg((k), (i), sizeof(v), &(v)) == CL_SUCCESS)

struct ClKernel {
  std::string name;
  kcache::opencl::ProgramSource program;
  // Returns the max abs error vs the CPU reference, or -1 on an OpenCL failure.
  std::function<double(const Env&, cl_program)> run;
};

inline std::vector<ClKernel> cl_kernel_set() {
  std::vector<ClKernel> ks;

  ks.push_back({"vector_add",
                {R"(
__kernel void vector_add(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
})",
                 "",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int n = 4096;
                  auto a = ramp(n, 0.01f, 0), b = ramp(n, 0.02f, 1);
                  Buf da(env.ctx, n * 4, a.data()), db(env.ctx, n * 4, b.data()), dc(env.ctx, n * 4);
                  size_t g = n;
                  if (!launch(
                          env, p, "vector_add",
                          [&](cl_kernel k) {
                            return KC_ARG(k, 0, da.m) && KC_ARG(k, 1, db.m) && KC_ARG(k, 2, dc.m) && KC_ARG(k, 3, n);
                          },
                          1, &g, nullptr))
                    return -1;
                  std::vector<float> c(n);
                  if (!read_back(env, dc, c)) return -1;
                  double err = 0;
                  for (int i = 0; i < n; ++i) err = std::max(err, std::fabs(double(c[i]) - (a[i] + b[i])));
                  return err;
                }});

  ks.push_back({"saxpy",
                {R"(
__kernel void saxpy(float alpha, __global const float* x, __global float* y, int n) {
  for (int i = get_global_id(0); i < n; i += get_global_size(0)) y[i] = alpha * x[i] + y[i];
})",
                 "-cl-mad-enable",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int n = 10000;
                  float alpha = 2.5f;
                  auto x = ramp(n, 0.003f, 0), y = ramp(n, 0.005f, 2);
                  Buf dx(env.ctx, n * 4, x.data()), dy(env.ctx, n * 4, y.data());
                  size_t g = 1024;
                  if (!launch(
                          env, p, "saxpy",
                          [&](cl_kernel k) {
                            return KC_ARG(k, 0, alpha) && KC_ARG(k, 1, dx.m) && KC_ARG(k, 2, dy.m) && KC_ARG(k, 3, n);
                          },
                          1, &g, nullptr))
                    return -1;
                  std::vector<float> out(n);
                  if (!read_back(env, dy, out)) return -1;
                  double err = 0;
                  for (int i = 0; i < n; ++i) err = std::max(err, std::fabs(double(out[i]) - (alpha * x[i] + y[i])));
                  return err;
                }});

  ks.push_back({"reduction",
                {R"(
__kernel void reduce_sum(__global const float* in, __global float* partial, __local float* scratch, int n) {
  int lid = get_local_id(0), lsz = get_local_size(0);
  float v = 0.0f;
  for (int i = get_global_id(0); i < n; i += get_global_size(0)) v += in[i];
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = lsz / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) partial[get_group_id(0)] = scratch[0];
})",
                 "",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int n = 1 << 16;
                  auto x = ramp(n, 0.001f, 0.5f);
                  size_t local = 64, groups = 32, g = local * groups;
                  Buf dx(env.ctx, n * 4, x.data()), dp(env.ctx, groups * 4);
                  if (!launch(
                          env, p, "reduce_sum",
                          [&](cl_kernel k) {
                            return KC_ARG(k, 0, dx.m) && KC_ARG(k, 1, dp.m) &&
                                   clSetKernelArg(k, 2, local * 4, nullptr) == CL_SUCCESS && KC_ARG(k, 3, n);
                          },
                          1, &g, &local))
                    return -1;
                  std::vector<float> part(groups);
                  if (!read_back(env, dp, part)) return -1;
                  double got = 0, want = 0;
                  for (float v : part) got += v;
                  for (float v : x) want += v;
                  return std::fabs(got - want) / std::max(1.0, std::fabs(want));
                }});

  ks.push_back({"matmul_tiled",
                {R"(
#ifndef TILE
#define TILE 16
#endif
__kernel void matmul(int M, int N, int K, __global const float* A, __global const float* B, __global float* C) {
  __local float As[TILE][TILE];
  __local float Bs[TILE][TILE];
  int tx = get_local_id(0), ty = get_local_id(1);
  int col = get_group_id(0) * TILE + tx, row = get_group_id(1) * TILE + ty;
  float acc = 0.0f;
  for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
    int ak = t * TILE + tx, bk = t * TILE + ty;
    As[ty][tx] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
    Bs[ty][tx] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (row < M && col < N) C[row * N + col] = acc;
})",
                 "-DTILE=16",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int M = 64, N = 48, K = 80;
                  auto A = ramp(M * K, 0.07f, 0), B = ramp(K * N, 0.05f, 0);
                  Buf dA(env.ctx, A.size() * 4, A.data()), dB(env.ctx, B.size() * 4, B.data()), dC(env.ctx, M * N * 4);
                  // The work-group is TILE x TILE; TILE comes from the build options.
                  size_t tile = 16;
                  {
                    cl_device_id dev;
                    std::string opts(256, '\0');
                    if (clGetProgramInfo(p, CL_PROGRAM_DEVICES, sizeof dev, &dev, nullptr) == CL_SUCCESS &&
                        clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_OPTIONS, opts.size(), opts.data(), nullptr) ==
                            CL_SUCCESS &&
                        opts.find("-DTILE=8") != std::string::npos)
                      tile = 8;
                  }
                  size_t local[2] = {tile, tile};
                  size_t global[2] = {(N + tile - 1) / tile * tile, (M + tile - 1) / tile * tile};
                  if (!launch(
                          env, p, "matmul",
                          [&](cl_kernel k) {
                            return KC_ARG(k, 0, M) && KC_ARG(k, 1, N) && KC_ARG(k, 2, K) && KC_ARG(k, 3, dA.m) &&
                                   KC_ARG(k, 4, dB.m) && KC_ARG(k, 5, dC.m);
                          },
                          2, global, local))
                    return -1;
                  std::vector<float> C(M * N);
                  if (!read_back(env, dC, C)) return -1;
                  double err = 0;
                  for (int i = 0; i < M; ++i)
                    for (int j = 0; j < N; ++j) {
                      double acc = 0;
                      for (int k = 0; k < K; ++k) acc += double(A[i * K + k]) * B[k * N + j];
                      err = std::max(err, std::fabs(acc - C[i * N + j]));
                    }
                  return err;
                }});

  ks.push_back({"softmax",
                {R"(
__kernel void softmax_rows(__global const float* x, __global float* y, int cols) {
  int r = get_global_id(0);
  __global const float* xr = x + r * cols;
  float m = xr[0];
  for (int c = 1; c < cols; ++c) m = fmax(m, xr[c]);
  float s = 0.0f;
  for (int c = 0; c < cols; ++c) s += exp(xr[c] - m);
  for (int c = 0; c < cols; ++c) y[r * cols + c] = exp(xr[c] - m) / s;
})",
                 "",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int rows = 64, cols = 100;
                  auto x = ramp(rows * cols, 0.37f, 0);
                  Buf dx(env.ctx, x.size() * 4, x.data()), dy(env.ctx, x.size() * 4);
                  size_t g = rows;
                  if (!launch(
                          env, p, "softmax_rows",
                          [&](cl_kernel k) { return KC_ARG(k, 0, dx.m) && KC_ARG(k, 1, dy.m) && KC_ARG(k, 2, cols); },
                          1, &g, nullptr))
                    return -1;
                  std::vector<float> y(x.size());
                  if (!read_back(env, dy, y)) return -1;
                  double err = 0;
                  for (int r = 0; r < rows; ++r) {
                    double m = -1e30, s = 0;
                    for (int c = 0; c < cols; ++c) m = std::max(m, double(x[r * cols + c]));
                    for (int c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
                    for (int c = 0; c < cols; ++c)
                      err = std::max(err, std::fabs(std::exp(x[r * cols + c] - m) / s - y[r * cols + c]));
                  }
                  return err;
                }});

  ks.push_back({"transpose",
                {R"(
#define TD 16
__kernel void transpose(__global const float* in, __global float* out, int rows, int cols) {
  __local float tile[TD][TD + 1];
  int x = get_group_id(0) * TD + get_local_id(0), y = get_group_id(1) * TD + get_local_id(1);
  if (x < cols && y < rows) tile[get_local_id(1)][get_local_id(0)] = in[y * cols + x];
  barrier(CLK_LOCAL_MEM_FENCE);
  x = get_group_id(1) * TD + get_local_id(0);
  y = get_group_id(0) * TD + get_local_id(1);
  if (x < rows && y < cols) out[y * rows + x] = tile[get_local_id(0)][get_local_id(1)];
})",
                 "",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int rows = 48, cols = 80;
                  auto a = ramp(rows * cols, 0.11f, 0);
                  Buf din(env.ctx, a.size() * 4, a.data()), dout(env.ctx, a.size() * 4);
                  size_t local[2] = {16, 16}, global[2] = {80, 48};
                  if (!launch(
                          env, p, "transpose",
                          [&](cl_kernel k) {
                            return KC_ARG(k, 0, din.m) && KC_ARG(k, 1, dout.m) && KC_ARG(k, 2, rows) &&
                                   KC_ARG(k, 3, cols);
                          },
                          2, global, local))
                    return -1;
                  std::vector<float> out(a.size());
                  if (!read_back(env, dout, out)) return -1;
                  double err = 0;
                  for (int r = 0; r < rows; ++r)
                    for (int c = 0; c < cols; ++c)
                      err = std::max(err, std::fabs(double(out[c * rows + r]) - a[r * cols + c]));
                  return err;
                }});

  ks.push_back({"layer_norm_with_header",
                {R"(
#include "norm_params.h"
__kernel void layer_norm(__global const float* x, __global float* y, int cols) {
  int r = get_global_id(0);
  __global const float* xr = x + r * cols;
  float mean = 0.0f, var = 0.0f;
  for (int c = 0; c < cols; ++c) mean += xr[c];
  mean /= cols;
  for (int c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
  float rstd = rsqrt(var / cols + NORM_EPS);
  for (int c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - mean) * rstd * NORM_GAIN;
})",
                 "",
                 {{"norm_params.h", "#define NORM_EPS 1e-5f\n#define NORM_GAIN 1.0f\n"}},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int rows = 32, cols = 64;
                  auto x = ramp(rows * cols, 0.23f, 0.1f);
                  Buf dx(env.ctx, x.size() * 4, x.data()), dy(env.ctx, x.size() * 4);
                  size_t g = rows;
                  if (!launch(
                          env, p, "layer_norm",
                          [&](cl_kernel k) { return KC_ARG(k, 0, dx.m) && KC_ARG(k, 1, dy.m) && KC_ARG(k, 2, cols); },
                          1, &g, nullptr))
                    return -1;
                  std::vector<float> y(x.size());
                  if (!read_back(env, dy, y)) return -1;
                  // Reference with the stock header (gain 1); a changed gain shows as error.
                  double err = 0;
                  for (int r = 0; r < rows; ++r) {
                    double mean = 0, var = 0;
                    for (int c = 0; c < cols; ++c) mean += x[r * cols + c];
                    mean /= cols;
                    for (int c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
                    double rstd = 1.0 / std::sqrt(var / cols + 1e-5);
                    for (int c = 0; c < cols; ++c)
                      err = std::max(err, std::fabs((x[r * cols + c] - mean) * rstd - y[r * cols + c]));
                  }
                  return err;
                }});

  ks.push_back({"histogram",
                {R"(
__kernel void histogram256(__global const uchar* data, __global uint* hist, int n) {
  __local uint local_hist[256];
  for (int i = get_local_id(0); i < 256; i += get_local_size(0)) local_hist[i] = 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = get_global_id(0); i < n; i += get_global_size(0)) atomic_inc(&local_hist[data[i]]);
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = get_local_id(0); i < 256; i += get_local_size(0)) atomic_add(&hist[i], local_hist[i]);
})",
                 "",
                 {},
                 {}},
                [](const Env& env, cl_program p) -> double {
                  int n = 50000;
                  std::vector<unsigned char> d(n);
                  for (int i = 0; i < n; ++i) d[i] = static_cast<unsigned char>((i * 2654435761u) >> 24);
                  std::vector<unsigned> zero(256, 0);
                  Buf dd(env.ctx, n, d.data()), dh(env.ctx, 256 * 4, zero.data());
                  size_t local = 64, g = 64 * 8;
                  if (!launch(
                          env, p, "histogram256",
                          [&](cl_kernel k) { return KC_ARG(k, 0, dd.m) && KC_ARG(k, 1, dh.m) && KC_ARG(k, 2, n); }, 1,
                          &g, &local))
                    return -1;
                  std::vector<unsigned> h(256);
                  if (!read_back(env, dh, h)) return -1;
                  std::vector<unsigned> want(256, 0);
                  for (unsigned char c : d) ++want[c];
                  double err = 0;
                  for (int i = 0; i < 256; ++i) err = std::max(err, std::fabs(double(h[i]) - want[i]));
                  return err;
                }});

  return ks;
}

#undef KC_ARG

}  // namespace kcache::cl_kernels

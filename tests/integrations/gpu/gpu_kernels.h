// A corpus of realistic CUDA kernels (the shapes ML and HPC JITs emit:
// reductions, GEMM, normalisations, scans, transposes...) shared by the
// NVRTC tests, the GPU benchmark, the demo and the CUDA check program.
#pragma once

#include <string>
#include <vector>

#include "kcache/nvrtc.h"

namespace kcache::gpu_kernels {

struct CudaKernel {
  std::string name;  // short label
  kcache::nvrtc::Program program;
  std::vector<std::string> entry_points;  // extern "C" kernels in the PTX
};

// Common helpers as a named header (so header changes can be tested).
inline const char* kCommonHeader = R"(
#pragma once
#define KC_WARP 32
template <typename T> __device__ __forceinline__ T kc_warp_sum(T v) {
  for (int o = KC_WARP / 2; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T kc_warp_max(T v) {
  for (int o = KC_WARP / 2; o > 0; o >>= 1) { T w = __shfl_down_sync(0xffffffffu, v, o); v = v > w ? v : w; }
  return v;
}
__device__ __forceinline__ float kc_gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}
)";

inline std::vector<CudaKernel> cuda_kernels(const std::string& arch = "-arch=sm_80") {
  std::vector<CudaKernel> k;
  auto add = [&](std::string name, std::string src, std::vector<std::string> entries,
                 std::vector<std::string> exprs = {}, std::vector<std::string> extra_opts = {}) {
    CudaKernel c;
    c.name = name;
    c.program.name = name + ".cu";
    c.program.source = std::move(src);
    c.program.options = {arch, "--std=c++17"};
    for (auto& o : extra_opts) c.program.options.push_back(o);
    c.program.headers = {{"kc_common.cuh", kCommonHeader}};
    c.program.name_expressions = std::move(exprs);
    c.entry_points = std::move(entries);
    k.push_back(std::move(c));
  };

  add("vector_add", R"(
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
})",
      {"vector_add"});

  add("saxpy", R"(
extern "C" __global__ void saxpy(float alpha, const float* __restrict__ x, float* __restrict__ y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = alpha * x[i] + y[i];
})",
      {"saxpy"});

  add("reduce_sum", R"(
#include "kc_common.cuh"
template <typename T, int BLOCK>
__global__ void reduce_sum(const T* __restrict__ in, T* __restrict__ out, int n) {
  __shared__ T warp_sums[BLOCK / KC_WARP];
  T v = T(0);
  for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) v += in[i];
  v = kc_warp_sum(v);
  if (threadIdx.x % KC_WARP == 0) warp_sums[threadIdx.x / KC_WARP] = v;
  __syncthreads();
  if (threadIdx.x < KC_WARP) {
    v = threadIdx.x < BLOCK / KC_WARP ? warp_sums[threadIdx.x] : T(0);
    v = kc_warp_sum(v);
    if (threadIdx.x == 0) atomicAdd(out, v);
  }
})",
      {}, {"reduce_sum<float, 256>", "reduce_sum<double, 128>", "reduce_sum<int, 512>"});

  add("reduce_max", R"(
#include "kc_common.cuh"
extern "C" __global__ void reduce_max(const float* in, float* block_max, int n) {
  __shared__ float s[32];
  float v = -3.402823466e38f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v = fmaxf(v, in[i]);
  v = kc_warp_max(v);
  if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? s[threadIdx.x] : -3.402823466e38f;
    v = kc_warp_max(v);
    if (threadIdx.x == 0) block_max[blockIdx.x] = v;
  }
})",
      {"reduce_max"});

  add("sgemm_tiled", R"(
#define TILE 16
extern "C" __global__ void sgemm_tiled(int M, int N, int K, float alpha, const float* A, const float* B,
                                       float beta, float* C) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
    int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.f;
    Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = alpha * acc + beta * C[row * N + col];
})",
      {"sgemm_tiled"});

  add("sgemm_regblock", R"(
template <int BM, int BN, int BK, int TM, int TN>
__global__ void sgemm_regblock(int M, int N, int K, const float* __restrict__ A, const float* __restrict__ B,
                               float* __restrict__ C) {
  __shared__ float As[BK][BM];
  __shared__ float Bs[BK][BN];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int threads = (BM / TM) * (BN / TN);
  float acc[TM][TN] = {};
  float a_reg[TM], b_reg[TN];
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += threads) {
      int r = i / BK, c = i % BK;
      As[c][r] = (row0 + r < M && k0 + c < K) ? A[(row0 + r) * K + k0 + c] : 0.f;
    }
    for (int i = threadIdx.x; i < BK * BN; i += threads) {
      int r = i / BN, c = i % BN;
      Bs[r][c] = (k0 + r < K && col0 + c < N) ? B[(k0 + r) * N + col0 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
#pragma unroll
      for (int m = 0; m < TM; ++m) a_reg[m] = As[k][ty * TM + m];
#pragma unroll
      for (int n = 0; n < TN; ++n) b_reg[n] = Bs[k][tx * TN + n];
#pragma unroll
      for (int m = 0; m < TM; ++m)
#pragma unroll
        for (int n = 0; n < TN; ++n) acc[m][n] += a_reg[m] * b_reg[n];
    }
    __syncthreads();
  }
  for (int m = 0; m < TM; ++m)
    for (int n = 0; n < TN; ++n) {
      int r = row0 + ty * TM + m, c = col0 + tx * TN + n;
      if (r < M && c < N) C[r * N + c] = acc[m][n];
    }
})",
      {}, {"sgemm_regblock<64, 64, 8, 4, 4>", "sgemm_regblock<128, 128, 8, 8, 8>"});

  add("softmax", R"(
#include "kc_common.cuh"
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  float m = -3.402823466e38f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = kc_warp_max(m);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : -3.402823466e38f;
    v = kc_warp_max(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  m = red[0];
  __syncthreads();
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c] - m);
  s = kc_warp_sum(s);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    v = kc_warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  float inv = 1.f / red[0];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - m) * inv;
})",
      {"softmax_rows"});

  add("layer_norm", R"(
#include "kc_common.cuh"
extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ gamma,
                                      const float* __restrict__ beta, float* __restrict__ y, int cols, float eps) {
  __shared__ float s_mean, s_rstd;
  __shared__ float red[2][32];
  const float* xr = x + blockIdx.x * cols;
  float sum = 0.f, sq = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = xr[c]; sum += v; sq += v * v; }
  sum = kc_warp_sum(sum); sq = kc_warp_sum(sq);
  if (threadIdx.x % 32 == 0) { red[0][threadIdx.x / 32] = sum; red[1][threadIdx.x / 32] = sq; }
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.f, b = 0.f;
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) { a += red[0][w]; b += red[1][w]; }
    float mean = a / cols;
    s_mean = mean;
    s_rstd = rsqrtf(b / cols - mean * mean + eps);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[blockIdx.x * cols + c] = (xr[c] - s_mean) * s_rstd * gamma[c] + beta[c];
})",
      {"layer_norm"});

  add("rms_norm", R"(
#include "kc_common.cuh"
template <typename T>
__global__ void rms_norm(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int cols, float eps) {
  __shared__ float red[32];
  const T* xr = x + blockIdx.x * cols;
  float sq = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = float(xr[c]); sq += v * v; }
  sq = kc_warp_sum(sq);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sq;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.f;
    for (int i = 0; i < (blockDim.x + 31) / 32; ++i) a += red[i];
    red[0] = rsqrtf(a / cols + eps);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = T(float(xr[c]) * red[0] * float(w[c]));
})",
      {}, {"rms_norm<float>", "rms_norm<double>"});

  add("scan_inclusive", R"(
extern "C" __global__ void scan_inclusive(const int* in, int* out, int n) {
  extern __shared__ int buf[];
  int t = threadIdx.x;
  buf[t] = t < n ? in[t] : 0;
  __syncthreads();
  for (int off = 1; off < blockDim.x; off <<= 1) {
    int v = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += v;
    __syncthreads();
  }
  if (t < n) out[t] = buf[t];
})",
      {"scan_inclusive"});

  add("scan_blelloch", R"(
template <int N>
__global__ void scan_exclusive(const float* in, float* out) {
  __shared__ float t[N];
  int i = threadIdx.x;
  t[2 * i] = in[2 * i];
  t[2 * i + 1] = in[2 * i + 1];
  int off = 1;
  for (int d = N >> 1; d > 0; d >>= 1) {
    __syncthreads();
    if (i < d) { int a = off * (2 * i + 1) - 1, b = off * (2 * i + 2) - 1; t[b] += t[a]; }
    off <<= 1;
  }
  if (i == 0) t[N - 1] = 0;
  for (int d = 1; d < N; d <<= 1) {
    off >>= 1;
    __syncthreads();
    if (i < d) { int a = off * (2 * i + 1) - 1, b = off * (2 * i + 2) - 1; float v = t[a]; t[a] = t[b]; t[b] += v; }
  }
  __syncthreads();
  out[2 * i] = t[2 * i];
  out[2 * i + 1] = t[2 * i + 1];
})",
      {}, {"scan_exclusive<512>", "scan_exclusive<1024>"});

  add("transpose", R"(
#define TD 32
#define RB 8
extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  __shared__ float tile[TD][TD + 1];
  int x = blockIdx.x * TD + threadIdx.x, y = blockIdx.y * TD + threadIdx.y;
  for (int j = 0; j < TD; j += RB)
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
  __syncthreads();
  x = blockIdx.y * TD + threadIdx.x; y = blockIdx.x * TD + threadIdx.y;
  for (int j = 0; j < TD; j += RB)
    if (x < rows && y + j < cols) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
})",
      {"transpose"});

  add("histogram", R"(
extern "C" __global__ void histogram256(const unsigned char* data, unsigned int* hist, int n) {
  __shared__ unsigned int local[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) atomicAdd(&local[data[i]], 1u);
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(&hist[i], local[i]);
})",
      {"histogram256"});

  add("conv2d_3x3", R"(
extern "C" __global__ void conv2d_3x3(const float* __restrict__ img, const float* __restrict__ w, float* out,
                                      int H, int W) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= W || y >= H) return;
  float acc = 0.f;
#pragma unroll
  for (int dy = -1; dy <= 1; ++dy)
#pragma unroll
    for (int dx = -1; dx <= 1; ++dx) {
      int yy = min(max(y + dy, 0), H - 1), xx = min(max(x + dx, 0), W - 1);
      acc += img[yy * W + xx] * w[(dy + 1) * 3 + dx + 1];
    }
  out[y * W + x] = acc;
})",
      {"conv2d_3x3"});

  add("elementwise", R"(
#include "kc_common.cuh"
struct Relu { __device__ float operator()(float x) const { return x > 0.f ? x : 0.f; } };
struct Gelu { __device__ float operator()(float x) const { return kc_gelu(x); } };
struct Silu { __device__ float operator()(float x) const { return x / (1.f + __expf(-x)); } };
template <typename Op>
__global__ void apply(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = Op()(in[i]);
})",
      {}, {"apply<Relu>", "apply<Gelu>", "apply<Silu>"});

  add("bias_gelu", R"(
#include "kc_common.cuh"
extern "C" __global__ void bias_gelu(const float* __restrict__ x, const float* __restrict__ bias, float* y,
                                     int rows, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] = kc_gelu(x[i] + bias[i % cols]);
})",
      {"bias_gelu"});

  add("bitonic_step", R"(
extern "C" __global__ void bitonic_step(float* data, int j, int k) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x, p = i ^ j;
  if (p > i) {
    bool up = (i & k) == 0;
    float a = data[i], b = data[p];
    if ((a > b) == up) { data[i] = b; data[p] = a; }
  }
})",
      {"bitonic_step"});

  add("stencil_1d", R"(
#ifndef RADIUS
#define RADIUS 3
#endif
extern "C" __global__ void stencil_1d(const float* in, float* out, int n) {
  extern __shared__ float s[];
  int g = blockIdx.x * blockDim.x + threadIdx.x, l = threadIdx.x + RADIUS;
  s[l] = g < n ? in[g] : 0.f;
  if (threadIdx.x < RADIUS) {
    s[l - RADIUS] = g >= RADIUS ? in[g - RADIUS] : 0.f;
    s[l + blockDim.x] = g + blockDim.x < n ? in[g + blockDim.x] : 0.f;
  }
  __syncthreads();
  float acc = 0.f;
  for (int o = -RADIUS; o <= RADIUS; ++o) acc += s[l + o];
  if (g < n) out[g] = acc;
})",
      {"stencil_1d"}, {}, {"-DRADIUS=4"});

  add("dot", R"(
#include "kc_common.cuh"
extern "C" __global__ void dot(const float* a, const float* b, float* out, int n) {
  float v = 0.f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += a[i] * b[i];
  v = kc_warp_sum(v);
  if (threadIdx.x % 32 == 0) atomicAdd(out, v);
})",
      {"dot"});

  add("argmax", R"(
extern "C" __global__ void argmax_rows(const float* x, int* idx, int cols) {
  __shared__ float sv[256];
  __shared__ int si[256];
  const float* r = x + blockIdx.x * cols;
  float best = -3.402823466e38f; int bi = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) if (r[c] > best) { best = r[c]; bi = c; }
  sv[threadIdx.x] = best; si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && (sv[threadIdx.x + s] > sv[threadIdx.x] ||
        (sv[threadIdx.x + s] == sv[threadIdx.x] && si[threadIdx.x + s] < si[threadIdx.x]))) {
      sv[threadIdx.x] = sv[threadIdx.x + s]; si[threadIdx.x] = si[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) idx[blockIdx.x] = si[0];
})",
      {"argmax_rows"});

  add("gemv", R"(
#include "kc_common.cuh"
extern "C" __global__ void gemv(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y,
                                int rows, int cols) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc = 0.f;
  for (int c = lane; c < cols; c += 32) acc += A[row * cols + c] * x[c];
  acc = kc_warp_sum(acc);
  if (lane == 0) y[row] = acc;
})",
      {"gemv"});

  add("cross_entropy", R"(
extern "C" __global__ void cross_entropy(const float* logits, const int* labels, float* loss, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* l = logits + r * cols;
  float m = l[0];
  for (int c = 1; c < cols; ++c) m = fmaxf(m, l[c]);
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += expf(l[c] - m);
  loss[r] = logf(s) + m - l[labels[r]];
})",
      {"cross_entropy"});

  add("rope", R"(
extern "C" __global__ void rope(float* q, const int* pos, int heads, int dim, float base) {
  int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  if (h >= heads || 2 * i + 1 >= dim) return;
  float theta = pos[t] * powf(base, -2.f * i / dim);
  float c = cosf(theta), s = sinf(theta);
  float* v = q + (t * heads + h) * dim;
  float a = v[2 * i], b = v[2 * i + 1];
  v[2 * i] = a * c - b * s;
  v[2 * i + 1] = a * s + b * c;
})",
      {"rope"});

  add("attention_scores", R"(
template <int D>
__global__ void attn_scores(const float* __restrict__ Q, const float* __restrict__ K, float* __restrict__ S,
                            int n, float scale) {
  __shared__ float q[D];
  int i = blockIdx.x;
  for (int d = threadIdx.x; d < D; d += blockDim.x) q[d] = Q[i * D + d];
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float acc = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) acc += q[d] * K[j * D + d];
    S[i * n + j] = j <= i ? acc * scale : -1e30f;
  }
})",
      {}, {"attn_scores<64>", "attn_scores<128>"});

  add("adam_step", R"(
extern "C" __global__ void adam_step(float* p, const float* g, float* m, float* v, int n, float lr, float b1,
                                     float b2, float eps, int t) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  m[i] = b1 * m[i] + (1.f - b1) * g[i];
  v[i] = b2 * v[i] + (1.f - b2) * g[i] * g[i];
  float mh = m[i] / (1.f - powf(b1, t)), vh = v[i] / (1.f - powf(b2, t));
  p[i] -= lr * mh / (sqrtf(vh) + eps);
})",
      {"adam_step"});

  return k;
}

}  // namespace kcache::gpu_kernels

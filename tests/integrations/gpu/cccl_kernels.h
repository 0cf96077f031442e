// CUDA kernels that include CCCL from the CUDA toolkit: CUB
// (cub::BlockReduce, cub::BlockRadixSort), libcu++ (cuda::std) and
// cooperative_groups. Shared by nvrtc_cccl_test and bench/gpu_bench.cc.
// Compile with -I<toolkit>/include/cccl -I<toolkit>/include (options_for).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kcache::cccl_kernels {

struct CcclKernel {
  const char* name;
  const char* source;
};

inline const CcclKernel kKernels[] = {
    {"block_reduce.cu",
     "#include <cub/block/block_reduce.cuh>\n"
     "extern \"C\" __global__ void block_sum(const float* in, float* out) {\n"
     "  using BlockReduce = cub::BlockReduce<float, 128>;\n"
     "  __shared__ typename BlockReduce::TempStorage tmp;\n"
     "  float s = BlockReduce(tmp).Sum(in[blockIdx.x * 128 + threadIdx.x]);\n"
     "  if (threadIdx.x == 0) out[blockIdx.x] = s;\n"
     "}\n"},
    {"block_radix_sort.cu",
     "#include <cub/block/block_radix_sort.cuh>\n"
     "extern \"C\" __global__ void block_sort(unsigned* keys) {\n"
     "  using Sort = cub::BlockRadixSort<unsigned, 128, 4>;\n"
     "  __shared__ typename Sort::TempStorage tmp;\n"
     "  unsigned k[4];\n"
     "  for (int i = 0; i < 4; ++i) k[i] = keys[threadIdx.x * 4 + i];\n"
     "  Sort(tmp).Sort(k);\n"
     "  for (int i = 0; i < 4; ++i) keys[threadIdx.x * 4 + i] = k[i];\n"
     "}\n"},
    {"cuda_std.cu",
     "#include <cuda/std/array>\n#include <cuda/std/limits>\n#include <cuda/std/type_traits>\n"
     "extern \"C\" __global__ void clamp_add(float* x, int n) {\n"
     "  cuda::std::array<float, 4> a{1.f, 2.f, 3.f, 4.f};\n"
     "  static_assert(cuda::std::is_floating_point_v<float>);\n"
     "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
     "  if (i < n) x[i] = fminf(x[i] + a[i % 4], cuda::std::numeric_limits<float>::max());\n"
     "}\n"},
    {"tile_sum.cu",
     "#include <cooperative_groups.h>\n"
     "namespace cg = cooperative_groups;\n"
     "extern \"C\" __global__ void tile_sum(const float* in, float* out) {\n"
     "  cg::thread_block block = cg::this_thread_block();\n"
     "  cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);\n"
     "  float v = in[block.group_index().x * block.size() + block.thread_rank()];\n"
     "  for (int o = tile.size() / 2; o > 0; o /= 2) v += tile.shfl_down(v, o);\n"
     "  if (tile.thread_rank() == 0) atomicAdd(out, v);\n"
     "}\n"},
};
inline constexpr size_t kKernelCount = sizeof(kKernels) / sizeof(kKernels[0]);

inline std::vector<std::string> options_for(const std::string& include) {
  return {"-arch=sm_90", "-std=c++17", "-I" + include + "/cccl", "-I" + include};
}

}  // namespace kcache::cccl_kernels

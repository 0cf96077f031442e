// OpenCL integration on the installed platform (PoCL here): cold and warm
// builds of a realistic kernel set through a real memory + LMDB cache, every
// program run and checked against a CPU reference. Skips, with the reason,
// when no OpenCL platform or device exists at run time.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <memory>

#include "kcache/cache.h"
#include "kcache/opencl.h"
#include "opencl_kernels.h"
#include "test_util.h"

namespace kcache {
namespace {

using cl_kernels::ClKernel;
using test::TempDir;

using test::disk_options;

class OpenclTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // PoCL keeps its own kernel cache in $HOME by default; off, so what is
    // tested is kcache alone and nothing is written outside the temp folder.
    ::setenv("POCL_KERNEL_CACHE", "0", /*overwrite=*/0);
    cl_uint n = 0;
    cl_platform_id platform = nullptr;
    if (clGetPlatformIDs(1, &platform, &n) != CL_SUCCESS || n == 0) {
      skip_reason_ = new std::string("no OpenCL platform found (is an ICD such as pocl-opencl-icd installed?)");
      return;
    }
    if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device_, &n) != CL_SUCCESS || n == 0) {
      skip_reason_ = new std::string("the OpenCL platform has no device");
      return;
    }
    cl_int e;
    env_.ctx = clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &e);
    if (e != CL_SUCCESS) {
      skip_reason_ = new std::string("clCreateContext failed: " + std::to_string(e));
      return;
    }
    env_.queue = clCreateCommandQueue(env_.ctx, device_, 0, &e);
    dir_ = new TempDir();
    cache_ = Cache::open(disk_options(dir_->path())).release();
    kernels_ = new std::vector<ClKernel>(cl_kernels::cl_kernel_set());
  }
  static void TearDownTestSuite() {
    delete kernels_;
    delete cache_;
    delete dir_;
    if (env_.queue) clReleaseCommandQueue(env_.queue);
    if (env_.ctx) clReleaseContext(env_.ctx);
    delete skip_reason_;
  }
  void SetUp() override {
    if (skip_reason_) GTEST_SKIP() << *skip_reason_;
  }

  // Builds through `pc`, runs, checks; returns the result (program released).
  static opencl::BuildResult build_and_check(opencl::ProgramCache& pc, const ClKernel& k, double tol,
                                             const opencl::DeviceDescription* desc = nullptr) {
    auto r = desc ? pc.build(env_.ctx, device_, *desc, k.program) : pc.build(env_.ctx, device_, k.program);
    EXPECT_TRUE(r.has_value()) << k.name << ": " << (r ? "" : r.error().to_string());
    if (!r) return {};
    double err = k.run(env_, r->program);
    EXPECT_GE(err, 0.0) << k.name << ": an OpenCL call failed";
    EXPECT_LE(err, tol) << k.name;
    clReleaseProgram(r->program);
    r->program = nullptr;
    return *r;
  }

  static std::string* skip_reason_;
  static cl_device_id device_;
  static cl_kernels::Env env_;
  static TempDir* dir_;
  static Cache* cache_;
  static std::vector<ClKernel>* kernels_;
};
std::string* OpenclTest::skip_reason_ = nullptr;
cl_device_id OpenclTest::device_ = nullptr;
cl_kernels::Env OpenclTest::env_;
TempDir* OpenclTest::dir_ = nullptr;
Cache* OpenclTest::cache_ = nullptr;
std::vector<ClKernel>* OpenclTest::kernels_ = nullptr;

const ClKernel& by_name(const std::vector<ClKernel>& ks, const std::string& n) {
  for (const auto& k : ks)
    if (k.name == n) return k;
  ADD_FAILURE() << "no kernel " << n;
  return ks.front();
}

TEST_F(OpenclTest, DescribeReadsTheDriverStrings) {
  auto d = opencl::describe(device_);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_FALSE(d->platform_name.empty());
  EXPECT_NE(d->platform_version.find("OpenCL"), std::string::npos) << d->platform_version;
  EXPECT_FALSE(d->device_name.empty());
  EXPECT_NE(d->device_version.find("OpenCL"), std::string::npos) << d->device_version;
  EXPECT_FALSE(d->driver_version.empty());
}

TEST_F(OpenclTest, ColdThenWarmBuildsRunAndMatchTheCpu) {
  ASSERT_GE(kernels_->size(), 8u);
  opencl::ProgramCache pc(*cache_);
  for (const auto& k : *kernels_) {
    auto cold = build_and_check(pc, k, 1e-3);
    EXPECT_EQ(cold.source, Source::compiled) << k.name;
    EXPECT_FALSE(cold.fell_back);
    auto warm = build_and_check(pc, k, 1e-3);
    EXPECT_EQ(warm.source, Source::memory) << k.name;
    EXPECT_EQ(warm.key, cold.key);
    auto stored = cache_->get(cold.key);
    ASSERT_TRUE(stored.has_value()) << k.name;
    EXPECT_GT(stored->artifact("binary").value_or("").size(), 100u) << k.name;
  }
  auto s = pc.stats();
  EXPECT_EQ(s.source_builds, kernels_->size());
  EXPECT_EQ(s.binary_loads, kernels_->size());
  EXPECT_EQ(s.refused_binaries, 0u);

  // A fresh cache on the same folder (a new process): every build is a disk
  // hit, loaded from the binary, and still computes the right answers.
  (void)cache_->flush();
  auto disk_only = Cache::open(disk_options(dir_->path(), /*memory=*/false));
  opencl::ProgramCache pc2(*disk_only);
  for (const auto& k : *kernels_) {
    auto r = build_and_check(pc2, k, 1e-3);
    EXPECT_EQ(r.source, Source::disk) << k.name;
  }
  EXPECT_EQ(pc2.stats().source_builds, 0u);
  EXPECT_EQ(pc2.stats().binary_loads, kernels_->size());
}

TEST_F(OpenclTest, OptionChangeIsAMissAndStillCorrect) {
  opencl::ProgramCache pc(*cache_);
  ClKernel k = by_name(*kernels_, "matmul_tiled");
  auto a = build_and_check(pc, k, 1e-3);
  k.program.options = "-DTILE=8";
  auto b = build_and_check(pc, k, 1e-3);
  EXPECT_EQ(b.source, Source::compiled);
  EXPECT_NE(a.key, b.key);
  k.program.options = "-DTILE=8 -cl-fast-relaxed-math";
  auto c = build_and_check(pc, k, 1e-2);
  EXPECT_EQ(c.source, Source::compiled);
  auto d = *opencl::describe(device_);
  auto ka = opencl::program_key(d, by_name(*kernels_, "matmul_tiled").program);
  auto kc = opencl::program_key(d, k.program);
  EXPECT_EQ(manifest_diff(ka->manifest, kc->manifest), std::vector<std::string>{"options"});
  // Whitespace in the options string is not an input.
  k.program.options = "  -DTILE=8\t -cl-fast-relaxed-math ";
  EXPECT_EQ(opencl::program_key(d, k.program)->key, c.key);
}

TEST_F(OpenclTest, DeviceOrDriverChangeIsAMiss) {
  opencl::ProgramCache pc(*cache_);
  const ClKernel& k = by_name(*kernels_, "saxpy");
  auto real = *opencl::describe(device_);
  auto a = build_and_check(pc, k, 1e-4, &real);
  auto again = build_and_check(pc, k, 1e-4, &real);
  EXPECT_NE(again.source, Source::compiled);

  opencl::DeviceDescription other = real;
  other.device_name += " (another device)";
  auto b = build_and_check(pc, k, 1e-4, &other);
  EXPECT_EQ(b.source, Source::compiled);
  EXPECT_NE(b.key, a.key);
  EXPECT_EQ(
      manifest_diff(opencl::program_key(real, k.program)->manifest, opencl::program_key(other, k.program)->manifest),
      std::vector<std::string>{"device.name"});

  opencl::DeviceDescription newer = real;
  newer.driver_version += ".1";
  auto c = build_and_check(pc, k, 1e-4, &newer);
  EXPECT_EQ(c.source, Source::compiled);
  EXPECT_EQ(
      manifest_diff(opencl::program_key(real, k.program)->manifest, opencl::program_key(newer, k.program)->manifest),
      std::vector<std::string>{"device.driver_version"});
  opencl::DeviceDescription plat = real;
  plat.platform_version += " patched";
  EXPECT_NE(opencl::program_key(plat, k.program)->key, a.key);
  plat = real;
  plat.extra["icd_digest"] = "abc";
  EXPECT_NE(opencl::program_key(plat, k.program)->key, a.key);
}

TEST_F(OpenclTest, HeaderChangeIsAMissAndChangesTheResult) {
  opencl::ProgramCache pc(*cache_);
  ClKernel k = by_name(*kernels_, "layer_norm_with_header");
  auto a = build_and_check(pc, k, 1e-3);
  k.program.headers[0].contents = "#define NORM_EPS 1e-5f\n#define NORM_GAIN 2.0f\n";
  auto r = pc.build(env_.ctx, device_, k.program);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->source, Source::compiled);
  EXPECT_NE(r->key, a.key);
  // Gain 2 doubles every output, so the error against the gain-1 reference is large.
  EXPECT_GT(k.run(env_, r->program), 0.5);
  clReleaseProgram(r->program);
}

TEST_F(OpenclTest, RefusedBinaryFallsBackToSourceAndIsReplaced) {
  opencl::ProgramCache pc(*cache_);
  ClKernel k = by_name(*kernels_, "vector_add");
  k.program.extra_key["case"] = "refused-binary";
  auto d = *opencl::describe(device_);
  auto key = opencl::program_key(d, k.program);
  ASSERT_TRUE(key.has_value());
  ASSERT_TRUE(cache_->put(*key, {{"binary", std::string(4096, '\x5a')}, {"log", ""}}).has_value());
  auto r = build_and_check(pc, k, 1e-5);
  EXPECT_TRUE(r.fell_back);
  EXPECT_EQ(pc.stats().refused_binaries, 1u);
  EXPECT_EQ(pc.stats().source_builds, 1u);
  // The bad entry was replaced by a good binary: the next build loads it.
  auto stored = cache_->get(key->key);
  ASSERT_TRUE(stored.has_value());
  EXPECT_NE(stored->artifact("binary").value_or(""), std::string(4096, '\x5a'));
  auto again = build_and_check(pc, k, 1e-5);
  EXPECT_FALSE(again.fell_back);
  EXPECT_EQ(pc.stats().binary_loads, 1u);
  EXPECT_EQ(pc.stats().refused_binaries, 1u);
}

TEST_F(OpenclTest, BuildErrorReturnsTheLogAndIsNotStored) {
  opencl::ProgramCache pc(*cache_);
  opencl::ProgramSource bad;
  bad.source = "__kernel void k(__global float* x) { x[0] = undefined_function_xyz(x); }\n";
  auto r = pc.build(env_.ctx, device_, bad);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Errc::compile_failed);
  EXPECT_NE(r.error().message().find("CL_BUILD_PROGRAM_FAILURE"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("undefined_function_xyz"), std::string::npos) << r.error().message();
  EXPECT_EQ(pc.stats().failed_builds, 1u);
  EXPECT_FALSE(cache_->get(opencl::program_key(*opencl::describe(device_), bad)->key).has_value());
  // A failing header, then the fixed one: the fix is used at once.
  opencl::ProgramSource h;
  h.source = "#include \"k.h\"\n__kernel void k(__global float* x) { x[0] = SCALE; }\n";
  h.headers = {{"k.h", "#define SCALE (2.0f\n"}};
  ASSERT_FALSE(pc.build(env_.ctx, device_, h).has_value());
  h.headers[0].contents = "#define SCALE (2.0f)\n";
  auto ok = pc.build(env_.ctx, device_, h);
  ASSERT_TRUE(ok.has_value()) << ok.error().to_string();
  clReleaseProgram(ok->program);
}

TEST_F(OpenclTest, SplitOptionsKeepsOrderAndQuotes) {
  EXPECT_EQ(opencl::split_options("  -DA=1   -cl-mad-enable\t-I \"a b\" "),
            (std::vector<std::string>{"-DA=1", "-cl-mad-enable", "-I", "\"a b\""}));
  EXPECT_TRUE(opencl::split_options("   ").empty());
}

}  // namespace
}  // namespace kcache

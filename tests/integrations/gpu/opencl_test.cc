// OpenCL integration on the installed platform (PoCL here): cold and warm
// builds of a realistic kernel set through a real memory + LMDB cache, every
// program run and checked against a CPU reference. Skips, with the reason,
// when no OpenCL platform or device exists at run time.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "kcache/cache.h"
#include "kcache/opencl.h"
#include "opencl_kernels.h"
#include "test_util.h"
#include "util/object_id.h"
#include "util/util.h"

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
  // The driver's library, not the ICD loader's: found through the platform's
  // dispatch table, the same for every call.
  cl_platform_id platform = nullptr;
  ASSERT_EQ(clGetDeviceInfo(device_, CL_DEVICE_PLATFORM, sizeof platform, &platform, nullptr), CL_SUCCESS);
  const void* table = nullptr;
  std::memcpy(&table, static_cast<const void*>(platform), sizeof table);
  std::string lib = util::object_path_at(table);
  EXPECT_FALSE(lib.empty());
  EXPECT_EQ(lib.find("libOpenCL"), std::string::npos) << lib;
  EXPECT_FALSE(d->driver_library.empty()) << lib;
  std::string bid = util::build_id_at(table);
  EXPECT_EQ(d->driver_library, bid.empty() ? d->driver_library : bid) << lib;
  EXPECT_EQ(opencl::describe(device_)->driver_library, d->driver_library);
  std::printf("driver library: %s (%s)\n", lib.c_str(), d->driver_library.c_str());
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
  // The driver rebuilt under the same version strings.
  opencl::DeviceDescription rebuilt = real;
  rebuilt.driver_library = "0123456789abcdef0123456789abcdef01234567";
  EXPECT_EQ(build_and_check(pc, k, 1e-4, &rebuilt).source, Source::compiled);
  EXPECT_EQ(
      manifest_diff(opencl::program_key(real, k.program)->manifest, opencl::program_key(rebuilt, k.program)->manifest),
      std::vector<std::string>{"device.driver_library"});
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

// x[0] = SCALE, built through `pc` and run; the value written, or NaN.
float run_scale(const cl_kernels::Env& env, cl_program prog) {
  cl_int e = CL_SUCCESS;
  float out = std::nanf("");
  cl_kernel k = clCreateKernel(prog, "k", &e);
  if (e != CL_SUCCESS) return out;
  cl_mem buf = clCreateBuffer(env.ctx, CL_MEM_WRITE_ONLY, sizeof(float), nullptr, &e);
  size_t one = 1;
  if (e == CL_SUCCESS && clSetKernelArg(k, 0, sizeof buf, &buf) == CL_SUCCESS &&
      clEnqueueNDRangeKernel(env.queue, k, 1, nullptr, &one, nullptr, 0, nullptr, nullptr) == CL_SUCCESS)
    clEnqueueReadBuffer(env.queue, buf, CL_TRUE, 0, sizeof out, &out, 0, nullptr, nullptr);
  if (buf) clReleaseMemObject(buf);
  clReleaseKernel(k);
  return out;
}

struct Scaled {
  float value = std::nanf("");
  Source source = Source::compiled;
  Key key;
};

Scaled build_scale(opencl::ProgramCache& pc, const cl_kernels::Env& env, cl_device_id dev,
                   const opencl::ProgramSource& p) {
  auto r = pc.build(env.ctx, dev, p);
  EXPECT_TRUE(r.has_value()) << r.error().to_string();
  if (!r) return {};
  Scaled s{run_scale(env, r->program), r->source, r->key};
  clReleaseProgram(r->program);
  return s;
}

void write_text(const std::string& path, const std::string& text) {
  ASSERT_TRUE(util::write_file_atomic(path, text).is_ok()) << path;
}

// The compiler reads headers from the folders -I names: their contents are
// in the key, so an edited header is a miss that builds the new value, and
// the unchanged one is a hit (PoCL's own cache is off in this suite).
TEST_F(OpenclTest, HeaderOnDiskThroughIIsKeyedByItsContents) {
  opencl::ProgramCache pc(*cache_);
  TempDir inc;
  write_text(inc.path() + "/scale.h", "#include \"inner.h\"\n#define SCALE (INNER * 2.0f)\n");
  write_text(inc.path() + "/inner.h", "#define INNER 1.5f\n");
  opencl::ProgramSource p;
  p.source = "#include <scale.h>\n__kernel void k(__global float* x) { x[0] = SCALE; }\n";
  p.options = "-I " + inc.path();
  p.extra_key["case"] = "disk-header";
  auto cold = build_scale(pc, env_, device_, p);
  EXPECT_EQ(cold.value, 3.0f);
  EXPECT_EQ(cold.source, Source::compiled);
  auto warm = build_scale(pc, env_, device_, p);
  EXPECT_EQ(warm.value, 3.0f);
  EXPECT_NE(warm.source, Source::compiled);
  EXPECT_EQ(warm.key, cold.key);
  // A header the first one includes, edited: a miss, and the new value.
  write_text(inc.path() + "/inner.h", "#define INNER 2.5f\n");
  auto edited = build_scale(pc, env_, device_, p);
  EXPECT_EQ(edited.source, Source::compiled);
  EXPECT_NE(edited.key, cold.key);
  EXPECT_EQ(edited.value, 5.0f);
  // The same header through -I<dir> (no space) finds the same contents.
  auto disk = opencl::disk_headers(p);
  ASSERT_TRUE(disk.has_value()) << disk.error().to_string();
  EXPECT_EQ(disk->at(inc.path() + "/inner.h"), hash_bytes("#define INNER 2.5f\n").hex());
  p.options = "-I" + inc.path();
  EXPECT_EQ(*opencl::disk_headers(p), *disk);
}

// A header put into an earlier -I folder shadows the one the build read:
// the path it now reads was "absent" in the key, so this is a miss.
TEST_F(OpenclTest, HeaderShadowedInAnEarlierFolderIsAMiss) {
  opencl::ProgramCache pc(*cache_);
  TempDir first, second;
  write_text(second.path() + "/scale.h", "#define SCALE 4.0f\n");
  opencl::ProgramSource p;
  p.source = "#include \"scale.h\"\n__kernel void k(__global float* x) { x[0] = SCALE; }\n";
  p.options = "-I " + first.path() + " -I " + second.path();
  auto a = build_scale(pc, env_, device_, p);
  EXPECT_EQ(a.value, 4.0f);
  write_text(first.path() + "/scale.h", "#define SCALE 7.0f\n");
  auto b = build_scale(pc, env_, device_, p);
  EXPECT_EQ(b.source, Source::compiled);
  EXPECT_EQ(b.value, 7.0f);
}

// An #include that names its file through a macro cannot be followed: the
// program is built, correctly, without the cache.
TEST_F(OpenclTest, IncludeThroughAMacroIsBuiltWithoutTheCache) {
  opencl::ProgramCache pc(*cache_);
  TempDir inc;
  write_text(inc.path() + "/scale.h", "#define SCALE 6.0f\n");
  opencl::ProgramSource p;
  p.source = "#define HEADER \"scale.h\"\n#include HEADER\n__kernel void k(__global float* x) { x[0] = SCALE; }\n";
  p.options = "-I " + inc.path();
  EXPECT_EQ(opencl::disk_headers(p).error().code(), Errc::unavailable);
  auto before = pc.stats().source_builds;
  EXPECT_EQ(build_scale(pc, env_, device_, p).value, 6.0f);
  write_text(inc.path() + "/scale.h", "#define SCALE 8.0f\n");
  EXPECT_EQ(build_scale(pc, env_, device_, p).value, 8.0f);
  EXPECT_EQ(pc.stats().source_builds, before + 2);
}

// Without include folders a program whose headers are all in memory keys as
// it did before headers on disk were read (stored entries stay valid).
TEST_F(OpenclTest, ProgramWithoutIncludeFoldersReadsNothingFromDisk) {
  ClKernel k = by_name(*kernels_, "layer_norm_with_header");
  auto disk = opencl::disk_headers(k.program);
  ASSERT_TRUE(disk.has_value());
  EXPECT_TRUE(disk->empty());
  opencl::ProgramSource p;
  p.options = "-DX=1 -cl-mad-enable";
  p.source = "#include \"/nonexistent/kcache/h.h\"\n";
  EXPECT_TRUE(opencl::disk_headers(p)->empty());
}

// PoCL finds a quoted #include of a source in memory in the working folder,
// with no -I at all: that file is keyed too.
TEST_F(OpenclTest, QuotedIncludeFoundInTheWorkingFolderIsKeyed) {
  opencl::ProgramCache pc(*cache_);
  TempDir cwd;
  std::string old_cwd(4096, '\0');
  ASSERT_NE(::getcwd(old_cwd.data(), old_cwd.size()), nullptr);
  old_cwd.resize(std::strlen(old_cwd.c_str()));
  ASSERT_EQ(::chdir(cwd.path().c_str()), 0);
  struct Back {  // the working folder back, however the test ends
    std::string to;
    ~Back() { (void)!::chdir(to.c_str()); }
  } back{old_cwd};
  write_text("here.h", "#define SCALE 9.0f\n");
  opencl::ProgramSource p;
  p.source = "#include \"here.h\"\n__kernel void k(__global float* x) { x[0] = SCALE; }\n";
  auto a = build_scale(pc, env_, device_, p);
  write_text("here.h", "#define SCALE 11.0f\n");
  auto b = build_scale(pc, env_, device_, p);
  EXPECT_EQ(a.value, 9.0f);
  EXPECT_EQ(b.source, Source::compiled);
  EXPECT_EQ(b.value, 11.0f);
}

// What disk_headers reads, without a device: every way a directive can be
// written reaches the file; what cannot be followed is said.
TEST(OpenclDiskHeaders, EveryFormOfTheDirectiveIsFollowed) {
  TempDir inc;
  for (const char* name : {"a.h", "b.h", "c.h", "d.h", "e.h", "f.h", "g.h", "h.h", "i.h", "j.bin", "forced.h"})
    write_text(inc.path() + "/" + name, std::string("// ") + name + "\n");
  opencl::ProgramSource p;
  p.options = "-DX=1 -I" + inc.path() + " -include forced.h";
  p.source =
      "#include \"a.h\"\n"
      "  #  include_next <b.h>\n"
      "%:include \"c.h\"\n"
      "#inc\\\nlude \"d.h\"\n"
      "/* before */ #/* between */include/* and */\"e.h\"\n"
      "#if 0\n#import <f.h>\n#endif\n"
      "// a comment: #include \"g.h\"\n"
      "#if __has_include(<h.h>) && __has_include_next (\"i.h\")\n#endif\n"
      "const char data[] = {\n#embed \"j.bin\"\n};\n";
  auto disk = opencl::disk_headers(p);
  ASSERT_TRUE(disk.has_value()) << disk.error().to_string();
  for (const char* name : {"a.h", "b.h", "c.h", "d.h", "e.h", "f.h", "g.h", "h.h", "i.h", "j.bin", "forced.h"})
    EXPECT_EQ(disk->count(inc.path() + "/" + name), 1u) << name;
  EXPECT_EQ(disk->at(inc.path() + "/a.h"), hash_bytes("// a.h\n").hex());
  EXPECT_EQ(disk->at("a.h"), "absent");  // the working folder, where PoCL also looks
  // The same folder as a quoted word, and through the long option.
  p.options = "\"-I" + inc.path() + "\" -include forced.h";
  EXPECT_EQ(*opencl::disk_headers(p), *disk);
  p.options = "--include-directory=" + inc.path() + " --include=forced.h";
  EXPECT_EQ(*opencl::disk_headers(p), *disk);
}

TEST(OpenclDiskHeaders, WhatCannotBeFollowedIsSaid) {
  opencl::ProgramSource p;
  p.options = "-I /nonexistent/kcache";
  for (const char* src : {"#include HEADER\n", "#include \\\n  HEADER\n",
                          "?"
                          "?=include \"a.h\"\n",
                          "#include /* open\n */ \"a.h\"\n"}) {
    p.source = src;
    auto disk = opencl::disk_headers(p);
    ASSERT_FALSE(disk.has_value()) << src;
    EXPECT_EQ(disk.error().code(), Errc::unavailable) << src;
  }
  p.source = "# /* a comment that runs on\n */ include \"a.h\"\n";
  EXPECT_EQ(opencl::disk_headers(p).error().code(), Errc::unavailable);
  p.source = "#if __has_include(HEADER)\n#endif\n";
  EXPECT_EQ(opencl::disk_headers(p).error().code(), Errc::unavailable);
  p.source = "#include \"a.h\"\n";
  for (const char* opts :
       {"-iprefix /x/ -iwithprefix y", "--include-directory-after /x", "-isystem-after /x", "-include-pch /x/h.pch",
        "-Xclang -include -Xclang f.h", "-Wp,-I/x", "-I=/x", "-I-", "@/x/options.txt", "-I"}) {
    p.options = opts;
    auto disk = opencl::disk_headers(p);
    ASSERT_FALSE(disk.has_value()) << opts;
    EXPECT_EQ(disk.error().code(), Errc::unavailable) << opts;
  }
  // Not a directive: nothing to follow, nothing refused.
  p.options = "-cl-mad-enable";
  p.source = "float x = a ? b : c; // #define N 1\n";
  EXPECT_TRUE(opencl::disk_headers(p)->empty());
}

// What the driver adds to every build from the environment is in the key,
// and its include folders are followed.
TEST(OpenclDiskHeaders, DriverFlagsFromTheEnvironmentAreKeyed) {
  TempDir inc;
  write_text(inc.path() + "/scale.h", "#define SCALE 1.0f\n");
  opencl::ProgramSource p;
  p.source = "#include <scale.h>\n";
  opencl::DeviceDescription d;
  auto plain = opencl::program_key(d, p);
  ASSERT_TRUE(plain.has_value());
  ::setenv("POCL_EXTRA_BUILD_FLAGS", ("-cl-fast-relaxed-math -I " + inc.path()).c_str(), 1);
  auto flagged = opencl::program_key(d, p);
  auto disk = opencl::disk_headers(p);
  ::unsetenv("POCL_EXTRA_BUILD_FLAGS");
  ASSERT_TRUE(flagged.has_value());
  EXPECT_EQ(manifest_diff(plain->manifest, flagged->manifest),
            (std::vector<std::string>{"disk_headers", "driver_env.POCL_EXTRA_BUILD_FLAGS"}));
  ASSERT_TRUE(disk.has_value());
  EXPECT_EQ(disk->at(inc.path() + "/scale.h"), hash_bytes("#define SCALE 1.0f\n").hex());
}

// A header on disk that includes another from its own folder (quoted),
// which the options' folders do not hold: followed there.
TEST(OpenclDiskHeaders, QuotedIncludeOfAHeaderOnDiskIsLookedForInItsFolder) {
  TempDir a, b;
  write_text(a.path() + "/top.h", "#include \"../" + std::string("b_link") + "/x.h\"\n#include \"near.h\"\n");
  write_text(a.path() + "/near.h", "#define NEAR 1\n");
  opencl::ProgramSource p;
  p.options = "-I \"" + a.path() + "\"";
  p.source = "#include <top.h>\n";
  auto disk = opencl::disk_headers(p);
  ASSERT_TRUE(disk.has_value()) << disk.error().to_string();
  EXPECT_EQ(disk->at(a.path() + "/near.h"), hash_bytes("#define NEAR 1\n").hex());
  EXPECT_EQ(disk->at(a.path() + "/../b_link/x.h"), "absent");
}

TEST_F(OpenclTest, SplitOptionsKeepsOrderAndQuotes) {
  EXPECT_EQ(opencl::split_options("  -DA=1   -cl-mad-enable\t-I \"a b\" "),
            (std::vector<std::string>{"-DA=1", "-cl-mad-enable", "-I", "\"a b\""}));
  EXPECT_TRUE(opencl::split_options("   ").empty());
}

}  // namespace
}  // namespace kcache

// NVRTC integration: real NVRTC compiles of a realistic kernel corpus, cold
// then warm, through a real memory + LMDB cache. The corpus is compiled cold
// once for the whole suite (NVRTC is the slow part); each test then checks
// one property against those results. Then real kernels that include their
// own headers from disk (edits are misses, in memory and on disk), the
// outputs NVRTC reports for each -arch spelling, and NUL-terminated PTX.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "gpu_kernels.h"
#include "integrations/nvrtc/manifest.h"
#include "integrations/nvrtc/observe.h"
#include "kcache/cache.h"
#include "kcache/nvrtc.h"
#include "test_util.h"

namespace kcache {
namespace {

using gpu_kernels::CudaKernel;
using test::TempDir;

using test::disk_options;

class NvrtcCorpus : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    cache_ = Cache::open(disk_options(dir_->path())).release();
    compiler_ = new nvrtc::Compiler(*cache_);
    kernels_ = new std::vector<CudaKernel>(gpu_kernels::cuda_kernels());
    cold_ = new std::vector<nvrtc::Result>();
    for (const auto& k : *kernels_) {
      auto r = compiler_->compile(k.program);
      ASSERT_TRUE(r.has_value()) << k.name << ": " << r.error().to_string();
      cold_->push_back(std::move(r).value());
    }
  }
  static void TearDownTestSuite() {
    delete cold_;
    delete kernels_;
    delete compiler_;
    delete cache_;
    delete dir_;
  }
  static TempDir* dir_;
  static Cache* cache_;
  static nvrtc::Compiler* compiler_;
  static std::vector<CudaKernel>* kernels_;
  static std::vector<nvrtc::Result>* cold_;
};
TempDir* NvrtcCorpus::dir_ = nullptr;
Cache* NvrtcCorpus::cache_ = nullptr;
nvrtc::Compiler* NvrtcCorpus::compiler_ = nullptr;
std::vector<CudaKernel>* NvrtcCorpus::kernels_ = nullptr;
std::vector<nvrtc::Result>* NvrtcCorpus::cold_ = nullptr;

TEST_F(NvrtcCorpus, CorpusHasTwentyKernelsAllCompiledCold) {
  ASSERT_GE(kernels_->size(), 20u);
  ASSERT_EQ(cold_->size(), kernels_->size());
  for (size_t i = 0; i < cold_->size(); ++i) EXPECT_EQ((*cold_)[i].source, Source::compiled) << (*kernels_)[i].name;
}

TEST_F(NvrtcCorpus, ColdOutputsAreRealPtxAndCubin) {
  for (size_t i = 0; i < cold_->size(); ++i) {
    const auto& r = (*cold_)[i];
    const auto& k = (*kernels_)[i];
    ASSERT_FALSE(r.ptx.empty()) << k.name;
    EXPECT_NE(r.ptx.find(".version"), std::string_view::npos) << k.name;
    EXPECT_NE(r.ptx.find(".target sm_80"), std::string_view::npos) << k.name;
    ASSERT_GE(r.cubin.size(), 64u) << k.name;
    EXPECT_EQ(r.cubin.substr(0, 4), std::string_view("\x7f"
                                                     "ELF",
                                                     4))
        << k.name;
    EXPECT_TRUE(r.ltoir.empty()) << k.name;
    for (const auto& ep : k.entry_points)
      EXPECT_NE(r.ptx.find(".entry " + ep + "("), std::string_view::npos) << k.name << " lacks " << ep;
  }
}

TEST_F(NvrtcCorpus, NameExpressionsAreLoweredAndPresentInPtx) {
  size_t checked = 0;
  for (size_t i = 0; i < cold_->size(); ++i) {
    const auto& r = (*cold_)[i];
    const auto& k = (*kernels_)[i];
    ASSERT_EQ(r.lowered_names.size(), k.program.name_expressions.size()) << k.name;
    for (const auto& e : k.program.name_expressions) {
      auto low = r.lowered(e);
      ASSERT_TRUE(low.has_value()) << e;
      EXPECT_TRUE(low->starts_with("_Z")) << e << " -> " << *low;
      EXPECT_NE(r.ptx.find(".entry " + std::string(*low) + "("), std::string_view::npos) << e;
      ++checked;
    }
  }
  EXPECT_GE(checked, 10u);
  // Distinct instantiations lower to distinct symbols.
  const auto& red = (*cold_)[2];
  EXPECT_NE(*red.lowered("reduce_sum<float, 256>"), *red.lowered("reduce_sum<double, 128>"));
}

TEST_F(NvrtcCorpus, WarmFromMemoryGivesIdenticalBytes) {
  uint64_t compiles = cache_->stats().compiles;
  for (size_t i = 0; i < kernels_->size(); ++i) {
    auto r = compiler_->compile((*kernels_)[i].program);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->source, Source::memory) << (*kernels_)[i].name;
    EXPECT_EQ(r->key, (*cold_)[i].key);
    EXPECT_EQ(r->ptx, (*cold_)[i].ptx);
    EXPECT_EQ(r->cubin, (*cold_)[i].cubin);
    EXPECT_EQ(r->lowered_names, (*cold_)[i].lowered_names);
  }
  EXPECT_EQ(cache_->stats().compiles, compiles);
}

TEST_F(NvrtcCorpus, WarmFromDiskInAFreshCacheGivesIdenticalBytes) {
  (void)cache_->flush();
  auto disk_only = Cache::open(disk_options(dir_->path(), /*memory=*/false));
  nvrtc::Compiler c(*disk_only);
  for (size_t i = 0; i < kernels_->size(); ++i) {
    auto r = c.compile((*kernels_)[i].program);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->source, Source::disk) << (*kernels_)[i].name;
    EXPECT_EQ(r->ptx, (*cold_)[i].ptx);
    EXPECT_EQ(r->cubin, (*cold_)[i].cubin);
    EXPECT_EQ(r->lowered_names, (*cold_)[i].lowered_names);
  }
  EXPECT_EQ(disk_only->stats().compiles, 0u);
}

TEST_F(NvrtcCorpus, CachedBytesEqualAnUncachedCompile) {
  // NVRTC is deterministic; a hit must hand out what a compile would make.
  for (size_t i : {size_t(0), size_t(4)}) {
    auto arts = nvrtc::compile_uncached((*kernels_)[i].program);
    ASSERT_TRUE(arts.has_value());
    for (const auto& a : *arts) {
      // The stored PTX carries its terminating NUL; Result::ptx stops before it.
      if (a.name == "ptx") {
        EXPECT_EQ(a.data, std::string((*cold_)[i].ptx) + '\0');
      }
      if (a.name == "cubin") {
        EXPECT_EQ(a.data, (*cold_)[i].cubin);
      }
    }
  }
}

TEST_F(NvrtcCorpus, ArchChangeIsAMissAndTheManifestSaysWhy) {
  nvrtc::Program p = (*kernels_)[0].program;
  p.options[0] = "-arch=sm_86";
  auto r = compiler_->compile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, Source::compiled);
  EXPECT_NE(r->key, (*cold_)[0].key);
  EXPECT_NE(r->ptx.find(".target sm_86"), std::string_view::npos);
  auto a = compiler_->key((*kernels_)[0].program), b = compiler_->key(p);
  EXPECT_EQ(manifest_diff(a->manifest, b->manifest), std::vector<std::string>{"options"});
}

TEST_F(NvrtcCorpus, VirtualArchGivesPtxOnlyAndDltoGivesLtoIr) {
  nvrtc::Program p = (*kernels_)[1].program;
  p.options[0] = "-arch=compute_80";
  auto v = compiler_->compile(p);
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->ptx.empty());
  EXPECT_TRUE(v->cubin.empty());
  p.options[0] = "-arch=sm_80";
  p.options.push_back("-dlto");
  auto l = compiler_->compile(p);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->source, Source::compiled);
  EXPECT_GT(l->ltoir.size(), 100u);
  EXPECT_TRUE(l->ptx.empty());
  EXPECT_TRUE(l->cubin.empty());
  auto again = compiler_->compile(p);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->source, Source::memory);
  EXPECT_EQ(again->ltoir, l->ltoir);
  EXPECT_NE(compiler_->key(p)->key, v->key);
}

TEST_F(NvrtcCorpus, HeaderChangeIsAMiss) {
  // reduce_sum includes kc_common.cuh; change the warp width there.
  nvrtc::Program p = (*kernels_)[2].program;
  std::string h = gpu_kernels::kCommonHeader;
  h.replace(h.find("#define KC_WARP 32"), 18, "#define KC_WARP 16");
  p.headers[0].contents = h;
  auto r = compiler_->compile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, Source::compiled);
  EXPECT_NE(r->ptx, (*cold_)[2].ptx);
  auto a = compiler_->key((*kernels_)[2].program), b = compiler_->key(p);
  EXPECT_EQ(manifest_diff(a->manifest, b->manifest), std::vector<std::string>{"headers"});
  // Renaming an unused header is also a change of input, hence a miss.
  nvrtc::Program q = (*kernels_)[2].program;
  q.headers.push_back({"unused.cuh", "// nothing"});
  EXPECT_NE(compiler_->key(q)->key, a->key);
}

TEST_F(NvrtcCorpus, MacroOptionOrderOnlyMattersWhenAMacroRepeats) {
  nvrtc::Program p = (*kernels_)[17].program;  // stencil_1d reads RADIUS
  ASSERT_EQ((*kernels_)[17].name, "stencil_1d");
  nvrtc::Program a = p, b = p;
  a.options.push_back("-DEXTRA_A=1");
  a.options.push_back("--define-macro=EXTRA_B=2");
  b.options.insert(b.options.begin(), "-DEXTRA_B=2");
  b.options.push_back("-DEXTRA_A=1");
  EXPECT_EQ(compiler_->key(a)->key, compiler_->key(b)->key);
  nvrtc::Program c = p, d = p;
  c.options.push_back("-URADIUS");
  d.options.insert(d.options.begin() + 2, "-URADIUS");  // before -DRADIUS=4
  EXPECT_NE(compiler_->key(c)->key, compiler_->key(d)->key);
  // And the two really compile differently: RADIUS 4 vs the default 3.
  auto rc = compiler_->compile(c), rd = compiler_->compile(d);
  ASSERT_TRUE(rc.has_value());
  ASSERT_TRUE(rd.has_value());
  EXPECT_NE(rc->ptx, rd->ptx);
  // A changed define value is a miss.
  nvrtc::Program e = p;
  e.options.back() = "-DRADIUS=5";
  auto re = compiler_->compile(e);
  ASSERT_TRUE(re.has_value());
  EXPECT_EQ(re->source, Source::compiled);
  EXPECT_NE(re->ptx, (*cold_)[17].ptx);
}

TEST_F(NvrtcCorpus, CanonicalOptionsAreDocumentedShape) {
  auto c = nvrtc::canonical_options(
      {"-arch=sm_80", "-DB=1", "-I", "/y", "--use_fast_math", "--define-macro=A", "-I/x", "-include", "p.h"});
  EXPECT_EQ(c.options,
            (std::vector<std::string>{"-arch=sm_80", "--use_fast_math", "-I/y", "-I/x", "--pre-include=p.h"}));
  EXPECT_EQ(c.macros, (std::vector<std::string>{"-DA=1", "-DB=1"}));
  // The last operation on a macro is what NVRTC uses.
  EXPECT_EQ(nvrtc::canonical_options({"-DA=1", "-UA"}).macros, std::vector<std::string>{"-UA"});
  EXPECT_EQ(nvrtc::canonical_options({"-UA", "-D", "A"}).macros, std::vector<std::string>{"-DA=1"});
  // One-string forms NVRTC rejects stay as given.
  EXPECT_EQ(nvrtc::canonical_options({"--define-macro A=2"}).options, std::vector<std::string>{"--define-macro A=2"});
  // NVRTC makes a CUBIN when any -arch names a real architecture.
  EXPECT_TRUE(nvrtc::outputs_for({"--gpu-architecture=sm_90", "-arch=compute_90"}).cubin);
  EXPECT_TRUE(nvrtc::outputs_for({"--gpu-architecture=sm_90"}).cubin);
  EXPECT_TRUE(nvrtc::outputs_for({"-arch", "sm_90"}).cubin);
  EXPECT_TRUE(nvrtc::outputs_for({"--gpu-architecture", "sm_90"}).cubin);
  EXPECT_FALSE(nvrtc::outputs_for({"-arch", "compute_90"}).cubin);
  EXPECT_TRUE(nvrtc::outputs_for({"--dlink-time-opt"}).ltoir);
}

TEST_F(NvrtcCorpus, CompileErrorReturnsTheFullLogAndIsNotStored) {
  nvrtc::Program bad;
  bad.name = "broken_kernel.cu";
  bad.source =
      "#include \"kc_common.cuh\"\nextern \"C\" __global__ void k(float* x) { x[0] = not_declared_here(x); }\n";
  bad.headers = {{"kc_common.cuh", gpu_kernels::kCommonHeader}};
  bad.options = {"-arch=sm_80"};
  uint64_t runs = nvrtc::detail::recorded_compiles();
  auto r = compiler_->compile(bad);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Errc::compile_failed);
  const std::string& m = r.error().message();
  EXPECT_NE(m.find("NVRTC_ERROR_COMPILATION"), std::string::npos) << m;
  EXPECT_NE(m.find("broken_kernel.cu(2): error"), std::string::npos) << m;
  EXPECT_NE(m.find("not_declared_here"), std::string::npos) << m;
  EXPECT_NE(m.find("1 error detected"), std::string::npos) << m;
  // Not cached: the same program compiles (and fails) again.
  auto r2 = compiler_->compile(bad);
  ASSERT_FALSE(r2.has_value());
  EXPECT_EQ(nvrtc::detail::recorded_compiles(), runs + 2);
  EXPECT_FALSE(cache_->get(compiler_->key(bad)->key).has_value());
}

TEST_F(NvrtcCorpus, FixedHeaderIsPickedUpImmediately) {
  nvrtc::Program p;
  p.name = "uses_header.cu";
  p.source = "#include \"scale.cuh\"\nextern \"C\" __global__ void scale(float* x) { x[threadIdx.x] *= SCALE; }\n";
  p.options = {"-arch=sm_80"};
  p.headers = {{"scale.cuh", "#define SCALE (2.0f  // missing parenthesis\n"}};
  auto bad = compiler_->compile(p);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("error"), std::string::npos);
  p.headers[0].contents = "#define SCALE (2.0f)\n";
  auto good = compiler_->compile(p);
  ASSERT_TRUE(good.has_value()) << good.error().to_string();
  EXPECT_NE(good->ptx.find(".entry scale("), std::string_view::npos);
}

TEST_F(NvrtcCorpus, RememberedFailuresSkipNvrtcForTheSameInputs) {
  nvrtc::CompilerOptions co;
  co.remember_failures = true;
  nvrtc::Compiler c(*cache_, co);
  nvrtc::Program bad;
  bad.source = "extern \"C\" __global__ void k() { syntax error here }\n";
  uint64_t runs = nvrtc::detail::recorded_compiles();
  auto r1 = c.compile(bad), r2 = c.compile(bad);
  ASSERT_FALSE(r1.has_value());
  ASSERT_FALSE(r2.has_value());
  EXPECT_EQ(r2.error().message(), r1.error().message());
  EXPECT_EQ(nvrtc::detail::recorded_compiles(), runs + 1);
  bad.source = "extern \"C\" __global__ void k() { }\n";
  EXPECT_TRUE(c.compile(bad).has_value());
}

TEST_F(NvrtcCorpus, IdentityNamesTheLoadedLibraryAndIsStableAcrossCompilers) {
  const auto& id = compiler_->identity();
  EXPECT_GE(id.major, 11);
  EXPECT_NE(id.library_path.find("libnvrtc"), std::string::npos) << id.library_path;
  EXPECT_NE(id.library_digest, Digest{});
  nvrtc::Compiler other(*cache_);
  EXPECT_EQ(other.identity().library_digest, id.library_digest);
  // Without the library digest the key differs (the component changes).
  nvrtc::CompilerOptions co;
  co.hash_library = false;
  nvrtc::Compiler version_only(*cache_, co);
  ASSERT_TRUE(version_only.compile((*kernels_)[0].program).has_value());
  EXPECT_NE(version_only.key((*kernels_)[0].program)->key, (*cold_)[0].key);
  auto a = compiler_->key((*kernels_)[0].program), b = version_only.key((*kernels_)[0].program);
  EXPECT_EQ(manifest_diff(a->manifest, b->manifest), std::vector<std::string>{"nvrtc.library"});
}

TEST_F(NvrtcCorpus, HeaderOrderDoesNotChangeTheKeyButDuplicatesAreRefused) {
  nvrtc::Program p = (*kernels_)[0].program;
  p.headers = {{"a.cuh", "int a;"}, {"b.cuh", "int b;"}};
  nvrtc::Program q = p;
  std::swap(q.headers[0], q.headers[1]);
  EXPECT_EQ(compiler_->key(p)->key, compiler_->key(q)->key);
  q.headers.push_back({"a.cuh", "int c;"});
  auto r = compiler_->compile(q);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Errc::invalid_argument);
}

TEST_F(NvrtcCorpus, ConcurrentCompilesOfANewProgramRunNvrtcOnce) {
  nvrtc::Program p = (*kernels_)[5].program;
  p.options.push_back("-DCONCURRENT_VARIANT=1");
  uint64_t compiles = cache_->stats().compiles, runs = nvrtc::detail::recorded_compiles();
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  std::string first_ptx;
  std::vector<std::string> ptxs(6);
  for (int i = 0; i < 6; ++i)
    ts.emplace_back([&, i] {
      auto r = compiler_->compile(p);
      if (r.has_value()) {
        ptxs[i] = std::string(r->ptx);
        ++ok;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 6);
  EXPECT_EQ(cache_->stats().compiles, compiles + 1);
  EXPECT_EQ(nvrtc::detail::recorded_compiles(), runs + 1);
  for (const auto& s : ptxs) EXPECT_EQ(s, ptxs[0]);
}

TEST_F(NvrtcCorpus, AnEntryMissingTheLoweredNamesIsRecompiledAndReplaced) {
  nvrtc::Program p = (*kernels_)[2].program;
  p.options.push_back("-DREPLACE_TEST=1");
  ASSERT_TRUE(compiler_->compile(p).has_value());
  auto ki = compiler_->key(p);
  ASSERT_TRUE(ki.has_value());
  ASSERT_TRUE(cache_->put(*ki, {{"ptx", "// not what was asked for"}}).has_value());
  auto r = compiler_->compile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, Source::compiled);
  EXPECT_EQ(r->lowered_names.size(), 3u);
  auto again = compiler_->compile(p);
  ASSERT_TRUE(again.has_value());
  EXPECT_NE(again->source, Source::compiled);
  EXPECT_EQ(again->ptx, r->ptx);
}

TEST_F(NvrtcCorpus, ExtraKeyComponentsChangeTheKey) {
  nvrtc::Program p = (*kernels_)[0].program;
  p.extra_key["disk_header_digest"] = "abc";
  auto a = compiler_->key(p);
  p.extra_key["disk_header_digest"] = "abd";
  auto b = compiler_->key(p);
  EXPECT_EQ(manifest_diff(a->manifest, b->manifest), std::vector<std::string>{"extra.disk_header_digest"});
}

// ---- headers NVRTC reads from disk --------------------------------------------

// Written, then left to become older than the file system's timestamp
// granularity (a compile that read a younger file is not stored).
void write_text(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    ASSERT_TRUE(f.good()) << path;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
}

// A kernel that reads its constants from headers found through -I: the
// source includes <kc_scale.cuh>, which includes "kc_offset.cuh" beside it.
class NvrtcDiskHeaders : public ::testing::Test {
 protected:
  void SetUp() override {
    inc_ = tmp_.path() + "/inc";
    cache_dir_ = tmp_.path() + "/cache";
    ASSERT_EQ(::mkdir(inc_.c_str(), 0755), 0);
    write_text(inc_ + "/kc_scale.cuh", "#pragma once\n#include \"kc_offset.cuh\"\n#define KC_SCALE 2.0f\n");
    write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 1.0f\n");
    cache_ = Cache::open(disk_options(cache_dir_));
    compiler_ = std::make_unique<nvrtc::Compiler>(*cache_);
    program_.name = "scale_offset.cu";
    program_.source =
        "#include <kc_scale.cuh>\n"
        "extern \"C\" __global__ void scale_offset(float* x) { x[threadIdx.x] = x[threadIdx.x] * KC_SCALE + "
        "KC_OFFSET; }\n";
    program_.options = {"-arch=sm_80", "-I" + inc_};
  }
  // A compile through a fresh cache on the same folder with no memory tier:
  // what another process would get from disk.
  Expected<nvrtc::Result> compile_in_fresh_process(const nvrtc::Program& p) {
    (void)cache_->flush();
    fresh_ = Cache::open(disk_options(cache_dir_, /*memory=*/false));
    nvrtc::Compiler c(*fresh_);
    return c.compile(p);
  }
  TempDir tmp_;
  std::string inc_, cache_dir_;
  std::unique_ptr<Cache> cache_, fresh_;
  std::unique_ptr<nvrtc::Compiler> compiler_;
  nvrtc::Program program_;
};

// 1.0f is 0f3F800000 in PTX, 3.0f is 0f40400000.
constexpr std::string_view kOne = "0f3F800000", kThree = "0f40400000";

TEST_F(NvrtcDiskHeaders, EditingANestedHeaderIsAMissWithNewPtxFromMemoryAndFromDisk) {
  auto cold = compiler_->compile(program_);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_EQ(cold->source, Source::compiled);
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  auto warm = compiler_->compile(program_);
  ASSERT_TRUE(warm.has_value());
  EXPECT_EQ(warm->source, Source::memory);  // unchanged: a hit
  EXPECT_EQ(warm->ptx, cold->ptx);
  auto from_disk = compile_in_fresh_process(program_);
  ASSERT_TRUE(from_disk.has_value());
  EXPECT_EQ(from_disk->source, Source::disk);
  EXPECT_EQ(from_disk->ptx, cold->ptx);

  // The header two levels down changes: a miss in this process...
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  auto edited = compiler_->compile(program_);
  ASSERT_TRUE(edited.has_value());
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->key, cold->key);
  EXPECT_NE(edited->ptx.find(kThree), std::string_view::npos);
  EXPECT_EQ(edited->ptx.find(kOne), std::string_view::npos);
  // ...and the manifest names the file that changed.
  auto a = compiler_->key(program_);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(manifest_diff(a->manifest, cold->entry.manifest()),
            std::vector<std::string>{"file:" + inc_ + "/kc_offset.cuh"});
  // Another process sees the new header too: from disk, the new PTX.
  auto edited_disk = compile_in_fresh_process(program_);
  ASSERT_TRUE(edited_disk.has_value());
  EXPECT_EQ(edited_disk->source, Source::disk);
  EXPECT_EQ(edited_disk->ptx, edited->ptx);

  // A process that has not seen the edit before compiles (never the old PTX).
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f  // same value, new bytes\n");
  auto third = compile_in_fresh_process(program_);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->source, Source::compiled);

  // Back to the first contents: the first entry is found again.
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 1.0f\n");
  auto back = compiler_->compile(program_);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->source, Source::memory);
  EXPECT_EQ(back->ptx, cold->ptx);
}

TEST_F(NvrtcDiskHeaders, EveryIncludePathSpellingIsFollowed) {
  const std::vector<std::vector<std::string>> spellings = {
      {"-arch=sm_80", "-I" + inc_},
      {"-arch=sm_80", "-I", inc_},
      {"-arch=sm_80", "--include-path=" + inc_},
      {"-arch=sm_80", "--include-path", inc_},
  };
  std::vector<Key> before;
  for (const auto& opts : spellings) {
    nvrtc::Program p = program_;
    p.options = opts;
    ASSERT_TRUE(compiler_->compile(p).has_value());
    auto k = compiler_->key(p);
    ASSERT_TRUE(k.has_value()) << k.error().to_string();
    before.push_back(k->key);
  }
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  for (size_t i = 0; i < spellings.size(); ++i) {
    nvrtc::Program p = program_;
    p.options = spellings[i];
    auto k = compiler_->key(p);
    ASSERT_TRUE(k.has_value());
    EXPECT_NE(k->key, before[i]) << "spelling " << i;
  }
}

TEST_F(NvrtcDiskHeaders, PreIncludedHeaderIsInTheKey) {
  write_text(inc_ + "/kc_pre.cuh", "#define KC_PRE 1.0f\n");
  nvrtc::Program p = program_;
  p.source = "extern \"C\" __global__ void pre(float* x) { x[threadIdx.x] += KC_PRE; }\n";
  p.options.push_back("--pre-include=kc_pre.cuh");
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  write_text(inc_ + "/kc_pre.cuh", "#define KC_PRE 3.0f\n");
  auto edited = compiler_->compile(p);
  ASSERT_TRUE(edited.has_value());
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->ptx.find(kThree), std::string_view::npos);
  // The short spelling too.
  nvrtc::Program q = p;
  q.options.back() = "-include";
  q.options.push_back("kc_pre.cuh");
  ASSERT_TRUE(compiler_->compile(q).has_value());
  auto kq = compiler_->key(q);
  ASSERT_TRUE(kq.has_value());
  write_text(inc_ + "/kc_pre.cuh", "#define KC_PRE 4.0f\n");
  EXPECT_NE(compiler_->key(q)->key, kq->key);
}

TEST_F(NvrtcDiskHeaders, AHeaderThatAppearsEarlierInTheSearchIsAMiss) {
  std::string first = tmp_.path() + "/first";
  ASSERT_EQ(::mkdir(first.c_str(), 0755), 0);
  nvrtc::Program p = program_;
  p.options = {"-arch=sm_80", "-I" + first, "-I" + inc_};
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  // kc_scale.cuh now exists in the first folder: NVRTC takes that one.
  write_text(first + "/kc_scale.cuh", "#pragma once\n#include \"kc_offset.cuh\"\n#define KC_SCALE 3.0f\n");
  auto shadowed = compiler_->compile(p);
  ASSERT_TRUE(shadowed.has_value());
  EXPECT_EQ(shadowed->source, Source::compiled);
  EXPECT_NE(shadowed->ptx.find(kThree), std::string_view::npos);
  // And a quoted include from the source looks beside the program name.
  nvrtc::Program q = program_;
  q.name = tmp_.path() + "/first/beside.cu";
  q.source = "#include \"kc_offset.cuh\"\nextern \"C\" __global__ void k(float* x) { x[0] *= KC_OFFSET; }\n";
  q.options = {"-arch=sm_80"};
  write_text(first + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  auto beside = compiler_->compile(q);
  ASSERT_TRUE(beside.has_value()) << beside.error().to_string();
  EXPECT_NE(beside->ptx.find(kThree), std::string_view::npos);
  write_text(first + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 4.0f\n");
  auto beside2 = compiler_->compile(q);
  ASSERT_TRUE(beside2.has_value());
  EXPECT_EQ(beside2->source, Source::compiled);
  EXPECT_NE(beside2->ptx.find("0f40800000"), std::string_view::npos);  // 4.0f
}

TEST_F(NvrtcDiskHeaders, AComputedIncludeIsResolvedThroughItsMacros) {
  nvrtc::Program p = program_;
  // The name is built from two macros, one of them defined in a header
  // found through -I and one given as an option.
  write_text(inc_ + "/kc_names.cuh", "#define KC_ROOT kc_scale\n#define KC_HEADER <KC_ROOT.KC_EXT>\n");
  p.source =
      "#include \"kc_names.cuh\"\n#include KC_HEADER\n"
      "extern \"C\" __global__ void computed(float* x) { x[threadIdx.x] *= KC_SCALE + KC_OFFSET; }\n";
  p.options.push_back("-DKC_EXT=cuh");
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  auto warm = compiler_->compile(p);
  ASSERT_TRUE(warm.has_value());
  EXPECT_EQ(warm->source, Source::memory);
  auto k0 = compiler_->key(p);
  ASSERT_TRUE(k0.has_value());
  // The header the macros name changes: a miss with new PTX (2 + 3 = 5),
  // and the explanation names it.
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  auto edited = compiler_->compile(p);
  ASSERT_TRUE(edited.has_value());
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->ptx.find("0f40A00000"), std::string_view::npos);  // 5.0f
  EXPECT_EQ(manifest_diff(compiler_->key(p)->manifest, k0->manifest),
            std::vector<std::string>{"file:" + inc_ + "/kc_offset.cuh"});
  // A file no directive names is not in the key.
  Key k1 = compiler_->key(p)->key;
  write_text(inc_ + "/unrelated.txt", "x");
  EXPECT_EQ(compiler_->key(p)->key, k1);
}

TEST_F(NvrtcDiskHeaders, AFunctionLikeMacroIncludeIsFollowedAndNoFolderIsKeyedWhole) {
  // What NVRTC opens is recorded, however the name was built: a file no
  // compile read is not in the key, and the header it did read is.
  nvrtc::Program p = program_;
  p.options.push_back("-no-source-include");
  p.source =
      "#define KC_PICK(x) <x>\n#include KC_PICK(kc_scale.cuh)\n"
      "extern \"C\" __global__ void picked(float* x) { x[threadIdx.x] *= KC_SCALE + KC_OFFSET; }\n";
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  auto k1 = compiler_->key(p);
  ASSERT_TRUE(k1.has_value());
  write_text(inc_ + "/unrelated.txt", "x");
  EXPECT_EQ(compiler_->key(p)->key, k1->key);
  EXPECT_EQ(compiler_->compile(p)->source, Source::memory);
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  auto edited = compiler_->compile(p);
  ASSERT_TRUE(edited.has_value());
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->ptx.find("0f40A00000"), std::string_view::npos);  // 2 + 3
}

TEST_F(NvrtcDiskHeaders, AnUnresolvableIncludeBesideTheSourceKeysTheSourceFolder) {
  // No -I: the header can only be beside the program, whose folder is keyed.
  const std::string proj = tmp_.path() + "/proj";
  ASSERT_EQ(::mkdir(proj.c_str(), 0755), 0);
  write_text(proj + "/cfg.cuh", "#define KC_CFG 1.0f\n");
  nvrtc::Program p;
  p.name = proj + "/k.cu";
  p.source =
      "#define STR(x) #x\n#define HDR STR(cfg.cuh)\n#include HDR\n"
      "extern \"C\" __global__ void k(float* x) { x[0] += KC_CFG; }\n";
  p.options = {"-arch=sm_80"};
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  write_text(proj + "/cfg.cuh", "#define KC_CFG 3.0f\n");
  auto edited = compiler_->compile(p);
  ASSERT_TRUE(edited.has_value()) << edited.error().to_string();
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->ptx.find(kThree), std::string_view::npos);
  auto warm = compiler_->compile(p);
  ASSERT_TRUE(warm.has_value());
  EXPECT_EQ(warm->source, Source::memory);
  EXPECT_EQ(warm->ptx, edited->ptx);
}

TEST_F(NvrtcDiskHeaders, AComputedIncludeBesideAProgramWithoutAFolderIsCachedAndFollowed) {
  // The working folder is never walked: the header NVRTC opened in it is
  // recorded, and an edit is a miss.
  const std::string proj = tmp_.path() + "/proj";
  ASSERT_EQ(::mkdir(proj.c_str(), 0755), 0);
  write_text(proj + "/cfg.cuh", "#define KC_CFG 1.0f\n");
  nvrtc::Program p;
  p.name = "k.cu";
  p.source =
      "#define STR(x) #x\n#define HDR STR(cfg.cuh)\n#include HDR\n"
      "extern \"C\" __global__ void k(float* x) { x[0] += KC_CFG; }\n";
  p.options = {"-arch=sm_80"};
  test::ScopedCwd back;
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(::chdir(proj.c_str()), 0);
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  EXPECT_EQ(compiler_->compile(p)->source, Source::memory);
  write_text(proj + "/cfg.cuh", "#define KC_CFG 3.0f\n");
  auto edited = compiler_->compile(p);
  ASSERT_TRUE(edited.has_value()) << edited.error().to_string();
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->ptx.find(kThree), std::string_view::npos);
}

TEST_F(NvrtcDiskHeaders, AQuotedIncludeBesideAProgramWithoutAFolderFollowsTheWorkingFolder) {
  const std::string a = tmp_.path() + "/a", b = tmp_.path() + "/b";
  ASSERT_EQ(::mkdir(a.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(b.c_str(), 0755), 0);
  write_text(a + "/kc_local.cuh", "#define KC_LOCAL 1.0f\n");
  write_text(b + "/kc_local.cuh", "#define KC_LOCAL 3.0f\n");
  nvrtc::Program p;
  p.name = "local.cu";
  p.source = "#include \"kc_local.cuh\"\nextern \"C\" __global__ void k(float* x) { x[0] += KC_LOCAL; }\n";
  p.options = {"-arch=sm_80"};
  test::ScopedCwd back;
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(::chdir(a.c_str()), 0);
  auto in_a = compiler_->compile(p);
  ASSERT_TRUE(in_a.has_value()) << in_a.error().to_string();
  EXPECT_NE(in_a->ptx.find(kOne), std::string_view::npos);
  ASSERT_EQ(::chdir(b.c_str()), 0);
  auto in_b = compiler_->compile(p);
  ASSERT_TRUE(in_b.has_value()) << in_b.error().to_string();
  EXPECT_EQ(in_b->source, Source::compiled);
  EXPECT_NE(in_b->ptx.find(kThree), std::string_view::npos);
  ASSERT_EQ(::chdir(a.c_str()), 0);
  auto again = compiler_->compile(p);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->source, Source::memory);
  EXPECT_EQ(again->ptx, in_a->ptx);
}

TEST_F(NvrtcDiskHeaders, ADigraphIncludeIsFollowed) {
  nvrtc::Program p = program_;
  p.source =
      "%:include <kc_scale.cuh>\n"
      "extern \"C\" __global__ void digraph(float* x) { x[threadIdx.x] += KC_OFFSET; }\n";
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  auto edited = compiler_->compile(p);
  ASSERT_TRUE(edited.has_value());
  EXPECT_EQ(edited->source, Source::compiled);
  EXPECT_NE(edited->ptx.find(kThree), std::string_view::npos);
  // A digraph directive split by a line splice, in a nested header.
  write_text(inc_ + "/kc_scale.cuh", "#pragma once\n%:inc\\\nlude \"kc_offset.cuh\"\n#define KC_SCALE 2.0f\n");
  ASSERT_TRUE(compiler_->compile(p).has_value());
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 4.0f\n");
  auto spliced = compiler_->compile(p);
  ASSERT_TRUE(spliced.has_value());
  EXPECT_EQ(spliced->source, Source::compiled);
  EXPECT_NE(spliced->ptx.find("0f40800000"), std::string_view::npos);  // 4.0f
}

TEST_F(NvrtcDiskHeaders, CreatingAProbedHeaderIsAMissNamedInTheExplanation) {
  nvrtc::Program p = program_;
  p.source =
      "#if __has_include(<kc_opt.cuh>)\n#include <kc_opt.cuh>\n#endif\n"
      "#ifndef KC_OPT\n#define KC_OPT 1.0f\n#endif\n"
      "extern \"C\" __global__ void probed(float* x) { x[threadIdx.x] += KC_OPT; }\n";
  auto cold = compiler_->compile(p);
  ASSERT_TRUE(cold.has_value()) << cold.error().to_string();
  EXPECT_NE(cold->ptx.find(kOne), std::string_view::npos);
  auto k0 = compiler_->key(p);
  ASSERT_TRUE(k0.has_value());
  write_text(inc_ + "/kc_opt.cuh", "#define KC_OPT 3.0f\n");
  auto created = compiler_->compile(p);
  ASSERT_TRUE(created.has_value());
  EXPECT_EQ(created->source, Source::compiled);
  EXPECT_NE(created->ptx.find(kThree), std::string_view::npos);
  auto diff = manifest_diff(k0->manifest, compiler_->key(p)->manifest);
  EXPECT_NE(std::find(diff.begin(), diff.end(), "file:" + inc_ + "/kc_opt.cuh"), diff.end());
  EXPECT_NE(std::find(diff.begin(), diff.end(), "probes.absent"), diff.end());
  // A probe alone (no include follows it) records existence, not contents.
  nvrtc::Program q = program_;
  q.source =
      "#if __has_include(\"kc_flag.cuh\")\n#define KC_F 3.0f\n#else\n#define KC_F 1.0f\n#endif\n"
      "extern \"C\" __global__ void flag(float* x) { x[threadIdx.x] += KC_F; }\n";
  ASSERT_TRUE(compiler_->compile(q).has_value());
  auto qa = compiler_->key(q);
  ASSERT_TRUE(qa.has_value());
  write_text(inc_ + "/kc_flag.cuh", "a");
  EXPECT_NE(compiler_->key(q)->key, qa->key);
  auto qr = compiler_->compile(q);
  ASSERT_TRUE(qr.has_value());
  EXPECT_EQ(qr->source, Source::compiled);
  EXPECT_NE(qr->ptx.find(kThree), std::string_view::npos);
  auto qb = compiler_->key(q);
  ASSERT_TRUE(qb.has_value());
  EXPECT_NE(qa->key, qb->key);
  // NVRTC opens the file a probe finds: its bytes are keyed.
  auto qdiff = manifest_diff(qa->manifest, qb->manifest);
  EXPECT_NE(std::find(qdiff.begin(), qdiff.end(), "file:" + inc_ + "/kc_flag.cuh"), qdiff.end());
}

TEST_F(NvrtcDiskHeaders, AWarmProcessStatsHeadersInsteadOfReadingThem) {
  ASSERT_TRUE(compiler_->compile(program_).has_value());
  uint64_t reads = nvrtc::detail::header_reads();
  for (int i = 0; i < 5; ++i) {
    auto r = compiler_->compile(program_);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->source, Source::memory);
  }
  EXPECT_EQ(nvrtc::detail::header_reads(), reads);
  // Another process (a fresh cache on the same folder) finds the record.
  (void)cache_->flush();
  auto fresh = Cache::open(disk_options(cache_dir_, /*memory=*/false));
  nvrtc::Compiler other(*fresh);
  auto r2 = other.compile(program_);
  ASSERT_TRUE(r2.has_value());
  EXPECT_EQ(r2->source, Source::disk);
  EXPECT_EQ(nvrtc::detail::header_reads(), reads);
  // A changed file is read again (its identity changed).
  write_text(inc_ + "/kc_offset.cuh", "#pragma once\n#define KC_OFFSET 3.0f\n");
  auto r = compiler_->compile(program_);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, Source::compiled);
  EXPECT_GT(nvrtc::detail::header_reads(), reads);
}

TEST(NvrtcManifestWatch, AChildForkedWhileAnotherThreadChecksNeverHangs) {
  SKIP_UNDER_TSAN();
  // A thread checks manifests again and again while the process forks; each
  // child checks with its own watcher and exits. A child that inherited a
  // held lock would hang (and be ended by its alarm).
  const char* env = std::getenv("KCACHE_TRIALS");
  const int trials = env ? std::max(1, std::atoi(env)) : 100;
  TempDir tmp;
  nvrtc::detail::DepManifest c;
  c.dirs.push_back({tmp.path(), false, {}});
  std::atomic<bool> stop{false};
  std::thread checker([&] {
    nvrtc::detail::WatchState w;
    while (!stop.load()) (void)nvrtc::detail::manifest_holds(c, &w);
  });
  nvrtc::detail::WatchState mine;
  (void)nvrtc::detail::manifest_holds(c, &mine);
  int hung = 0;
  for (int i = 0; i < trials; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(10);
      nvrtc::detail::WatchState w;
      (void)nvrtc::detail::manifest_holds(c, &w);
      bool ok = w.generation != 0 && w.generation != mine.generation;
      ::_exit(ok ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++hung;
  }
  stop = true;
  checker.join();
  EXPECT_EQ(hung, 0);
}

// ---- options as NVRTC reads them ------------------------------------------------

// A table of option lists, each compiled by NVRTC itself: for every pair,
// the keys are equal exactly when NVRTC's results (PTX and log, or the
// failure and its log) are equal. The kernel stores A * 1000 + B, each 7 or
// 9 when not defined; h2.h (pre-included, found through -I) defines B as 5.
// No row leaves A untouched: a -U of a macro nothing defined is a no-op
// that keeps a key of its own (NVRTC predefines non-reserved names such as
// NULL and CUDART_VERSION, so no -U can be dropped).
TEST(NvrtcOptionTable, SameKeyExactlyWhenNvrtcGivesTheSameResult) {
  TempDir dir;
  const std::string d = dir.path() + "/d";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  write_text(d + "/h2.h", "#define B 5\n");
  auto cache = Cache::open(disk_options(dir.path() + "/cache"));
  nvrtc::Compiler compiler(*cache);
  const std::vector<std::vector<std::string>> rows = {
      {"-DA=1"},
      {"-D", "A=1"},
      {"-D A=1"},
      {"-D", " A=1"},
      {"--define-macro", "A=1"},
      {"--define-macro=A=1"},
      {"-DA"},
      {"-D", "A"},
      {"-DA=1", "-DA=1"},
      {"-DA=2"},
      {"-DA=1", "--define-macro", "A=2"},
      {"--define-macro", "A=2", "-DA=1"},
      {"-DA=1", "-DA=2"},
      {"-DA=3", "-UA"},
      {"-DA=3", "-U", "A"},
      {"-DA=3", "-U A"},
      {"-DA=3", "--undefine-macro", "A"},
      {"-DA=3", "--undefine-macro=A"},
      {"-UA", "-DA=3"},
      {"--undefine-macro=A", "-DA=3"},
      {"-DA=3"},
      {"-DA=2", "-DB=3"},
      {"-DB=3", "-DA=2"},
      {"--define-macro=B=3", "-D", "A=2"},
      {"-DA=4", "-include", "h2.h", "-I", d},
      {"-DA=4", "--pre-include=h2.h", "-I" + d},
      {"-DA=4", "--pre-include", "h2.h", "--include-path", d},
      {"-DA=4", "-include=h2.h", "--include-path=" + d},
      {"-DA=4", "-include", "h2.h", "-I " + d},
      {"-DA=4", "-include", "h2.h", "-I=" + d},
      {"-DA=1", "--define-macro A=2"},  // rejected by NVRTC
      {"-DA=1", "-include h2.h"},       // rejected by NVRTC
  };
  struct Outcome {
    Key key;
    std::string result;
  };
  std::vector<Outcome> out;
  for (const auto& opts : rows) {
    nvrtc::Program p;
    p.name = "table.cu";
    p.source =
        "#ifndef A\n#define A 7\n#endif\n#ifndef B\n#define B 9\n#endif\n"
        "extern \"C\" __global__ void k(int* x) { x[0] = A * 1000 + B; }\n";
    p.options = opts;
    p.options.insert(p.options.begin(), "-arch=compute_80");
    auto k = compiler.key(p);
    ASSERT_TRUE(k.has_value()) << k.error().to_string();
    auto arts = nvrtc::compile_uncached(p);
    std::string result;
    if (arts) {
      for (const auto& a : *arts) result += a.name + "=" + a.data + ";";
    } else {
      result = "failed: " + arts.error().to_string();
    }
    out.push_back({k->key, std::move(result)});
  }
  auto show = [&](size_t i) {
    std::string s;
    for (const auto& o : rows[i]) s += "[" + o + "]";
    return s;
  };
  size_t same = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = i + 1; j < rows.size(); ++j) {
      bool same_key = out[i].key == out[j].key, same_result = out[i].result == out[j].result;
      EXPECT_EQ(same_key, same_result) << show(i) << " vs " << show(j);
      same += same_key;
    }
  EXPECT_GT(same, 40u);  // the table has many spellings of one meaning
}

// ---- outputs as NVRTC reports them; PTX ready for cuModuleLoadData -------------

TEST(NvrtcOutputs, EveryArchSpellingGivesACubinFromCompileAndFromTheCache) {
  TempDir dir;
  auto cache = Cache::open(disk_options(dir.path()));
  nvrtc::Compiler compiler(*cache);
  const std::vector<std::vector<std::string>> spellings = {
      {"-arch", "sm_90"},
      {"--gpu-architecture", "sm_90"},
      {"-arch=sm_90", "-arch=compute_90"},
      {"--gpu-architecture=sm_90"},
  };
  for (const auto& opts : spellings) {
    nvrtc::Program p;
    p.name = "arch.cu";
    p.source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n";
    p.options = opts;
    std::string what = opts[0] + (opts.size() > 1 ? " " + opts[1] : "");
    auto r = compiler.compile(p);
    ASSERT_TRUE(r.has_value()) << what << ": " << r.error().to_string();
    EXPECT_EQ(r->source, Source::compiled) << what;
    ASSERT_GE(r->cubin.size(), 64u) << what;
    EXPECT_EQ(r->cubin.substr(0, 4), std::string_view("\x7f"
                                                      "ELF",
                                                      4))
        << what;
    EXPECT_NE(r->ptx.find(".target sm_90"), std::string_view::npos) << what;
    auto again = compiler.compile(p);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->source, Source::memory) << what;
    EXPECT_EQ(again->cubin, r->cubin) << what;
  }
  // A virtual architecture alone: PTX and no CUBIN.
  nvrtc::Program v;
  v.source = "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }\n";
  v.options = {"-arch", "compute_90"};
  auto r = compiler.compile(v);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->cubin.empty());
  EXPECT_FALSE(r->ptx.empty());
}

TEST(NvrtcOutputs, PtxIsNulTerminatedFromCompileMemoryAndDisk) {
  TempDir dir;
  nvrtc::Program p;
  p.source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n";
  p.options = {"-arch=sm_80"};
  auto check = [](const nvrtc::Result& r, const char* where) {
    ASSERT_FALSE(r.ptx.empty()) << where;
    EXPECT_EQ(r.ptx.data()[r.ptx.size()], '\0') << where;
    EXPECT_EQ(std::strlen(r.ptx_cstr()), r.ptx.size()) << where;
    EXPECT_EQ(r.ptx_cstr(), r.ptx.data()) << where;
    EXPECT_NE(r.ptx.back(), '\0') << where;  // the view itself stops before the NUL
  };
  {
    auto cache = Cache::open(disk_options(dir.path()));
    nvrtc::Compiler c(*cache);
    auto cold = c.compile(p);
    ASSERT_TRUE(cold.has_value());
    EXPECT_EQ(cold->source, Source::compiled);
    check(*cold, "compiled");
    auto warm = c.compile(p);
    ASSERT_TRUE(warm.has_value());
    EXPECT_EQ(warm->source, Source::memory);
    check(*warm, "memory");
  }
  auto disk_only = Cache::open(disk_options(dir.path(), /*memory=*/false));
  nvrtc::Compiler c(*disk_only);
  auto disk = c.compile(p);
  ASSERT_TRUE(disk.has_value());
  EXPECT_EQ(disk->source, Source::disk);
  check(*disk, "disk");
  // No PTX (-dlto): ptx_cstr() is "" rather than a dangling pointer.
  p.options.push_back("-dlto");
  auto lto = c.compile(p);
  ASSERT_TRUE(lto.has_value());
  EXPECT_TRUE(lto->ptx.empty());
  EXPECT_STREQ(lto->ptx_cstr(), "");
}

TEST(NvrtcOutputs, AStoredPtxWithoutItsNulIsRecompiledAndReplaced) {
  TempDir dir;
  auto cache = Cache::open(disk_options(dir.path()));
  nvrtc::Compiler c(*cache);
  nvrtc::Program p;
  p.source = "extern \"C\" __global__ void k(float* x) { x[0] = 2.0f; }\n";
  p.options = {"-arch=compute_80"};
  ASSERT_TRUE(c.compile(p).has_value());
  auto ki = c.key(p);
  ASSERT_TRUE(ki.has_value());
  ASSERT_EQ(ki->manifest.ns, nvrtc::kNamespace);  // the entry's key, its manifest holding
  ASSERT_TRUE(cache->put(*ki, {{"ptx", ".version 9.0 // no NUL"}}).has_value());
  auto r = c.compile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, Source::compiled);
  EXPECT_NE(r->ptx.find(".entry k("), std::string_view::npos);
  EXPECT_EQ(r->ptx.data()[r->ptx.size()], '\0');
}

}  // namespace
}  // namespace kcache

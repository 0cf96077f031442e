// NVRTC keys from what NVRTC reads: one case (at least) of each way a key
// that guessed the preprocessor's reads could hand back a stale kernel, and
// the rules that keep a compile whose inputs moved out of the cache. Each
// case compiles a program through the cache, changes what NVRTC would read,
// and checks that what the cache returns (in this process and in a fresh
// one on the same store) is what NVRTC itself makes now.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integrations/nvrtc/manifest.h"
#include "integrations/nvrtc/observe.h"
#include "kcache/cache.h"
#include "kcache/nvrtc.h"
#include "test_util.h"

extern char** environ;

namespace kcache {
namespace {

using test::disk_options;
using test::TempDir;

// Written, then left older than the file system's timestamp granularity.
void write_file(const std::string& path, const std::string& text, bool age = true) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
  }
  if (age) std::this_thread::sleep_for(std::chrono::milliseconds(60));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void make_dir(const std::string& path) { ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << path; }

std::string uncached_ptx(const nvrtc::Program& p) {
  auto arts = nvrtc::compile_uncached(p);
  if (!arts) return "failed: " + arts.error().to_string();
  for (const auto& a : *arts)
    if (a.name == "ptx") return a.data.substr(0, a.data.size() - 1);
  return std::string();
}

// A kernel that stores V, which the headers define.
std::string kernel(const std::string& includes) {
  return includes + "\nextern \"C\" __global__ void k(int* x) { x[0] = V; }\n";
}

class NvrtcObserve : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(nvrtc::detail::install_recorder().is_ok()) << nvrtc::detail::install_recorder().to_string();
    root_ = tmp_.path();
    store_ = root_ + "/store";
    cache_ = Cache::open(disk_options(store_));
    compiler_ = std::make_unique<nvrtc::Compiler>(*cache_);
  }
  // The program through this process's compiler and through a fresh cache
  // and compiler on the same store (another process): both give what NVRTC
  // makes now.
  void expect_fresh(const nvrtc::Program& p, const std::string& what) {
    std::string want = uncached_ptx(p);
    ASSERT_EQ(want.find("failed"), std::string::npos) << what << ": " << want;
    auto here = compiler_->compile(p);
    ASSERT_TRUE(here.has_value()) << what << ": " << here.error().to_string();
    EXPECT_EQ(std::string(here->ptx), want) << what << " (this process, " << source_name(here->source) << ")";
    (void)cache_->flush();
    auto other_cache = Cache::open(disk_options(store_, /*memory=*/false));
    nvrtc::Compiler other(*other_cache);
    auto there = other.compile(p);
    ASSERT_TRUE(there.has_value()) << what << ": " << there.error().to_string();
    EXPECT_EQ(std::string(there->ptx), want) << what << " (another process, " << source_name(there->source) << ")";
  }
  // Compiled and stored: a second compile is a hit.
  void compile_stored(const nvrtc::Program& p) {
    auto r = compiler_->compile(p);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    auto again = compiler_->compile(p);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->source, Source::memory);
  }

  TempDir tmp_;
  std::string root_, store_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<nvrtc::Compiler> compiler_;
};

// ---- the preprocessor read unlike a scanner ------------------------------------

TEST_F(NvrtcObserve, AMacroNameInsideAStringLiteralIsNotReplaced) {
  make_dir(root_ + "/p");
  write_file(root_ + "/p/kc.h", "#define V 1\n");
  write_file(root_ + "/p/kd.h", "#define V 2\n");
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source = kernel("#define kc kd\n#include \"kc.h\"");
  p.options = {"-arch=compute_80"};
  compile_stored(p);
  write_file(root_ + "/p/kc.h", "#define V 3\n");
  expect_fresh(p, "kc.h edited");
}

TEST_F(NvrtcObserve, AComputedIncludeOfAPredefinedMacroIsFollowed) {
  make_dir(root_ + "/p");
  std::string name = "v" + std::to_string(compiler_->identity().major) + ".h";
  write_file(root_ + "/p/" + name, "#define V 1\n");
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source = kernel(
      "#define S2(x) #x\n#define S(x) S2(x)\n#define C2(a, b) a##b\n#define C(a, b) C2(a, b)\n"
      "#include S(C(v, __CUDACC_VER_MAJOR__).h)");
  p.options = {"-arch=compute_80"};
  compile_stored(p);
  write_file(root_ + "/p/" + name, "#define V 4\n");
  expect_fresh(p, name + " edited");
}

TEST_F(NvrtcObserve, AnIncludeAfterARawStringLiteralIsFollowed) {
  make_dir(root_ + "/p");
  write_file(root_ + "/p/r.h", "#define V 1\n");
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source = kernel("static const char s[] = R\"x(/*)x\";\n#include \"r.h\"\n// */");
  p.options = {"-arch=compute_80", "-std=c++17"};
  compile_stored(p);
  write_file(root_ + "/p/r.h", "#define V 5\n");
  expect_fresh(p, "r.h edited");
  // A prefixed character literal holding a quote.
  nvrtc::Program q = p;
  q.source = kernel("static const char16_t c = u'\"';\n#include \"r.h\"\n// \"");
  compile_stored(q);
  write_file(root_ + "/p/r.h", "#define V 6\n");
  expect_fresh(q, "r.h edited after a prefixed literal");
}

TEST_F(NvrtcObserve, ATrigraphIncludeIsFollowedWhereNvrtcReadsTrigraphs) {
  make_dir(root_ + "/p");
  write_file(root_ + "/p/t.h", "#define V 1\n");
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source = kernel("#define V 9\n?\?=undef V\n?\?=include \"t.h\"");
  p.options = {"-arch=compute_80", "-std=c++11"};
  if (uncached_ptx(p).find("failed") != std::string::npos) GTEST_SKIP() << "NVRTC rejects trigraphs here";
  compile_stored(p);
  write_file(root_ + "/p/t.h", "#define V 7\n");
  expect_fresh(p, "t.h edited");
}

TEST_F(NvrtcObserve, AHasIncludeWrapperOnAMacroArgumentRecordsTheProbe) {
  make_dir(root_ + "/p");
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source =
      kernel("#define HAS(x) __has_include(x)\n#if HAS(\"opt.h\")\n#include \"opt.h\"\n#else\n#define V 2\n#endif");
  p.options = {"-arch=compute_80"};
  compile_stored(p);
  write_file(root_ + "/p/opt.h", "#define V 8\n");
  expect_fresh(p, "opt.h created");
}

TEST_F(NvrtcObserve, AStringizedRelativeIncludeOutsideEveryFolderIsFollowed) {
  make_dir(root_ + "/p");
  make_dir(root_ + "/other");
  write_file(root_ + "/other/x.h", "#define V 1\n");
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source = kernel("#define S2(x) #x\n#define S(x) S2(x)\n#include S(../other/x.h)");
  p.options = {"-arch=compute_80"};
  compile_stored(p);
  write_file(root_ + "/other/x.h", "#define V 9\n");
  expect_fresh(p, "../other/x.h edited");
}

// ---- NVRTC's search order ---------------------------------------------------------

TEST_F(NvrtcObserve, IncludeNextInTheProgramItselfFollowsNvrtc) {
  make_dir(root_ + "/a");
  make_dir(root_ + "/b");
  write_file(root_ + "/b/n.h", "#define V 1\n");
  nvrtc::Program p;
  p.name = root_ + "/k.cu";
  p.source = kernel("#include_next <n.h>");
  p.options = {"-arch=compute_80", "-I" + root_ + "/a", "-I" + root_ + "/b"};
  if (uncached_ptx(p).find("failed") != std::string::npos) GTEST_SKIP() << "NVRTC rejects it";
  compile_stored(p);
  write_file(root_ + "/a/n.h", "#define V 2\n");
  expect_fresh(p, "a/n.h created");
  write_file(root_ + "/b/n.h", "#define V 3\n");
  expect_fresh(p, "b/n.h edited");
}

TEST_F(NvrtcObserve, APreIncludeIsSearchedWhereNvrtcSearchesIt) {
  make_dir(root_ + "/w");
  make_dir(root_ + "/d");
  write_file(root_ + "/d/pre.h", "#define V 1\n");
  test::ScopedCwd back;
  ASSERT_EQ(::chdir((root_ + "/w").c_str()), 0);
  nvrtc::Program p;
  p.name = root_ + "/src/k.cu";
  p.source = kernel("");
  p.options = {"-arch=compute_80", "-include", "pre.h", "-I" + root_ + "/d"};
  compile_stored(p);
  write_file(root_ + "/w/pre.h", "#define V 2\n");
  expect_fresh(p, "pre.h created in the working folder");
}

TEST_F(NvrtcObserve, AQuotedIncludeInANamedHeaderIsSearchedWhereNvrtcSearchesIt) {
  make_dir(root_ + "/w");
  make_dir(root_ + "/d");
  write_file(root_ + "/d/b.h", "#define V 1\n");
  test::ScopedCwd back;
  ASSERT_EQ(::chdir((root_ + "/w").c_str()), 0);
  nvrtc::Program p;
  p.name = root_ + "/src/k.cu";
  p.source = kernel("#include \"h.h\"");
  p.headers = {{"h.h", "#include \"b.h\"\n"}};
  p.options = {"-arch=compute_80", "-I" + root_ + "/d"};
  compile_stored(p);
  write_file(root_ + "/w/b.h", "#define V 2\n");
  expect_fresh(p, "b.h created in the working folder");
}

TEST_F(NvrtcObserve, IncludePathsWithTrailingBlanksAreFollowed) {
  make_dir(root_ + "/d");
  write_file(root_ + "/d/x.h", "#define V 1\n");
  write_file(root_ + "/d/pre.h", "#define W 1\n");
  nvrtc::Program p;
  p.name = root_ + "/k.cu";
  p.source = kernel("#include <x.h>");
  p.options = {"-arch=compute_80", "-I" + root_ + "/d ", "-include", "pre.h "};
  if (uncached_ptx(p).find("failed") != std::string::npos) GTEST_SKIP() << "NVRTC rejects it";
  compile_stored(p);
  write_file(root_ + "/d/x.h", "#define V 2\n");
  expect_fresh(p, "x.h edited");
  write_file(root_ + "/d/pre.h", "#define W 2\n#define V 3\n#include <x.h>\n");
  expect_fresh(p, "pre.h edited");
}

TEST_F(NvrtcObserve, ADanglingSymlinkEarlierInTheSearchThatComesToLife) {
  make_dir(root_ + "/a");
  make_dir(root_ + "/b");
  write_file(root_ + "/b/x.h", "#define V 1\n");
  ASSERT_EQ(::symlink((root_ + "/a/target.h").c_str(), (root_ + "/a/x.h").c_str()), 0);
  nvrtc::Program p;
  p.name = root_ + "/k.cu";
  p.source = kernel("#include <x.h>");
  p.options = {"-arch=compute_80", "-I" + root_ + "/a", "-I" + root_ + "/b"};
  compile_stored(p);
  write_file(root_ + "/a/target.h", "#define V 2\n");
  expect_fresh(p, "the link's target created");
}

// ---- what is read is what is keyed ---------------------------------------------------

TEST_F(NvrtcObserve, AFileChangedBetweenItsReadAndTheEndOfTheCompileIsNotStored) {
  // The recording of a compile that read h.h, then h.h changes before the
  // manifest is made: uncacheable.
  const std::string h = root_ + "/h.h";
  write_file(h, "#define V 1\n");
  struct stat st;
  ASSERT_EQ(::stat(h.c_str(), &st), 0);
  nvrtc::detail::Recording rec;
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  rec.cwd = cwd;
  nvrtc::detail::Access a;
  a.kind = nvrtc::detail::Access::Kind::opened;
  a.path = h;
  a.found = true;
  a.has_id = true;
  a.id = nvrtc::detail::id_of(st);
  rec.accesses.push_back(a);
  EXPECT_TRUE(nvrtc::detail::build_manifest(rec, {}, {}).uncacheable.empty());
  write_file(h, "#define V 22\n");
  std::string why = nvrtc::detail::build_manifest(rec, {}, {}).uncacheable;
  EXPECT_NE(why.find("changed while compiling"), std::string::npos) << why;
  // A path NVRTC did not find that exists at the end.
  nvrtc::detail::Recording rec2;
  rec2.cwd = cwd;
  a.path = root_ + "/late.h";
  a.found = false;
  a.has_id = false;
  rec2.accesses.push_back(a);
  EXPECT_TRUE(nvrtc::detail::build_manifest(rec2, {}, {}).uncacheable.empty());
  write_file(root_ + "/late.h", "x", /*age=*/false);
  why = nvrtc::detail::build_manifest(rec2, {}, {}).uncacheable;
  EXPECT_NE(why.find("appeared"), std::string::npos) << why;
}

TEST_F(NvrtcObserve, AHeaderYoungerThanTheTimestampGranularityIsNotStored) {
  make_dir(root_ + "/d");
  nvrtc::Program p;
  p.name = root_ + "/k.cu";
  p.source = kernel("#include <x.h>");
  p.options = {"-arch=compute_80", "-I" + root_ + "/d"};
  // Its time stamp a few seconds ahead: young for every compile here,
  // however slowly the machine runs.
  write_file(root_ + "/d/x.h", "#define V 1\n", /*age=*/false);
  struct timespec ahead[2];
  ::clock_gettime(CLOCK_REALTIME, &ahead[0]);
  ahead[0].tv_sec += 5;
  ahead[1] = ahead[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, (root_ + "/d/x.h").c_str(), ahead, 0), 0);
  auto a = compiler_->compile(p);
  ASSERT_TRUE(a.has_value());
  auto b = compiler_->compile(p);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->source, Source::compiled);  // the first was not stored
  // Rewritten within the same tick, same size: never served stale.
  write_file(root_ + "/d/x.h", "#define V 2\n", /*age=*/false);
  ASSERT_EQ(::utimensat(AT_FDCWD, (root_ + "/d/x.h").c_str(), ahead, 0), 0);
  expect_fresh(p, "x.h rewritten at once");
  // Older than a tick: stored.
  struct timespec past[2];
  ::clock_gettime(CLOCK_REALTIME, &past[0]);
  past[0].tv_sec -= 5;
  past[1] = past[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, (root_ + "/d/x.h").c_str(), past, 0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // its ctime, set by utimensat, too
  compile_stored(p);
}

TEST_F(NvrtcObserve, TimeAndDateMakeAProgramUncacheable) {
  nvrtc::Program p;
  p.name = root_ + "/k.cu";
  p.source = "extern \"C\" __global__ void k(char* x) { x[0] = __TIME__[7]; }\n";
  p.options = {"-arch=compute_80"};
  ASSERT_TRUE(compiler_->compile(p).has_value());
  auto again = compiler_->compile(p);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->source, Source::compiled);
  // In a header read from disk.
  make_dir(root_ + "/d");
  write_file(root_ + "/d/when.h", "#define V (__DATE__[0])\n");
  nvrtc::Program q;
  q.name = root_ + "/q.cu";
  q.source = kernel("#include <when.h>");
  q.options = {"-arch=compute_80", "-I" + root_ + "/d"};
  ASSERT_TRUE(compiler_->compile(q).has_value());
  EXPECT_EQ(compiler_->compile(q)->source, Source::compiled);
}

TEST_F(NvrtcObserve, LineInfoKeysTheWorkingFolder) {
  make_dir(root_ + "/a");
  make_dir(root_ + "/b");
  test::ScopedCwd back;
  nvrtc::Program p;
  p.name = "k.cu";
  p.source = kernel("#define V 1");
  p.options = {"-arch=compute_80", "-lineinfo"};
  ASSERT_EQ(::chdir((root_ + "/a").c_str()), 0);
  compile_stored(p);
  auto k = compiler_->key(p);
  ASSERT_TRUE(k.has_value());
  bool keyed = false;
  for (const auto& it : k->manifest.items) keyed |= it.name == "working_folder";
  EXPECT_TRUE(keyed);
  ASSERT_EQ(::chdir((root_ + "/b").c_str()), 0);
  auto r = compiler_->compile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, Source::compiled);
  expect_fresh(p, "-lineinfo in another working folder");
}

TEST_F(NvrtcObserve, TheTargetOfASymlinkedHeaderEditedWithinTheRecheckSecond) {
  make_dir(root_ + "/d");
  make_dir(root_ + "/t");
  write_file(root_ + "/t/x.h", "#define V 1\n");
  ASSERT_EQ(::symlink("../t/x.h", (root_ + "/d/x.h").c_str()), 0);
  nvrtc::Program p;
  p.name = root_ + "/k.cu";
  p.source = kernel("#include <x.h>");
  p.options = {"-arch=compute_80", "-I" + root_ + "/d"};
  compile_stored(p);
  write_file(root_ + "/t/x.h", "#define V 2\n");  // within the second a watched manifest is trusted
  auto r = compiler_->compile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(std::string(r->ptx), uncached_ptx(p));
  expect_fresh(p, "the target edited");
}

TEST_F(NvrtcObserve, TheBuiltinsLibraryKeyedIsTheOneLoaded) {
  const nvrtc::Program p{kernel("#define V 1"), "", {"-arch=compute_80"}, {}, {}, {}};
  compile_stored(p);
  auto k = compiler_->key(p);
  ASSERT_TRUE(k.has_value());
  std::string loaded;
  for (const auto& l : nvrtc::detail::nvrtc_loads())
    if (l.name.starts_with("libnvrtc-builtins")) loaded = l.path;
  ASSERT_FALSE(loaded.empty());
  bool named = false;
  for (const auto& it : k->manifest.items)
    if (it.name.starts_with("library:libnvrtc-builtins")) named = it.value && *it.value == loaded;
  EXPECT_TRUE(named) << loaded;
}

// A child process started with LD_LIBRARY_PATH on a copy of the builtins:
// what it keys names the copy.
TEST(NvrtcObserveChild, KeyNamesTheBuiltinsLoaded) {
  const char* out = std::getenv("KCACHE_TEST_OBSERVE_OUT");
  if (!out) GTEST_SKIP() << "run by NvrtcObserve's builtins test";
  TempDir store;
  auto cache = Cache::open(disk_options(store.path()));
  nvrtc::Compiler c(*cache);
  nvrtc::Program p{kernel("#define V 1"), "", {"-arch=compute_80"}, {}, {}, {}};
  ASSERT_TRUE(c.compile(p).has_value());
  auto k = c.key(p);
  ASSERT_TRUE(k.has_value());
  std::string got;
  for (const auto& it : k->manifest.items)
    if (it.name.starts_with("library:libnvrtc-builtins") && it.value) got = *it.value;
  std::ofstream(out) << got;
}

std::string self_exe() {
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
}

TEST_F(NvrtcObserve, BuiltinsFoundThroughLdLibraryPathAreTheOnesKeyed) {
  std::string builtins;
  for (const auto& l : nvrtc::detail::nvrtc_loads())
    if (l.name.starts_with("libnvrtc-builtins")) builtins = l.path;
  if (builtins.empty()) {
    compile_stored(nvrtc::Program{kernel("#define V 1"), "", {"-arch=compute_80"}, {}, {}, {}});
    for (const auto& l : nvrtc::detail::nvrtc_loads())
      if (l.name.starts_with("libnvrtc-builtins")) builtins = l.path;
  }
  ASSERT_FALSE(builtins.empty());
  make_dir(root_ + "/lib");
  std::string copy = root_ + "/lib/" + builtins.substr(builtins.rfind('/') + 1);
  write_file(copy, read_file(builtins) + std::string(16, '\0'), /*age=*/false);
  std::string cmd = "LD_LIBRARY_PATH=" + root_ + "/lib KCACHE_TEST_OBSERVE_OUT=" + root_ + "/out.txt " + self_exe() +
                    " --gtest_filter=NvrtcObserveChild.* >" + root_ + "/child.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(root_ + "/child.log");
  EXPECT_EQ(read_file(root_ + "/out.txt"), copy);
}

// ---- the store ----------------------------------------------------------------------------

TEST_F(NvrtcObserve, AStoreUnderTheProgramFolderIsNeverKeyed) {
  make_dir(root_ + "/p");
  const std::string store = root_ + "/p/.kcache";
  nvrtc::Program p;
  p.name = root_ + "/p/k.cu";
  p.source = kernel("#if __has_include(\"missing.h\")\n#include \"missing.h\"\n#else\n#define V 3\n#endif");
  p.options = {"-arch=compute_80"};
  std::vector<Source> got;
  for (int i = 0; i < 3; ++i) {
    auto cache = Cache::open(disk_options(store, /*memory=*/false));
    nvrtc::Compiler c(*cache);
    auto r = c.compile(p);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    got.push_back(r->source);
    auto k = c.key(p);
    ASSERT_TRUE(k.has_value());
    for (const auto& it : k->manifest.items) EXPECT_EQ(it.name.find(".kcache"), std::string::npos) << it.name;
  }
  EXPECT_EQ(got, (std::vector<Source>{Source::compiled, Source::disk, Source::disk}));
}

// ---- single flight across processes -------------------------------------------------------

TEST(NvrtcObserveChild, CompileTheSharedProgram) {
  const char* store = std::getenv("KCACHE_TEST_FLIGHT_STORE");
  if (!store) GTEST_SKIP() << "run by NvrtcObserve's single-flight test";
  auto cache = Cache::open(disk_options(store, /*memory=*/false));
  nvrtc::Compiler c(*cache);
  nvrtc::Program p;
  p.name = "shared.cu";
  p.source = kernel("#include <cuda/std/limits>\n#define V (cuda::std::numeric_limits<int>::max() - 1)");
  p.options = {"-arch=sm_80", "-std=c++17", "-I" KCACHE_TEST_CUDA_INCLUDE "/cccl", "-I" KCACHE_TEST_CUDA_INCLUDE};
  auto r = c.compile(p);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  std::ofstream(std::getenv("KCACHE_TEST_FLIGHT_OUT")) << source_name(r->source);
}

TEST_F(NvrtcObserve, FourProcessesCompileANewProgramOnce) {
  const std::string exe = self_exe();
  const int n = 4;
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    std::string filter = "--gtest_filter=NvrtcObserveChild.CompileTheSharedProgram";
    std::string env_store = "KCACHE_TEST_FLIGHT_STORE=" + store_ + "-shared";
    std::string env_out = "KCACHE_TEST_FLIGHT_OUT=" + root_ + "/flight" + std::to_string(i);
    std::vector<std::string> env_s{env_store, env_out};
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    std::vector<char*> env;
    for (auto& s : env_s) env.push_back(s.data());
    env.push_back(nullptr);
    std::vector<char*> argv{const_cast<char*>(exe.c_str()), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), env.data()), 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  int compiled = 0;
  for (int i = 0; i < n; ++i) compiled += read_file(root_ + "/flight" + std::to_string(i)) == "compiled";
  EXPECT_EQ(compiled, 1);
}

// ---- the recorder's own limits -------------------------------------------------

// Whether `rec` saw NVRTC open `path`.
bool opened(const nvrtc::detail::Recording& rec, const std::string& path) {
  for (const auto& a : rec.accesses)
    if (a.path == path && a.kind == nvrtc::detail::Access::Kind::opened) return true;
  return false;
}

TEST_F(NvrtcObserve, ASlotReboundDuringTheCompileIsNotStoredAndIsPatchedAgain) {
  // The lazy resolver on another thread writing libc's fopen over the
  // wrapper after the check at the start: the compile reads unseen.
  make_dir(root_ + "/lb");
  write_file(root_ + "/lb/h.h", "#define V 1\n");
  nvrtc::Program p;
  p.source = kernel("#include \"h.h\"");
  p.options = {"-arch=compute_80", "-I" + root_ + "/lb"};
  nvrtc::detail::Recording rec;
  {
    nvrtc::detail::ScopedRecording on(&rec);
    nvrtc::detail::rebind_slots_for_test();
    ASSERT_TRUE(nvrtc::compile_uncached(p).has_value());
  }
  EXPECT_TRUE(rec.hooks_lost);
  EXPECT_FALSE(opened(rec, root_ + "/lb/h.h"));
  std::string why = nvrtc::detail::build_manifest(rec, {}, {}).uncacheable;
  EXPECT_NE(why.find("rebound"), std::string::npos) << why;
  // Patched again: the next compile is seen whole.
  nvrtc::detail::Recording again;
  {
    nvrtc::detail::ScopedRecording on(&again);
    ASSERT_TRUE(nvrtc::compile_uncached(p).has_value());
  }
  EXPECT_FALSE(again.hooks_lost);
  EXPECT_TRUE(opened(again, root_ + "/lb/h.h"));
  EXPECT_TRUE(nvrtc::detail::build_manifest(again, {}, {}).uncacheable.empty());
}

TEST_F(NvrtcObserve, SlotsRepairedFromManyThreadsAtOnceStayPatched) {
  // Each recording repairs rebound slots; eight threads at once each make
  // pages writable and read-only again, serialised.
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) {
        nvrtc::detail::rebind_slots_for_test();
        nvrtc::detail::Recording rec;
        nvrtc::detail::ScopedRecording on(&rec);
      }
    });
  }
  for (auto& t : threads) t.join();
  make_dir(root_ + "/mt");
  write_file(root_ + "/mt/h.h", "#define V 1\n");
  nvrtc::Program p;
  p.source = kernel("#include \"h.h\"");
  p.options = {"-arch=compute_80", "-I" + root_ + "/mt"};
  nvrtc::detail::Recording rec;
  {
    nvrtc::detail::ScopedRecording on(&rec);
    ASSERT_TRUE(nvrtc::compile_uncached(p).has_value());
  }
  EXPECT_FALSE(rec.hooks_lost);
  EXPECT_TRUE(opened(rec, root_ + "/mt/h.h"));
}

TEST_F(NvrtcObserve, ThreadsChildrenAndSystemCallsOfNvrtcAreHooked) {
  auto hooked = nvrtc::detail::hooked_functions();
  for (const char* f : {"pthread_create", "fork", "execv", "execve", "execvp", "system", "syscall", "mkdir", "unlink"})
    EXPECT_NE(std::find(hooked.begin(), hooked.end(), f), hooked.end()) << f;
}

TEST_F(NvrtcObserve, ACompileBesideAnUnrecordedOneIsNotStored) {
  // NVRTC reading on a thread with no recording while this one records
  // (its own worker, or here an unrecorded compile beside): unseen reads.
  make_dir(root_ + "/un");
  write_file(root_ + "/un/h.h", "#define V 1\n");
  nvrtc::Program p;
  p.source = kernel("#include \"h.h\"");
  p.options = {"-arch=compute_80", "-I" + root_ + "/un"};
  nvrtc::detail::Recording rec;
  {
    nvrtc::detail::ScopedRecording on(&rec);
    std::thread other([&] { ASSERT_TRUE(nvrtc::compile_uncached(p).has_value()); });
    other.join();
  }
  ASSERT_NE(rec.escaped, nullptr);
  std::string why = nvrtc::detail::build_manifest(rec, {}, {}).uncacheable;
  EXPECT_NE(why.find("not seen"), std::string::npos) << why;
  // Alone, the same compile is seen whole and may be stored.
  nvrtc::detail::Recording alone;
  {
    nvrtc::detail::ScopedRecording on(&alone);
    ASSERT_TRUE(nvrtc::compile_uncached(p).has_value());
  }
  EXPECT_EQ(alone.escaped, nullptr) << alone.escaped;
  EXPECT_TRUE(nvrtc::detail::build_manifest(alone, {}, {}).uncacheable.empty());
}

TEST_F(NvrtcObserve, AHeaderNvrtcCouldNotOpenIsNeverStored) {
  // h.h in the first folder with mode 000: NVRTC cannot open it (EACCES)
  // and takes the second folder's; after a chmod 644 it would take the
  // first's. Root reads a mode-000 file, so the compile runs in a child as
  // nobody.
  make_dir(root_ + "/a");
  make_dir(root_ + "/b");
  write_file(root_ + "/a/h.h", "#define V 1\n");
  write_file(root_ + "/b/h.h", "#define V 2\n");
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((root_ + "/a/h.h").c_str(), 0), 0);
  nvrtc::Program p;
  p.source = kernel("#include \"h.h\"");
  p.options = {"-arch=compute_80", "-I" + root_ + "/a", "-I" + root_ + "/b"};
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::getuid() == 0 && ::setuid(65534) != 0) ::_exit(10);
    nvrtc::detail::Recording rec;
    {
      nvrtc::detail::ScopedRecording on(&rec);
      auto arts = nvrtc::compile_uncached(p);
      // NVRTC skipped the unreadable header or failed on it: either way
      // nothing may be stored.
      (void)arts;
    }
    if (rec.unreadable != root_ + "/a/h.h") ::_exit(11);
    std::string why = nvrtc::detail::build_manifest(rec, {}, {}).uncacheable;
    ::_exit(why.find("could not be opened") != std::string::npos ? 0 : 12);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "10: setuid failed, 11: the failed open not recorded, 12: stored";
}

TEST_F(NvrtcObserve, APathFoundWhosePermissionsChangedNoLongerHolds) {
  const std::string h = root_ + "/probe.h";
  write_file(h, "x");
  nvrtc::detail::Recording rec;
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  rec.cwd = cwd;
  nvrtc::detail::Access a;
  a.kind = nvrtc::detail::Access::Kind::stated;
  a.path = h;
  a.found = true;
  rec.accesses.push_back(a);
  auto built = nvrtc::detail::build_manifest(rec, {}, {});
  ASSERT_TRUE(built.uncacheable.empty()) << built.uncacheable;
  ASSERT_EQ(built.manifest.present.size(), 1u);
  EXPECT_TRUE(nvrtc::detail::manifest_holds(built.manifest));
  auto decoded = nvrtc::detail::decode_manifest(nvrtc::detail::encode_manifest(built.manifest));
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->present[0].mode, built.manifest.present[0].mode);
  ASSERT_EQ(::chmod(h.c_str(), 0), 0);
  EXPECT_FALSE(nvrtc::detail::manifest_holds(built.manifest));
  EXPECT_FALSE(nvrtc::detail::manifest_holds(*decoded));
}

TEST_F(NvrtcObserve, AFolderListedThatChangedDuringTheCompileIsNotStored) {
  // The names are taken at the end of the compile: one added while NVRTC
  // compiled would be in the manifest though NVRTC listed the folder
  // without it.
  make_dir(root_ + "/ls");
  write_file(root_ + "/ls/one.h", "x");
  nvrtc::detail::Recording rec;
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  rec.cwd = cwd;
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  rec.start_ns = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  nvrtc::detail::Access a;
  a.kind = nvrtc::detail::Access::Kind::listed;
  a.path = root_ + "/ls";
  a.found = true;
  rec.accesses.push_back(a);
  EXPECT_TRUE(nvrtc::detail::build_manifest(rec, {}, {}).uncacheable.empty());
  write_file(root_ + "/ls/two.h", "x", /*age=*/false);  // during the compile
  std::string why = nvrtc::detail::build_manifest(rec, {}, {}).uncacheable;
  EXPECT_NE(why.find("too new"), std::string::npos) << why;
}

TEST_F(NvrtcObserve, AProgramRemembersItsLastEightFailures) {
  // Each remembered failure is checked on every lookup of the program: the
  // oldest are dropped past eight.
  nvrtc::CompilerOptions co;
  co.remember_failures = true;
  nvrtc::Compiler c(*cache_, co);
  make_dir(root_ + "/f");
  nvrtc::Program p;
  p.source = kernel("#include \"bad.h\"");
  p.options = {"-arch=compute_80", "-I" + root_ + "/f"};
  auto fail_with = [&](int i) {
    write_file(root_ + "/f/bad.h", "#define V 1\nsyntax error " + std::to_string(i) + "\n");
    uint64_t runs = nvrtc::detail::recorded_compiles();
    auto r = c.compile(p);
    EXPECT_FALSE(r.has_value());
    return nvrtc::detail::recorded_compiles() - runs;
  };
  for (int i = 0; i < 10; ++i) EXPECT_EQ(fail_with(i), 1u) << i;
  EXPECT_EQ(fail_with(9), 0u);  // remembered
  EXPECT_EQ(fail_with(2), 0u);  // the oldest kept
  EXPECT_EQ(fail_with(0), 1u);  // dropped
}

TEST_F(NvrtcObserve, AReadOfANonRegularFileIsNotStored) {
  // /proc's bytes change with no identity change; a FIFO would block the
  // digest's read.
  const std::string fifo = root_ + "/fifo.h";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& path : {std::string("/proc/self/status"), fifo}) {
    nvrtc::detail::Recording rec;
    char cwd[4096];
    ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
    rec.cwd = cwd;
    nvrtc::detail::Access a;
    a.kind = nvrtc::detail::Access::Kind::opened;
    a.path = path;
    a.found = true;
    rec.accesses.push_back(a);
    std::string why = nvrtc::detail::build_manifest(rec, {}, {}).uncacheable;
    EXPECT_NE(why.find("not a regular file"), std::string::npos) << path << ": " << why;
  }
}

TEST_F(NvrtcObserve, EnvironmentVariablesNvrtcAsksForAreInputs) {
  // What getenv answered NVRTC on the recording thread: a later value
  // makes the manifest no longer hold.
  ::setenv("KCACHE_TEST_NVRTC_ENV", "one", 1);
  ::unsetenv("KCACHE_TEST_NVRTC_UNSET");
  nvrtc::detail::Recording rec;
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  rec.cwd = cwd;
  nvrtc::detail::Access a;
  a.kind = nvrtc::detail::Access::Kind::env;
  a.path = "KCACHE_TEST_NVRTC_ENV";
  a.found = true;
  a.target = "one";
  rec.accesses.push_back(a);
  a.path = "KCACHE_TEST_NVRTC_UNSET";
  a.found = false;
  a.target.clear();
  rec.accesses.push_back(a);
  auto built = nvrtc::detail::build_manifest(rec, {}, {});
  ASSERT_TRUE(built.uncacheable.empty()) << built.uncacheable;
  // These two, and any NVRTC asked for in an earlier compile here.
  size_t ours = 0;
  for (const auto& e : built.manifest.env) ours += e.path.rfind("KCACHE_TEST_NVRTC_", 0) == 0;
  ASSERT_EQ(ours, 2u);
  auto decoded = nvrtc::detail::decode_manifest(nvrtc::detail::encode_manifest(built.manifest));
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(nvrtc::detail::manifest_holds(*decoded));
  ::setenv("KCACHE_TEST_NVRTC_ENV", "two", 1);
  EXPECT_FALSE(nvrtc::detail::manifest_holds(*decoded));
  ::setenv("KCACHE_TEST_NVRTC_ENV", "one", 1);
  ::setenv("KCACHE_TEST_NVRTC_UNSET", "", 1);
  EXPECT_FALSE(nvrtc::detail::manifest_holds(*decoded));
  ::unsetenv("KCACHE_TEST_NVRTC_UNSET");
  EXPECT_TRUE(nvrtc::detail::manifest_holds(*decoded));
  // The wrapper is in place, and a compile through the cache is still a
  // hit (whatever NVRTC asks for is unchanged).
  auto hooked = nvrtc::detail::hooked_functions();
  EXPECT_NE(std::find(hooked.begin(), hooked.end(), "getenv"), hooked.end());
  nvrtc::Program p;
  p.source = kernel("#define V 3");
  p.options = {"-arch=compute_80"};
  compile_stored(p);
  ::unsetenv("KCACHE_TEST_NVRTC_ENV");
}

TEST_F(NvrtcObserve, NvrtcAppendFlagsInTheEnvironmentIsFollowed) {
  // NVRTC 13 reads NVRTC_APPEND_FLAGS (and EDG_BASE, PWD, ...) on the
  // compiling thread: options added through it change the output.
  ::unsetenv("NVRTC_APPEND_FLAGS");
  nvrtc::Program p;
  p.source = kernel("#ifndef V\n#define V 1\n#endif");
  p.options = {"-arch=compute_80"};
  compile_stored(p);
  ::setenv("NVRTC_APPEND_FLAGS", "-DV=7", 1);
  std::string want = uncached_ptx(p);
  EXPECT_NE(want.find("7"), std::string::npos);
  expect_fresh(p, "NVRTC_APPEND_FLAGS set");
  ::unsetenv("NVRTC_APPEND_FLAGS");
  expect_fresh(p, "NVRTC_APPEND_FLAGS unset again");
}

TEST_F(NvrtcObserve, SplitCompileWorkersThatReachNoFileKeepTheCompileCacheable) {
  // -split-compile starts threads: their file calls would reach the
  // wrappers unrecorded and refuse the compile; code generation makes none.
  nvrtc::Program p;
  p.source = kernel("#define V 4") + "extern \"C\" __global__ void k2(int* x) { x[0] = 2; }\n";
  p.options = {"-arch=sm_80", "-split-compile=4"};
  nvrtc::detail::Recording rec;
  {
    nvrtc::detail::ScopedRecording on(&rec);
    ASSERT_TRUE(nvrtc::compile_uncached(p).has_value());
  }
  EXPECT_EQ(rec.escaped, nullptr) << rec.escaped;
  compile_stored(p);
}

}  // namespace
}  // namespace kcache

// NVRTC on CCCL: kernels that include CUB (cub::BlockReduce,
// cub::BlockRadixSort), libcu++ (cuda::std) and cooperative_groups from the
// CUDA toolkit on this machine. The toolkit's headers that NVRTC reads for
// them are copied into a private include tree (so that each can be
// edited), the programs are compiled once by a child process under strace
// (which files NVRTC itself opens), and every test then works from a
// working folder that holds the cache folder.
//
// Needs strace for the test that compares the files keyed with the files
// NVRTC opens (skipped without it).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "cccl_kernels.h"
#include "integrations/nvrtc/manifest.h"
#include "kcache/cache.h"
#include "kcache/explain.h"
#include "kcache/nvrtc.h"
#include "test_util.h"

namespace kcache {
namespace {

using cccl_kernels::kKernelCount;
using cccl_kernels::kKernels;
using test::disk_options;
using test::TempDir;

const std::string kToolkitInclude = KCACHE_TEST_CUDA_INCLUDE;

bool have_cccl() {
  struct stat st;
  return ::stat((kToolkitInclude + "/cccl/cub/block/block_reduce.cuh").c_str(), &st) == 0;
}

nvrtc::Program program_for(size_t i, const std::string& include) {
  nvrtc::Program p;
  p.name = kKernels[i].name;  // no folder: quoted includes would look in the working folder
  p.source = kKernels[i].source;
  p.options = cccl_kernels::options_for(include);
  return p;
}

std::set<std::string> keyed_files(const KeyInfo& k) {
  std::set<std::string> out;
  for (const auto& it : k.manifest.items)
    if (it.name.starts_with("file:")) out.insert(it.name.substr(5));
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_all(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

void mkdirs(const std::string& dir) {
  for (size_t at = dir.find('/', 1); at != std::string::npos; at = dir.find('/', at + 1))
    ::mkdir(dir.substr(0, at).c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
}

bool have_strace() { return std::system("strace -V >/dev/null 2>&1") == 0; }

// The child: in the working folder, key each program (its own reads happen
// here), then compile it between two markers that strace sees, so the
// opens between them are NVRTC's.
TEST(NvrtcCcclChild, CompileEachProgramBetweenMarkers) {
  const char* root = std::getenv("KCACHE_TEST_CCCL_ROOT");
  if (!root) GTEST_SKIP() << "run by NvrtcCccl's set-up";
  ASSERT_EQ(::chdir((std::string(root) + "/work").c_str()), 0);
  auto cache = Cache::open(disk_options(".kcache"));
  nvrtc::Compiler c(*cache);
  for (size_t i = 0; i < kKernelCount; ++i) {
    auto p = program_for(i, std::string(root) + "/include");
    std::string begin = std::string(root) + "/marker-begin-" + kKernels[i].name;
    std::string end = std::string(root) + "/marker-end-" + kKernels[i].name;
    int fd = ::open(begin.c_str(), O_RDONLY);
    EXPECT_LT(fd, 0);
    auto r = c.compile(p);
    ASSERT_TRUE(r.has_value()) << kKernels[i].name << ": " << r.error().to_string();
    EXPECT_EQ(r->source, Source::compiled);
    fd = ::open(end.c_str(), O_RDONLY);
    EXPECT_LT(fd, 0);
  }
}

class NvrtcCccl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_cccl()) return;
    root_ = new TempDir();
    const std::string inc = root_->path() + "/include";
    // The toolkit files NVRTC reads, copied at their relative paths.
    {
      TempDir scratch;
      auto cache = Cache::open(disk_options(scratch.path()));
      nvrtc::Compiler c(*cache);
      for (size_t i = 0; i < kKernelCount; ++i) {
        ASSERT_TRUE(c.compile(program_for(i, kToolkitInclude)).has_value());
        auto k = c.key(program_for(i, kToolkitInclude));
        ASSERT_TRUE(k.has_value()) << k.error().to_string();
        for (const auto& f : keyed_files(*k)) {
          ASSERT_TRUE(f.starts_with(kToolkitInclude + "/")) << f;
          std::string to = inc + f.substr(kToolkitInclude.size());
          mkdirs(to.substr(0, to.rfind('/')));
          write_all(to, read_all(f));
        }
      }
    }
    work_ = new std::string(root_->path() + "/work");
    mkdirs(*work_);
    // Older than the file system's timestamp granularity (a younger file
    // makes a compile uncacheable).
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // The cold compiles: a child process, under strace where there is one.
    trace_ = new std::string(root_->path() + "/trace.txt");
    traced_ = have_strace();
    std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
    char exe[4096];
    ssize_t n = ::readlink(self.c_str(), exe, sizeof exe - 1);
    ASSERT_GT(n, 0);
    exe[n] = '\0';
    std::string cmd = "KCACHE_TEST_CCCL_ROOT=" + root_->path() + " ";
    if (traced_) {
      // LeakSanitizer cannot run under ptrace: off in the traced child.
      const char* asan = std::getenv("ASAN_OPTIONS");
      cmd += "ASAN_OPTIONS='" + std::string(asan ? asan : "") + ":detect_leaks=0' ";
      cmd += "strace -f -qq -e trace=open,openat -o " + *trace_ + " ";
    }
    cmd += std::string(exe) + " --gtest_filter=NvrtcCcclChild.* >" + root_->path() + "/child.log 2>&1";
    int rc = std::system(cmd.c_str());
    ASSERT_EQ(rc, 0) << read_all(root_->path() + "/child.log");
    char cwd[4096];
    ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
    old_cwd_ = new std::string(cwd);
    ASSERT_EQ(::chdir(work_->c_str()), 0);
  }
  static void TearDownTestSuite() {
    if (old_cwd_) (void)::chdir(old_cwd_->c_str());
    delete old_cwd_;
    delete trace_;
    delete work_;
    delete root_;
    old_cwd_ = trace_ = work_ = nullptr;
    root_ = nullptr;
  }
  void SetUp() override {
    if (!have_cccl()) GTEST_SKIP() << "no CCCL headers under " << kToolkitInclude;
  }
  static std::string include() { return root_->path() + "/include"; }
  // The cache folder, inside the working folder (always named by one path:
  // a process opens each store once).
  static std::string cache_dir() { return *work_ + "/.kcache"; }
  static nvrtc::Program program(size_t i) { return program_for(i, include()); }
  // What another process sharing the cache gets: a fresh cache, no memory.
  static Expected<nvrtc::Result> compile_elsewhere(const nvrtc::Program& p, const std::string& dir = cache_dir()) {
    auto cache = Cache::open(disk_options(dir, /*memory=*/false));
    nvrtc::Compiler c(*cache);
    return c.compile(p);
  }

  static TempDir* root_;
  static std::string *work_, *trace_, *old_cwd_;
  static bool traced_;
};
TempDir* NvrtcCccl::root_ = nullptr;
std::string* NvrtcCccl::work_ = nullptr;
std::string* NvrtcCccl::trace_ = nullptr;
std::string* NvrtcCccl::old_cwd_ = nullptr;
bool NvrtcCccl::traced_ = false;

TEST_F(NvrtcCccl, CompiledByAChildAndFoundHereWithTheCacheInsideTheWorkingFolder) {
  for (size_t i = 0; i < kKernelCount; ++i) {
    auto r = compile_elsewhere(program(i));
    ASSERT_TRUE(r.has_value()) << kKernels[i].name << ": " << r.error().to_string();
    EXPECT_EQ(r->source, Source::disk) << kKernels[i].name;
    EXPECT_FALSE(r->cubin.empty());
  }
  // A program compiled three times with the cache in the working folder:
  // compiled, then found, then found.
  nvrtc::Program p = program(2);
  p.options.push_back("-DKC_VARIANT=1");
  std::vector<Source> got;
  for (int i = 0; i < 3; ++i) {
    auto r = compile_elsewhere(p);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    got.push_back(r->source);
  }
  EXPECT_EQ(got, (std::vector<Source>{Source::compiled, Source::disk, Source::disk}));
}

TEST_F(NvrtcCccl, TheWorkingFolderGainingFilesIsAHitAndIsNeverWalked) {
  auto cache = Cache::open(disk_options(cache_dir()));
  nvrtc::Compiler c(*cache);
  for (size_t i = 0; i < kKernelCount; ++i) ASSERT_EQ(c.compile(program(i))->source, Source::disk);
  write_all("notes.txt", "notes\n");
  for (size_t i = 0; i < kKernelCount; ++i) {
    EXPECT_EQ(c.compile(program(i))->source, Source::memory) << kKernels[i].name;
    auto r = compile_elsewhere(program(i));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->source, Source::disk) << kKernels[i].name;
  }
  // A working folder of 30,000 files (on tmpfs when there is one, to make
  // them quickly): still cached, and a warm key reads no header and walks
  // nothing.
  struct stat shm;
  std::string many =
      (::stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) ? "/dev/shm" : root_->path()) + "/kcache-many-XXXXXX";
  ASSERT_NE(::mkdtemp(many.data()), nullptr);
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{many};
  ASSERT_EQ(::chdir(many.c_str()), 0);
  struct Back {
    ~Back() { (void)::chdir(work_->c_str()); }
  } back;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 30000; ++i) {
    int fd = ::open(("f" + std::to_string(i)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  std::printf("created 30,000 files in %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // A folder NVRTC looked in that changed within the file system's time
  // stamp granularity before a compile makes that compile too new to store
  // (so an edit in the same tick is never missed): the folder is filled
  // well before the compiles, as a user's is.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  // NVRTC asks for the working folder (programs named without a folder
  // are found in it): each program is compiled once for this folder.
  for (size_t i = 0; i < kKernelCount; ++i) ASSERT_TRUE(c.compile(program(i)).has_value());
  uint64_t reads = nvrtc::detail::header_reads();
  for (size_t i = 0; i < kKernelCount; ++i) {
    EXPECT_EQ(c.compile(program(i))->source, Source::memory) << kKernels[i].name;
    auto r = compile_elsewhere(program(i));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->source, Source::disk) << kKernels[i].name;
  }
  EXPECT_EQ(nvrtc::detail::header_reads(), reads);
  // Warm key CPU, for the record (benchmarks report it; not asserted).
  struct timespec a, b;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  const int rounds = 20;
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < kKernelCount; ++i) ASSERT_TRUE(c.key(program(i)).has_value());
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  double us = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / (rounds * kKernelCount);
  std::printf("warm key: %.0f us CPU per program (30,000 files in the working folder)\n", us);
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < kKernelCount; ++i) ASSERT_EQ(c.compile(program(i))->source, Source::memory);
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  us = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / (rounds * kKernelCount);
  std::printf("warm compile (a memory hit): %.0f us CPU per program\n", us);
  EXPECT_EQ(nvrtc::detail::header_reads(), reads);
}

TEST_F(NvrtcCccl, FilesKeyedAreExactlyTheFilesNvrtcOpens) {
  if (!traced_) GTEST_SKIP() << "strace is not installed";
  std::ifstream f(*trace_);
  std::string line, current;
  std::map<std::string, std::set<std::string>> opened;  // kernel -> files under the include tree
  const std::string inc = include() + "/";
  while (std::getline(f, line)) {
    size_t q = line.find('"');
    if (q == std::string::npos) continue;
    size_t q2 = line.find('"', q + 1);
    std::string path = line.substr(q + 1, q2 - q - 1);
    if (path.starts_with(root_->path() + "/marker-begin-")) current = path.substr(path.rfind('-') + 1);
    if (path.starts_with(root_->path() + "/marker-end-")) current.clear();
    size_t eq = line.rfind(" = ");
    if (current.empty() || !path.starts_with(inc) || eq == std::string::npos || line[eq + 3] == '-') continue;
    if (line.find("O_DIRECTORY") != std::string::npos || line.find("O_PATH") != std::string::npos) continue;
    opened[current].insert(path);
  }
  auto cache = Cache::open(disk_options(cache_dir()));
  nvrtc::Compiler c(*cache);
  for (size_t i = 0; i < kKernelCount; ++i) {
    auto k = c.key(program(i));
    ASSERT_TRUE(k.has_value());
    std::set<std::string> keyed = keyed_files(*k);
    const auto& op = opened[kKernels[i].name];
    ASSERT_FALSE(op.empty()) << kKernels[i].name;
    for (const auto& o : op) EXPECT_TRUE(keyed.count(o)) << kKernels[i].name << ": NVRTC opened " << o;
    for (const auto& o : keyed)
      EXPECT_TRUE(op.count(o)) << kKernels[i].name << ": keyed but not opened by NVRTC: " << o;
    std::printf("%-22s files keyed %zu, files NVRTC opens %zu\n", kKernels[i].name, keyed.size(), op.size());
    EXPECT_EQ(keyed, op) << kKernels[i].name;
  }
}

TEST_F(NvrtcCccl, EditingEachHeaderReadIsAMissAndACompileNamesIt) {
  auto cache = Cache::open(disk_options(cache_dir()));
  nvrtc::Compiler c(*cache);
  std::vector<KeyInfo> before;
  std::map<std::string, std::vector<size_t>> users;  // file -> programs that read it
  for (size_t i = 0; i < kKernelCount; ++i) {
    auto k = c.key(program(i));
    ASSERT_TRUE(k.has_value());
    for (const auto& f : keyed_files(*k)) users[f].push_back(i);
    before.push_back(std::move(*k));
  }
  ASSERT_GT(users.size(), 300u);
  // Every header the libcu++ and cooperative_groups programs read; of the
  // headers only CUB programs read, one in eight (all of them with
  // KCACHE_TEST_TRIALS set). The key of an edited program is no longer any
  // stored one's; for one header in forty it is compiled too, and the new
  // key differs from the old one by that file alone.
  const bool all = std::getenv("KCACHE_TEST_TRIALS") != nullptr;
  size_t edits = 0, compiled = 0, cub_only = 0;
  for (const auto& [path, progs] : users) {
    if (progs.back() < 2 && !all && cub_only++ % 8 != 0) continue;
    std::string original = read_all(path);
    write_all(path, original + "\n// edited\n");
    size_t i = progs.back();  // one program that reads it
    auto k = c.key(program(i));
    ASSERT_TRUE(k.has_value());
    EXPECT_NE(k->key, before[i].key) << path;
    if (edits % 40 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));  // older than the timestamp granularity
      auto r = c.compile(program(i));
      ASSERT_TRUE(r.has_value()) << path;
      EXPECT_EQ(r->source, Source::compiled) << path;
      auto k2 = c.key(program(i));
      // Files only: what NVRTC probes around the working folder it first
      // saw differs between this process and the one that stored `before`.
      std::vector<std::string> files;
      for (const auto& d : manifest_diff(before[i].manifest, k2->manifest))
        if (d.starts_with("file:")) files.push_back(d);
      EXPECT_EQ(files, std::vector<std::string>{"file:" + path});
      ++compiled;
    }
    ++edits;
    write_all(path, original);
  }
  // Restored (the same bytes, a new identity): the keys are the first
  // ones again, the bytes having been read again.
  for (size_t i = 0; i < kKernelCount; ++i) EXPECT_EQ(c.key(program(i))->key, before[i].key);
  std::printf("%zu header edits checked, %zu compiled\n", edits, compiled);
}

// What NVRTC looked for and did not find, from a compile with the recorder.
std::vector<std::string> absent_paths(const nvrtc::Program& p) {
  nvrtc::detail::Recording rec;
  EXPECT_TRUE(nvrtc::detail::install_recorder().is_ok());
  {
    nvrtc::detail::ScopedRecording on(&rec);
    EXPECT_TRUE(nvrtc::compile_uncached(p).has_value());
  }
  auto b = nvrtc::detail::build_manifest(rec, {}, {});
  const auto& m = b.manifest;
  std::printf(
      "accesses %zu: files %zu, present %zu, absent %zu, folders %zu, links %zu, realpaths %zu, listings %zu, "
      "libraries %zu, working folder %s%s%s\n",
      rec.accesses.size(), m.files.size(), m.present.size(), m.absent.size(), m.dirs.size(), m.links.size(),
      m.resolved.size(), m.listings.size(), m.libs.size(), m.cwd.empty() ? "(not an input)" : m.cwd.c_str(),
      b.uncacheable.empty() ? "" : "; uncacheable: ", b.uncacheable.c_str());
  for (const auto& l : m.libs) std::printf("  library %s: %s\n", l.name.c_str(), l.path.c_str());
  return m.absent;
}

TEST_F(NvrtcCccl, CreatingAHeaderWhereNvrtcLookedIsAMiss) {
  auto cache = Cache::open(disk_options(cache_dir()));
  nvrtc::Compiler c(*cache);
  nvrtc::Program p = program(0);
  auto k0 = c.key(p);
  ASSERT_TRUE(k0.has_value());
  // Paths looked for inside the include tree whose folder exists, a
  // sample of them.
  std::vector<std::string> candidates;
  for (const auto& a : absent_paths(p)) {
    struct stat st;
    if (a.starts_with(include()) && ::stat(a.substr(0, a.rfind('/')).c_str(), &st) == 0) candidates.push_back(a);
  }
  ASSERT_GE(candidates.size(), 5u);
  size_t step = std::max<size_t>(1, candidates.size() / 25);
  size_t checked = 0;
  for (size_t i = 0; i < candidates.size(); i += step) {
    const std::string& path = candidates[i];
    write_all(path, "// created\n");
    auto k = c.key(p);
    ASSERT_TRUE(k.has_value());
    EXPECT_NE(k->key, k0->key) << path;
    ASSERT_EQ(::unlink(path.c_str()), 0);
    ++checked;
  }
  EXPECT_EQ(c.key(p)->key, k0->key);
  std::printf("%zu created headers checked of %zu paths looked for\n", checked, candidates.size());
}

TEST_F(NvrtcCccl, MissesAreExplainedByTheFilesThatChanged) {
  auto cache = Cache::open(disk_options(cache_dir()));
  nvrtc::Compiler c(*cache);
  nvrtc::Program p = program(3);
  auto k0 = c.key(p);
  ASSERT_TRUE(k0.has_value());
  std::string header = include() + "/cooperative_groups.h";
  std::string original = read_all(header);
  write_all(header, original + "\n// edited\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  ASSERT_TRUE(c.compile(p).has_value());
  auto k1 = c.key(p);
  write_all(header, original);
  ASSERT_TRUE(k1.has_value());
  MissRecord miss;
  miss.key = k1->key;
  miss.label = k1->label;
  miss.manifest = k1->manifest;
  NearestSearch found;
  found.entry = StoredManifest{k0->key, k0->label, k0->manifest, 0};
  found.compared = 1;
  MissReport r = make_miss_report(miss, found);
  std::string cause = miss_cause(r);
  EXPECT_NE(cause.find("file:" + header), std::string::npos) << cause;
  std::string text = to_text(r, TextForm::line);
  EXPECT_NE(text.find("file:" + header + ": changed"), std::string::npos) << text;
}

}  // namespace
}  // namespace kcache

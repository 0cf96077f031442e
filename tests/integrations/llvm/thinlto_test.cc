// kcache's FileCache on a real consumer: ThinLTO links through
// llvm::lto::LTO (the API LLD's ELF port uses) of real C code (zlib's and
// zstd's example programs as ThinLTO bitcode; see CMakeLists.txt), once with
// llvm::localCache and once with kcache::llvm::localCache.
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <llvm/Support/TargetSelect.h>

#include "kcache/llvm_file_cache.h"
#include "test_util.h"
#include "thinlto_link.h"

using kcache::test::TempDir;
namespace kl = kcache::llvm;

namespace {

std::vector<std::string> inputs() {
  std::vector<std::string> out;
  std::stringstream list(KCACHE_THINLTO_INPUTS);
  std::string path;
  while (std::getline(list, path, ':')) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    out.push_back(s.str());
  }
  return out;
}

class LlvmThinLto : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(KCACHE_THINLTO_MISSING).size()) GTEST_SKIP() << KCACHE_THINLTO_MISSING;
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
    in_ = inputs();
    ASSERT_GE(in_.size(), 10u);
  }
  std::vector<std::string> in_;
};

// The objects of the modules the backend compiles (task 0 is the regular
// LTO partition, which no cache sees).
size_t modules(const kcache_thinlto::LinkResult& r) { return r.files.size() - (r.files.count(0) ? 1 : 0); }

}  // namespace

// The same objects as llvm::localCache's link; the next link finds every
// module in the store and compiles none.
TEST_F(LlvmThinLto, SameObjectsAsLocalCacheAndTheNextLinkHitsEveryModule) {
  TempDir llvm_dir, kcache_dir;
  kcache_thinlto::Link theirs;
  auto lc = llvm::localCache("ThinLTO", "Thin", llvm_dir.path(), theirs.buffer_sink());
  ASSERT_TRUE(bool(lc));
  ASSERT_TRUE(theirs.run(in_, *lc, 2)) << theirs.result.error;
  ASSERT_EQ(modules(theirs.result), in_.size());

  auto counters = std::make_shared<kl::FileCacheCounters>();
  auto link_with_kcache = [&](kcache_thinlto::Link& link) {
    kl::FileCacheOptions o;
    o.counters = counters;
    kcache::Options co;
    co.dir = kcache_dir.path();
    auto fc = kl::localCache(kcache::Cache::open(co), "ThinLTO", link.buffer_sink(), o);
    return link.run(in_, fc, 2);
  };
  kcache_thinlto::Link cold;
  ASSERT_TRUE(link_with_kcache(cold)) << cold.result.error;
  EXPECT_EQ(counters->streams.load(), in_.size());
  EXPECT_EQ(counters->hits.load(), 0u);
  EXPECT_EQ(cold.result.files, theirs.result.files);

  kcache_thinlto::Link warm;
  ASSERT_TRUE(link_with_kcache(warm)) << warm.result.error;
  EXPECT_EQ(counters->streams.load(), in_.size());  // no compile more
  EXPECT_EQ(counters->hits.load(), in_.size());
  EXPECT_EQ(warm.result.files, theirs.result.files);
}

// Four links at once (four processes, as four LLDs) on an empty store
// compile each module once between them, and all four produce the objects
// of a link without a cache.
TEST_F(LlvmThinLto, FourLinksAtOnceCompileEachModuleOnce) {
  TempDir dir;
  kcache_thinlto::Link plain;
  ASSERT_TRUE(plain.run(in_, llvm::FileCache(), 2)) << plain.result.error;
  std::string want;
  for (auto& [task, bytes] : plain.result.files) want += std::to_string(task) + ":" + bytes;

  constexpr int kLinks = 4;
  int go[2], counts[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(counts), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kLinks; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      ::close(counts[0]);
      char c;
      if (::read(go[0], &c, 1) != 0) ::_exit(3);
      auto counters = std::make_shared<kl::FileCacheCounters>();
      kcache_thinlto::Link link;
      kl::FileCacheOptions o;
      o.counters = counters;
      kcache::Options co;
      co.dir = dir.path();
      auto fc = kl::localCache(kcache::Cache::open(co), "ThinLTO", link.buffer_sink(), o);
      if (!link.run(in_, fc, 2)) ::_exit(2);
      std::string got;
      for (auto& [task, bytes] : link.result.files) got += std::to_string(task) + ":" + bytes;
      if (got != want) ::_exit(1);
      uint32_t n = static_cast<uint32_t>(counters->streams.load());
      if (::write(counts[1], &n, sizeof n) != sizeof n) ::_exit(4);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  ::close(counts[1]);
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: objects differ from the uncached link; 2: link failed";
  }
  uint32_t total = 0, n = 0;
  while (::read(counts[0], &n, sizeof n) == sizeof n) total += n;
  ::close(counts[0]);
  EXPECT_EQ(total, in_.size());
}

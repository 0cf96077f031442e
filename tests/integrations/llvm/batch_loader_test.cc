// BitcodeLoader::add_files across processes: N processes (children of
// fork()) load one list of bitcode files into LLJITs of their own, on one
// empty store, in the same order and in different orders. Every module is
// compiled exactly once in all (the children's code generator runs add up
// to the number of modules), every child's JIT runs every function right,
// a process compiles what nobody else holds before it waits, and a holder
// killed mid-compile is taken over.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <llvm/AsmParser/Parser.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>

#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"
#include "process_sync.h"
#include "test_util.h"

namespace kl = kcache::llvm;
using kcache::test::Signal;
using kcache::test::TempDir;

namespace {

// The native target, set up before the first test (and so before any fork).
[[maybe_unused]] const bool kNativeTarget = [] {
  return !llvm::InitializeNativeTarget() && !llvm::InitializeNativeTargetAsmPrinter();
}();

// Function `name`: acc = acc * mul + i for i in [0, x), from `start`.
std::string loop_fn(const std::string& name, uint64_t start, uint64_t mul) {
  return "define i64 @" + name +
         "(i64 %x) {\n"
         "entry:\n  br label %loop\n"
         "loop:\n"
         "  %i = phi i64 [0, %entry], [%i1, %loop]\n"
         "  %acc = phi i64 [" +
         std::to_string(start) + ", %entry], [%acc1, %loop]\n  %m = mul i64 %acc, " + std::to_string(mul) +
         "\n"
         "  %acc1 = add i64 %m, %i\n"
         "  %i1 = add i64 %i, 1\n"
         "  %c = icmp slt i64 %i1, %x\n"
         "  br i1 %c, label %loop, label %exit\n"
         "exit:\n  ret i64 %acc1\n}\n";
}

uint64_t reference(uint64_t start, uint64_t mul, int64_t x) {
  uint64_t acc = start;
  int64_t i = 0;
  do {
    acc = acc * mul + static_cast<uint64_t>(i);
    ++i;
  } while (i < x);
  return acc;
}

// Module i: f<i> (start 1000 + i, multiplier 31) and `filler` more
// functions, so that a compile takes a while and processes overlap.
std::string module_text(int i, int filler) {
  std::string t = loop_fn("f" + std::to_string(i), 1000 + i, 31);
  for (int k = 0; k < filler; ++k)
    t += loop_fn("g" + std::to_string(i) + "_" + std::to_string(k), static_cast<uint64_t>(i * 100 + k), 7 + k);
  return t;
}

std::string bitcode_of(const std::string& text) {
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic err;
  auto m = llvm::parseAssemblyString(text, err, ctx);
  EXPECT_TRUE(m) << err.getMessage().str();
  if (!m) return {};
  std::string out;
  llvm::raw_string_ostream os(out);
  llvm::WriteBitcodeToFile(*m, os);
  os.flush();
  return out;
}

// The list: `n` bitcode files m<i>.bc in `dir`.
std::vector<std::string> write_modules(const std::string& dir, int n, int filler) {
  std::vector<std::string> paths;
  for (int i = 0; i < n; ++i) {
    paths.push_back(dir + "/m" + std::to_string(i) + ".bc");
    std::ofstream(paths.back(), std::ios::binary) << bitcode_of(module_text(i, filler));
  }
  return paths;
}

std::unique_ptr<kcache::Cache> open_cache(const std::string& dir) {
  kcache::Options o;
  o.dir = dir;
  o.log_level = kcache::LogLevel::error;
  return kcache::Cache::open(o);
}

// What a child reports through its pipe.
struct Report {
  uint64_t codegen_runs = 0;  // the child's CompileCounters
  uint64_t lookups = 0;
  uint64_t compiles = 0;  // the child's CacheStats
  uint64_t takeovers = 0;
  uint64_t lease_waits = 0;
  int wrong = -1;  // functions that answered wrong (or -1: the child failed first)
};

// Loads `paths` into a make_cached_lljit of its own (add_files on
// `threads` workers), then runs f<i> of every file m<i>.bc.
Report load_and_run(const std::string& store, const std::vector<std::string>& paths, unsigned threads) {
  Report r;
  auto cache = open_cache(store);
  auto counters = std::make_shared<kl::CompileCounters>();
  kl::JitOptions jo;
  jo.counters = counters;
  auto jit = kl::make_cached_lljit(*cache, jo);
  if (!jit) return r;
  auto loader = kl::BitcodeLoader::for_jit(**jit);
  if (!loader) return r;
  if (auto err = loader->add_files(paths, nullptr, threads)) {
    std::fprintf(stderr, "add_files: %s\n", llvm::toString(std::move(err)).c_str());
    return r;
  }
  r.wrong = 0;
  for (const auto& path : paths) {
    const std::string base = path.substr(path.rfind('/') + 2);  // "<i>.bc"
    const int i = std::stoi(base);
    auto sym = (*jit)->lookup("f" + std::to_string(i));
    if (!sym) {
      llvm::consumeError(sym.takeError());
      ++r.wrong;
      continue;
    }
    auto f = kl::compat::jit_pointer<uint64_t (*)(int64_t)>(*sym);
    if (f(50 + i) != reference(1000 + i, 31, 50 + i)) ++r.wrong;
  }
  (void)cache->flush();
  r.codegen_runs = counters->codegen_runs.load();
  r.lookups = counters->lookups.load();
  auto st = cache->stats();
  r.compiles = st.compiles;
  r.takeovers = st.lease_takeovers;
  r.lease_waits = st.lease_waits;
  return r;
}

using Child = kcache::test::Forked<Report>;

// The object key the JIT's CachingCompiler gives the module in `path`.
kcache::KeyInfo object_key_of(llvm::orc::LLJIT& jit, const std::string& path) {
  auto buf = llvm::MemoryBuffer::getFile(path);
  EXPECT_TRUE(bool(buf));
  llvm::LLVMContext ctx;
  auto m = llvm::parseBitcodeFile((*buf)->getMemBufferRef(), ctx);
  EXPECT_TRUE(bool(m));
  kl::CachingCompiler* cc = kl::CachingCompiler::of(jit);
  auto k = kl::object_key(**m, cc->target(), cc->key_options());
  EXPECT_TRUE(bool(k));
  return *k;
}

// Runs `procs` children at once over `orders[k % orders.size()]`, checks
// each ran every function right and that the modules were compiled once
// in all; returns the children's reports.
std::vector<Report> run_together(const std::string& store, const std::vector<std::vector<std::string>>& orders,
                                 int procs, unsigned threads) {
  Signal go;
  std::vector<Child> kids;
  for (int k = 0; k < procs; ++k) {
    const auto& paths = orders[static_cast<size_t>(k) % orders.size()];
    kids.push_back(kcache::test::fork_report([&] {
      go.wait();
      return load_and_run(store, paths, threads);
    }));
  }
  for (int k = 0; k < procs; ++k) go.post();
  std::vector<Report> reports;
  for (auto& c : kids) reports.push_back(kcache::test::join_report(c));
  return reports;
}

uint64_t total(const std::vector<Report>& rs, uint64_t Report::*field) {
  uint64_t n = 0;
  for (const auto& r : rs) n += r.*field;
  return n;
}

constexpr int kModules = 12;
constexpr int kFiller = 24;

}  // namespace

// Four processes, one list in one order: each module compiled once in all,
// and a second round on the warm store compiles nothing.
TEST(LlvmBatchLoader, FourProcessesSameOrderCompileEachModuleOnce) {
  TempDir d;
  auto paths = write_modules(d.path(), kModules, kFiller);
  const std::string store = d.path() + "/cache";
  auto reports = run_together(store, {paths}, 4, 2);
  for (const auto& r : reports) {
    EXPECT_EQ(r.wrong, 0);
    EXPECT_EQ(r.lookups, static_cast<uint64_t>(kModules));
    EXPECT_EQ(r.codegen_runs, r.compiles);
  }
  EXPECT_EQ(total(reports, &Report::codegen_runs), static_cast<uint64_t>(kModules));
  EXPECT_EQ(total(reports, &Report::compiles), static_cast<uint64_t>(kModules));

  auto warm = run_together(store, {paths}, 2, 2);
  for (const auto& r : warm) EXPECT_EQ(r.wrong, 0);
  EXPECT_EQ(total(warm, &Report::codegen_runs), 0u);
}

// Four processes, four orders (as listed, reversed, rotated by half, odd
// ones first): still each module once, every function right.
TEST(LlvmBatchLoader, FourProcessesDifferentOrdersCompileEachModuleOnce) {
  TempDir d;
  auto paths = write_modules(d.path(), kModules, kFiller);
  std::vector<std::vector<std::string>> orders(4, paths);
  std::reverse(orders[1].begin(), orders[1].end());
  std::rotate(orders[2].begin(), orders[2].begin() + kModules / 2, orders[2].end());
  orders[3].clear();
  for (int first : {1, 0})
    for (int i = first; i < kModules; i += 2) orders[3].push_back(paths[static_cast<size_t>(i)]);
  auto reports = run_together(d.path() + "/cache", orders, 4, 1);
  for (const auto& r : reports) EXPECT_EQ(r.wrong, 0);
  EXPECT_EQ(total(reports, &Report::codegen_runs), static_cast<uint64_t>(kModules));
  EXPECT_EQ(total(reports, &Report::compiles), static_cast<uint64_t>(kModules));
}

// A process holds the lease of the list's first module (a Flight it owns,
// as a compiling process holds it). A loader given the list compiles every
// other module before it waits for that one; the holder then either
// commits the object (`kill` false: the loader compiled all but one) or is
// killed mid-compile (the loader takes the lease over and compiles it).
void held_first_module(bool kill) {
  TempDir d;
  auto paths = write_modules(d.path(), kModules, kFiller);
  const std::string store = d.path() + "/cache";
  Signal held;
  Child holder = kcache::test::fork_report([&] {
    Report r;
    auto cache = open_cache(store);
    kl::JitOptions jo;
    auto jit = kl::make_cached_lljit(*cache, jo);
    if (!jit) return r;
    std::vector<kcache::KeyInfo> keys;
    for (const auto& p : paths) keys.push_back(object_key_of(**jit, p));
    kcache::Flight f = cache->begin(keys[0]);
    if (!f.owner()) return r;
    held.post();
    // Until the loader has stored every other module: it did not wait.
    bool others = kcache::test::wait_until(
        [&] {
          for (size_t i = 1; i < keys.size(); ++i)
            if (!cache->get(keys[i].key)) return false;
          return true;
        },
        120000);
    if (!others) return r;
    if (kill) ::raise(SIGKILL);  // holding the lease, mid-"compile"
    // The object of module 0, as the loader's JIT would make it.
    auto none_opts = kcache::Options{};
    none_opts.disabled = true;
    auto none = kcache::Cache::open(none_opts);
    auto none_jit = kl::make_cached_lljit(*none, jo);
    if (!none_jit) return r;
    auto* cc = kl::CachingCompiler::of(**none_jit);
    auto buf = llvm::MemoryBuffer::getFile(paths[0]);
    llvm::LLVMContext ctx;
    auto m = llvm::parseBitcodeFile((*buf)->getMemBufferRef(), ctx);
    if (!m) return r;
    auto obj = (*cc)(**m);
    if (!obj) return r;
    if (!f.commit({{"obj", (*obj)->getBuffer().str()}})) return r;
    r.codegen_runs = 1;
    r.wrong = 0;
    return r;
  });
  ASSERT_TRUE(held.wait(120000));
  Child loader = kcache::test::fork_report([&] { return load_and_run(store, paths, 2); });
  // The holder first: a killed one is reaped at once, so its PID is gone
  // while the loader waits (a zombie would still look alive).
  Report h = kcache::test::join_report(holder);
  Report l = kcache::test::join_report(loader);
  EXPECT_EQ(l.wrong, 0);
  if (kill) {
    EXPECT_EQ(h.wrong, -1);  // killed: no report
    EXPECT_EQ(l.codegen_runs, static_cast<uint64_t>(kModules));
    EXPECT_GE(l.takeovers, 1u);
  } else {
    EXPECT_EQ(h.wrong, 0);
    EXPECT_EQ(h.codegen_runs, 1u);
    EXPECT_EQ(l.codegen_runs, static_cast<uint64_t>(kModules - 1));
  }
  EXPECT_GE(l.lease_waits, 1u);
}

TEST(LlvmBatchLoader, CompilesWhatNobodyHoldsThenWaitsForTheHolder) { held_first_module(false); }

TEST(LlvmBatchLoader, AHolderKilledMidCompileIsTakenOver) { held_first_module(true); }

// Input errors are all or nothing: a list with one buffer that is not
// bitcode fails before anything is added or compiled, with the cache and
// with it disabled; the list without it then loads.
TEST(LlvmBatchLoader, ABufferThatDoesNotParseAddsNothing) {
  TempDir d;
  auto paths = write_modules(d.path(), 3, 0);
  auto buffers = [&](bool garbage) {
    std::vector<std::unique_ptr<llvm::MemoryBuffer>> v;
    for (const auto& p : paths) v.push_back(std::move(*llvm::MemoryBuffer::getFile(p)));
    if (garbage) v.push_back(llvm::MemoryBuffer::getMemBufferCopy("not bitcode", "bad.bc"));
    return v;
  };
  for (bool disabled : {false, true}) {
    kcache::Options o;
    o.dir = d.path() + "/cache";
    o.disabled = disabled;
    o.log_level = kcache::LogLevel::error;
    auto cache = kcache::Cache::open(o);
    auto counters = std::make_shared<kl::CompileCounters>();
    kl::JitOptions jo;
    jo.counters = counters;
    auto jit = kl::make_cached_lljit(*cache, jo);
    ASSERT_TRUE(bool(jit));
    auto loader = kl::BitcodeLoader::for_jit(**jit);
    ASSERT_TRUE(bool(loader));
    llvm::Error err = loader->add_all(buffers(true));
    EXPECT_TRUE(bool(err));
    llvm::consumeError(std::move(err));
    EXPECT_EQ(counters->codegen_runs.load(), 0u);
    auto none = (*jit)->lookup("f0");
    EXPECT_FALSE(bool(none));
    if (!none) llvm::consumeError(none.takeError());
    EXPECT_FALSE(loader->add_all(buffers(false)));
    // With the cache, compiled before any lookup; without, at the lookup.
    EXPECT_EQ(counters->codegen_runs.load(), disabled ? 0u : 3u);
    for (int i = 0; i < 3; ++i) {
      auto sym = (*jit)->lookup("f" + std::to_string(i));
      ASSERT_TRUE(bool(sym)) << llvm::toString(sym.takeError());
      EXPECT_EQ(kl::compat::jit_pointer<uint64_t (*)(int64_t)>(*sym)(20), reference(1000 + i, 31, 20));
    }
  }
}

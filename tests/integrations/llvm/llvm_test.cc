// The LLVM integration against real LLVM 14: ORC (make_cached_lljit,
// CachingCompiler, ConcurrentIRCompiler + ObjectCache) and MCJIT, on real
// disk tiers.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <latch>
#include <set>
#include <thread>

#include <llvm/AsmParser/Parser.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/ExecutionEngine/ExecutionEngine.h>
#include <llvm/ExecutionEngine/MCJIT.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>

#include "integrations/llvm/jit_memory.h"
#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"
#include "kcache/miss_journal.h"
#include "test_util.h"

namespace kl = kcache::llvm;
using kcache::test::TempDir;

namespace {

struct LlvmInit {
  LlvmInit() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  }
};
const LlvmInit kInit;

// A loop that is worth optimising: acc = acc * 31 + i for i in [0, x).
std::string ir_text(const std::string& fn, uint64_t start, const std::string& extra = "") {
  return extra + "define i64 @" + fn +
         "(i64 %x) {\n"
         "entry:\n  br label %loop\n"
         "loop:\n"
         "  %i = phi i64 [0, %entry], [%i1, %loop]\n"
         "  %acc = phi i64 [" +
         std::to_string(start) +
         ", %entry], [%acc1, %loop]\n"
         "  %m = mul i64 %acc, 31\n"
         "  %acc1 = add i64 %m, %i\n"
         "  %i1 = add i64 %i, 1\n"
         "  %c = icmp slt i64 %i1, %x\n"
         "  br i1 %c, label %loop, label %exit\n"
         "exit:\n  ret i64 %acc1\n}\n";
}

uint64_t reference(uint64_t start, int64_t x) {
  uint64_t acc = start;
  int64_t i = 0;
  do {
    acc = acc * 31 + static_cast<uint64_t>(i);
    ++i;
  } while (i < x);
  return acc;
}

std::unique_ptr<llvm::Module> parse(const std::string& text, llvm::LLVMContext& ctx, const std::string& id = "m") {
  llvm::SMDiagnostic err;
  auto m = llvm::parseAssemblyString(text, err, ctx);
  EXPECT_TRUE(m) << err.getMessage().str();
  if (m) {
    m->setModuleIdentifier(id);
    m->setSourceFileName(id + ".src");
  }
  return m;
}

llvm::orc::ThreadSafeModule tsm(const std::string& text, const std::string& id = "m") {
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto m = parse(text, *ctx, id);
  return llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx));
}

std::unique_ptr<kcache::Cache> open_cache(const std::string& dir, const std::string& engine) {
  kcache::Options o;
  o.dir = dir;
  o.engine = kcache::parse_engine(engine);
  return kcache::Cache::open(o);
}

std::unique_ptr<llvm::TargetMachine> make_tm(const std::string& triple, const std::string& cpu,
                                             const std::string& features,
                                             kl::compat::CodeGenOptLevel level = kl::compat::CodeGenOptLevel::Default) {
  llvm::orc::JITTargetMachineBuilder b{llvm::Triple(triple)};
  b.setCPU(cpu);
  b.getFeatures() = llvm::SubtargetFeatures(features);
  b.setCodeGenOptLevel(level);
  auto tm = b.createTargetMachine();
  EXPECT_TRUE(bool(tm)) << (tm ? "" : llvm::toString(tm.takeError()));
  return tm ? std::move(*tm) : nullptr;
}

const std::string kTriple = "x86_64-pc-linux-gnu";

// `jtmb` configured as LLJIT configures it for its own linker, as
// make_cached_lljit does by default (JitOptions::lljit_linker): on LLVM 19
// x86-64 ELF, JITLink's small code model and PIC.
llvm::orc::JITTargetMachineBuilder as_lljit(llvm::orc::JITTargetMachineBuilder jtmb) {
  llvm::orc::LLJITBuilder b;
  b.setJITTargetMachineBuilder(std::move(jtmb));
  if (auto err = b.prepareForConstruction()) ADD_FAILURE() << llvm::toString(std::move(err));
  return *b.JTMB;
}

using Fn = uint64_t (*)(int64_t);

// Adds `count` modules f0..f{count-1} to a cached LLJIT, runs each, returns
// the results (empty on failure).
std::vector<uint64_t> run_jit(kcache::Cache& cache, int count, std::shared_ptr<kl::CompileCounters> counters,
                              unsigned opt_level = 2) {
  kl::JitOptions jo;
  jo.counters = counters;
  jo.opt_level = opt_level;
  auto jit = kl::make_cached_lljit(cache, jo);
  EXPECT_TRUE(bool(jit)) << (jit ? "" : llvm::toString(jit.takeError()));
  if (!jit) return {};
  std::vector<uint64_t> out;
  for (int i = 0; i < count; ++i) {
    std::string name = "f" + std::to_string(i);
    EXPECT_FALSE((*jit)->addIRModule(tsm(ir_text(name, 1000 + i), name)));
  }
  for (int i = 0; i < count; ++i) {
    auto sym = (*jit)->lookup("f" + std::to_string(i));
    EXPECT_TRUE(bool(sym)) << (sym ? "" : llvm::toString(sym.takeError()));
    if (!sym) return {};
    out.push_back(kl::compat::jit_pointer<Fn>(*sym)(100 + i));
  }
  return out;
}

std::vector<std::string> kce_files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (auto* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    std::string p = dir + "/" + n;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      for (auto& f : kce_files(p)) out.push_back(f);
    } else if (n.size() > 4 && n.ends_with(".kce")) {
      out.push_back(p);
    }
  }
  ::closedir(d);
  return out;
}

}  // namespace

// ---- cold and warm runs --------------------------------------------------------

class LlvmEngines : public ::testing::TestWithParam<std::string> {};

TEST_P(LlvmEngines, WarmRunExecutesCachedObjectsWithColdResults) {
  TempDir dir;
  const int n = 6;
  std::vector<uint64_t> want;
  for (int i = 0; i < n; ++i) want.push_back(reference(1000 + i, 100 + i));

  auto cold_counters = std::make_shared<kl::CompileCounters>();
  std::vector<uint64_t> cold;
  {
    auto cache = open_cache(dir.path(), GetParam());
    cold = run_jit(*cache, n, cold_counters);
  }
  EXPECT_EQ(cold, want);
  EXPECT_EQ(cold_counters->codegen_runs.load(), uint64_t(n));
  EXPECT_EQ(cold_counters->hits.load(), 0u);

  // A new Cache on the same folder: empty memory tier, everything from disk.
  auto warm_counters = std::make_shared<kl::CompileCounters>();
  auto cache = open_cache(dir.path(), GetParam());
  std::vector<uint64_t> warm = run_jit(*cache, n, warm_counters);
  EXPECT_EQ(warm, cold);
  EXPECT_EQ(warm_counters->codegen_runs.load(), 0u);
  EXPECT_EQ(warm_counters->hits.load(), uint64_t(n));
  kcache::CacheStats st = cache->stats();
  EXPECT_EQ(st.compiles, 0u);
  EXPECT_EQ(st.hits, uint64_t(n));
}

TEST_P(LlvmEngines, CorruptStoredObjectIsAMissAndARecompile) {
  TempDir dir;
  {
    auto cache = open_cache(dir.path(), GetParam());
    auto c = std::make_shared<kl::CompileCounters>();
    ASSERT_EQ(run_jit(*cache, 1, c), std::vector<uint64_t>{reference(1000, 100)});
  }
  // Flip bytes in the middle of the stored entry (inside the object code).
  std::vector<std::string> files;
  if (GetParam() == "files") {
    files = kce_files(dir.path() + "/files");
  } else {
    files = {dir.path() + "/lmdb/data.mdb"};
  }
  ASSERT_FALSE(files.empty());
  bool flipped = false;
  for (const auto& f : files) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(io.good()) << f;
    std::string bytes((std::istreambuf_iterator<char>(io)), std::istreambuf_iterator<char>());
    // The ELF magic of the stored object: corrupt the object right there.
    size_t p = bytes.find(
        "\x7f"
        "ELF");
    if (p == std::string::npos) continue;
    for (size_t k = p + 64; k < p + 96 && k < bytes.size(); ++k) bytes[k] = static_cast<char>(bytes[k] ^ 0x5a);
    io.seekp(0);
    io.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    flipped = true;
  }
  ASSERT_TRUE(flipped);

  auto c2 = std::make_shared<kl::CompileCounters>();
  {
    auto cache = open_cache(dir.path(), GetParam());
    EXPECT_EQ(run_jit(*cache, 1, c2), std::vector<uint64_t>{reference(1000, 100)});
    EXPECT_EQ(c2->codegen_runs.load(), 1u);
    kcache::CacheStats st = cache->stats();
    uint64_t corrupt = 0;
    for (auto& t : st.tiers) corrupt += t.stats.corrupt;
    EXPECT_GE(corrupt + st.faults, 1u);
  }
  // The recompiled object replaced the bad entry.
  auto c3 = std::make_shared<kl::CompileCounters>();
  auto cache = open_cache(dir.path(), GetParam());
  EXPECT_EQ(run_jit(*cache, 1, c3), std::vector<uint64_t>{reference(1000, 100)});
  EXPECT_EQ(c3->codegen_runs.load(), 0u);
  EXPECT_EQ(c3->hits.load(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Engines, LlvmEngines,
                         ::testing::Values(std::string("files")
#if KCACHE_HAVE_LMDB
                                               ,
                                           std::string("lmdb")
#endif
                                               ));

// ---- entries whose checksum is fine but whose object is not ----------------

TEST(LlvmCompiler, GarbageObjectWithValidChecksumIsRecompiled) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "files");
  auto counters = std::make_shared<kl::CompileCounters>();
  kl::CompilerOptions co;
  co.counters = counters;
  auto compiler = kl::CachingCompiler::create(*cache, *llvm::orc::JITTargetMachineBuilder::detectHost(), co);
  ASSERT_TRUE(bool(compiler));

  llvm::LLVMContext ctx;
  auto m = parse(ir_text("g", 7), ctx);
  kl::KeyOptions ko;
  ko.ir_opt_level = co.ir_opt_level;
  auto key = kl::object_key(*m, (*compiler)->target(), ko);
  ASSERT_TRUE(key.has_value());
  ASSERT_TRUE(cache->put(*key, {{"obj", "this is not an object file"}}).has_value());

  auto obj = (**compiler)(*m);
  ASSERT_TRUE(bool(obj)) << llvm::toString(obj.takeError());
  EXPECT_TRUE(bool(llvm::object::ObjectFile::createObjectFile((*obj)->getMemBufferRef())));
  EXPECT_EQ(counters->bad_objects.load(), 1u);
  EXPECT_EQ(counters->codegen_runs.load(), 1u);
  // Replaced by the good object.
  auto e = cache->get(key->key);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e->artifact("obj"), (*obj)->getBuffer().str());
}

// ---- single-flight -------------------------------------------------------------

TEST(LlvmCompiler, EightThreadsCompilingOneModuleRunCodegenOnce) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "files");
  auto counters = std::make_shared<kl::CompileCounters>();
  kl::CompilerOptions co;
  co.counters = counters;
  auto compiler = kl::CachingCompiler::create(*cache, *llvm::orc::JITTargetMachineBuilder::detectHost(), co);
  ASSERT_TRUE(bool(compiler));

  // A module big enough that codegen takes a while, so the threads overlap.
  std::string text;
  for (int i = 0; i < 60; ++i) text += ir_text("h" + std::to_string(i), i);
  const int kThreads = 8;
  std::vector<std::string> objs(kThreads);
  std::vector<std::string> errors(kThreads);
  std::latch start(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      llvm::LLVMContext ctx;
      auto m = parse(text, ctx, "thread" + std::to_string(t));
      start.arrive_and_wait();
      auto obj = (**compiler)(*m);
      if (!obj) {
        errors[t] = llvm::toString(obj.takeError());
        return;
      }
      objs[t] = (*obj)->getBuffer().str();
    });
  }
  for (auto& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "");
    EXPECT_FALSE(objs[t].empty());
    EXPECT_EQ(objs[t], objs[0]);
  }
  EXPECT_EQ(counters->codegen_runs.load(), 1u);
  EXPECT_EQ(cache->stats().compiles, 1u);
  EXPECT_EQ(counters->lookups.load(), uint64_t(kThreads));
}

// ---- bytes ------------------------------------------------------------------------

TEST(LlvmCompiler, CachedObjectBytesEqualFreshlyCompiledOnes) {
  TempDir dir;
  auto jtmb = *llvm::orc::JITTargetMachineBuilder::detectHost();
  auto cache = open_cache(dir.path(), "files");
  auto compiler = kl::CachingCompiler::create(*cache, jtmb);
  ASSERT_TRUE(bool(compiler));
  kcache::Options off;
  off.disabled = true;
  auto no_cache = kcache::Cache::open(off);
  auto fresh_compiler = kl::CachingCompiler::create(*no_cache, jtmb);
  ASSERT_TRUE(bool(fresh_compiler));

  llvm::LLVMContext ctx;
  auto m1 = parse(ir_text("b", 5), ctx);
  auto key = kl::object_key(*m1, (*compiler)->target(), kl::KeyOptions{2, {}});
  ASSERT_TRUE(key.has_value());
  auto cold = (**compiler)(*m1);
  ASSERT_TRUE(bool(cold));
  auto m2 = parse(ir_text("b", 5), ctx);
  auto fresh = (**fresh_compiler)(*m2);
  ASSERT_TRUE(bool(fresh));
  auto stored = cache->get(key->key);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(*stored->artifact("obj"), (*fresh)->getBuffer().str());
  EXPECT_EQ((*cold)->getBuffer().str(), (*fresh)->getBuffer().str());
  // And a hit hands out the same bytes.
  auto m3 = parse(ir_text("b", 5), ctx);
  auto warm = (**compiler)(*m3);
  ASSERT_TRUE(bool(warm));
  EXPECT_EQ((*warm)->getBuffer().str(), (*fresh)->getBuffer().str());
  EXPECT_EQ((*compiler)->counters().hits.load(), 1u);
}

// A compiler made with the caller's machine describes its target from it
// and compiles with it; without one it is an error, not a crash.
TEST(LlvmCompiler, CreatedWithTheCallersMachine) {
  auto jtmb = *llvm::orc::JITTargetMachineBuilder::detectHost();
  kcache::Options off;
  off.disabled = true;
  auto no_cache = kcache::Cache::open(off);
  auto none = kl::CachingCompiler::create(*no_cache, jtmb, {}, nullptr);
  ASSERT_FALSE(bool(none));
  llvm::consumeError(none.takeError());

  auto tm = jtmb.createTargetMachine();
  ASSERT_TRUE(bool(tm));
  const kl::TargetDesc want = kl::TargetDesc::of(**tm);
  auto given = kl::CachingCompiler::create(*no_cache, jtmb, {}, std::move(*tm));
  ASSERT_TRUE(bool(given)) << llvm::toString(given.takeError());
  auto made = kl::CachingCompiler::create(*no_cache, jtmb);
  ASSERT_TRUE(bool(made));
  EXPECT_EQ((*given)->target().features, want.features);
  EXPECT_EQ((*given)->target().cpu, (*made)->target().cpu);
  EXPECT_EQ((*given)->target().features, (*made)->target().features);
  llvm::LLVMContext ctx;
  auto m1 = parse(ir_text("c", 3), ctx);
  auto m2 = parse(ir_text("c", 3), ctx);
  auto a = (**given)(*m1);
  auto b = (**made)(*m2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ((*a)->getBuffer().str(), (*b)->getBuffer().str());
}

// A compiler keeps its TargetMachines for later compiles. Each object is
// still the bytes a compiler that never compiled before makes: after other
// modules, after a function that asked for other target features, and
// with threads compiling at once.
TEST(LlvmCompiler, ReusedTargetMachinesMakeTheBytesOfFreshOnes) {
  auto jtmb = *llvm::orc::JITTargetMachineBuilder::detectHost();
  kcache::Options off;
  off.disabled = true;
  auto no_cache = kcache::Cache::open(off);
  const std::string fp =
      "define void @v(<4 x double>* %p, double %s) {\n"
      "  %a = load <4 x double>, <4 x double>* %p\n"
      "  %i = insertelement <4 x double> undef, double %s, i32 0\n"
      "  %b = shufflevector <4 x double> %i, <4 x double> undef, <4 x i32> zeroinitializer\n"
      "  %c = fmul <4 x double> %a, %b\n"
      "  store <4 x double> %c, <4 x double>* %p\n"
      "  ret void\n}\n";
  const std::vector<std::string> texts = {
      ir_text("a", 1),
      fp,
      fp +
          "define double @nf(double %x) #0 { %y = fmul double %x, 3.0\n ret double %y\n}\n"
          "attributes #0 = { \"target-features\"=\"-avx,-avx2,-avx512f\" }\n" +
          ir_text("t", 3),
      ir_text("a", 1) +
          "define i64 @w(i64 %x) #1 { %y = mul i64 %x, 7\n ret i64 %y\n}\n"
          "attributes #1 = { \"target-cpu\"=\"x86-64\" }\n",
      ir_text("a", 1),
      fp,
  };
  auto object_of = [](kl::CachingCompiler& c, const std::string& text) {
    llvm::LLVMContext ctx;
    auto m = parse(text, ctx);
    auto obj = c(*m);
    if (!obj) {
      ADD_FAILURE() << llvm::toString(obj.takeError());
      return std::string();
    }
    return (*obj)->getBuffer().str();
  };
  auto fresh_object = [&](const std::string& text) {
    auto c = kl::CachingCompiler::create(*no_cache, jtmb);
    if (!c) {
      ADD_FAILURE() << llvm::toString(c.takeError());
      return std::string();
    }
    return object_of(**c, text);
  };
  std::vector<std::string> want;
  for (const auto& t : texts) want.push_back(fresh_object(t));

  auto shared = kl::CachingCompiler::create(*no_cache, jtmb);
  ASSERT_TRUE(bool(shared));
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(object_of(**shared, texts[i]), want[i]) << "module " << i;

  // A module that lists a global in @llvm.used, then one with a global of
  // the same shape that does not: LLVM 14 would give the second's global a
  // retained section of its own whenever it landed at the address of the
  // first's, on a machine that compiled the first. Such a machine is not
  // kept.
  const std::string global = "@x = global i32 1\ndefine i32 @f() {\n  %v = load i32, i32* @x\n  ret i32 %v\n}\n";
  const std::string used =
      global + "@llvm.used = appending global [1 x i8*] [i8* bitcast (i32* @x to i8*)], section \"llvm.metadata\"\n";
  const std::string plain = fresh_object(global);
  int differed = 0;
  for (int i = 0; i < 60; ++i) {
    (void)object_of(**shared, used);
    differed += object_of(**shared, global) != plain;
  }
  EXPECT_EQ(differed, 0) << "objects after an @llvm.used module differ from a fresh compiler's";

  constexpr int kThreads = 4;
  std::vector<std::thread> ts;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (size_t r = 0; r < 2 * texts.size(); ++r) {
        size_t i = (r + static_cast<size_t>(t)) % texts.size();
        llvm::LLVMContext ctx;
        auto m = parse(texts[i], ctx);
        auto obj = (**shared)(*m);
        if (!obj) {
          llvm::consumeError(obj.takeError());
          ++wrong;
        } else if ((*obj)->getBuffer().str() != want[i]) {
          ++wrong;
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(LlvmObjectCache, StoresExactlyWhatSimpleCompilerProduces) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "files");
  auto tm = make_tm(kTriple, "x86-64", "");
  kl::ObjectCache oc(*cache, kl::TargetDesc::of(*tm));
  llvm::LLVMContext ctx;
  auto m1 = parse(ir_text("s", 3), ctx);
  llvm::orc::SimpleCompiler with_cache(*tm, &oc);
  auto obj1 = with_cache(*m1);
  ASSERT_TRUE(bool(obj1));
  auto m2 = parse(ir_text("s", 3), ctx);
  llvm::orc::SimpleCompiler plain(*tm);
  auto obj2 = plain(*m2);
  ASSERT_TRUE(bool(obj2));
  EXPECT_EQ((*obj1)->getBuffer().str(), (*obj2)->getBuffer().str());
  auto m3 = parse(ir_text("s", 3), ctx);
  auto hit = oc.getObject(m3.get());
  ASSERT_TRUE(hit != nullptr);
  EXPECT_EQ(hit->getBuffer().str(), (*obj2)->getBuffer().str());
  EXPECT_EQ(oc.counters().codegen_runs.load(), 1u);
  EXPECT_EQ(oc.counters().hits.load(), 1u);
}

// ---- what is in the key ------------------------------------------------------------

TEST(LlvmKey, ChangingIrOptLevelCpuFeaturesOrTripleIsAMiss) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "files");
  llvm::LLVMContext ctx;
  auto base_tm = make_tm(kTriple, "x86-64", "+sse2");
  kl::TargetDesc base = kl::TargetDesc::of(*base_tm);
  {
    // Store the base module's object.
    kl::ObjectCache oc(*cache, base);
    auto m = parse(ir_text("k", 1), ctx);
    llvm::orc::SimpleCompiler sc(*base_tm, &oc);
    ASSERT_TRUE(bool(sc(*m)));
    auto again = parse(ir_text("k", 1), ctx);
    EXPECT_TRUE(oc.getObject(again.get()) != nullptr);
  }
  auto base_key = kl::object_key(*parse(ir_text("k", 1), ctx), base);
  ASSERT_TRUE(base_key.has_value());

  struct Variant {
    std::string what;
    std::unique_ptr<llvm::TargetMachine> tm;
    std::string ir;
    std::string component;
  };
  std::vector<Variant> vs;
  vs.push_back({"ir", make_tm(kTriple, "x86-64", "+sse2"), ir_text("k", 2), "ir"});
  vs.push_back({"opt level", make_tm(kTriple, "x86-64", "+sse2", kl::compat::CodeGenOptLevel::Less), ir_text("k", 1),
                "codegen_opt_level"});
  vs.push_back({"cpu", make_tm(kTriple, "skylake", "+sse2"), ir_text("k", 1), "cpu"});
  vs.push_back({"features", make_tm(kTriple, "x86-64", "+sse2,+avx2"), ir_text("k", 1), "features"});
  vs.push_back({"triple", make_tm("i686-pc-linux-gnu", "x86-64", "+sse2"), ir_text("k", 1), "triple"});
  for (auto& v : vs) {
    ASSERT_TRUE(v.tm) << v.what;
    kl::TargetDesc d = kl::TargetDesc::of(*v.tm);
    auto m = parse(v.ir, ctx);
    kl::ObjectCache oc(*cache, d);
    EXPECT_TRUE(oc.getObject(m.get()) == nullptr) << v.what << " should miss";
    EXPECT_EQ(oc.counters().misses.load(), 1u) << v.what;
    auto k = kl::object_key(*m, d);
    ASSERT_TRUE(k.has_value());
    EXPECT_NE(k->key, base_key->key) << v.what;
    auto diff = kcache::manifest_diff(base_key->manifest, k->manifest);
    EXPECT_NE(std::find(diff.begin(), diff.end(), v.component), diff.end()) << v.what;
  }
  // The IR optimisation level run inside the compile is in the key too.
  auto m = parse(ir_text("k", 1), ctx);
  auto o2 = kl::object_key(*m, base, kl::KeyOptions{2, {}});
  auto o3 = kl::object_key(*m, base, kl::KeyOptions{3, {}});
  ASSERT_TRUE(o2.has_value() && o3.has_value());
  EXPECT_NE(o2->key, o3->key);
  EXPECT_EQ(kcache::manifest_diff(o2->manifest, o3->manifest), std::vector<std::string>{"ir_opt_level"});
}

TEST(LlvmKey, LljitOptLevelChangeRecompiles) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "files");
  auto c2 = std::make_shared<kl::CompileCounters>();
  auto c1 = std::make_shared<kl::CompileCounters>();
  EXPECT_EQ(run_jit(*cache, 1, c2, 2), std::vector<uint64_t>{reference(1000, 100)});
  EXPECT_EQ(run_jit(*cache, 1, c1, 1), std::vector<uint64_t>{reference(1000, 100)});
  EXPECT_EQ(c2->codegen_runs.load(), 1u);
  EXPECT_EQ(c1->codegen_runs.load(), 1u);
}

// ---- normalisation -------------------------------------------------------------------

TEST(LlvmKey, ModuleIdentifierAndSourceFileNameAreNotInTheKey) {
  llvm::LLVMContext ctx;
  auto tm = make_tm(kTriple, "x86-64", "");
  kl::TargetDesc d = kl::TargetDesc::of(*tm);
  auto a = parse(ir_text("n", 1), ctx, "/home/alice/jit/a.ll");
  auto b = parse(ir_text("n", 1), ctx, "module-42");
  auto ka = kl::object_key(*a, d);
  auto kb = kl::object_key(*b, d);
  ASSERT_TRUE(ka.has_value() && kb.has_value());
  EXPECT_EQ(ka->key, kb->key);
  // Both are restored for the caller.
  EXPECT_EQ(a->getModuleIdentifier(), "/home/alice/jit/a.ll");
  EXPECT_EQ(a->getSourceFileName(), "/home/alice/jit/a.ll.src");

  // Through the JIT: the second module is a hit and runs correctly.
  TempDir dir;
  auto cache = open_cache(dir.path(), "files");
  auto counters = std::make_shared<kl::CompileCounters>();
  kl::JitOptions jo;
  jo.counters = counters;
  for (const char* id : {"first.ll", "second-module"}) {
    auto jit = kl::make_cached_lljit(*cache, jo);
    ASSERT_TRUE(bool(jit));
    ASSERT_FALSE((*jit)->addIRModule(tsm(ir_text("n", 1), id)));
    auto sym = (*jit)->lookup("n");
    ASSERT_TRUE(bool(sym));
    EXPECT_EQ(kl::compat::jit_pointer<Fn>(*sym)(50), reference(1, 50));
  }
  EXPECT_EQ(counters->codegen_runs.load(), 1u);
  EXPECT_EQ(counters->hits.load(), 1u);
}

TEST(LlvmKey, CounterGeneratedNamesAreInTheKeyAsDocumented) {
  llvm::LLVMContext ctx;
  auto tm = make_tm(kTriple, "x86-64", "");
  kl::TargetDesc d = kl::TargetDesc::of(*tm);
  // Exported names are the interface: kernel_1 and kernel_2 are different
  // objects even with equal bodies.
  auto k1 = kl::object_key(*parse(ir_text("kernel_1", 1), ctx), d);
  auto k2 = kl::object_key(*parse(ir_text("kernel_2", 1), ctx), d);
  ASSERT_TRUE(k1.has_value() && k2.has_value());
  EXPECT_NE(k1->key, k2->key);
  EXPECT_EQ(kcache::manifest_diff(k1->manifest, k2->manifest), std::vector<std::string>{"ir"});
  // Private globals named by a counter also differ; unnamed ones (numbered
  // by position) are the documented way to get equal keys.
  auto p1 = kl::object_key(*parse(ir_text("p", 1, "@.str.1 = private constant [2 x i8] c\"a\\00\"\n"), ctx), d);
  auto p7 = kl::object_key(*parse(ir_text("p", 1, "@.str.7 = private constant [2 x i8] c\"a\\00\"\n"), ctx), d);
  auto u1 = kl::object_key(*parse(ir_text("p", 1, "@0 = private constant [2 x i8] c\"a\\00\"\n"), ctx, "x"), d);
  auto u2 = kl::object_key(*parse(ir_text("p", 1, "@0 = private constant [2 x i8] c\"a\\00\"\n"), ctx, "y"), d);
  ASSERT_TRUE(p1.has_value() && p7.has_value() && u1.has_value() && u2.has_value());
  EXPECT_NE(p1->key, p7->key);
  EXPECT_EQ(u1->key, u2->key);
}

TEST(LlvmKey, ManifestNamesEveryComponent) {
  llvm::LLVMContext ctx;
  auto tm = make_tm(kTriple, "x86-64", "");
  auto k =
      kl::object_key(*parse(ir_text("z", 1), ctx), kl::TargetDesc::of(*tm), kl::KeyOptions{2, {{"client", "t/1"}}});
  ASSERT_TRUE(k.has_value());
  std::vector<std::string> names;
  for (auto& it : k->manifest.items) names.push_back(it.name);
  std::vector<std::string> want = {
      "code_model", "codegen_opt_level", "cpu",         "extra",          "features", "ir", "ir_opt_level",
      "llvm",       "module_triple",     "reloc_model", "target_options", "triple"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(k->manifest.ns, kl::kKeyNamespace);
  EXPECT_TRUE(kl::llvm_identity().starts_with(LLVM_VERSION_STRING " ")) << kl::llvm_identity();
  EXPECT_EQ(kl::llvm_identity().find("no-build-id"), std::string::npos) << kl::llvm_identity();
}

// ---- other JIT front doors ---------------------------------------------------------------

TEST(LlvmObjectCache, OrcConcurrentIRCompilerUsesIt) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "lmdb");
  auto jtmb = *llvm::orc::JITTargetMachineBuilder::detectHost();
  auto tm = jtmb.createTargetMachine();
  ASSERT_TRUE(bool(tm));
  kl::ObjectCacheOptions oo;
  oo.short_lived_buffers = true;
  kl::ObjectCache oc(*cache, kl::TargetDesc::of(**tm), oo);
  for (int round = 0; round < 2; ++round) {
    llvm::orc::LLJITBuilder b;
    b.setJITTargetMachineBuilder(jtmb);
    b.setCompileFunctionCreator([&](llvm::orc::JITTargetMachineBuilder j)
                                    -> llvm::Expected<std::unique_ptr<llvm::orc::IRCompileLayer::IRCompiler>> {
      return std::make_unique<llvm::orc::ConcurrentIRCompiler>(std::move(j), &oc);
    });
    auto jit = b.create();
    ASSERT_TRUE(bool(jit));
    ASSERT_FALSE((*jit)->addIRModule(tsm(ir_text("c", 9))));
    auto sym = (*jit)->lookup("c");
    ASSERT_TRUE(bool(sym));
    EXPECT_EQ(kl::compat::jit_pointer<Fn>(*sym)(20), reference(9, 20));
  }
  EXPECT_EQ(oc.counters().codegen_runs.load(), 1u);
  EXPECT_EQ(oc.counters().hits.load(), 1u);
}

TEST(LlvmObjectCache, McjitUsesIt) {
  TempDir dir;
  auto cache = open_cache(dir.path(), "lmdb");
  std::shared_ptr<kl::ObjectCache> oc;
  for (int round = 0; round < 2; ++round) {
    llvm::LLVMContext ctx;
    auto m = parse(ir_text("mc", 4), ctx);
    std::string err;
    std::unique_ptr<llvm::ExecutionEngine> ee(
        llvm::EngineBuilder(std::move(m)).setErrorStr(&err).setEngineKind(llvm::EngineKind::JIT).create());
    ASSERT_TRUE(ee) << err;
    // MCJIT keeps object buffers for its lifetime: the default copies
    // bytes pinned by an LMDB read.
    if (!oc) oc = std::make_shared<kl::ObjectCache>(*cache, kl::TargetDesc::of(*ee->getTargetMachine()));
    ee->setObjectCache(oc.get());
    auto addr = ee->getFunctionAddress("mc");
    ASSERT_NE(addr, 0u);
    EXPECT_EQ(reinterpret_cast<Fn>(addr)(30), reference(4, 30));
  }
  EXPECT_EQ(oc->counters().codegen_runs.load(), 1u);
  EXPECT_EQ(oc->counters().hits.load(), 1u);
}

// ---- keys from what the client has, and front-end (stage) keys -------------------

namespace {

std::string bitcode_of(const std::string& text) {
  llvm::LLVMContext ctx;
  auto m = parse(text, ctx);
  llvm::SmallVector<char, 0> bc;
  llvm::BitcodeWriter w(bc);
  w.writeModule(*m);
  w.writeStrtab();
  return std::string(bc.data(), bc.size());
}

// A module parsed from bitcode bytes, as a JIT that reads .bc files has it.
llvm::orc::ThreadSafeModule tsm_from_bitcode(const std::string& bc, const std::string& id) {
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto m = llvm::parseBitcodeFile(llvm::MemoryBufferRef(bc, id), *ctx);
  EXPECT_TRUE(bool(m));
  return llvm::orc::ThreadSafeModule(std::move(*m), std::move(ctx));
}

uint64_t call(llvm::orc::LLJIT& jit, const std::string& fn, int64_t x) {
  auto sym = jit.lookup(fn);
  EXPECT_TRUE(bool(sym)) << (sym ? "" : llvm::toString(sym.takeError()));
  return sym ? kl::compat::jit_pointer<Fn>(*sym)(x) : 0;
}

}  // namespace

TEST(LlvmKey, DigestAndBitcodeKeysCoverTheTargetAndDifferFromModuleKeys) {
  auto tm = make_tm(kTriple, "x86-64", "");
  auto t = kl::TargetDesc::of(*tm);
  std::string bc = bitcode_of(ir_text("f", 1));
  auto by_bytes = kl::object_key_of_bitcode(bc, t);
  auto by_digest = kl::object_key(kcache::hash_bytes(bc), t);
  ASSERT_TRUE(by_bytes && by_digest);
  EXPECT_EQ(by_bytes->key, by_digest->key);
  EXPECT_NE(by_bytes->key, kl::object_key_of_bitcode(bitcode_of(ir_text("f", 2)), t)->key);
  auto t2 = t;
  t2.cpu = "skylake";
  EXPECT_NE(by_bytes->key, kl::object_key_of_bitcode(bc, t2)->key);
  kl::KeyOptions ko;
  ko.ir_opt_level = 3;
  EXPECT_NE(by_bytes->key, kl::object_key_of_bitcode(bc, t, ko)->key);
  llvm::LLVMContext ctx;
  auto m = parse(ir_text("f", 1), ctx);
  EXPECT_NE(by_bytes->key, kl::object_key(*m, t)->key);
}

// The object key make_cached_lljit with default JitOptions (this host,
// -O2) gives a module tagged with the IR digest `ir`.
// One process's view in the two-run tests: an LMDB cache in `dir`, a cached
// LLJIT on it, and that JIT's counters (the JIT goes before the cache).
struct CountedJit {
  std::unique_ptr<kcache::Cache> cache;
  std::shared_ptr<kl::CompileCounters> counters = std::make_shared<kl::CompileCounters>();
  std::unique_ptr<llvm::orc::LLJIT> jit;
};
CountedJit counted_jit(const std::string& dir) {
  CountedJit c;
  c.cache = open_cache(dir, "lmdb");
  kl::JitOptions jo;
  jo.counters = c.counters;
  auto jit = kl::make_cached_lljit(*c.cache, jo);
  EXPECT_TRUE(bool(jit)) << (jit ? "" : llvm::toString(jit.takeError()));
  if (jit) c.jit = std::move(*jit);
  return c;
}

kcache::Key default_jit_key(const kcache::Digest& ir) {
  auto tmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!tmb) {
    ADD_FAILURE() << llvm::toString(tmb.takeError());
    return {};
  }
  tmb->setCodeGenOptLevel(kl::compat::CodeGenOptLevel::Default);
  auto tm = as_lljit(*tmb).createTargetMachine();
  if (!tm) {
    ADD_FAILURE() << llvm::toString(tm.takeError());
    return {};
  }
  kl::KeyOptions ko;
  ko.ir_opt_level = 2;
  return kl::object_key(ir, kl::TargetDesc::of(**tm), ko)->key;
}

// ir_digest: what object_key(Module&) hashes of the IR. The module
// identifier and source file name are set aside (and left as they were);
// any change to the code changes it. A module tagged with it compiles once,
// hits in the next process, and its entry keeps the module's label.
TEST(LlvmKey, IrDigestIgnoresTheModuleNameAndTagsKeepTheLabel) {
  llvm::LLVMContext ctx;
  auto a = parse(ir_text("f", 1), ctx, "first.ll");
  auto b = parse(ir_text("f", 1), ctx, "second.ll");
  b->setSourceFileName("elsewhere.c");
  auto c = parse(ir_text("f", 2), ctx, "first.ll");
  EXPECT_EQ(kl::ir_digest(*a), kl::ir_digest(*b));
  EXPECT_NE(kl::ir_digest(*a), kl::ir_digest(*c));
  EXPECT_EQ(a->getModuleIdentifier(), "first.ll");
  EXPECT_EQ(b->getSourceFileName(), "elsewhere.c");

  TempDir d;
  for (int run = 0; run < 2; ++run) {
    auto [cache, counters, jit] = counted_jit(d.path());
    ASSERT_TRUE(jit);
    auto t = tsm(ir_text("g", 7), "kernel_g.ll");
    kcache::Digest ir;
    t.withModuleDo([&](llvm::Module& m) {
      ir = kl::ir_digest(m);
      kl::set_ir_digest(m, ir);
    });
    ASSERT_FALSE(jit->addIRModule(std::move(t)));
    EXPECT_EQ(call(*jit, "g", 50), reference(7, 50));
    EXPECT_EQ(counters->codegen_runs.load(), run == 0 ? 1u : 0u);
    (void)cache->flush();
    auto e = cache->get(default_jit_key(ir));
    ASSERT_TRUE(e);
    EXPECT_EQ(e->meta().label, "kernel_g.ll");
  }
}

TEST(LlvmCompiler, IrDigestTagSkipsSerialisingAndHitsAcrossProcesses) {
  TempDir d;
  std::string bc = bitcode_of(ir_text("g", 7));
  auto digest = kcache::hash_bytes(bc);
  for (int run = 0; run < 2; ++run) {
    auto [cache, counters, jit] = counted_jit(d.path());
    ASSERT_TRUE(jit);
    auto t = tsm_from_bitcode(bc, "g.bc");
    t.withModuleDo([&](llvm::Module& m) { kl::set_ir_digest(m, digest); });
    ASSERT_FALSE(jit->addIRModule(std::move(t)));
    EXPECT_EQ(call(*jit, "g", 50), reference(7, 50));
    EXPECT_EQ(counters->codegen_runs.load(), run == 0 ? 1u : 0u);
    EXPECT_EQ(counters->hits.load(), run == 0 ? 0u : 1u);
    (void)cache->flush();
    // The entry is under the digest key (the tag never reached the key).
    EXPECT_TRUE(cache->get(default_jit_key(digest)));
  }
}

TEST(LlvmFrontend, HitByFrontEndKeyNeedsNoModuleAndUnchangedIrSkipsCodegen) {
  TempDir d;
  kl::JitOptions jo;
  jo.key_extra = {{"frontend", "test/1"}};
  auto fk = kl::FrontendKeys::for_jit(jo);
  ASSERT_TRUE(fk);
  const auto front_a = fk->key(kcache::hash_bytes("source A"));
  const auto front_b = fk->key(kcache::hash_bytes("source B, same IR"));
  const auto front_c = fk->key(kcache::hash_bytes("source C, other IR"));
  EXPECT_NE(front_a.key, front_b.key);

  // Adds the module of `src` the way a front end would: found by its front-end
  // key, else lowered (here: parsed), tagged and compiled by the JIT.
  auto add = [&](kcache::Cache& cache, llvm::orc::LLJIT& jit, kl::CompileCounters& c, const kcache::KeyInfo& front,
                 const std::string& ir, int* lowered) {
    if (auto obj = fk->find(cache, front.key, &c)) {
      ASSERT_FALSE(jit.addObjectFile(std::move(obj)));
      return;
    }
    ++*lowered;
    auto t = tsm(ir, "h");
    t.withModuleDo([&](llvm::Module& m) { kl::set_frontend_key(m, front.key); });
    ASSERT_FALSE(jit.addIRModule(std::move(t)));
  };

  for (int run = 0; run < 2; ++run) {
    auto cache = open_cache(d.path(), "lmdb");
    auto c = std::make_shared<kl::CompileCounters>();
    auto jo2 = jo;
    jo2.counters = c;
    auto jit = kl::make_cached_lljit(*cache, jo2);
    ASSERT_TRUE(bool(jit));
    int lowered = 0;
    add(*cache, **jit, *c, front_a, ir_text("h", 3), &lowered);
    EXPECT_EQ(call(**jit, "h", 20), reference(3, 20));
    if (run == 0) {
      EXPECT_EQ(lowered, 1);
      EXPECT_EQ(c->codegen_runs.load(), 1u);
      EXPECT_EQ(c->links_stored.load(), 1u);
    } else {
      EXPECT_EQ(lowered, 0);  // neither the front end nor codegen ran
      EXPECT_EQ(c->codegen_runs.load(), 0u);
      EXPECT_EQ(c->frontend_hits.load(), 1u);
    }
    (void)cache->flush();
  }
  {
    // Another source, the same IR: the front end runs, codegen does not.
    auto cache = open_cache(d.path(), "lmdb");
    auto c = std::make_shared<kl::CompileCounters>();
    auto jo2 = jo;
    jo2.counters = c;
    auto jit = kl::make_cached_lljit(*cache, jo2);
    ASSERT_TRUE(bool(jit));
    int lowered = 0;
    add(*cache, **jit, *c, front_b, ir_text("h", 3), &lowered);
    EXPECT_EQ(call(**jit, "h", 21), reference(3, 21));
    EXPECT_EQ(lowered, 1);
    EXPECT_EQ(c->codegen_runs.load(), 0u);
    EXPECT_EQ(c->links_stored.load(), 1u);
    (void)cache->flush();
    EXPECT_TRUE(kcache::find_stage_link(*cache, fk->link_front(front_b.key)));
  }
  {
    // A source whose IR changed: both run, and the right code comes back.
    auto cache = open_cache(d.path(), "lmdb");
    auto c = std::make_shared<kl::CompileCounters>();
    auto jo2 = jo;
    jo2.counters = c;
    auto jit = kl::make_cached_lljit(*cache, jo2);
    ASSERT_TRUE(bool(jit));
    int lowered = 0;
    add(*cache, **jit, *c, front_c, ir_text("h", 9), &lowered);
    EXPECT_EQ(call(**jit, "h", 22), reference(9, 22));
    EXPECT_EQ(lowered, 1);
    EXPECT_EQ(c->codegen_runs.load(), 1u);
  }
}

// ---- what a key sets aside: !srcloc; bitcode as the JIT read it ---------------------

namespace {

// ir_text("h", start) with an inline asm barrier whose !srcloc is `loc`,
// as clang emits it (the byte offset of the asm in its buffer).
std::string asm_ir(uint64_t start, uint64_t loc, const std::string& asm_text = "") {
  std::string t = ir_text("h", start);
  t.replace(t.find("entry:\n"), 7,
            "entry:\n  call void asm sideeffect \"" + asm_text + "\", \"~{memory}\"(), !srcloc !0\n");
  return t + "!0 = !{i64 " + std::to_string(loc) + "}\n";
}

// The object the JIT made for `bc` (a module of make_cached_lljit with
// default options), from the entry its object key names in `cache`.
std::string stored_object(kcache::Cache& cache, const std::string& bc) {
  llvm::LLVMContext ctx;
  auto m = llvm::parseBitcodeFile(llvm::MemoryBufferRef(bc, "x"), ctx);
  if (!m) return "no module: " + llvm::toString(m.takeError());
  auto tmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!tmb) return llvm::toString(tmb.takeError());
  tmb->setCodeGenOptLevel(kl::compat::CodeGenOptLevel::Default);
  auto tm = as_lljit(*tmb).createTargetMachine();
  if (!tm) return llvm::toString(tm.takeError());
  kl::KeyOptions ko;
  ko.ir_opt_level = 2;
  auto k = kl::object_key(**m, kl::TargetDesc::of(**tm), ko);
  if (!k) return "no key";
  auto e = cache.get(k->key);
  if (!e || !e->artifact("obj")) return "not stored";
  return std::string(*e->artifact("obj"));
}

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

// !srcloc holds where clang found an inline asm (for diagnostics only): two
// modules that differ in it alone have one key and one object, and keying
// leaves it on the module.
TEST(LlvmKey, SrclocIsSetAsideAndChangesNoObject) {
  llvm::LLVMContext ctx;
  auto tm = make_tm(kTriple, "x86-64", "");
  kl::TargetDesc d = kl::TargetDesc::of(*tm);
  auto a = parse(asm_ir(3, 120), ctx);
  auto b = parse(asm_ir(3, 161), ctx);
  auto other_asm = parse(asm_ir(3, 120, "nop"), ctx);
  auto ka = kl::object_key(*a, d), kb = kl::object_key(*b, d), ko = kl::object_key(*other_asm, d);
  ASSERT_TRUE(ka && kb && ko);
  EXPECT_EQ(ka->key, kb->key);
  EXPECT_NE(ka->key, ko->key);  // the asm itself is code
  EXPECT_EQ(kl::ir_digest(*a), kl::ir_digest(*b));
  // Put back for the code generator's diagnostics.
  unsigned with_srcloc = 0;
  for (auto& i : a->getFunction("h")->getEntryBlock())
    if (auto* md = i.getMetadata("srcloc")) {
      ++with_srcloc;
      auto* c = llvm::mdconst::extract<llvm::ConstantInt>(md->getOperand(0));
      EXPECT_EQ(c->getZExtValue(), 120u);
    }
  EXPECT_EQ(with_srcloc, 1u);
  // The code generator makes the same bytes of both.
  llvm::orc::SimpleCompiler sc(*tm);
  auto oa = sc(*a), ob = sc(*b);
  ASSERT_TRUE(oa && ob);
  EXPECT_EQ((*oa)->getBuffer(), (*ob)->getBuffer());
}

// A label is the module's file name, not the folder it was read from.
TEST(LlvmKey, LabelIsTheLastComponentOfTheModuleIdentifier) {
  llvm::LLVMContext ctx;
  auto tm = make_tm(kTriple, "x86-64", "");
  auto k1 = kl::object_key(*parse(ir_text("f", 1), ctx, "/home/alice/build/lapi.bc"), kl::TargetDesc::of(*tm));
  auto k2 = kl::object_key(*parse(ir_text("f", 1), ctx, "lcode.bc"), kl::TargetDesc::of(*tm));
  ASSERT_TRUE(k1 && k2);
  EXPECT_EQ(k1->label, "lapi.bc");
  EXPECT_EQ(k2->label, "lcode.bc");
}

// BitcodeLoader: keyed on the file's bytes (a warm start parses nothing and
// serialises nothing), labelled by the file's name, and bitcode whose only
// change is a -D that no code reads (it moves every !srcloc) finds the
// object it made before: no code generation, no miss, the same object.
TEST(LlvmBitcodeLoader, KeysOnTheBytesAndSeesThroughADefineNoCodeReads) {
  TempDir d;
  std::string a_bc, b_bc;
#ifdef KCACHE_TEST_CLANG
  if (::access(KCACHE_TEST_CLANG, X_OK) == 0) {
    // Real clang output: the !srcloc of an asm in a header counts the
    // bytes of the predefines, which the -D lengthens.
    write_file(d.path() + "/barrier.h",
               "static inline void barrier(void) { __asm__ volatile(\"\" ::: \"memory\"); }\n");
    write_file(d.path() + "/h.c",
               "#include \"barrier.h\"\n"
               "unsigned long long h(long long x) {\n"
               "  barrier();\n"
               "  unsigned long long acc = 3;\n"
               "  long long i = 0;\n"
               "  do { acc = acc * 31 + (unsigned long long)i; ++i; } while (i < x);\n"
               "  return acc;\n}\n");
    std::string cc = std::string(KCACHE_TEST_CLANG) + " -O2 -c -emit-llvm " + d.path() + "/h.c -o ";
    ASSERT_EQ(std::system((cc + d.path() + "/a.bc").c_str()), 0);
    ASSERT_EQ(std::system((cc + d.path() + "/b.bc -DNOT_READ_BY_ANY_CODE=1").c_str()), 0);
    a_bc = read_file(d.path() + "/a.bc");
    b_bc = read_file(d.path() + "/b.bc");
  }
#endif
  if (a_bc.empty()) {
    a_bc = bitcode_of(asm_ir(3, 120));
    b_bc = bitcode_of(asm_ir(3, 161));
  }
  ASSERT_TRUE(a_bc != b_bc);
  ::mkdir((d.path() + "/one").c_str(), 0755);
  ::mkdir((d.path() + "/two").c_str(), 0755);
  write_file(d.path() + "/one/h.bc", a_bc);
  write_file(d.path() + "/two/h.bc", a_bc);
  std::string store = d.path() + "/cache";

  // Runs the JIT over `path` in a "process" of its own; returns its counters.
  auto run = [&](const std::string& path) {
    auto cache = open_cache(store, "lmdb");
    auto c = std::make_shared<kl::CompileCounters>();
    kl::JitOptions jo;
    jo.counters = c;
    auto jit = kl::make_cached_lljit(*cache, jo);
    EXPECT_TRUE(bool(jit));
    auto loader = kl::BitcodeLoader::for_jit(*cache, **jit, jo);
    EXPECT_TRUE(bool(loader));
    EXPECT_FALSE(loader->add_file(path));
    EXPECT_EQ(call(**jit, "h", 40), reference(3, 40));
    (void)cache->flush();
    return c;
  };
  auto cold = run(d.path() + "/one/h.bc");
  EXPECT_EQ(cold->codegen_runs.load(), 1u);
  EXPECT_EQ(cold->misses.load(), 1u);
  EXPECT_EQ(cold->links_stored.load(), 1u);

  // The same bytes from another folder: found by the bytes, nothing parsed.
  auto warm = run(d.path() + "/two/h.bc");
  EXPECT_EQ(warm->codegen_runs.load(), 0u);
  EXPECT_EQ(warm->frontend_hits.load(), 1u);

  // Rebuilt with the -D: new bytes, the same object.
  write_file(d.path() + "/two/h.bc", b_bc);
  auto redefined = run(d.path() + "/two/h.bc");
  EXPECT_EQ(redefined->codegen_runs.load(), 0u);
  EXPECT_EQ(redefined->misses.load(), 0u);
  EXPECT_EQ(redefined->hits.load(), 1u);
  EXPECT_EQ(redefined->links_stored.load(), 1u);
  {
    auto cache = open_cache(store, "lmdb");
    std::string obj_a = stored_object(*cache, a_bc), obj_b = stored_object(*cache, b_bc);
    EXPECT_EQ(obj_a, obj_b);
    EXPECT_GT(obj_a.size(), 64u) << obj_a;
    // Freshly compiled, with no cache, the -D bitcode makes those bytes too.
    kcache::Options off;
    off.disabled = true;
    auto none = kcache::Cache::open(off);
    auto t = tsm_from_bitcode(b_bc, "h.bc");
    auto tmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    ASSERT_TRUE(bool(tmb));
    auto cc = kl::CachingCompiler::create(*none, as_lljit(*tmb));
    ASSERT_TRUE(bool(cc));
    llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> fresh = nullptr;
    t.withModuleDo([&](llvm::Module& m) { fresh = (**cc)(m); });
    ASSERT_TRUE(bool(fresh));
    EXPECT_EQ((*fresh)->getBuffer().str(), obj_a);
  }
  // One miss journaled in all, labelled by the file's name.
  auto recs = kcache::read_miss_journal(store + "/lmdb", 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 1u);
  EXPECT_EQ((*recs)[0].label, "h.bc");
}

// A loader takes every keyed setting from its JIT: one given -O0 options
// over a JIT at -O3 keys the file for -O3 (what the JIT compiles), so a
// later, correctly configured -O0 run compiles its own -O0 object and never
// links the -O3 one. Each module is one lookup, hit or miss.
TEST(LlvmBitcodeLoader, TakesEveryKeyedSettingFromItsJit) {
  TempDir d;
  write_file(d.path() + "/h.bc", bitcode_of(ir_text("h", 3)));
  const std::string store = d.path() + "/cache";
  struct Run {
    std::shared_ptr<kl::CompileCounters> c;
    std::string linked;  // the object a front-end lookup finds after the run
    std::string stored;  // the object stored under the JIT's own object key
  };
  // One "process": a JIT at `jit_level`, a loader given options at
  // `loader_level`, h.bc added and run.
  auto run = [&](unsigned jit_level, unsigned loader_level) {
    Run r;
    auto cache = open_cache(store, "lmdb");
    r.c = std::make_shared<kl::CompileCounters>();
    kl::JitOptions jo;
    jo.opt_level = jit_level;
    jo.counters = r.c;
    auto jit = kl::make_cached_lljit(*cache, jo);
    EXPECT_TRUE(bool(jit));
    if (!jit) return r;
    kl::JitOptions lo;
    lo.opt_level = loader_level;
    auto loader = kl::BitcodeLoader::for_jit(*cache, **jit, lo);
    EXPECT_TRUE(bool(loader));
    EXPECT_FALSE(loader->add_file(d.path() + "/h.bc"));
    EXPECT_EQ(call(**jit, "h", 40), reference(3, 40));
    auto* cc = kl::CachingCompiler::of(**jit);
    EXPECT_NE(cc, nullptr);
    if (!cc) return r;
    EXPECT_EQ(cc->key_options().ir_opt_level, static_cast<int>(jit_level));
    // What the JIT's own keys find now, and what its object key holds.
    auto fk = kl::FrontendKeys::for_jit(**jit);
    EXPECT_TRUE(bool(fk));
    std::string bc = read_file(d.path() + "/h.bc");
    if (auto obj = fk->find(*cache, fk->key(kcache::hash_bytes(bc)).key)) r.linked = obj->getBuffer().str();
    llvm::LLVMContext ctx;
    auto m = llvm::parseBitcodeFile(llvm::MemoryBufferRef(bc, "h.bc"), ctx);
    EXPECT_TRUE(bool(m));
    if (!m) return r;
    (*m)->setDataLayout((*jit)->getDataLayout());  // as the JIT sets it before compiling
    auto k = kl::object_key(**m, cc->target(), cc->key_options());
    EXPECT_TRUE(bool(k));
    if (auto e = cache->get(k->key); e && e->artifact("obj")) r.stored = std::string(*e->artifact("obj"));
    (void)cache->flush();
    return r;
  };
  auto expect_one_lookup = [](const kl::CompileCounters& c) {
    EXPECT_EQ(c.lookups.load(), 1u);
    EXPECT_EQ(c.lookups.load(), c.hits.load() + c.misses.load());
  };

  // A loader given -O0 options over a JIT at -O3: keyed as the JIT compiles.
  Run mismatched = run(3, 0);
  EXPECT_EQ(mismatched.c->codegen_runs.load(), 1u);
  EXPECT_EQ(mismatched.c->misses.load(), 1u);
  EXPECT_EQ(mismatched.c->links_stored.load(), 1u);
  expect_one_lookup(*mismatched.c);
  ASSERT_GT(mismatched.stored.size(), 64u);
  EXPECT_EQ(mismatched.linked, mismatched.stored);

  // A correct -O0 run compiles its own object: not the -O3 one.
  Run o0 = run(0, 0);
  EXPECT_EQ(o0.c->codegen_runs.load(), 1u);
  EXPECT_EQ(o0.c->frontend_hits.load(), 0u);
  expect_one_lookup(*o0.c);
  ASSERT_GT(o0.stored.size(), 64u);
  EXPECT_NE(o0.stored, mismatched.stored);  // -O0 code is not -O3 code
  EXPECT_EQ(o0.linked, o0.stored);

  // Warm, each level finds its own object by the file's bytes alone.
  Run o0_warm = run(0, 0);
  EXPECT_EQ(o0_warm.c->codegen_runs.load(), 0u);
  EXPECT_EQ(o0_warm.c->frontend_hits.load(), 1u);
  expect_one_lookup(*o0_warm.c);
  EXPECT_EQ(o0_warm.linked, o0.stored);
  Run o3_warm = run(3, 3);
  EXPECT_EQ(o3_warm.c->codegen_runs.load(), 0u);
  EXPECT_EQ(o3_warm.c->frontend_hits.load(), 1u);
  expect_one_lookup(*o3_warm.c);
  EXPECT_EQ(o3_warm.linked, mismatched.stored);

  // The two compiles were journaled with manifests that differ in the levels.
  auto recs = kcache::read_miss_journal(store + "/lmdb", 100);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_NE((*recs)[0].key, (*recs)[1].key);
  auto level = [](const kcache::MissRecord& r, const std::string& name) {
    for (const auto& it : r.manifest.items)
      if (it.name == name) return it.value.value_or("?");
    return std::string("absent");
  };
  std::set<std::string> levels;
  for (const auto& r : *recs) levels.insert(level(r, "ir_opt_level") + "/" + level(r, "codegen_opt_level"));
  EXPECT_EQ(levels, (std::set<std::string>{"0/0", "3/3"}));
}

// Front-end keys made for other settings than the JIT's (FrontendKeys::
// for_jit with -O0 options, a JIT at -O3): the module gets the JIT's -O3
// object, and the link it leaves is bound to -O3, so the -O0 keys never
// find it (a miss, then the -O0 compile), nor do keys made for the JIT.
TEST(LlvmFrontend, ALinkLeftUnderAnotherConfigurationsKeyIsAMiss) {
  TempDir d;
  auto cache = open_cache(d.path(), "lmdb");
  kl::JitOptions o0, o3;
  o0.opt_level = 0;
  o3.opt_level = 3;
  auto c = std::make_shared<kl::CompileCounters>();
  o3.counters = c;
  auto fk0 = kl::FrontendKeys::for_jit(o0);
  ASSERT_TRUE(fk0);
  const auto in = kcache::hash_bytes("source of h");
  const auto front0 = fk0->key(in);
  {
    auto jit3 = kl::make_cached_lljit(*cache, o3);
    ASSERT_TRUE(bool(jit3));
    auto t = tsm(ir_text("h", 5), "h");
    t.withModuleDo([&](llvm::Module& m) { kl::set_frontend_key(m, front0.key); });
    ASSERT_FALSE((*jit3)->addIRModule(std::move(t)));
    EXPECT_EQ(call(**jit3, "h", 30), reference(5, 30));
    EXPECT_EQ(c->links_stored.load(), 1u);
    auto fk3 = kl::FrontendKeys::for_jit(**jit3);
    ASSERT_TRUE(fk3);
    (void)cache->flush();
    // Stored, bound to the -O3 compiler: under fk3's binding of front0.
    EXPECT_TRUE(kcache::find_stage_link(*cache, fk3->link_front(front0.key)));
    EXPECT_FALSE(kcache::find_stage_link(*cache, fk0->link_front(front0.key)));
    EXPECT_EQ(fk3->find(*cache, fk3->key(in).key), nullptr);
  }
  kl::CompileCounters mine;
  EXPECT_EQ(fk0->find(*cache, front0.key, &mine), nullptr);
  EXPECT_EQ(mine.lookups.load(), 0u);  // counted by the compiler the module goes to
  EXPECT_EQ(mine.hits.load(), 0u);
}

// A JIT whose compile layer is not a CachingCompiler: no front-end keys, a
// loader that parses and adds.
TEST(LlvmBitcodeLoader, OverAJitWithoutACachingCompilerItOnlyParsesAndAdds) {
  TempDir d;
  write_file(d.path() + "/h.bc", bitcode_of(ir_text("h", 4)));
  auto jit = llvm::orc::LLJITBuilder().create();
  ASSERT_TRUE(bool(jit));
  EXPECT_EQ(kl::CachingCompiler::of(**jit), nullptr);
  EXPECT_FALSE(kl::FrontendKeys::for_jit(**jit));
  auto loader = kl::BitcodeLoader::for_jit(**jit);
  ASSERT_TRUE(bool(loader));
  EXPECT_FALSE(loader->add_file(d.path() + "/h.bc"));
  EXPECT_EQ(call(**jit, "h", 12), reference(4, 12));
}

TEST(LlvmFrontend, KeysCoverTheJitConfiguration) {
  kl::JitOptions a, b, c;
  b.opt_level = 1;
  c.key_extra = {{"frontend", "v2"}};
  auto in = kcache::hash_bytes("src");
  auto ka = kl::FrontendKeys::for_jit(a)->key(in).key;
  EXPECT_EQ(ka, kl::FrontendKeys::for_jit(a)->key(in).key);
  EXPECT_NE(ka, kl::FrontendKeys::for_jit(b)->key(in).key);
  EXPECT_NE(ka, kl::FrontendKeys::for_jit(c)->key(in).key);
}

// for_jit remembers a configuration's target description (make_cached_lljit
// tells it too): what it remembers must be what a fresh machine says.
TEST(LlvmFrontend, RememberedTargetsAreThoseOfFreshMachines) {
  TempDir d;
  auto cache = open_cache(d.path(), "lmdb");
  auto in = kcache::hash_bytes("src");
  auto fresh_key = [&](const kl::JitOptions& o, kl::compat::CodeGenOptLevel cg) {
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    EXPECT_TRUE(bool(jtmb));
    if (!o.cpu.empty()) jtmb->setCPU(o.cpu);
    if (!o.features.empty()) jtmb->getFeatures() = llvm::SubtargetFeatures(o.features);
    jtmb->setCodeGenOptLevel(cg);
    auto tm = as_lljit(*jtmb).createTargetMachine();
    EXPECT_TRUE(bool(tm));
    kl::KeyOptions ko;
    ko.ir_opt_level = static_cast<int>(o.opt_level);
    ko.extra = o.key_extra;
    return kl::FrontendKeys(kl::TargetDesc::of(**tm), ko).key(in).key;
  };
  kl::JitOptions o2, o1, cpu, feat;
  o2.key_extra = o1.key_extra = cpu.key_extra = feat.key_extra = {{"test", "remembered"}};
  o1.opt_level = 1;
  cpu.cpu = "x86-64";
  feat.cpu = "x86-64";
  feat.features = "+sse4.2,+popcnt";
  // o2 learned from a JIT, o1 and cpu by for_jit itself; each asked twice.
  auto jit = kl::make_cached_lljit(*cache, o2);
  ASSERT_TRUE(bool(jit));
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(kl::FrontendKeys::for_jit(o2)->key(in).key, fresh_key(o2, kl::compat::CodeGenOptLevel::Default));
    EXPECT_EQ(kl::FrontendKeys::for_jit(o1)->key(in).key, fresh_key(o1, kl::compat::CodeGenOptLevel::Less));
    EXPECT_EQ(kl::FrontendKeys::for_jit(cpu)->key(in).key, fresh_key(cpu, kl::compat::CodeGenOptLevel::Default));
    EXPECT_EQ(kl::FrontendKeys::for_jit(feat)->key(in).key, fresh_key(feat, kl::compat::CodeGenOptLevel::Default));
  }
  EXPECT_NE(kl::FrontendKeys::for_jit(cpu)->key(in).key, kl::FrontendKeys::for_jit(o2)->key(in).key);
  EXPECT_NE(kl::FrontendKeys::for_jit(feat)->key(in).key, kl::FrontendKeys::for_jit(cpu)->key(in).key);
}

// CPU times are counted only when the counters ask for them (each is a
// system call); wall times always are.
TEST(LlvmCompiler, CpuTimesAreCountedOnlyWhenAsked) {
  for (bool cpu : {true, false}) {
    TempDir d;
    auto cache = open_cache(d.path(), "lmdb");
    auto c = std::make_shared<kl::CompileCounters>();
    c->cpu_times = cpu;
    auto cold = run_jit(*cache, 2, c);
    ASSERT_EQ(cold.size(), 2u);
    auto warm = std::make_shared<kl::CompileCounters>();
    warm->cpu_times = cpu;
    ASSERT_EQ(run_jit(*cache, 2, warm), cold);
    EXPECT_EQ(c->codegen_runs.load(), 2u);
    EXPECT_EQ(warm->hits.load(), 2u);
    EXPECT_GT(c->compile_ns.load(), 0u);
    EXPECT_GT(c->key_ns.load(), 0u);
    EXPECT_GT(warm->lookup_ns.load(), 0u);
    if (cpu) {
      EXPECT_GT(c->compile_cpu_ns.load(), 0u);
      EXPECT_GT(c->key_cpu_ns.load() + c->lookup_cpu_ns.load(), 0u);
      EXPECT_EQ(c->to_json().find("null"), std::string::npos) << c->to_json();
    } else {
      EXPECT_EQ(c->compile_cpu_ns.load() + c->key_cpu_ns.load() + c->lookup_cpu_ns.load(), 0u);
      EXPECT_EQ(warm->lookup_cpu_ns.load(), 0u);
      EXPECT_NE(c->to_json().find("\"compile_cpu_s\":null"), std::string::npos) << c->to_json();
    }
  }
}

TEST(LlvmFrontend, ALinkToAnObjectForAnotherTargetIsAMiss) {
  TempDir d;
  auto cache = open_cache(d.path(), "lmdb");
  auto fk = kl::FrontendKeys::for_jit({});
  ASSERT_TRUE(fk);
  auto front = fk->key(kcache::hash_bytes("src"));
  // A well-formed link to an entry whose "obj" is not an object file.
  auto junk = *kcache::KeyBuilder("junk").add_string("x", "y").finish();
  ASSERT_TRUE(cache->put(junk, {{"obj", std::string(256, '\x7f')}}));
  ASSERT_TRUE(kcache::put_stage_link(*cache, fk->link_front(front.key), kcache::hash_bytes("ir"), junk.key));
  (void)cache->flush();
  kl::CompileCounters c;
  EXPECT_EQ(fk->find(*cache, front.key, &c), nullptr);
  EXPECT_EQ(c.bad_objects.load(), 1u);
  EXPECT_EQ(c.hits.load(), 0u);
}

TEST(LlvmCompiler, DisabledCacheComputesNoKey) {
  TempDir d;
  kcache::Options o;
  o.dir = d.path();
  o.disabled = true;
  auto cache = kcache::Cache::open(o);
  auto counters = std::make_shared<kl::CompileCounters>();
  auto r = run_jit(*cache, 2, counters);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], reference(1000, 100));
  EXPECT_EQ(counters->codegen_runs.load(), 2u);
  EXPECT_EQ(counters->key_ns.load(), 0u);
}

// ---- linking into the arena (arena_memory_managers) ------------------------------

namespace {

// The process's mappings, from /proc/self/maps: [lo, hi), permissions
// ("r-xp", ...) and the whole line (with its name, "[stack]", ...).
struct Mapping {
  uintptr_t lo = 0, hi = 0;
  std::string perms, line;
};
std::vector<Mapping> mappings() {
  std::vector<Mapping> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &m.lo, &m.hi, perms) != 3) continue;
    m.perms = perms;
    m.line = std::move(line);
    out.push_back(std::move(m));
  }
  return out;
}

// The permissions of the mapping that holds `addr`.
std::string perms_at(uintptr_t addr) {
  for (const auto& m : mappings())
    if (addr >= m.lo && addr < m.hi) return m.perms;
  return "";
}

// The mapping (start, end) that holds `addr`.
std::pair<uintptr_t, uintptr_t> mapping_of(uintptr_t addr) {
  for (const auto& m : mappings())
    if (addr >= m.lo && addr < m.hi) return {m.lo, m.hi};
  return {0, 0};
}

// A module with code, a constant table (read-only data) and a counter
// (read-write data): g<i>(x) = tab<i>[x & 3] + ++count<i>.
std::string arena_ir(int i) {
  std::string s = std::to_string(i);
  return "@tab" + s + " = constant [4 x i64] [i64 " + std::to_string(10 * i) + ", i64 1, i64 2, i64 3]\n" + "@count" +
         s + " = global i64 0\n" + "define i64 @g" + s +
         "(i64 %x) {\n"
         "  %j = and i64 %x, 3\n"
         "  %p = getelementptr [4 x i64], [4 x i64]* @tab" +
         s + ", i64 0, i64 %j\n" +
         "  %v = load i64, i64* %p\n"
         "  %c = load i64, i64* @count" +
         s + "\n" +
         "  %c1 = add i64 %c, 1\n"
         "  store i64 %c1, i64* @count" +
         s + "\n" +
         "  %r = add i64 %v, %c1\n"
         "  ret i64 %r\n}\n";
}

}  // namespace

// make_cached_lljit links into one arena, with RuntimeDyld (lljit_linker
// false, on every LLVM) and with LLJIT's own linker (JITLink on LLVM 19 for
// x86-64 ELF, into arena_jitlink_memory_manager): code is executable and
// never writable, constants are read-only, globals are writable, and
// objects can be removed and linked again (their pages go back to the
// system).
class LlvmArenaLinkers : public ::testing::TestWithParam<bool> {};

TEST_P(LlvmArenaLinkers, ObjectsRunWithTheirProtectionsAndComeBackAfterRemoval) {
  TempDir d;
  auto cache = open_cache(d.path(), "lmdb");
  kl::JitOptions jo;
  jo.lljit_linker = GetParam();
  auto jit = kl::make_cached_lljit(*cache, jo);
  ASSERT_TRUE(bool(jit)) << llvm::toString(jit.takeError());
  constexpr int kModules = 40;
  std::vector<llvm::orc::ResourceTrackerSP> rts(kModules);
  auto add = [&](int i) {
    rts[i] = (*jit)->getMainJITDylib().createResourceTracker();
    ASSERT_FALSE((*jit)->addIRModule(rts[i], tsm(arena_ir(i), "a" + std::to_string(i))));
  };
  auto addr = [&](const std::string& name) -> uintptr_t {
    auto sym = (*jit)->lookup(name);
    EXPECT_TRUE(bool(sym)) << name << ": " << (sym ? "" : llvm::toString(sym.takeError()));
    return sym ? reinterpret_cast<uintptr_t>(kl::compat::jit_pointer<void*>(*sym)) : 0;
  };
  using G = int64_t (*)(int64_t);
  for (int i = 0; i < kModules; ++i) add(i);
  for (int i = 0; i < kModules; ++i) {
    std::string s = std::to_string(i);
    uintptr_t g = addr("g" + s), tab = addr("tab" + s), count = addr("count" + s);
    ASSERT_NE(g, 0u);
    EXPECT_EQ(reinterpret_cast<G>(g)(0), 10 * i + 1);
    EXPECT_EQ(reinterpret_cast<G>(g)(6), 2 + 2);
    EXPECT_EQ(perms_at(g).substr(0, 3), "r-x") << i;
    EXPECT_EQ(perms_at(tab).substr(0, 3), "r--") << i;
    EXPECT_EQ(perms_at(count).substr(0, 3), "rw-") << i;
    EXPECT_EQ(*reinterpret_cast<int64_t*>(count), 2);
  }
  // Neighbouring objects' code is one mapping, not one per object.
  EXPECT_EQ(mapping_of(addr("g0")), mapping_of(addr("g1")));
  // Remove every other object (its pages go back: no access left), then
  // link those again: fresh counters.
  const uintptr_t g0 = addr("g0");
  for (int i = 0; i < kModules; i += 2) ASSERT_FALSE(rts[i]->remove());
  EXPECT_EQ(perms_at(g0), "---p");
  for (int i = 0; i < kModules; i += 2) add(i);
  for (int i = 0; i < kModules; ++i) {
    uintptr_t g = addr("g" + std::to_string(i));
    ASSERT_NE(g, 0u);
    EXPECT_EQ(reinterpret_cast<G>(g)(1), 1 + (i % 2 == 0 ? 1 : 3)) << i;
  }
}

// A warm start's objects (from the cache, by front-end key) in a JITDylib
// of their own: 200 objects share a few mappings of the arena, and removing
// the JITDylib gives every page back.
TEST_P(LlvmArenaLinkers, ManyCachedObjectsShareTheArenaAndARemovedJitDylibGivesItAllBack) {
  TempDir d;
  kl::JitOptions jo;
  jo.lljit_linker = GetParam();
  constexpr int kModules = 200;
  auto front = [](int i) { return kcache::hash_bytes("arena-warm-" + std::to_string(i)); };
  {  // cold: compiled and stored under their front-end keys
    auto cache = open_cache(d.path(), "lmdb");
    auto jit = kl::make_cached_lljit(*cache, jo);
    ASSERT_TRUE(bool(jit)) << llvm::toString(jit.takeError());
    auto fk = kl::FrontendKeys::for_jit(**jit);
    ASSERT_TRUE(bool(fk));
    for (int i = 0; i < kModules; ++i) {
      auto m = tsm(arena_ir(i), "w" + std::to_string(i));
      kl::set_frontend_key(*m.getModuleUnlocked(), fk->key(front(i)).key);
      ASSERT_FALSE((*jit)->addIRModule(std::move(m)));
    }
    for (int i = 0; i < kModules; ++i) ASSERT_TRUE(bool((*jit)->lookup("g" + std::to_string(i))));
  }
  auto cache = open_cache(d.path(), "lmdb");
  auto jit = kl::make_cached_lljit(*cache, jo);
  ASSERT_TRUE(bool(jit)) << llvm::toString(jit.takeError());
  auto fk = kl::FrontendKeys::for_jit(**jit);
  ASSERT_TRUE(bool(fk));
  auto made = (*jit)->createJITDylib("warm");
  ASSERT_TRUE(bool(made)) << llvm::toString(made.takeError());
  llvm::orc::JITDylib* jd = &*made;
  for (int i = 0; i < kModules; ++i) {
    auto obj = fk->find(*cache, fk->key(front(i)).key);
    ASSERT_TRUE(obj) << i;
    ASSERT_FALSE((*jit)->addObjectFile(*jd, std::move(obj)));
  }
  using G = int64_t (*)(int64_t);
  std::set<std::pair<uintptr_t, uintptr_t>> code_mappings;
  std::vector<uintptr_t> code(kModules);
  for (int i = 0; i < kModules; ++i) {
    auto sym = (*jit)->lookup(*jd, "g" + std::to_string(i));
    ASSERT_TRUE(bool(sym)) << llvm::toString(sym.takeError());
    code[i] = reinterpret_cast<uintptr_t>(kl::compat::jit_pointer<void*>(*sym));
    EXPECT_EQ(reinterpret_cast<G>(code[i])(0), 10 * i + 1);
    EXPECT_EQ(perms_at(code[i]).substr(0, 3), "r-x") << i;
  }
  for (uintptr_t c : code) code_mappings.insert(mapping_of(c));
  // A mapping per object would be 200; the arena's code range is one (or a
  // few where another mapping of the process happens to split it).
  EXPECT_LE(code_mappings.size(), 4u);
  ASSERT_FALSE((*jit)->getExecutionSession().removeJITDylib(*jd));
  for (int i = 0; i < kModules; ++i) {
    std::string p = perms_at(code[i]);
    EXPECT_TRUE(p.empty() || p == "---p") << i << ": " << p;
  }
}

// An exception thrown by the host through JIT code unwinds through it (its
// EH frames are registered, with either linker) and is caught beyond it.
TEST_P(LlvmArenaLinkers, ExceptionsUnwindThroughJitCode) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the test's own code throws through x86-64 JIT code";
#endif
  TempDir d;
  auto cache = open_cache(d.path(), "lmdb");
  kl::JitOptions jo;
  jo.lljit_linker = GetParam();
  for (int round = 0; round < 2; ++round) {  // compiled, then from the cache
    auto jit = kl::make_cached_lljit(*cache, jo);
    ASSERT_TRUE(bool(jit)) << llvm::toString(jit.takeError());
    ASSERT_FALSE(
        (*jit)->addIRModule(tsm("define i64 @through(void ()* %f, i64 %x) #0 {\n"
                                "  call void %f()\n"
                                "  %r = add i64 %x, 1\n"
                                "  ret i64 %r\n}\n"
                                "attributes #0 = { uwtable }\n",
                                "eh")));
    auto sym = (*jit)->lookup("through");
    ASSERT_TRUE(bool(sym)) << llvm::toString(sym.takeError());
    auto through = kl::compat::jit_pointer<int64_t (*)(void (*)(), int64_t)>(*sym);
    EXPECT_EQ(through([] {}, 41), 42);
    int caught = 0;
    try {
      through([] { throw std::runtime_error("from the host"); }, 1);
    } catch (const std::runtime_error& e) {
      caught = std::string(e.what()) == "from the host" ? 1 : 2;
    }
    EXPECT_EQ(caught, 1) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Linkers, LlvmArenaLinkers, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("LljitLinker") : std::string("RuntimeDyld");
                         });

// libgcc's unwinder skips an FDE whose function starts at an address with
// its low 32 bits zero, so no code region may hold such an address: a
// region that would is moved one page past it, and one that does not stays
// where it is.
TEST(LlvmArenaMemory, NoCodeRegionHoldsAnAddressWithItsLow32BitsZero) {
  constexpr size_t kPage = 4096;
  const uint64_t four_g = uint64_t{1} << 32;
  auto at = [](uint64_t a) { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(a)); };
  auto start = [&](uint64_t a, size_t size) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(kl::code_region_start(at(a), size, kPage)));
  };
  const uint64_t b = 0x7f3400000000;  // on a boundary, as a slab was when an exception ended a test
  EXPECT_EQ(start(b, kPage), b + kPage);
  EXPECT_EQ(start(b - kPage, 2 * kPage), b + kPage);  // the boundary inside
  EXPECT_EQ(start(b - kPage, kPage), b - kPage);      // ends right before it
  EXPECT_EQ(start(b + kPage, 64 << 20), b + kPage);
  EXPECT_EQ(start(b - (64 << 20), 64 << 20), b - (64 << 20));
  EXPECT_EQ(start(b - (64 << 20), (64 << 20) + 1), b + kPage);
  EXPECT_EQ(start(b, 0), b);  // nothing placed
  for (uint64_t a = b - 8 * kPage; a <= b + 8 * kPage; a += kPage)
    for (size_t size : {size_t{1}, kPage, 3 * kPage, size_t{16} << 20}) {
      uint64_t s = start(a, size);
      EXPECT_GE(s, a);
      EXPECT_LT(s - a, size + 2 * kPage);
      EXPECT_EQ((s + size - 1) / four_g, s / four_g) << std::hex << a << " " << size << ": crosses a boundary";
      EXPECT_NE(s % four_g, 0u) << std::hex << a << " " << size;
    }
}

// The arena itself, made to take a slab that starts on a 4 GiB boundary:
// the address space above it is filled, so the slab lands in a hole left
// there (where mmap places mappings top-down, Linux's default; elsewhere
// the test is skipped). Its first code section is then not on the boundary.
TEST(LlvmArenaMemory, ASlabOnA4GiBBoundaryPutsNoCodeThere) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "runs x86-64 code (ret)";
#endif
  constexpr uint64_t kSlab = uint64_t{3} * (64 << 20);  // a slab's address space (jit_memory.cc)
  const uint64_t four_g = uint64_t{1} << 32;
  const size_t big = size_t{12} << 30;
  void* r = ::mmap(nullptr, big, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) GTEST_SKIP() << "no 12 GiB of address space to arrange";
  std::vector<std::pair<void*, size_t>> fills;
  struct Unmap {  // whatever the test maps goes, however it ends
    std::function<void()> fn;
    ~Unmap() { fn(); }
  } unmap{[&] {
    for (auto& [f, n] : fills) ::munmap(f, n);
    ::munmap(r, big);  // what is left of the reservation
  }};
  const uint64_t r0 = reinterpret_cast<uintptr_t>(r), r1 = r0 + big;
  const uint64_t hole = (r1 - kSlab) / four_g * four_g;  // the highest boundary with a slab's room above it
  ASSERT_GE(hole, r0);
  // Every other gap at least a slab wide above the hole is filled, but the
  // one under the stack (where mmap never places anything).
  const std::vector<Mapping> maps = mappings();
  for (size_t i = 0; i + 1 < maps.size(); ++i) {
    const uint64_t lo = maps[i].hi, hi = maps[i + 1].lo;
    if (hi <= lo || hi - lo < kSlab || lo < hole) continue;
    const std::string& above = maps[i + 1].line;
    if (above.find("[stack]") != std::string::npos || above.find("[v") != std::string::npos) continue;
    void* f = ::mmap(reinterpret_cast<void*>(lo), hi - lo, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (f != MAP_FAILED) fills.emplace_back(f, hi - lo);
  }
  // A hole of a slab's size; or, where the kernel aligns a large anonymous
  // mapping to 2 MiB (it asks for 2 MiB more room, then places the mapping
  // 2 MiB above an already aligned start), one that begins 2 MiB lower.
  bool placed = false;
  for (uint64_t lead : {uint64_t{0}, uint64_t{2} << 20}) {
    const uint64_t from = hole - lead, size = kSlab + lead;
    ASSERT_EQ(::munmap(reinterpret_cast<void*>(from), size), 0);
    auto make = kl::arena_memory_managers();
    auto mm = make();
    mm->reserveAllocationSpace(100, kl::compat::ReserveAlign(16), 0, kl::compat::ReserveAlign(1), 0,
                               kl::compat::ReserveAlign(1));
    uint8_t* code = mm->allocateCodeSection(100, 16, 1, ".text");
    ASSERT_TRUE(code);
    const uint64_t c = reinterpret_cast<uintptr_t>(code);
    if (c >= hole && c < hole + (uint64_t{1} << 20)) {  // the slab starts on the boundary
      placed = true;
      EXPECT_NE(c % four_g, 0u) << std::hex << c;
      std::memset(code, 0xc3, 100);  // ret
      std::string err;
      ASSERT_FALSE(mm->finalizeMemory(&err)) << err;
      reinterpret_cast<void (*)()>(code)();
    }
    mm.reset();
    make = nullptr;  // the arena, and with it its slab, goes
    if (placed) break;
    void* back = ::mmap(reinterpret_cast<void*>(from), size, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    ASSERT_NE(back, MAP_FAILED);
  }
  if (!placed) GTEST_SKIP() << std::hex << "mmap never placed the arena's slab in the hole at " << hole;
}

// The memory managers on their own, as RuntimeDyld drives them: sections
// aligned as asked, within what was reserved; one beyond the reservation
// still gets memory; finalising makes code RX and constants R; a manager
// that is gone gives its pages back.
TEST(LlvmArenaMemory, SectionsAreAlignedAndASectionBeyondTheReservationStillGetsMemory) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "runs x86-64 code (ret)";
#endif
  auto make = kl::arena_memory_managers();
  uintptr_t code_at = 0;
  {
    auto mm = make();
    ASSERT_TRUE(mm->needsToReserveAllocationSpace());
    mm->reserveAllocationSpace(100, kl::compat::ReserveAlign(16), 40, kl::compat::ReserveAlign(64), 8,
                               kl::compat::ReserveAlign(8));
    uint8_t* code = mm->allocateCodeSection(100, 16, 1, ".text");
    uint8_t* ro = mm->allocateDataSection(40, 64, 2, ".rodata", true);
    uint8_t* rw = mm->allocateDataSection(8, 8, 3, ".data", false);
    uint8_t* extra = mm->allocateCodeSection(10000, 4096, 4, ".text.extra");  // not reserved
    ASSERT_TRUE(code && ro && rw && extra);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(code) % 16, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ro) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(extra) % 4096, 0u);
    std::memset(code, 0xc3, 100);  // ret
    std::memset(extra, 0xc3, 10000);
    std::memset(ro, 7, 40);
    std::memset(rw, 9, 8);
    std::string err;
    ASSERT_FALSE(mm->finalizeMemory(&err)) << err;
    EXPECT_EQ(perms_at(reinterpret_cast<uintptr_t>(code)).substr(0, 3), "r-x");
    EXPECT_EQ(perms_at(reinterpret_cast<uintptr_t>(extra) + 9999).substr(0, 3), "r-x");
    EXPECT_EQ(perms_at(reinterpret_cast<uintptr_t>(ro)).substr(0, 3), "r--");
    EXPECT_EQ(perms_at(reinterpret_cast<uintptr_t>(rw)).substr(0, 3), "rw-");
    EXPECT_EQ(ro[39], 7);
    reinterpret_cast<void (*)()>(code)();
    code_at = reinterpret_cast<uintptr_t>(code);
  }
  EXPECT_EQ(perms_at(code_at).substr(0, 3), "---") << "given back";
}

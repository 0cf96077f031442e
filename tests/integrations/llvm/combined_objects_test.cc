// Combined objects: a set of modules added together (BitcodeLoader::add_files)
// is stored once more as one object, which a later start links in place of
// the modules' objects. The combined object is found only for the same set
// (never when a module changed, was added or left out, in any order); it
// keeps what separate objects keep apart (two modules' static functions of
// one name) and joins what they share (a call or a global across modules,
// a function of the host process); objects it cannot join without a
// linker's judgement (a name defined in two modules) are linked one by one,
// and that answer is remembered; a damaged combined object is a miss.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <llvm/AsmParser/Parser.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>

#include "kcache/llvm.h"
#include "kcache/llvm_compat.h"
#include "test_util.h"

namespace kl = kcache::llvm;
using kcache::test::TempDir;

namespace {

[[maybe_unused]] const bool kNativeTarget = [] {
  return !llvm::InitializeNativeTarget() && !llvm::InitializeNativeTargetAsmPrinter();
}();

// Module a: a global, a static helper, and a call into module b.
const char* kA = R"(
@counter = global i64 5
define internal i64 @helper(i64 %x) {
  %y = mul i64 %x, 3
  ret i64 %y
}
declare i64 @b(i64)
define i64 @a(i64 %x) {
  %h = call i64 @helper(i64 %x)
  %r = call i64 @b(i64 %x)
  %c = load i64, {P64} @counter
  %s = add i64 %h, %r
  %t = add i64 %s, %c
  ret i64 %t
}
)";

// Module b: a static helper of the same name as a's, a's global, and
// `delta`, which the test changes.
std::string module_b(int delta) {
  return R"(
@counter = external global i64
define internal i64 @helper(i64 %x) {
  %y = add i64 %x, )" +
         std::to_string(delta) + R"(
  ret i64 %y
}
define i64 @b(i64 %x) {
  %h = call i64 @helper(i64 %x)
  %c = load i64, {P64} @counter
  %s = add i64 %h, %c
  ret i64 %s
}
)";
}

// Module c: a function of the host process (labs), a string constant and
// a table of function pointers (relocations in data).
const char* kC = R"(
@msg = private unnamed_addr constant [6 x i8] c"hello\00"
@table = internal constant [2 x {FP}] [{FP} @twice, {FP} @thrice]
declare i64 @labs(i64)
declare i64 @strlen({P8})
define internal i64 @twice(i64 %x) {
  %y = mul i64 %x, 2
  ret i64 %y
}
define internal i64 @thrice(i64 %x) {
  %y = mul i64 %x, 3
  ret i64 %y
}
define i64 @c(i64 %x, i64 %which) {
  %p = getelementptr [2 x {FP}], {PTABLE} @table, i64 0, i64 %which
  %f = load {FP}, {FPP} %p
  %v = call i64 %f(i64 %x)
  %a = call i64 @labs(i64 %v)
  %n = call i64 @strlen({MSG})
  %r = add i64 %a, %n
  ret i64 %r
}
)";

// Two modules with a weak definition of one name each: nothing a combined
// object may hold without a linker's choice between them.
std::string weak_module(const std::string& fn, int v) {
  return "define weak i64 @shared() {\n  ret i64 " + std::to_string(v) + "\n}\ndefine i64 @" + fn +
         "() {\n  %s = call i64 @shared()\n  ret i64 %s\n}\n";
}

// Writes `text` as bitcode to `path`, its pointer types ({P64} and kin)
// spelled as this LLVM's IR spells them.
void write_bitcode(const std::string& path, std::string text) {
#if LLVM_VERSION_MAJOR >= 15
  const std::pair<const char*, const char*> spelling[] = {{"{P64}", "ptr"},    {"{P8}", "ptr"},  {"{FP}", "ptr"},
                                                          {"{PTABLE}", "ptr"}, {"{FPP}", "ptr"}, {"{MSG}", "ptr @msg"}};
#else
  const std::pair<const char*, const char*> spelling[] = {
      {"{P64}", "i64*"},        {"{P8}", "i8*"},
      {"{FP}", "i64 (i64)*"},   {"{PTABLE}", "[2 x i64 (i64)*]*"},
      {"{FPP}", "i64 (i64)**"}, {"{MSG}", "i8* getelementptr inbounds ([6 x i8], [6 x i8]* @msg, i64 0, i64 0)"}};
#endif
  for (const auto& [from, to] : spelling)
    for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, std::strlen(from), to);
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic err;
  auto m = llvm::parseAssemblyString(text, err, ctx);
  ASSERT_TRUE(m) << err.getMessage().str() << "\n" << text;
  std::string out;
  llvm::raw_string_ostream os(out);
  llvm::WriteBitcodeToFile(*m, os);
  os.flush();
  std::ofstream(path, std::ios::binary) << out;
}

std::unique_ptr<kcache::Cache> open_cache(const std::string& dir) {
  kcache::Options o;
  o.dir = dir;
  o.log_level = kcache::LogLevel::error;
  return kcache::Cache::open(o);
}

// One start: a JIT of its own over the store, the files added together.
struct Start {
  std::unique_ptr<kcache::Cache> cache;
  std::shared_ptr<kl::CompileCounters> counters = std::make_shared<kl::CompileCounters>();
  std::unique_ptr<llvm::orc::LLJIT> jit;

  Start(const std::string& store, const std::vector<std::string>& files, bool combine = true,
        bool lljit_linker = true) {
    cache = open_cache(store);
    kl::JitOptions jo;
    jo.counters = counters;
    jo.lljit_linker = lljit_linker;
    auto j = kl::make_cached_lljit(*cache, jo);
    if (!j) {
      ADD_FAILURE() << llvm::toString(j.takeError());
      return;
    }
    jit = std::move(*j);
    auto loader = kl::BitcodeLoader::for_jit(*jit);
    if (!loader) {
      ADD_FAILURE() << loader.error().to_string();
      return;
    }
    loader->set_combine(combine);
    if (auto err = loader->add_files(files)) ADD_FAILURE() << llvm::toString(std::move(err));
  }
  template <typename Fn>
  Fn* fn(const std::string& name) {
    auto sym = jit->lookup(name);
    if (!sym) {
      ADD_FAILURE() << name << ": " << llvm::toString(sym.takeError());
      return nullptr;
    }
    return kl::compat::jit_pointer<Fn*>(*sym);
  }
  uint64_t set_hits() const { return counters->set_hits.load(); }
  uint64_t sets_stored() const { return counters->sets_stored.load(); }
  uint64_t codegen() const { return counters->codegen_runs.load(); }
};

// What a(x), b(x), c(x, which) return with b's helper adding `delta`.
int64_t want_b(int64_t x, int delta) { return x + delta + 5; }
int64_t want_a(int64_t x, int delta) { return 3 * x + want_b(x, delta) + 5; }
int64_t want_c(int64_t x, int64_t which) { return std::labs(x * (which ? 3 : 2)) + 5; }

void expect_abc(Start& s, int delta) {
  using Unary = int64_t(int64_t);
  using Binary = int64_t(int64_t, int64_t);
  auto* a = s.fn<Unary>("a");
  auto* b = s.fn<Unary>("b");
  auto* c = s.fn<Binary>("c");
  ASSERT_TRUE(a && b && c);
  for (int64_t x : {-7, 0, 4, 1000}) {
    EXPECT_EQ(a(x), want_a(x, delta)) << x;
    EXPECT_EQ(b(x), want_b(x, delta)) << x;
    EXPECT_EQ(c(x, 0), want_c(x, 0)) << x;
    EXPECT_EQ(c(x, 1), want_c(x, 1)) << x;
  }
}

class CombinedObjects : public ::testing::Test {
 protected:
  TempDir dir;
  std::string store() const { return dir.path() + "/store"; }
  std::string file(const std::string& name) const { return dir.path() + "/" + name; }
  std::vector<std::string> abc() const { return {file("a.bc"), file("b.bc"), file("c.bc")}; }
  void SetUp() override {
    write_bitcode(file("a.bc"), kA);
    write_bitcode(file("b.bc"), module_b(100));
    write_bitcode(file("c.bc"), kC);
  }
};

TEST_F(CombinedObjects, ColdStoresOneObjectAndAWarmStartLinksIt) {
  {
    Start cold(store(), abc());
    EXPECT_EQ(cold.codegen(), 3u);
    EXPECT_EQ(cold.sets_stored(), 1u);
    EXPECT_EQ(cold.set_hits(), 0u);
    expect_abc(cold, 100);
  }
  Start warm(store(), abc());
  EXPECT_EQ(warm.codegen(), 0u);
  EXPECT_EQ(warm.set_hits(), 1u);
  EXPECT_EQ(warm.sets_stored(), 0u);
  EXPECT_EQ(warm.counters->lookups.load(), 3u);
  EXPECT_EQ(warm.counters->hits.load(), 3u);
  expect_abc(warm, 100);
}

TEST_F(CombinedObjects, NeverUsedWhenOneOfItsModulesChanged) {
  { Start cold(store(), abc()); }
  // b changed: its object is compiled, the set is another set.
  write_bitcode(file("b.bc"), module_b(200));
  {
    Start changed(store(), abc());
    EXPECT_EQ(changed.set_hits(), 0u);
    EXPECT_EQ(changed.codegen(), 1u);
    EXPECT_EQ(changed.sets_stored(), 1u);
    expect_abc(changed, 200);
  }
  {
    // And now the changed set is whole again, in any order.
    Start again(store(), {file("c.bc"), file("b.bc"), file("a.bc")});
    EXPECT_EQ(again.set_hits(), 1u);
    EXPECT_EQ(again.codegen(), 0u);
    expect_abc(again, 200);
  }
  // b as it was: the first set's combined object again.
  write_bitcode(file("b.bc"), module_b(100));
  {
    Start back(store(), abc());
    EXPECT_EQ(back.set_hits(), 1u);
    EXPECT_EQ(back.codegen(), 0u);
    expect_abc(back, 100);
  }
  // A set with a module added, or one left out, is another set: its
  // modules' objects (compiled for the one added), then a combined object
  // of its own.
  write_bitcode(file("d.bc"), "define i64 @d(i64 %x) {\n  %y = sub i64 %x, 1\n  ret i64 %y\n}\n");
  {
    Start more(store(), {file("a.bc"), file("b.bc"), file("c.bc"), file("d.bc")});
    EXPECT_EQ(more.set_hits(), 0u);
    EXPECT_EQ(more.codegen(), 1u);
    EXPECT_EQ(more.sets_stored(), 1u);
    expect_abc(more, 100);
    auto* d = more.fn<int64_t(int64_t)>("d");
    ASSERT_TRUE(d);
    EXPECT_EQ(d(10), 9);
  }
  Start fewer(store(), {file("a.bc"), file("b.bc")});
  EXPECT_EQ(fewer.set_hits(), 0u);
  EXPECT_EQ(fewer.codegen(), 0u);
  EXPECT_EQ(fewer.sets_stored(), 1u);
  auto* a = fewer.fn<int64_t(int64_t)>("a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a(-9), want_a(-9, 100));
}

TEST_F(CombinedObjects, ANameDefinedInTwoModulesIsLinkedOneByOneAndRemembered) {
  write_bitcode(file("w1.bc"), weak_module("one", 1));
  write_bitcode(file("w2.bc"), weak_module("two", 2));
  const std::vector<std::string> files = {file("w1.bc"), file("w2.bc")};
  for (int round = 0; round < 2; ++round) {
    Start s(store(), files);
    EXPECT_EQ(s.sets_stored(), 0u) << round;
    EXPECT_EQ(s.set_hits(), 0u) << round;
    EXPECT_EQ(s.codegen(), round == 0 ? 2u : 0u) << round;
    auto* one = s.fn<int64_t()>("one");
    auto* two = s.fn<int64_t()>("two");
    ASSERT_TRUE(one && two);
    // Both call the one definition the JIT chose, as without the cache.
    EXPECT_EQ(one(), two());
  }
  // The refusal is what the set's entry holds: nothing to link.
  auto cache = open_cache(store());
  auto keys = kl::FrontendKeys::for_jit(kl::JitOptions{});
  ASSERT_TRUE(keys);
  std::vector<kcache::Key> fronts;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fronts.push_back(keys->key(kcache::hash_bytes(bytes)).key);
  }
  auto set = keys->set_key(fronts);
  ASSERT_TRUE(set);
  EXPECT_TRUE(cache->get(set->key).has_value());
  EXPECT_EQ(keys->find_set(*cache, set->key), nullptr);
  EXPECT_EQ(keys->store_set(*cache, fronts), nullptr);
}

TEST_F(CombinedObjects, ADamagedCombinedObjectIsAMissAndIsReplaced) {
  { Start cold(store(), abc()); }
  // The set's entry overwritten with bytes that are no object.
  auto keys = kl::FrontendKeys::for_jit(kl::JitOptions{});
  ASSERT_TRUE(keys);
  std::vector<kcache::Key> fronts;
  for (const auto& f : abc()) {
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fronts.push_back(keys->key(kcache::hash_bytes(bytes)).key);
  }
  auto set = keys->set_key(fronts);
  ASSERT_TRUE(set);
  {
    auto cache = open_cache(store());
    std::vector<kcache::Artifact> junk;
    junk.push_back({"obj", std::string(4096, 'x')});
    ASSERT_TRUE(cache->put(*set, std::move(junk)));
  }
  {
    Start damaged(store(), abc());
    EXPECT_EQ(damaged.set_hits(), 0u);
    EXPECT_EQ(damaged.counters->bad_objects.load(), 1u);
    EXPECT_EQ(damaged.codegen(), 0u);
    EXPECT_EQ(damaged.sets_stored(), 1u);
    expect_abc(damaged, 100);
  }
  Start warm(store(), abc());
  EXPECT_EQ(warm.set_hits(), 1u);
  expect_abc(warm, 100);
}

TEST_F(CombinedObjects, OffLinksEachModulesObject) {
  { Start cold(store(), abc(), /*combine=*/false); }
  Start warm(store(), abc(), /*combine=*/false);
  EXPECT_EQ(warm.set_hits(), 0u);
  EXPECT_EQ(warm.sets_stored(), 0u);
  EXPECT_EQ(warm.codegen(), 0u);
  EXPECT_EQ(warm.counters->hits.load(), 3u);
  expect_abc(warm, 100);
}

// An exception thrown by the host unwinds through two modules' code in one
// combined object (both modules' EH frames, in one object, registered) and
// is caught beyond it; with either linker.
class CombinedObjectsLinkers : public CombinedObjects, public ::testing::WithParamInterface<bool> {};

TEST_P(CombinedObjectsLinkers, ExceptionsUnwindThroughACombinedObject) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the test's own code throws through x86-64 JIT code";
#endif
  write_bitcode(file("t1.bc"),
                "define i64 @through1(void ()* %f, i64 %x) #0 {\n  call void %f()\n  %r = add i64 %x, 1\n"
                "  ret i64 %r\n}\nattributes #0 = { uwtable }\n");
  write_bitcode(file("t2.bc"),
                "declare i64 @through1(void ()*, i64)\n"
                "define i64 @through2(void ()* %f, i64 %x) #0 {\n  %r = call i64 @through1(void ()* %f, i64 %x)\n"
                "  %s = add i64 %r, 10\n  ret i64 %s\n}\nattributes #0 = { uwtable }\n");
  for (int round = 0; round < 2; ++round) {  // made from compiled objects, then found
    Start s(store(), {file("t1.bc"), file("t2.bc")}, /*combine=*/true, /*lljit_linker=*/GetParam());
    EXPECT_EQ(s.set_hits(), round == 0 ? 0u : 1u);
    EXPECT_EQ(s.sets_stored(), round == 0 ? 1u : 0u);
    auto* through2 = s.fn<int64_t(void (*)(), int64_t)>("through2");
    ASSERT_TRUE(through2);
    EXPECT_EQ(through2([] {}, 31), 42);
    int caught = 0;
    try {
      through2([] { throw std::runtime_error("from the host"); }, 1);
    } catch (const std::runtime_error& e) {
      caught = std::string(e.what()) == "from the host" ? 1 : 2;
    }
    EXPECT_EQ(caught, 1) << "round " << round;
  }
}

// Names that were each module's own meet in one object: module x calls the
// host's getpagesize and keeps a static `count`; module y has a static
// getpagesize of its own and exports a global `count`. Each call and load still reaches its
// own module's (or the host's) definition, and `count` is y's to the
// outside, with either linker (RuntimeDyld resolves by name).
TEST_P(CombinedObjectsLinkers, ModulesNamesStayTheirOwn) {
  // @fn: getpagesize() + count, whichever of each its module sees.
  auto sum_of = [](const std::string& fn) {
    return "define i64 @" + fn +
           "(i64 %v) {\n"
           "  %p = call i32 @getpagesize()\n"
           "  %a = sext i32 %p to i64\n"
           "  %c = load volatile i64, {P64} @count\n"
           "  %r = add i64 %a, %c\n"
           "  ret i64 %r\n"
           "}\n";
  };
  write_bitcode(file("x.bc"), "declare i32 @getpagesize()\n@count = internal global i64 7\n" + sum_of("x"));
  write_bitcode(
      file("y.bc"),
      "@count = global i64 100\ndefine internal i32 @getpagesize() noinline {\n  ret i32 1234\n}\n" + sum_of("y"));
  for (int round = 0; round < 2; ++round) {
    Start s(store(), {file("x.bc"), file("y.bc")}, /*combine=*/true, /*lljit_linker=*/GetParam());
    EXPECT_EQ(s.set_hits(), round == 0 ? 0u : 1u);
    EXPECT_EQ(s.sets_stored(), round == 0 ? 1u : 0u);
    auto* x = s.fn<int64_t(int64_t)>("x");
    auto* y = s.fn<int64_t(int64_t)>("y");
    ASSERT_TRUE(x && y);
    EXPECT_EQ(x(0), ::getpagesize() + 7) << "round " << round;
    EXPECT_EQ(y(0), 1234 + 100) << "round " << round;
    auto count = s.jit->lookup("count");
    ASSERT_TRUE(bool(count)) << llvm::toString(count.takeError());
    EXPECT_EQ(*kl::compat::jit_pointer<int64_t*>(*count), 100);
  }
}

INSTANTIATE_TEST_SUITE_P(Linkers, CombinedObjectsLinkers, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("LljitLinker") : std::string("RuntimeDyld");
                         });

}  // namespace

// A client of the installed kcache::llvm: JITs one IR function through
// make_cached_lljit twice, each time with a fresh cache object and JIT over
// the same folder. The first JIT compiles the module, the second loads its
// object from the disk tier without running code generation; both must run
// and return the right value. Exits 0 when every check holds.
#include <kcache/cache.h>
#include <kcache/llvm.h>

#include <llvm/AsmParser/Parser.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

// The LLVM headers seen here are those of the LLVM the package found.
#if defined(KCACHE_CONSUMER_LLVM_MAJOR)
static_assert(LLVM_VERSION_MAJOR == KCACHE_CONSUMER_LLVM_MAJOR, "LLVM headers of another release");
#endif

namespace {

constexpr const char* kIr = R"(
define i32 @kc_mad(i32 %a, i32 %b) {
  %p = mul i32 %a, %b
  %r = add i32 %p, 7
  ret i32 %r
}
)";

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "consumer (LLVM): FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// One JIT over the cache in `dir`: adds the module, calls kc_mad(6, 7).
// Returns the counters of the JIT's compiler.
std::shared_ptr<kcache::llvm::CompileCounters> jit_once(const std::string& dir) {
  auto counters = std::make_shared<kcache::llvm::CompileCounters>();
  kcache::Options options;
  options.dir = dir;
  auto cache = kcache::Cache::open(options);
  check(cache != nullptr, "cache opened");
  if (!cache) return counters;
  kcache::llvm::JitOptions jo;
  jo.counters = counters;
  auto jit = kcache::llvm::make_cached_lljit(*cache, jo);
  if (!jit) {
    check(false, "make_cached_lljit: " + ::llvm::toString(jit.takeError()));
    return counters;
  }
  auto context = std::make_unique<::llvm::LLVMContext>();
  ::llvm::SMDiagnostic diag;
  auto module = ::llvm::parseAssemblyString(kIr, diag, *context);
  check(module != nullptr, "IR parsed");
  if (!module) return counters;
  if (auto err = (*jit)->addIRModule(::llvm::orc::ThreadSafeModule(std::move(module), std::move(context)))) {
    check(false, "addIRModule: " + ::llvm::toString(std::move(err)));
    return counters;
  }
  auto sym = (*jit)->lookup("kc_mad");
  if (!sym) {
    check(false, "lookup: " + ::llvm::toString(sym.takeError()));
    return counters;
  }
  auto* fn = kcache::llvm::compat::jit_pointer<int (*)(int, int)>(*sym);
  check(fn(6, 7) == 49, "kc_mad(6, 7) == 49");
  return counters;
}

}  // namespace

int main() {
  ::llvm::InitializeNativeTarget();
  ::llvm::InitializeNativeTargetAsmPrinter();
  std::string dir = (std::filesystem::temp_directory_path() / "kcache-consumer-llvm-XXXXXX").string();
  if (!mkdtemp(dir.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  auto cold = jit_once(dir);
  check(cold->misses == 1 && cold->codegen_runs == 1, "the first JIT compiled the module");
  auto warm = jit_once(dir);
  check(warm->hits == 1 && warm->codegen_runs == 0, "the second JIT loaded the stored object");
  std::filesystem::remove_all(dir);
  if (failures) return 1;
  std::printf("consumer (LLVM %s): compiled once, then loaded from the cache; kc_mad(6, 7) = 49\n",
              LLVM_VERSION_STRING);
  std::printf("consumer (LLVM): ok\n");
  return 0;
}

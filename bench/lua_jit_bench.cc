// kcache_bench_lua_jit: a real C code base (Lua 5.4, one bitcode file per
// translation unit, made by scripts/lua_bench.sh) JIT-ed through
// make_cached_lljit: no cache (KCACHE_DISABLE=1), cold and warm, each run in
// a process of its own, repeated; prints medians of wall and CPU time.
//
//   kcache_bench_lua_jit --bc DIR [--reps N] [--keys frontend|module] [--json]
//   kcache_bench_lua_jit --bc DIR --cache DIR --run     one run (JSON)
//
// A run reads every DIR/*.bc. With --keys frontend (the default) each file's
// bytes are its front-end key (FrontendKeys): a hit goes to the JIT as an
// object without parsing the bitcode; a miss is parsed, tagged with the
// front-end key and with the bytes' digest (so the compiler does not
// serialise it again) and compiled. With --keys module the compiler keys each
// parsed module on its own bitcode (object_key(Module&)), as before stage
// keys. Then one defined function of every file is looked up, which compiles
// or links it -- "ready" -- and the JIT-ed Lua runs `return 6*7`.
#include <dirent.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/TargetSelect.h>

#include "bitcode_dir.h"
#include "kcache/cache.h"
#include "kcache/llvm.h"

namespace {

struct Args {
  std::string bc, cache;
  std::string keys = "frontend";
  unsigned reps = 3;
  bool run = false, json = false;
};

using kcache::bench::clock_s;
using kcache::bench::now_s;

[[noreturn]] void die(const std::string& msg) { kcache::bench::die("kcache_bench_lua_jit", msg); }
std::vector<std::string> bc_files(const std::string& dir) {
  return kcache::bench::bc_files("kcache_bench_lua_jit", dir);
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A defined, exported function of the module (looking it up materialises the module).
std::string symbol_of(const llvm::Module& m) {
  for (const auto& f : m)
    if (!f.isDeclaration() && f.hasExternalLinkage()) return f.getName().str();
  return {};
}

std::string symbol_of(const llvm::MemoryBuffer& obj) {
  auto o = llvm::object::ObjectFile::createObjectFile(obj.getMemBufferRef());
  if (!o) {
    llvm::consumeError(o.takeError());
    return {};
  }
  for (const auto& s : (*o)->symbols()) {
    auto flags = s.getFlags();
    auto type = s.getType();
    if (!flags || !type) {
      if (!flags) llvm::consumeError(flags.takeError());
      if (!type) llvm::consumeError(type.takeError());
      continue;
    }
    if ((*flags & llvm::object::SymbolRef::SF_Global) && !(*flags & llvm::object::SymbolRef::SF_Undefined) &&
        *type == llvm::object::SymbolRef::ST_Function) {
      auto name = s.getName();
      if (name) return name->str();
      llvm::consumeError(name.takeError());
    }
  }
  return {};
}

int run_once(const Args& a) {
  double t0 = now_s();
  kcache::Options o;
  o.dir = a.cache;
  o.producer = "kcache_bench_lua_jit";
  o = kcache::Options::from_env(o);
  o.dir = a.cache;
  o.memory_tier = false;  // every module is asked for once per process
  auto cache = kcache::Cache::open(o);
  auto C = std::make_shared<kcache::llvm::CompileCounters>();
  kcache::llvm::JitOptions jo;
  jo.opt_level = 2;
  jo.counters = C;
  jo.key_extra = {{"client", "lua-bench/1"}};
  auto jit = kcache::llvm::make_cached_lljit(*cache, jo);
  if (!jit) die(llvm::toString(jit.takeError()));
  std::optional<kcache::llvm::FrontendKeys> fk;
  if (a.keys == "frontend" && !o.disabled) fk = *kcache::llvm::FrontendKeys::for_jit(jo);

  std::vector<std::string> syms;
  auto files = bc_files(a.bc);
  if (files.empty()) die("no .bc files in " + a.bc);
  uint64_t parsed = 0;
  for (const auto& path : files) {
    std::string bytes = read_all(path);
    kcache::KeyInfo front;
    if (fk) {
      double k0 = now_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      // The bitcode file is what this "front end" read: its bytes are the key.
      kcache::Digest d = kcache::hash_bytes(bytes);
      front = fk->key(d);
      C->key_ns += static_cast<uint64_t>((now_s() - k0) * 1e9);
      C->key_cpu_ns += static_cast<uint64_t>((clock_s(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e9);
      if (auto obj = fk->find(*cache, front.key, C.get())) {
        syms.push_back(symbol_of(*obj));
        if (auto err = (*jit)->addObjectFile(std::move(obj))) die(llvm::toString(std::move(err)));
        continue;
      }
    }
    auto ctx = std::make_unique<llvm::LLVMContext>();
    auto m = llvm::parseBitcodeFile(llvm::MemoryBufferRef(bytes, path), *ctx);
    if (!m) die(path + ": " + llvm::toString(m.takeError()));
    ++parsed;
    if (fk) {
      kcache::llvm::set_frontend_key(**m, front.key);
      kcache::llvm::set_ir_digest(**m, kcache::hash_bytes(bytes));
    }
    syms.push_back(symbol_of(**m));
    if (auto err = (*jit)->addIRModule(llvm::orc::ThreadSafeModule(std::move(*m), std::move(ctx))))
      die(llvm::toString(std::move(err)));
  }
  double t_add = now_s(), cpu_add = clock_s(CLOCK_THREAD_CPUTIME_ID);
  const double pre_key = C->key_ns / 1e9, pre_cache = C->lookup_ns / 1e9;
  const double pre_key_cpu = C->key_cpu_ns / 1e9, pre_cache_cpu = C->lookup_cpu_ns / 1e9;
  for (const auto& s : syms) {
    if (s.empty()) continue;
    auto sym = (*jit)->lookup(s);
    if (!sym) die("lookup " + s + ": " + llvm::toString(sym.takeError()));
  }
  double t_ready = now_s(), cpu_ready = clock_s(CLOCK_THREAD_CPUTIME_ID), pcpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);

  // Run the JIT-ed interpreter.
  auto addr = [&](const char* n) -> uint64_t {
    auto s = (*jit)->lookup(n);
    if (!s) die(std::string("lookup ") + n + ": " + llvm::toString(s.takeError()));
    return reinterpret_cast<uint64_t>(kcache::llvm::compat::jit_pointer<void*>(*s));
  };
  using NewState = void* (*)();
  using OpenLibs = void (*)(void*);
  using LoadString = int (*)(void*, const char*);
  using PCallK = int (*)(void*, int, int, int, intptr_t, void*);
  using ToIntegerX = long long (*)(void*, int, int*);
  void* L = reinterpret_cast<NewState>(addr("luaL_newstate"))();
  reinterpret_cast<OpenLibs>(addr("luaL_openlibs"))(L);
  long long result = -1;
  if (reinterpret_cast<LoadString>(addr("luaL_loadstring"))(
          L, "local t = {} for i = 1, 6 do t[i] = i end return #t * 7") == 0 &&
      reinterpret_cast<PCallK>(addr("lua_pcallk"))(L, 0, 1, 0, 0, nullptr) == 0)
    result = reinterpret_cast<ToIntegerX>(addr("lua_tointegerx"))(L, -1, nullptr);

  const auto& c = *C;
  double key_s = c.key_ns / 1e9, cache_s = c.lookup_ns / 1e9, compile_s = c.compile_ns / 1e9;
  double link_s = (t_ready - t_add) - (key_s - pre_key) - (cache_s - pre_cache) - compile_s;
  double key_cpu = c.key_cpu_ns / 1e9, cache_cpu = c.lookup_cpu_ns / 1e9;
  double link_cpu =
      (cpu_ready - cpu_add) - (key_cpu - pre_key_cpu) - (cache_cpu - pre_cache_cpu) - c.compile_cpu_ns / 1e9;
  (void)cache->flush();
  std::printf(
      "{\"files\":%zu,\"parsed\":%llu,\"ready_s\":%.6f,\"ready_cpu_s\":%.6f,\"key_s\":%.6f,\"cache_s\":%.6f,"
      "\"compile_s\":%.6f,\"link_s\":%.6f,\"key_cpu_s\":%.6f,\"cache_cpu_s\":%.6f,\"link_cpu_s\":%.6f,"
      "\"lua_result\":%lld,\"jit\":%s}\n",
      files.size(), (unsigned long long)parsed, t_ready - t0, pcpu, key_s, cache_s, compile_s, link_s, key_cpu,
      cache_cpu, link_cpu, result, c.to_json().c_str());
  return result == 42 ? 0 : 2;
}

std::string run_child(const Args& a, const char* self, const std::string& cache, bool disabled) {
  std::vector<std::string> argv = {self, "--bc", a.bc, "--cache", cache, "--keys", a.keys, "--run"};
  int fd[2];
  if (::pipe(fd) != 0) die("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    if (disabled)
      ::setenv("KCACHE_DISABLE", "1", 1);
    else
      ::unsetenv("KCACHE_DISABLE");
    ::dup2(fd[1], 1);
    ::close(fd[0]);
    ::close(fd[1]);
    std::vector<char*> cargv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    ::execv(self, cargv.data());
    _exit(127);
  }
  ::close(fd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("child run failed: " + out);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

double num(const std::string& json, const std::string& field) {
  auto p = json.find("\"" + field + "\":");
  if (p == std::string::npos) die("no " + field);
  return std::strtod(json.c_str() + p + field.size() + 3, nullptr);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + s);
      return argv[++i];
    };
    if (s == "--bc")
      a.bc = val();
    else if (s == "--cache")
      a.cache = val();
    else if (s == "--keys")
      a.keys = val();
    else if (s == "--reps")
      a.reps = static_cast<unsigned>(std::stoul(val()));
    else if (s == "--run")
      a.run = true;
    else if (s == "--json")
      a.json = true;
    else
      die("unknown argument " + s + " (see the comment at the top of bench/lua_jit_bench.cc)");
  }
  if (a.bc.empty()) die("--bc DIR is required (scripts/lua_bench.sh makes it)");
  if (a.keys != "frontend" && a.keys != "module") die("--keys frontend|module");
  if (a.run) {
    if (a.cache.empty()) die("--run needs --cache DIR");
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return run_once(a);
  }
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("cannot find own executable");
  self[n] = '\0';
  std::vector<double> nc, nc_cpu, cold, cold_cpu, warm, warm_cpu, wk, wl, wkc, wlc;
  for (unsigned r = 0; r < std::max(1u, a.reps); ++r) {
    std::string tmpl = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kcache-lua-XXXXXX";
    if (!::mkdtemp(tmpl.data())) die("mkdtemp");
    // Which of no cache and cold goes first alternates, so neither always
    // runs on a machine the other has just warmed; warm follows cold.
    std::string x, c;
    if (r % 2 == 0) x = run_child(a, self, tmpl + "/c", true);
    c = run_child(a, self, tmpl + "/c", false);
    if (r % 2 == 1) x = run_child(a, self, tmpl + "/c", true);
    std::string w = run_child(a, self, tmpl + "/c", false);
    (void)::system(("rm -rf '" + tmpl + "'").c_str());
    nc.push_back(num(x, "ready_s"));
    nc_cpu.push_back(num(x, "ready_cpu_s"));
    cold.push_back(num(c, "ready_s"));
    cold_cpu.push_back(num(c, "ready_cpu_s"));
    warm.push_back(num(w, "ready_s"));
    warm_cpu.push_back(num(w, "ready_cpu_s"));
    wk.push_back(num(w, "key_s") + num(w, "cache_s"));
    wl.push_back(num(w, "link_s"));
    wkc.push_back(num(w, "key_cpu_s") + num(w, "cache_cpu_s"));
    wlc.push_back(num(w, "link_cpu_s"));
    if (num(w, "codegen_runs") != 0) die("warm run compiled: " + w);
    if (!a.json)
      std::printf(
          "rep %u: nocache %.3f s (cpu %.3f), cold %.3f s (cpu %.3f), warm %.4f s (cpu %.4f); warm keys+lookups "
          "%.2f ms (cpu %.2f), linking %.2f ms (cpu %.2f)\n",
          r + 1, nc.back(), nc_cpu.back(), cold.back(), cold_cpu.back(), warm.back(), warm_cpu.back(), wk.back() * 1e3,
          wkc.back() * 1e3, wl.back() * 1e3, wlc.back() * 1e3);
  }
  // The median of each repetition's own ratio: its two runs are back to
  // back, so what drifts across the invocation cancels.
  std::vector<double> paired;
  for (size_t r = 0; r < nc.size(); ++r)
    if (nc[r] > 0) paired.push_back(cold[r] / nc[r]);
  std::printf(
      "{\"keys\":\"%s\",\"reps\":%zu,\"nocache_s\":%.4f,\"cold_s\":%.4f,\"warm_s\":%.5f,"
      "\"nocache_cpu_s\":%.4f,\"cold_cpu_s\":%.4f,\"warm_cpu_s\":%.5f,\"cold_over_nocache\":%.4f,"
      "\"cold_over_nocache_paired\":%.4f,\"cold_over_nocache_cpu\":%.4f,\"warm_kcache_s\":%.5f,\"warm_link_s\":%.5f,"
      "\"warm_kcache_share_of_link\":%.4f,"
      "\"warm_kcache_cpu_s\":%.5f,\"warm_link_cpu_s\":%.5f,\"warm_kcache_cpu_share_of_link\":%.4f}\n",
      a.keys.c_str(), nc.size(), median(nc), median(cold), median(warm), median(nc_cpu), median(cold_cpu),
      median(warm_cpu), median(cold) / median(nc), paired.empty() ? 0.0 : median(paired),
      median(cold_cpu) / median(nc_cpu), median(wk), median(wl), median(wk) / median(wl), median(wkc), median(wlc),
      median(wkc) / median(wlc));
  return 0;
}

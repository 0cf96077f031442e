// kcache_bench_llvm_codebase: a real C code base, one bitcode file per
// translation unit (made by scripts/llvm_codebase_bench.sh), JIT-ed four
// ways, each run in a process of its own:
//
//   plain    a plain LLJIT with the same pipeline (examples/jit/plain_lljit.h):
//            no kcache code on the path; the baseline
//   nocache  make_cached_lljit + BitcodeLoader with KCACHE_DISABLE=1
//   cold     the same on an empty cache folder
//   warm     the same again on that folder
//
//   kcache_bench_llvm_codebase --bc DIR [--rounds N] [--check sha|lua|cares|none]
//   kcache_bench_llvm_codebase --bc DIR --coop N [--rounds R] [--check ...]
//   kcache_bench_llvm_codebase --bc DIR --symbols FILE --run plain|kcache [--cache DIR] [--batch T] [--rtdyld]
//                              [--check ...]
//
// --coop N: processes sharing a cold start. Each round, on empty stores,
// in wall time from the first fork to the last exit: one process loading
// every file (BitcodeLoader::add_files, one compile thread), N such
// processes started together on the same list in the same order, and (the
// baseline of before) N processes adding the files one by one (add_file).
// Prints each, the ratio one / N (how much sooner N processes finish than
// one) and checks each module was compiled once in all and that every
// process's JIT answers right. Under other load wall time says more about
// that load than about kcache, so the ratios are also given over the
// quiet rounds alone: those in which the one process had a core to itself
// (its CPU time at least 95 % of its wall time).
//
// Every round runs plain, nocache and cold in a rotating order (each goes
// first, second and third equally often over three rounds), then warm. CPU
// time is the child's whole user + system time (wait4's rusage: every
// thread, exit included), which other processes on the machine inflate far
// less than wall time. Ratios are paired: each round's cold / plain,
// nocache / plain and warm / plain, then the median (and the range) of the
// rounds' ratios. A run adds every file (BitcodeLoader::add_file, or parse
// + addIRModule for plain), then looks up one defined function of each
// file, which compiles or links it ("ready"), then runs the JIT-ed code and
// checks its answer (--check sha: pycryptodome's SHA-256 and MD5 of "abc";
// lua: Lua's `return 6*7`-style chunk; cares: c-ares's version, an error
// text and its library init). "kcache share of a warm start" is
// the warm run's key and lookup CPU time (the compiling thread's) over its
// process CPU time to ready. After the warm run, two more on its folder add
// the files together (add_files): the first stores the set's combined
// object (FrontendKeys::set_key), the second links it; warm_set_over_warm
// is that run's CPU time over the warm run's. Two last runs add no file: the
// floor every start pays (process start, libLLVM loaded, cache opened, JIT
// made), and a plain LLJIT's (the same without the cache). Built with
// -DKCACHE_LLVM_STATIC=ON, the process carries LLVM in itself, as hosts
// that link LLVM's static libraries do, and loads no libLLVM.so.
#include <dirent.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>

#include "bitcode_dir.h"
#include "kcache/cache.h"
#include "kcache/llvm.h"
#include "plain_lljit.h"

namespace {

struct Args {
  std::string bc, cache, symbols, run, check = "none";
  unsigned rounds = 3;
  unsigned coop = 0;    // --coop N: the cooperative cold start with N processes
  unsigned batch = 0;   // --batch T: add_files on T compile threads (0: add_file one by one)
  bool rtdyld = false;  // --rtdyld: link with RuntimeDyld (JitOptions::lljit_linker false)
};

using kcache::bench::clock_s;
using kcache::bench::now_s;

[[noreturn]] void die(const std::string& msg) { kcache::bench::die("kcache_bench_llvm_codebase", msg); }
std::vector<std::string> bc_files(const std::string& dir) {
  return kcache::bench::bc_files("kcache_bench_llvm_codebase", dir);
}

// file -> one defined external symbol, as "path\tsymbol" lines.
std::vector<std::pair<std::string, std::string>> read_symbols(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    auto tab = line.find('\t');
    if (tab == std::string::npos) continue;
    out.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return out;
}

// The driver: parses each file once (untimed) for a function to look up.
std::string write_symbols(const std::string& bc_dir, const std::string& out_path) {
  std::ofstream out(out_path);
  unsigned n = 0;
  for (const auto& path : bc_files(bc_dir)) {
    auto buf = llvm::MemoryBuffer::getFile(path);
    if (!buf) die("cannot read " + path);
    llvm::LLVMContext ctx;
    auto m = llvm::parseBitcodeFile((*buf)->getMemBufferRef(), ctx);
    if (!m) die(path + ": " + llvm::toString(m.takeError()));
    // A defined external function, else (a file of tables) a variable.
    std::string sym;
    for (const auto& f : **m)
      if (!f.isDeclaration() && f.hasExternalLinkage()) {
        sym = f.getName().str();
        break;
      }
    for (const auto& g : (*m)->globals())
      if (sym.empty() && !g.isDeclaration() && g.hasExternalLinkage()) sym = g.getName().str();
    if (sym.empty()) continue;
    out << path << '\t' << sym << '\n';
    ++n;
  }
  if (n == 0) die("no .bc file with a defined symbol in " + bc_dir);
  return out_path;
}

template <typename Fn>
Fn fn(llvm::orc::LLJIT& jit, const char* name) {
  auto s = jit.lookup(name);
  if (!s) die(std::string("lookup ") + name + ": " + llvm::toString(s.takeError()));
  return kcache::llvm::compat::jit_pointer<Fn>(*s);
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* h = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += {h[p[i] >> 4], h[p[i] & 15]};
  return s;
}

// Runs the JIT-ed code; true when it answers right.
bool check(llvm::orc::LLJIT& jit, const std::string& what) {
  if (what == "none") return true;
  if (what == "sha") {
    using Init = int (*)(void**);
    using Update = int (*)(void*, const uint8_t*, size_t);
    using Digest = int (*)(const void*, uint8_t*, size_t);
    using Destroy = int (*)(void*);
    const uint8_t abc[] = {'a', 'b', 'c'};
    uint8_t d[32];
    void* st = nullptr;
    bool ok = fn<Init>(jit, "SHA256_init")(&st) == 0 && fn<Update>(jit, "SHA256_update")(st, abc, 3) == 0 &&
              fn<Digest>(jit, "SHA256_digest")(st, d, 32) == 0 &&
              hex(d, 32) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    if (st) fn<Destroy>(jit, "SHA256_destroy")(st);
    using Md5Digest = int (*)(const void*, uint8_t*);
    st = nullptr;
    ok = ok && fn<Init>(jit, "MD5_init")(&st) == 0 && fn<Update>(jit, "MD5_update")(st, abc, 3) == 0 &&
         fn<Md5Digest>(jit, "MD5_digest")(st, d) == 0 && hex(d, 16) == "900150983cd24fb0d6963f7d28e17f72";
    if (st) fn<Destroy>(jit, "MD5_destroy")(st);
    return ok;
  }
  if (what == "lua") {
    using NewState = void* (*)();
    using OpenLibs = void (*)(void*);
    using LoadString = int (*)(void*, const char*);
    using PCallK = int (*)(void*, int, int, int, intptr_t, void*);
    using ToIntegerX = long long (*)(void*, int, int*);
    void* L = fn<NewState>(jit, "luaL_newstate")();
    fn<OpenLibs>(jit, "luaL_openlibs")(L);
    return fn<LoadString>(jit, "luaL_loadstring")(L, "local t = {} for i = 1, 6 do t[i] = i end return #t * 7") == 0 &&
           fn<PCallK>(jit, "lua_pcallk")(L, 0, 1, 0, 0, nullptr) == 0 &&
           fn<ToIntegerX>(jit, "lua_tointegerx")(L, -1, nullptr) == 42;
  }
  if (what == "cares") {
    using Version = const char* (*)(int*);
    using StrError = const char* (*)(int);
    using LibInit = int (*)(int);
    using LibCleanup = void (*)();
    int v = 0;
    const char* text = fn<Version>(jit, "ares_version")(&v);
    bool ok = text && v >> 16 == 1 &&
              std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 0xff) + "." + std::to_string(v & 0xff) == text;
    ok = ok && std::string(fn<StrError>(jit, "ares_strerror")(0)) == "Successful completion";
    ok = ok && fn<LibInit>(jit, "ares_library_init")(1 /* ARES_LIB_INIT_ALL */) == 0;
    if (ok) fn<LibCleanup>(jit, "ares_library_cleanup")();
    return ok;
  }
  die("--check sha|lua|cares|none");
}

int run_once(const Args& a) {
  double t0 = now_s();
  auto syms = read_symbols(a.symbols);
  std::unique_ptr<kcache::Cache> cache;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  auto C = std::make_shared<kcache::llvm::CompileCounters>();
  if (a.run == "plain") {
    auto j = kjit::make_plain_lljit(2);
    if (!j) die(llvm::toString(j.takeError()));
    jit = std::move(*j);
    for (const auto& [path, sym] : syms) {
      auto buf = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
      if (!buf) die("cannot read " + path);
      auto ctx = std::make_unique<llvm::LLVMContext>();
      auto m = llvm::parseBitcodeFile((*buf)->getMemBufferRef(), *ctx);
      if (!m) die(path + ": " + llvm::toString(m.takeError()));
      if (auto err = jit->addIRModule(llvm::orc::ThreadSafeModule(std::move(*m), std::move(ctx))))
        die(llvm::toString(std::move(err)));
    }
  } else {
    kcache::Options o;
    o.dir = a.cache;
    o.producer = "kcache_bench_llvm_codebase";
    o = kcache::Options::from_env(o);
    o.dir = a.cache;
    o.memory_tier = false;  // every module is asked for once per process
    cache = kcache::Cache::open(o);
    kcache::llvm::JitOptions jo;
    jo.opt_level = 2;
    jo.counters = C;
    jo.key_extra = {{"client", "codebase-bench/1"}};
    jo.lljit_linker = !a.rtdyld;
    auto j = kcache::llvm::make_cached_lljit(*cache, jo);
    if (!j) die(llvm::toString(j.takeError()));
    jit = std::move(*j);
    auto loader = kcache::llvm::BitcodeLoader::for_jit(*cache, *jit, jo);
    if (!loader) die(loader.error().to_string());
    if (a.batch) {
      std::vector<std::string> paths;
      for (const auto& [path, sym] : syms) paths.push_back(path);
      if (auto err = loader->add_files(paths, nullptr, a.batch)) die(llvm::toString(std::move(err)));
    } else {
      for (const auto& [path, sym] : syms)
        if (auto err = loader->add_file(path)) die(path + ": " + llvm::toString(std::move(err)));
    }
  }
  for (const auto& [path, sym] : syms) {
    auto s = jit->lookup(sym);
    if (!s) die("lookup " + sym + ": " + llvm::toString(s.takeError()));
  }
  double t_ready = now_s(), pcpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  bool ok = check(*jit, a.check);
  if (cache) (void)cache->flush();
  const auto& c = *C;
  std::printf(
      "{\"run\":\"%s\",\"files\":%zu,\"ready_s\":%.6f,\"ready_cpu_s\":%.6f,\"key_cpu_s\":%.6f,\"cache_cpu_s\":%.6f,"
      "\"compile_cpu_s\":%.6f,\"check\":%s,\"jit\":%s}\n",
      a.run.c_str(), syms.size(), t_ready - t0, pcpu, c.key_cpu_ns / 1e9, c.lookup_cpu_ns / 1e9, c.compile_cpu_ns / 1e9,
      ok ? "true" : "false", c.to_json().c_str());
  return ok ? 0 : 2;
}

struct Child {
  std::string out;
  double cpu_s = 0;  // user + system of the whole child
  double sys_s = 0;  // its system part
  long minflt = 0;   // page faults served without I/O
};

struct Running {
  pid_t pid;
  int fd;  // the child's stdout
  std::string mode;
};

// Starts `self` as a child in `mode` (--batch `batch` when not 0).
Running start_child(const Args& a, const char* self, const std::string& mode, const std::string& cache, bool disabled,
                    unsigned batch = 0) {
  std::vector<std::string> argv = {self, "--bc", a.bc, "--symbols", a.symbols, "--run", mode, "--check", a.check};
  if (!cache.empty()) argv.insert(argv.end(), {"--cache", cache});
  if (batch) argv.insert(argv.end(), {"--batch", std::to_string(batch)});
  int fd[2];
  if (::pipe(fd) != 0) die("pipe");
  pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    // A session of its own, as a process started on its own has: where the
    // scheduler groups processes by session (autogroup), N children of one
    // session would share one session's part of the machine's CPU when
    // other sessions keep it busy, and N processes could never finish
    // sooner than one.
    ::setsid();
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
  return {pid, fd[0], mode};
}

// Its output and CPU time once it ends (dies when it failed).
Child finish_child(const Running& r) {
  const int fd[2] = {r.fd, -1};
  const pid_t pid = r.pid;
  const std::string& mode = r.mode;
  Child c;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd[0], buf, sizeof buf)) > 0) c.out.append(buf, static_cast<size_t>(n));
  ::close(fd[0]);
  int st = 0;
  rusage ru{};
  ::wait4(pid, &st, 0, &ru);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die(mode + " run failed: " + c.out);
  c.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  c.sys_s = static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) * 1e-6;
  c.minflt = ru.ru_minflt;
  while (!c.out.empty() && c.out.back() == '\n') c.out.pop_back();
  return c;
}

Child run_child(const Args& a, const char* self, const std::string& mode, const std::string& cache, bool disabled,
                unsigned batch = 0) {
  return finish_child(start_child(a, self, mode, cache, disabled, batch));
}

double num(const std::string& json, const std::string& field) {
  auto p = json.find("\"" + field + "\":");
  if (p == std::string::npos) die("no " + field + " in " + json);
  return std::strtod(json.c_str() + p + field.size() + 3, nullptr);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string stat(const std::vector<double>& v) {
  char b[128];
  std::snprintf(b, sizeof b, "{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f}", median(v),
                v.empty() ? 0 : *std::min_element(v.begin(), v.end()),
                v.empty() ? 0 : *std::max_element(v.begin(), v.end()));
  return b;
}

// `n` processes started together on the empty store `dir`, each loading
// every file (add_files on one compile thread when `batch`, else add_file
// one by one): the wall time from the first start to the last end, and
// the code generator runs of each.
struct Together {
  double wall_s = 0;
  double busiest_cpu_s = 0;  // the largest CPU time of one of the processes
  std::vector<unsigned> codegen_runs;
};

Together together(const Args& a, const char* self, unsigned n, const std::string& dir, bool batch) {
  Together t;
  const double t0 = now_s();
  std::vector<Running> kids;
  for (unsigned k = 0; k < n; ++k) kids.push_back(start_child(a, self, "kcache", dir, false, batch ? 1 : 0));
  for (const auto& r : kids) {
    Child c = finish_child(r);
    t.codegen_runs.push_back(static_cast<unsigned>(num(c.out, "codegen_runs")));
    t.busiest_cpu_s = std::max(t.busiest_cpu_s, c.cpu_s);
  }
  t.wall_s = now_s() - t0;
  return t;
}

std::string runs_of(const Together& t) {
  std::string s;
  for (unsigned c : t.codegen_runs) s += (s.empty() ? "" : "+") + std::to_string(c);
  return s;
}

// --coop N (see the top of the file).
int coop_bench(const Args& a, const char* self, const std::string& tmp, unsigned files) {
  const unsigned n = a.coop;
  struct Round {
    Together one, coop, by_one;  // one process; n with add_files; n with add_file one by one
    // The share of a core the one process had: its CPU time over its wall.
    double one_share() const { return one.busiest_cpu_s / one.wall_s; }
    // Whether the machine left it a core (95 % or more) to itself.
    bool quiet() const { return one_share() >= 0.95; }
  };
  std::vector<Round> rounds;
  for (unsigned r = 0; r < std::max(1u, a.rounds); ++r) {
    const std::string dir = tmp + "/coop-" + std::to_string(r + 1);
    Round& x = rounds.emplace_back();
    for (unsigned k = 0; k < 3; ++k) {  // each first, second and third in turn
      switch ((r + k) % 3) {
        case 0:
          x.one = together(a, self, 1, dir + "-one", true);
          break;
        case 1:
          x.coop = together(a, self, n, dir + "-coop", true);
          break;
        default:
          x.by_one = together(a, self, n, dir + "-by-one", false);
          break;
      }
    }
    for (const Together* t : {&x.one, &x.coop, &x.by_one}) {
      unsigned sum = 0;
      for (unsigned c : t->codegen_runs) sum += c;
      if (sum != files) die("compiled " + std::to_string(sum) + " modules of " + std::to_string(files));
    }
    std::fprintf(stderr,
                 "round %u: wall one process %.3f s; %u processes with add_files %.3f s (compiles %s), one / %u = "
                 "%.3f; %u with add_file one by one %.3f s (compiles %s), one / that = %.3f; the one process "
                 "had %.0f %% of a core%s\n",
                 r + 1, x.one.wall_s, n, x.coop.wall_s, runs_of(x.coop).c_str(), n, x.one.wall_s / x.coop.wall_s, n,
                 x.by_one.wall_s, runs_of(x.by_one).c_str(), x.one.wall_s / x.by_one.wall_s, 100 * x.one_share(),
                 x.quiet() ? " (quiet)" : "");
  }
  // A figure of every round, or of the quiet ones.
  auto each = [&](double (*f)(const Round&), bool quiet = false) {
    std::vector<double> v;
    for (const Round& x : rounds)
      if (!quiet || x.quiet()) v.push_back(f(x));
    return v;
  };
  const auto coop_ratio = [](const Round& x) { return x.one.wall_s / x.coop.wall_s; };
  const auto by_one_ratio = [](const Round& x) { return x.one.wall_s / x.by_one.wall_s; };
  std::printf(
      "{\"files\":%u,\"processes\":%u,\"rounds\":%zu,\"wall\":\"first start to last exit, empty store\","
      "\"one_s\":%.4f,\"coop_s\":%.4f,\"one_by_one_s\":%.4f,\"one_over_coop\":%s,\"one_over_one_by_one\":%s,"
      "\"quiet_rounds\":%zu,\"quiet_one_over_coop\":%s,\"quiet_one_over_one_by_one\":%s,"
      "\"coop_compiles_last_round\":\"%s\"}\n",
      files, n, rounds.size(), median(each([](const Round& x) { return x.one.wall_s; })),
      median(each([](const Round& x) { return x.coop.wall_s; })),
      median(each([](const Round& x) { return x.by_one.wall_s; })), stat(each(coop_ratio)).c_str(),
      stat(each(by_one_ratio)).c_str(), each(coop_ratio, true).size(), stat(each(coop_ratio, true)).c_str(),
      stat(each(by_one_ratio, true)).c_str(), runs_of(rounds.back().coop).c_str());
  return 0;
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
    else if (s == "--symbols")
      a.symbols = val();
    else if (s == "--run")
      a.run = val();
    else if (s == "--check")
      a.check = val();
    else if (s == "--rounds")
      a.rounds = static_cast<unsigned>(std::stoul(val()));
    else if (s == "--coop")
      a.coop = static_cast<unsigned>(std::stoul(val()));
    else if (s == "--rtdyld")
      a.rtdyld = true;
    else if (s == "--batch")
      a.batch = static_cast<unsigned>(std::stoul(val()));
    else
      die("unknown argument " + s + " (see the comment at the top of bench/llvm_codebase_bench.cc)");
  }
  if (a.bc.empty()) die("--bc DIR is required (scripts/llvm_codebase_bench.sh makes it)");
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::InitializeNativeTargetAsmParser();  // C code base: inline asm
  if (!a.run.empty()) {
    if (a.run != "plain" && a.run != "kcache") die("--run plain|kcache");
    if (a.run == "kcache" && a.cache.empty()) die("--run kcache needs --cache DIR");
    return run_once(a);
  }
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("cannot find own executable");
  self[n] = '\0';
  std::string tmp = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kcache-codebase-XXXXXX";
  if (!::mkdtemp(tmp.data())) die("mkdtemp");
  a.symbols = write_symbols(a.bc, tmp + "/symbols");
  if (a.coop) {
    int rc = coop_bench(a, self, tmp, static_cast<unsigned>(read_symbols(a.symbols).size()));
    (void)::system(("rm -rf '" + tmp + "'").c_str());
    return rc;
  }
  std::vector<double> plain, nocache, cold, warm, r_cold, r_nocache, r_warm, warm_share, warm_key_share;
  std::vector<double> warm_set, r_warm_set, r_set_over_warm, floor, plain_floor;
  std::vector<double> sys_plain, sys_cold, flt_cold;
  std::string files;
  for (unsigned r = 0; r < std::max(1u, a.rounds); ++r) {
    std::string dir = tmp + "/round-" + std::to_string(r + 1);
    Child p, x, c;
    // Rotate the order of the three: each is first, second and third
    // equally often, so none always runs on a machine another just warmed.
    for (unsigned k = 0; k < 3; ++k) {
      switch ((r + k) % 3) {
        case 0:
          p = run_child(a, self, "plain", "", false);
          break;
        case 1:
          x = run_child(a, self, "kcache", dir + "-off", true);
          break;
        default:
          c = run_child(a, self, "kcache", dir, false);
          break;
      }
    }
    Child w = run_child(a, self, "kcache", dir, false);
    if (num(w.out, "codegen_runs") != 0) die("warm run compiled: " + w.out);
    // The same warm start with the files added together (add_files): the
    // first such run finds every module's object and stores the set's
    // combined object, the second links that one object.
    Child first_set = run_child(a, self, "kcache", dir, false, 1);
    if (num(first_set.out, "sets_stored") != 1) die("no combined object stored: " + first_set.out);
    Child ws = run_child(a, self, "kcache", dir, false, 1);
    if (num(ws.out, "codegen_runs") != 0 || num(ws.out, "set_hits") != 1)
      die("warm run with add_files did not link the combined object: " + ws.out);
    // The floor: the same process adding no file (start, libLLVM's
    // loading, the cache opened, the JIT made, exit).
    Args none = a;
    none.symbols = tmp + "/no-symbols";
    none.check = "none";
    { std::ofstream(none.symbols).flush(); }
    Child fl = run_child(none, self, "kcache", dir, false, 1);
    Child pfl = run_child(none, self, "plain", "", false);
    floor.push_back(fl.cpu_s);
    plain_floor.push_back(pfl.cpu_s);
    warm_set.push_back(ws.cpu_s);
    r_warm_set.push_back(ws.cpu_s / p.cpu_s);
    r_set_over_warm.push_back(ws.cpu_s / w.cpu_s);
    files = std::to_string(static_cast<int>(num(p.out, "files")));
    plain.push_back(p.cpu_s);
    nocache.push_back(x.cpu_s);
    cold.push_back(c.cpu_s);
    warm.push_back(w.cpu_s);
    r_cold.push_back(c.cpu_s / p.cpu_s);
    r_nocache.push_back(x.cpu_s / p.cpu_s);
    r_warm.push_back(w.cpu_s / p.cpu_s);
    sys_plain.push_back(p.sys_s);
    sys_cold.push_back(c.sys_s);
    flt_cold.push_back(static_cast<double>(c.minflt) / static_cast<double>(std::max(1L, p.minflt)));
    double ready = num(w.out, "ready_cpu_s");
    warm_share.push_back((num(w.out, "key_cpu_s") + num(w.out, "cache_cpu_s")) / ready);
    warm_key_share.push_back(num(w.out, "key_cpu_s") / ready);
    std::fprintf(stderr,
                 "round %u: CPU plain %.3f s, nocache %.3f s, cold %.3f s, warm %.3f s; cold/plain %.4f, "
                 "nocache/plain %.4f; system plain %.3f s, cold %.3f s; page faults plain %ld, cold %ld; warm keys "
                 "%.2f ms of %.1f ms to ready; warm with one combined object %.3f s, over warm %.3f; a process "
                 "adding no file %.4f s (plain LLJIT %.4f s)\n",
                 r + 1, p.cpu_s, x.cpu_s, c.cpu_s, w.cpu_s, r_cold.back(), r_nocache.back(), p.sys_s, c.sys_s, p.minflt,
                 c.minflt, num(w.out, "key_cpu_s") * 1e3, ready * 1e3, ws.cpu_s, r_set_over_warm.back(), fl.cpu_s,
                 pfl.cpu_s);
  }
  (void)::system(("rm -rf '" + tmp + "'").c_str());
  std::printf(
      "{\"files\":%s,\"rounds\":%zu,\"cpu\":\"rusage user+sys of each child\",\"plain_cpu_s\":%.4f,"
      "\"nocache_cpu_s\":%.4f,\"cold_cpu_s\":%.4f,\"warm_cpu_s\":%.4f,\"cold_over_plain\":%s,"
      "\"nocache_over_plain\":%s,\"warm_over_plain\":%s,\"warm_kcache_share\":%s,\"warm_key_share\":%s,"
      "\"plain_sys_s\":%.4f,\"cold_sys_s\":%.4f,\"cold_over_plain_page_faults\":%s,\"warm_set_cpu_s\":%.4f,"
      "\"warm_set_over_plain\":%s,\"warm_set_over_warm\":%s,\"no_file_cpu_s\":%.4f,\"plain_no_file_cpu_s\":%.4f}\n",
      files.c_str(), plain.size(), median(plain), median(nocache), median(cold), median(warm), stat(r_cold).c_str(),
      stat(r_nocache).c_str(), stat(r_warm).c_str(), stat(warm_share).c_str(), stat(warm_key_share).c_str(),
      median(sys_plain), median(sys_cold), stat(flt_cold).c_str(), median(warm_set), stat(r_warm_set).c_str(),
      stat(r_set_over_warm).c_str(), median(floor), median(plain_floor));
  return 0;
}

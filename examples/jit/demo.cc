// kcache-demo: a kernel JIT (kernels.h) on LLVM ORC at -O2 with a kcache.
//
//   kcache-demo                      four runs, each in its own process, on a
//                                    fresh temporary folder: a plain LLJIT
//                                    (no kcache code on the path, the same
//                                    pipeline: plain_lljit.h), no cache
//                                    (KCACHE_DISABLE=1), cold, warm
//   kcache-demo --dir DIR            one run on DIR (cold if DIR is empty)
//   kcache-demo --dir DIR --both     the three runs on DIR (must be empty)
//   --kernels N (default 240)  --engine lmdb|files  --copy (no zero-copy)
//   --opt-level N (default 2)        the IR optimisation level: a warm run at
//                                    another level misses every kernel, and
//                                    `kcache misses` says why
//   --rounds N (default 1)           (with --dir, implies --both): N rounds of
//                                    no cache and cold, alternating which
//                                    goes first, each cold run on an empty
//                                    folder and followed by a warm run on
//                                    it; times are the medians, and
//                                    cold_over_nocache_paired is the
//                                    median of each round's own ratio
//   --cpu-split                      also split keys, lookups and linking
//                                    in the compiling thread's CPU time (a
//                                    system call before and after each
//                                    step: off, the warm run is ~3% faster)
//   --json                           one JSON object on stdout
//   --plain                          with --dir: one run on a plain LLJIT
//   --no-combine                     link each kernel's object, never one
//                                    combined object for all of them
//                                    (FrontendKeys::set_key)
//
// Rounds run plain, no cache and cold in a rotating order (each first,
// second and third equally often), then warm. Besides wall times, each
// child's whole CPU time (wait4's rusage, user + system, every thread and
// the exit) is recorded, and cold_over_plain_cpu_paired and
// nocache_over_plain_cpu_paired are the medians of each round's own ratios
// of it: the figures other processes on the machine disturb least.
//
// A run: open the cache, build an LLJIT whose compiler is kcache's
// CachingCompiler, generate N kernels and, for each, look its object up by
// a stage key on the kernel's source (kcache/stage.h): a hit goes to the JIT
// as an object, without lowering the kernel to IR; a miss is lowered to its
// own module, tagged with its front-end key and its IR digest (taken as soon
// as it is lowered), and compiled (or found by its IR) by the
// CachingCompiler, which stores the link. Then every kernel is
// looked up -- that is "ready" -- and run on data and compared with the
// interpreter. The kernels are a set loaded together: a run that found
// every kernel's object but no combined object of them all, or compiled,
// makes one after "ready" (FrontendKeys::store_set), and a later start
// that finds it links that one object instead (--no-combine: never).
#include <dirent.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/TargetSelect.h>

#include "kcache/cache.h"
#include "kcache/llvm.h"
#include "kernels.h"
#include "plain_lljit.h"

namespace {

struct Args {
  std::string dir;
  std::string engine;
  unsigned kernels = 240;
  bool json = false;
  bool both = false;
  bool zero_copy = true;
  bool cpu_split = false;
  unsigned opt_level = 2;
  unsigned rounds = 1;
  bool plain = false;
  bool combine = true;
};

double cpu_s() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// CPU time of the whole process (every thread: ORC's, the cache's committer).
double process_cpu_s() {
  timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "kcache-demo: %s\n", msg.c_str());
  std::exit(1);
}

constexpr int64_t kElems = 1024;

// Values agree if bit-equal, or both NaN, or within 1e-12 relative: the JIT
// and the interpreter do the same operations in the same order.
bool close(double x, double y) {
  if (x == y || (std::isnan(x) && std::isnan(y))) return true;
  return std::fabs(x - y) <= 1e-12 * std::fmax(std::fabs(x), std::fabs(y));
}

// One run in this process; prints its JSON object or a summary line.
int run_once(const Args& a) {
  double t0 = now_s();
  kcache::Options o;
  o.dir = a.dir;
  o.engine = kcache::parse_engine(a.engine);
  o.producer = "kcache-demo";
  o = kcache::Options::from_env(o);
  o.dir = a.dir;  // the demo's folder wins over KCACHE_DIR
  // ORC keeps every kernel it loaded, so a process asks for each key once:
  // promoting disk hits into a memory tier would only cost a copy. Keep the
  // memory tier when several JITs in one process share kernels.
  o.memory_tier = false;
  auto cache = kcache::Cache::open(o);

  auto counters = std::make_shared<kcache::llvm::CompileCounters>();
  kcache::llvm::JitOptions jo;
  jo.opt_level = a.opt_level;
  jo.counters = counters;
  // Splitting keys, lookups and linking in CPU time costs two reads of the
  // thread's CPU clock per step, each a system call: only when asked.
  counters->cpu_times = a.cpu_split;
  jo.zero_copy = a.zero_copy;
  jo.key_extra = {{"client", "kcache-demo/1"}};
  auto jit = kcache::llvm::make_cached_lljit(*cache, jo);
  if (!jit) die("LLJIT: " + llvm::toString(jit.takeError()));
  // Front-end keys: the kernel's source text under this JIT's target and
  // options. A disabled cache looks nothing up.
  std::optional<kcache::llvm::FrontendKeys> fkeys;
  if (!cache->options().disabled) {
    auto f = kcache::llvm::FrontendKeys::for_jit(jo);
    if (!f) die("front-end keys: " + f.error().to_string());
    fkeys = std::move(*f);
  }
  double t_setup = now_s();

  std::vector<kjit::Kernel> ks;
  ks.reserve(a.kernels);
  // One context for all modules: compiles run on this thread, one at a time.
  llvm::orc::ThreadSafeContext tsc(std::make_unique<llvm::LLVMContext>());
  uint64_t lowered = 0;
  // Key work done here, in the front end, counts as key time.
  auto as_key_time = [&](auto&& f) {
    double k0 = now_s(), c0 = a.cpu_split ? cpu_s() : 0;
    f();
    counters->key_ns += static_cast<uint64_t>((now_s() - k0) * 1e9);
    if (a.cpu_split) counters->key_cpu_ns += static_cast<uint64_t>((cpu_s() - c0) * 1e9);
  };
  // Every kernel and its front-end key first: the kernels' exact bytes are
  // everything the front end (lower) reads; its version is in the key
  // through key_extra ("client").
  std::vector<kcache::Key> fronts;
  for (unsigned i = 0; i < a.kernels; ++i) {
    ks.push_back(kjit::generate(i));
    if (fkeys) as_key_time([&] { fronts.push_back(fkeys->key(kcache::hash_bytes(ks.back().encode())).key); });
  }
  // The kernels are loaded together: one combined object for all of them
  // (FrontendKeys::set_key), when one is stored, is all there is to link.
  std::optional<kcache::KeyInfo> set;
  bool whole = false;
  if (fkeys && a.combine) set = fkeys->set_key(fronts);
  if (set) {
    if (auto obj = fkeys->find_set(*cache, set->key, counters.get())) {
      if (auto err = (*jit)->addObjectFile(std::move(obj))) die("addObjectFile: " + llvm::toString(std::move(err)));
      counters->lookups += a.kernels;
      counters->hits += a.kernels;
      whole = true;
    }
  }
  for (unsigned i = 0; i < a.kernels && !whole; ++i) {
    if (fkeys) {
      if (auto obj = fkeys->find(*cache, fronts[i], counters.get())) {
        if (auto err = (*jit)->addObjectFile(std::move(obj))) die("addObjectFile: " + llvm::toString(std::move(err)));
        continue;
      }
    }
    auto m = kjit::lower(ks[i], *tsc.getContext());
    ++lowered;
    if (fkeys) {
      kcache::llvm::set_frontend_key(*m, fronts[i]);
      // The IR digest (for early cutoff) now, while the module is fresh in
      // the CPU's caches: the compile comes later, after every kernel is
      // lowered.
      as_key_time([&] { kcache::llvm::set_ir_digest(*m, kcache::llvm::ir_digest(*m)); });
    }
    if (auto err = (*jit)->addIRModule(llvm::orc::ThreadSafeModule(std::move(m), tsc)))
      die("addIRModule: " + llvm::toString(std::move(err)));
  }
  double t_ir = now_s(), cpu_ir = cpu_s();
  const double pre_key = counters->key_ns.load() / 1e9, pre_cache = counters->lookup_ns.load() / 1e9;
  const double pre_key_cpu = counters->key_cpu_ns.load() / 1e9, pre_cache_cpu = counters->lookup_cpu_ns.load() / 1e9;
  std::vector<kjit::KernelFn> fns(a.kernels);
  for (unsigned i = 0; i < a.kernels; ++i) {
    auto sym = (*jit)->lookup(ks[i].name);
    if (!sym) die("lookup " + ks[i].name + ": " + llvm::toString(sym.takeError()));
    fns[i] = kcache::llvm::compat::jit_pointer<kjit::KernelFn>(*sym);
  }
  double t_ready = now_s(), cpu_ready = cpu_s(), process_cpu_ready = process_cpu_s();
  // Every kernel's object is stored now: the set's combined object made
  // from them and stored, for the next start (after "ready": this start
  // links its objects one by one already).
  bool set_stored = false;
  if (set && !whole) set_stored = fkeys->store_set(*cache, fronts, counters.get()) != nullptr;
  double t_set = now_s() - t_ready;

  // Run and check every kernel.
  std::vector<double> in_a(kElems), in_b(kElems), in_c(kElems), got(kElems), want(kElems);
  for (int64_t i = 0; i < kElems; ++i) {
    in_a[i] = std::sin(0.37 * i) * 2.0;
    in_b[i] = std::cos(0.11 * i) * 1.5;
    in_c[i] = (i % 17) / 8.0 - 1.0;
  }
  unsigned mismatched = 0;
  for (unsigned i = 0; i < a.kernels; ++i) {
    int64_t n_out = ks[i].reduce == kjit::Reduce::none ? kElems : 1;
    fns[i](in_a.data(), in_b.data(), in_c.data(), got.data(), kElems);
    kjit::evaluate(ks[i], in_a.data(), in_b.data(), in_c.data(), want.data(), kElems);
    bool ok = true;
    for (int64_t j = 0; j < n_out; ++j) ok &= close(got[j], want[j]);
    if (!ok) {
      if (mismatched++ < 3) std::fprintf(stderr, "kcache-demo: mismatch in %s\n", ks[i].to_string().c_str());
    }
  }

  const auto& C = *counters;
  // Front-end key lookups happen before t_ir (they replace lowering); the
  // compiler's own key and lookup time falls after it, within materialising.
  double key_s = C.key_ns.load() / 1e9;
  double cache_s = C.lookup_ns.load() / 1e9;
  double compile_s = C.compile_ns.load() / 1e9;
  // Materialisation is key + cache + compile + link; what is left after
  // the compiler's own measured parts is ORC linking the objects in.
  double link_s = (t_ready - t_ir) - (key_s - pre_key) - (cache_s - pre_cache) - compile_s;
  // The same split in this thread's CPU time (compiles run on this thread),
  // which other processes on the machine do not inflate.
  double key_cpu = C.key_cpu_ns.load() / 1e9, cache_cpu = C.lookup_cpu_ns.load() / 1e9;
  double link_cpu =
      (cpu_ready - cpu_ir) - (key_cpu - pre_key_cpu) - (cache_cpu - pre_cache_cpu) - C.compile_cpu_ns.load() / 1e9;
  (void)cache->flush();
  kcache::CacheStats st = cache->stats();
  bool warm = C.codegen_runs.load() == 0;
  const char* run = cache->options().disabled ? "nocache" : warm ? "warm" : "cold";

  // CPU figures only when they were counted (--cpu-split).
  auto cpu_field = [&](double v, const char* fmt) {
    if (!a.cpu_split) return std::string("null");
    char b[32];
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  if (a.json) {
    std::printf(
        "{\"run\":\"%s\",\"kernels\":%u,\"lowered\":%llu,\"ready_s\":%.6f,\"ready_cpu_s\":%.6f,\"setup_s\":%.6f,"
        "\"frontend_s\":%.6f,"
        "\"materialize_s\":%.6f,\"key_s\":%.6f,\"cache_s\":%.6f,\"compile_s\":%.6f,\"link_s\":%.6f,"
        "\"cache_share_of_link\":%.4f,\"key_cpu_s\":%s,\"cache_cpu_s\":%s,\"link_cpu_s\":%s,"
        "\"cache_cpu_share_of_link\":%s,\"combined\":%s,\"set_stored\":%s,\"set_store_s\":%.6f,"
        "\"results_match\":%s,\"mismatched\":%u,\"jit\":%s,\"cache\":%s}\n",
        run, a.kernels, (unsigned long long)lowered, t_ready - t0, process_cpu_ready, t_setup - t0, t_ir - t_setup,
        t_ready - t_ir, key_s, cache_s, compile_s, link_s, link_s > 0 ? cache_s / link_s : 0.0,
        cpu_field(key_cpu, "%.6f").c_str(), cpu_field(cache_cpu, "%.6f").c_str(), cpu_field(link_cpu, "%.6f").c_str(),
        cpu_field(link_cpu > 0 ? cache_cpu / link_cpu : 0.0, "%.4f").c_str(), whole ? "true" : "false",
        set_stored ? "true" : "false", t_set, mismatched ? "false" : "true", mismatched, C.to_json().c_str(),
        st.to_json().c_str());
  } else {
    std::printf("%s run: %u kernels ready in %.3f s (%llu compiled, %llu from the cache), results %s\n", run, a.kernels,
                t_ready - t0, (unsigned long long)C.codegen_runs.load(), (unsigned long long)C.hits.load(),
                mismatched ? "DIFFER" : "match the interpreter");
    std::printf("%s", st.to_string().c_str());
  }
  return mismatched ? 2 : 0;
}

// The same kernels through a plain LLJIT (plain_lljit.h): no cache, no
// kcache code on the path; the baseline of cold_over_plain.
int run_plain(const Args& a) {
  double t0 = now_s();
  auto jit = kjit::make_plain_lljit(a.opt_level);
  if (!jit) die("LLJIT: " + llvm::toString(jit.takeError()));
  double t_setup = now_s();
  std::vector<kjit::Kernel> ks;
  ks.reserve(a.kernels);
  llvm::orc::ThreadSafeContext tsc(std::make_unique<llvm::LLVMContext>());
  for (unsigned i = 0; i < a.kernels; ++i) {
    ks.push_back(kjit::generate(i));
    if (auto err = (*jit)->addIRModule(llvm::orc::ThreadSafeModule(kjit::lower(ks.back(), *tsc.getContext()), tsc)))
      die("addIRModule: " + llvm::toString(std::move(err)));
  }
  double t_ir = now_s();
  std::vector<kjit::KernelFn> fns(a.kernels);
  for (unsigned i = 0; i < a.kernels; ++i) {
    auto sym = (*jit)->lookup(ks[i].name);
    if (!sym) die("lookup " + ks[i].name + ": " + llvm::toString(sym.takeError()));
    fns[i] = kcache::llvm::compat::jit_pointer<kjit::KernelFn>(*sym);
  }
  double t_ready = now_s(), process_cpu_ready = process_cpu_s();
  std::vector<double> in_a(kElems), in_b(kElems), in_c(kElems), got(kElems), want(kElems);
  for (int64_t i = 0; i < kElems; ++i) {
    in_a[i] = std::sin(0.37 * i) * 2.0;
    in_b[i] = std::cos(0.11 * i) * 1.5;
    in_c[i] = (i % 17) / 8.0 - 1.0;
  }
  unsigned mismatched = 0;
  for (unsigned i = 0; i < a.kernels; ++i) {
    int64_t n_out = ks[i].reduce == kjit::Reduce::none ? kElems : 1;
    fns[i](in_a.data(), in_b.data(), in_c.data(), got.data(), kElems);
    kjit::evaluate(ks[i], in_a.data(), in_b.data(), in_c.data(), want.data(), kElems);
    for (int64_t j = 0; j < n_out; ++j)
      if (!close(got[j], want[j])) {
        ++mismatched;
        break;
      }
  }
  if (a.json)
    std::printf(
        "{\"run\":\"plain\",\"kernels\":%u,\"lowered\":%u,\"ready_s\":%.6f,\"ready_cpu_s\":%.6f,\"setup_s\":%.6f,"
        "\"frontend_s\":%.6f,\"materialize_s\":%.6f,\"codegen_runs\":%u,\"results_match\":%s,\"mismatched\":%u}\n",
        a.kernels, a.kernels, t_ready - t0, process_cpu_ready, t_setup - t0, t_ir - t_setup, t_ready - t_ir, a.kernels,
        mismatched ? "false" : "true", mismatched);
  else
    std::printf("plain LLJIT run: %u kernels ready in %.3f s, results %s\n", a.kernels, t_ready - t0,
                mismatched ? "DIFFER" : "match the interpreter");
  return mismatched ? 2 : 0;
}

// ---- the runs, each in a child process ------------------------------------------

// One run in a child process; its JSON. `cpu`, when given, gets the
// child's whole CPU time (user + system, from wait4's rusage).
std::string run_child(const Args& a, const char* self, bool disabled = false, const std::string& dir = {},
                      bool plain = false, double* cpu = nullptr) {
  std::vector<std::string> argv = {self,    "--dir", dir.empty() ? a.dir : dir, "--kernels", std::to_string(a.kernels),
                                   "--json"};
  if (!a.engine.empty()) argv.insert(argv.end(), {"--engine", a.engine});
  if (!a.zero_copy) argv.push_back("--copy");
  if (a.cpu_split) argv.push_back("--cpu-split");
  if (a.opt_level != 2) argv.insert(argv.end(), {"--opt-level", std::to_string(a.opt_level)});
  if (plain) argv.push_back("--plain");
  if (!a.combine) argv.push_back("--no-combine");
  int fd[2];
  if (::pipe(fd) != 0) die("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
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
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  if (cpu)
    *cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 2)) die("child run failed");
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

double num(const std::string& json, const std::string& field) {
  auto p = json.find("\"" + field + "\":");
  if (p == std::string::npos) die("child output lacks " + field);
  return std::strtod(json.c_str() + p + field.size() + 3, nullptr);
}

// The value of "field": as it is written (a number or null).
std::string raw(const std::string& json, const std::string& field) {
  auto p = json.find("\"" + field + "\":");
  if (p == std::string::npos) die("child output lacks " + field);
  size_t s = p + field.size() + 3;
  return json.substr(s, json.find_first_of(",}", s) - s);
}

// The balanced {...} that follows "field": in json.
std::string object(const std::string& json, const std::string& field) {
  auto p = json.find("\"" + field + "\":{");
  if (p == std::string::npos) return "{}";
  size_t s = p + field.size() + 3, depth = 0;
  for (size_t i = s; i < json.size(); ++i) {
    if (json[i] == '{') ++depth;
    if (json[i] == '}' && --depth == 0) return json.substr(s, i - s + 1);
  }
  return "{}";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// True when `dir` does not exist or holds nothing: a run there starts cold.
bool folder_is_empty(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return true;
  bool empty = true;
  while (struct dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
  ::closedir(d);
  return empty;
}

int run_both(Args a, const char* self, bool temp) {
  // Rounds of plain, no cache and cold, in a rotating order, so none
  // always runs on a machine another has just warmed. Each cold run gets
  // an empty folder of its own, and a warm run follows it there.
  std::string plain, nocache, cold, warm, dir = a.dir;
  std::vector<double> nocache_runs, cold_runs, nocache_cpus, cold_cpus, warm_runs, warm_cpus, plain_runs, plain_cpus;
  // Each child's whole CPU time (rusage), per round.
  std::vector<double> plain_rus, nocache_rus, cold_rus, warm_rus;
  bool match = true;
  // One child run: its JSON, its wall and CPU times recorded.
  auto run = [&](bool disabled, std::vector<double>& walls, std::vector<double>& cpus, std::vector<double>& rus,
                 bool plain_jit) {
    double ru = 0;
    std::string j = run_child(a, self, disabled, dir, plain_jit, &ru);
    walls.push_back(num(j, "ready_s"));
    cpus.push_back(num(j, "ready_cpu_s"));
    rus.push_back(ru);
    match &= j.find("\"results_match\":true") != std::string::npos;
    return j;
  };
  bool cold_on_empty = true;  // every cold run started on an empty folder
  for (unsigned r = 0; r < a.rounds; ++r) {
    if (a.rounds > 1) dir = a.dir + "/round-" + std::to_string(r + 1);
    if (!folder_is_empty(dir)) cold_on_empty = false;
    // Each of the three goes first, second and third equally often.
    for (unsigned k = 0; k < 3; ++k) {
      switch ((r + k) % 3) {
        case 0:
          plain = run(/*disabled=*/true, plain_runs, plain_cpus, plain_rus, /*plain_jit=*/true);
          break;
        case 1:
          nocache = run(/*disabled=*/true, nocache_runs, nocache_cpus, nocache_rus, false);
          break;
        default:
          cold = run(false, cold_runs, cold_cpus, cold_rus, false);
          break;
      }
    }
    // The warm run reuses this round's folder, which its cold run filled.
    warm = run(false, warm_runs, warm_cpus, warm_rus, false);
  }
  // Each round's own ratio of CPU time (rusage) to the plain LLJIT's.
  auto over_plain = [&](const std::vector<double>& v) {
    std::vector<double> out;
    for (size_t r = 0; r < v.size() && r < plain_rus.size(); ++r)
      if (plain_rus[r] > 0) out.push_back(v[r] / plain_rus[r]);
    return out;
  };
  const std::vector<double> cold_plain = over_plain(cold_rus), nocache_plain = over_plain(nocache_rus),
                            warm_plain = over_plain(warm_rus);
  auto range = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("[0,0]");
    char b[64];
    std::snprintf(b, sizeof b, "[%.4f,%.4f]", *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(b);
  };
  const double plain_s = median(plain_runs), plain_cpu = median(plain_cpus);
  double nocache_s = median(nocache_runs), cold_s = median(cold_runs), warm_s = median(warm_runs);
  double nocache_cpu = median(nocache_cpus), cold_cpu = median(cold_cpus), warm_cpu = median(warm_cpus);
  double speedup = warm_s > 0 ? cold_s / warm_s : 0;
  double cold_ratio = nocache_s > 0 ? cold_s / nocache_s : 0;
  // Each round's two runs are back to back: the median of the rounds' own
  // ratios cancels what drifts across the invocation (other load, a slower
  // host), which the ratio of the two medians does not.
  std::vector<double> paired;
  for (size_t r = 0; r < cold_runs.size() && r < nocache_runs.size(); ++r)
    if (nocache_runs[r] > 0) paired.push_back(cold_runs[r] / nocache_runs[r]);
  double paired_ratio = paired.empty() ? 0 : median(paired);
  if (a.json) {
    std::printf(
        "{\"kernels\":%u,\"rounds\":%u,\"nocache_runs_s\":%s,\"cold_runs_s\":%s,\"warm_runs_s\":%s,"
        "\"nocache_s\":%.6f,\"cold_s\":%.6f,\"warm_s\":%.6f,\"speedup\":%.2f,"
        "\"cold_over_nocache\":%.4f,\"cold_over_nocache_paired\":%.4f,\"nocache_cpu_s\":%.6f,\"cold_cpu_s\":%.6f,"
        "\"warm_cpu_s\":%.6f,"
        "\"results_match\":%s,"
        "\"warm_cache_s\":%.6f,\"warm_link_s\":%.6f,\"warm_cache_share_of_link\":%.4f,"
        "\"warm_cache_cpu_s\":%s,\"warm_link_cpu_s\":%s,\"warm_cache_cpu_share_of_link\":%s,"
        "\"plain_runs_s\":%s,\"plain_s\":%.6f,\"plain_cpu_s\":%.6f,\"plain_rusage_cpu_s\":%.6f,"
        "\"nocache_rusage_cpu_s\":%.6f,\"cold_rusage_cpu_s\":%.6f,\"warm_rusage_cpu_s\":%.6f,"
        "\"cold_over_plain_cpu_paired\":%.4f,\"cold_over_plain_cpu_range\":%s,"
        "\"nocache_over_plain_cpu_paired\":%.4f,\"nocache_over_plain_cpu_range\":%s,"
        "\"warm_over_plain_cpu_paired\":%.4f,"
        "\"cache\":%s,\"plain\":%s,\"nocache\":%s,\"cold\":%s,\"warm\":%s}\n",
        a.kernels, a.rounds, list(nocache_runs).c_str(), list(cold_runs).c_str(), list(warm_runs).c_str(), nocache_s,
        cold_s, warm_s, speedup, cold_ratio, paired_ratio, nocache_cpu, cold_cpu, warm_cpu, match ? "true" : "false",
        num(warm, "cache_s"), num(warm, "link_s"), num(warm, "cache_share_of_link"), raw(warm, "cache_cpu_s").c_str(),
        raw(warm, "link_cpu_s").c_str(), raw(warm, "cache_cpu_share_of_link").c_str(), list(plain_runs).c_str(),
        plain_s, plain_cpu, median(plain_rus), median(nocache_rus), median(cold_rus), median(warm_rus),
        median(cold_plain), range(cold_plain).c_str(), median(nocache_plain), range(nocache_plain).c_str(),
        median(warm_plain), object(warm, "cache").c_str(), plain.c_str(), nocache.c_str(), cold.c_str(), warm.c_str());
  } else {
    std::printf("kcache-demo: %u kernels, LLVM ORC at -O2, cache in %s%s\n", a.kernels, a.dir.c_str(),
                temp ? " (temporary)" : "");
    if (a.rounds > 1)
      std::printf("  times: medians of %u rounds of no cache and cold, each on an empty folder\n", a.rounds);
    std::printf("  plain LLJIT (no kcache, new process):     %4.0f compiled, ready in %8.3f s (CPU %.3f s)\n",
                num(plain, "codegen_runs"), plain_s, plain_cpu);
    std::printf("  no cache (KCACHE_DISABLE=1, new process): %4.0f compiled, ready in %8.3f s (CPU %.3f s)\n",
                num(nocache, "codegen_runs"), nocache_s, nocache_cpu);
    std::printf(
        "  %s %4.0f compiled, ready in %8.3f s (CPU %.3f s), %.3fx no cache\n",
        cold_on_empty ? "cold run (empty cache, new process):     " : "first run (cache NOT empty, new process):",
        num(cold, "codegen_runs"), cold_s, cold_cpu, cold_ratio);
    if (a.rounds > 1) std::printf("  cold / no cache within each round, median of the rounds: %.3fx\n", paired_ratio);
    std::printf(
        "  whole-process CPU over the plain LLJIT's, median of the rounds' own ratios: cold %.3fx %s, no cache "
        "%.3fx %s\n",
        median(cold_plain), range(cold_plain).c_str(), median(nocache_plain), range(nocache_plain).c_str());
    std::printf("  warm run (same folder, new process):      %4.0f loaded,   ready in %8.3f s (CPU %.3f s)\n",
                num(warm, "hits"), warm_s, warm_cpu);
    std::printf("  speedup: %.1fx    results match the interpreter in all runs: %s\n", speedup, match ? "yes" : "NO");
    std::printf(
        "  warm run: %.0f kernels found by their source (none lowered to IR); keys %.1f ms, cache lookup+read "
        "%.1f ms, linking %.1f ms\n",
        num(warm, "frontend_hits"), num(warm, "key_s") * 1e3, num(warm, "cache_s") * 1e3, num(warm, "link_s") * 1e3);
    if (a.cpu_split)
      std::printf("            in CPU time: keys %.1f ms, cache lookup+read %.1f ms, linking %.1f ms\n",
                  num(warm, "key_cpu_s") * 1e3, num(warm, "cache_cpu_s") * 1e3, num(warm, "link_cpu_s") * 1e3);
    std::string cs = object(warm, "cache");
    std::printf("  cache statistics after the warm run: %.0f hits, %.0f misses, %.0f compiles, %.0f faults\n",
                num(cs, "hits"), num(cs, "misses"), num(cs, "compiles"), num(cs, "faults"));
    std::printf("  per tier: %s\n",
                cs.substr(cs.find("\"tiers\":") + 8, cs.size() - cs.find("\"tiers\":") - 9).c_str());
  }
  return match ? 0 : 2;
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
    if (s == "--dir")
      a.dir = val();
    else if (s == "--kernels")
      a.kernels = static_cast<unsigned>(std::stoul(val()));
    else if (s == "--engine")
      a.engine = val();
    else if (s == "--opt-level")
      a.opt_level = static_cast<unsigned>(std::stoul(val()));
    else if (s == "--json")
      a.json = true;
    else if (s == "--both")
      a.both = true;
    else if (s == "--rounds")
      a.rounds = static_cast<unsigned>(std::stoul(val()));
    else if (s == "--copy")
      a.zero_copy = false;
    else if (s == "--cpu-split")
      a.cpu_split = true;
    else if (s == "--plain")
      a.plain = true;
    else if (s == "--no-combine")
      a.combine = false;
    else if (s == "-h" || s == "--help") {
      std::printf(
          "usage: kcache-demo [--dir DIR [--both | --plain]] [--rounds N] [--kernels N] [--engine lmdb|files] "
          "[--copy] [--opt-level N] [--cpu-split] [--no-combine] [--json]\n");
      return 0;
    } else {
      die("unknown argument " + s);
    }
  }
  if (a.kernels == 0) die("--kernels must be at least 1");
  if (a.rounds == 0) die("--rounds must be at least 1");
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("cannot find own executable");
  self[n] = '\0';

  if (a.dir.empty()) {
    std::string tmpl =
        (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) + "/kcache-demo-XXXXXX";
    if (!::mkdtemp(tmpl.data())) die("mkdtemp failed");
    a.dir = tmpl;
    int rc = run_both(a, self, true);
    std::string rm = "rm -rf '" + tmpl + "'";
    (void)::system(rm.c_str());
    return rc;
  }
  // --rounds compares runs, so it means the three runs (--both) on DIR.
  if (a.both || a.rounds > 1) return run_both(a, self, false);

  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  // The demo's kernels have no inline asm; a JIT whose modules may (C
  // compiled by clang, say) needs the asm parser too, with kcache as with a
  // plain LLJIT: without it the code generator aborts the process.
  llvm::InitializeNativeTargetAsmParser();
  return a.plain ? run_plain(a) : run_once(a);
}

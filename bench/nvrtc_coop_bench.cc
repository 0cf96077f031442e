// kcache_bench_nvrtc_coop: processes sharing a cold NVRTC start.
//
//   kcache_bench_nvrtc_coop [--programs M] [--procs N] [--rounds R] [--unroll U]
//
// M CUDA programs (default 16; kernel i loops U times, default 256, unrolled,
// compiled to PTX for compute_80). Each round, on empty stores, in wall time
// from the start signal to the last exit: **one** process compiling the list
// with nvrtc::Compiler::compile_all on one worker thread (the baseline), N such
// processes (default 2) started **together** on the same list in the same
// order, and (the baseline of before) N processes calling compile() **one by
// one** down the list, and (the ceiling on this machine now) N processes each
// compiling its own share of the list (programs k, k+N, ...) on a store of its
// own, no coordination at all, **split**. Prints each, the ratio one / N (how
// much sooner N processes finish than one) and checks that each program was
// compiled once in all and every result is PTX of its kernel. Each store starts
// with the NVRTC library's identity known (one process ran with this NVRTC
// before; hashing the 110 MB library is a first-use cost on a machine, not a
// per-program one). Children are sessions of their own (autogroups would give
// the children of one session one share of the CPU). Under other load wall time
// says more about that load than about kcache: the ratios are also given over
// the quiet rounds alone, those in which the one process had a core to itself
// (CPU time ≥ 95 % of its wall time), and as CPU time, which other load
// inflates far less: the one process's over the busiest of the N (how evenly
// the N shared the work; N at best).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "kcache/nvrtc.h"

namespace {

using namespace kcache;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "kcache_bench_nvrtc_coop: %s\n", why.c_str());
  std::exit(1);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

nvrtc::Program program(int i, int unroll) {
  nvrtc::Program p;
  p.name = "k" + std::to_string(i) + ".cu";
  p.source = "extern \"C\" __global__ void k" + std::to_string(i) +
             "(float* out, const float* in, int n) {\n"
             "  int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (t >= n) return;\n"
             "  float acc = in[t];\n"
             "#pragma unroll\n"
             "  for (int j = 0; j < " +
             std::to_string(unroll) + "; ++j) acc = acc * " + std::to_string(i + 2) +
             ".5f + __sinf(acc + j) * __cosf(acc - j);\n"
             "  out[t] = acc;\n}\n";
  p.options = {"-arch=compute_80", "-default-device"};
  return p;
}

std::unique_ptr<Cache> open_cache(const std::string& dir) {
  Options o;
  o.dir = dir;
  o.log_level = LogLevel::error;
  return Cache::open(o);
}

// What a child writes to its pipe: programs it compiled, results wrong.
struct Out {
  int compiled = 0;
  int wrong = -1;
};

// The child's work: programs first, first + step, ... through compile_all
// (one worker) or compile() one by one.
Out run(const std::string& store, int programs, int unroll, bool batch, int first = 0, int step = 1) {
  Out o;
  auto cache = open_cache(store);
  nvrtc::Compiler c(*cache);
  std::vector<nvrtc::Program> ps;
  std::vector<int> ids;
  for (int i = first; i < programs; i += step) {
    ps.push_back(program(i, unroll));
    ids.push_back(i);
  }
  std::vector<Expected<nvrtc::Result>> rs;
  if (batch) {
    rs = c.compile_all(ps, 1);
  } else {
    for (const auto& p : ps) rs.push_back(c.compile(p));
  }
  o.wrong = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int i = ids[k];
    const auto& r = rs[k];
    if (!r || r->ptx.find(".entry k" + std::to_string(i) + "(") == std::string_view::npos) {
      ++o.wrong;
      continue;
    }
    o.compiled += r->source == Source::compiled;
  }
  (void)cache->flush();
  return o;
}

struct Child {
  pid_t pid;
  int fd;
};

// n children started together (released by one pipe once all are forked):
// wall time from the release to the last exit; the children's outputs and
// CPU times. `split`: child k compiles programs k, k+n, ... on a store of
// its own (store + "-k").
struct Together {
  double wall_s = 0;
  double cpu_s = 0;  // of the busiest child
  std::vector<Out> outs;
};

Together together(int n, const std::string& store, int programs, int unroll, bool batch, bool split = false) {
  int go[2];
  if (::pipe(go) != 0) die("pipe");
  std::vector<Child> kids;
  std::fflush(nullptr);
  for (int k = 0; k < n; ++k) {
    int p[2];
    if (::pipe(p) != 0) die("pipe");
    pid_t pid = ::fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      ::setsid();
      ::close(p[0]);
      ::close(go[1]);
      char x;
      if (::read(go[0], &x, 1) != 1) ::_exit(2);
      Out o = split ? run(store + "-" + std::to_string(k), programs, unroll, batch, k, n)
                    : run(store, programs, unroll, batch);
      (void)!::write(p[1], &o, sizeof o);
      ::_exit(0);
    }
    ::close(p[1]);
    kids.push_back({pid, p[0]});
  }
  ::close(go[0]);
  Together t;
  const double t0 = now_s();
  const std::string release(static_cast<size_t>(n), 'g');
  if (::write(go[1], release.data(), release.size()) != static_cast<ssize_t>(release.size())) die("write");
  ::close(go[1]);
  for (const auto& c : kids) {
    Out o;
    if (::read(c.fd, &o, sizeof o) != static_cast<ssize_t>(sizeof o)) o.wrong = -1;
    ::close(c.fd);
    int st = 0;
    rusage ru{};
    ::wait4(c.pid, &st, 0, &ru);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) o.wrong = -1;
    t.cpu_s = std::max(t.cpu_s, static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                                    static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6);
    t.outs.push_back(o);
  }
  t.wall_s = now_s() - t0;
  return t;
}

// A store in which the NVRTC library's identity is already known.
void seed(const std::string& store) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    auto cache = open_cache(store);
    nvrtc::Compiler c(*cache);
    (void)c.identity();
    (void)cache->flush();
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("seeding " + store + " failed");
}

std::string runs(const Together& t) {
  std::string s;
  for (const auto& o : t.outs) s += (s.empty() ? "" : "+") + std::to_string(o.compiled);
  return s;
}

void check(const Together& t, int programs, const char* what) {
  int compiled = 0;
  for (const auto& o : t.outs) {
    if (o.wrong != 0) die(std::string(what) + ": a process failed or got a wrong result");
    compiled += o.compiled;
  }
  if (compiled != programs)
    die(std::string(what) + ": " + std::to_string(compiled) + " compiles for " + std::to_string(programs) +
        " programs");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string stat(const std::vector<double>& v) {
  if (v.empty()) return "{}";
  char b[128];
  std::snprintf(b, sizeof b, "{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}", median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  int programs = 16, procs = 2, rounds = 5, unroll = 256;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&] {
      if (i + 1 >= argc) die("missing value for " + a);
      return std::atoi(argv[++i]);
    };
    if (a == "--programs")
      programs = val();
    else if (a == "--procs")
      procs = val();
    else if (a == "--rounds")
      rounds = val();
    else if (a == "--unroll")
      unroll = val();
    else
      die("usage: kcache_bench_nvrtc_coop [--programs M] [--procs N] [--rounds R] [--unroll U]");
  }
  if (programs < 1 || procs < 1 || rounds < 1 || unroll < 1) die("counts must be positive");
  char tmpl[] = "/tmp/kcache-nvrtc-coop-XXXXXX";
  if (!::mkdtemp(tmpl)) die("mkdtemp");
  const std::string tmp = tmpl;

  std::vector<double> one_s, coop_s, by_one_s, ratio, by_one_ratio, quiet_ratio, cpu_ratio, split_ratio;
  for (int r = 0; r < rounds; ++r) {
    const std::string dir = tmp + "/r" + std::to_string(r);
    for (const char* s : {"-one", "-coop", "-by-one"}) seed(dir + s);
    for (int k = 0; k < procs; ++k) seed(dir + "-split-" + std::to_string(k));
    Together one = together(1, dir + "-one", programs, unroll, true);
    Together coop = together(procs, dir + "-coop", programs, unroll, true);
    Together by_one = together(procs, dir + "-by-one", programs, unroll, false);
    Together split = together(procs, dir + "-split", programs, unroll, true, true);
    check(one, programs, "one");
    check(coop, programs, "together");
    check(by_one, programs, "one by one");
    check(split, programs, "split");
    split_ratio.push_back(one.wall_s / split.wall_s);
    const bool quiet = one.cpu_s >= 0.95 * one.wall_s;
    one_s.push_back(one.wall_s);
    coop_s.push_back(coop.wall_s);
    by_one_s.push_back(by_one.wall_s);
    ratio.push_back(one.wall_s / coop.wall_s);
    by_one_ratio.push_back(one.wall_s / by_one.wall_s);
    if (quiet) quiet_ratio.push_back(ratio.back());
    cpu_ratio.push_back(one.cpu_s / coop.cpu_s);
    std::printf(
        "round %d: one %.3f s | %d together (compile_all) %.3f s, compiled %s: %.2fx sooner (CPU %.3f s, busiest "
        "%.3f s: %.2fx) | %d one by one (compile) %.3f s, compiled %s: %.2fx | split %.3f s: %.2fx%s\n",
        r + 1, one.wall_s, procs, coop.wall_s, runs(coop).c_str(), ratio.back(), one.cpu_s, coop.cpu_s,
        cpu_ratio.back(), procs, by_one.wall_s, runs(by_one).c_str(), by_one_ratio.back(), split.wall_s,
        split_ratio.back(), quiet ? "" : " (one process under 95 % of a core)");
    std::fflush(stdout);
  }
  std::printf(
      "{\"bench\":\"nvrtc_coop\",\"programs\":%d,\"procs\":%d,\"rounds\":%d,\"unroll\":%d,\"one_s\":%.3f,"
      "\"together_s\":%.3f,\"one_by_one_s\":%.3f,\"one_over_together\":%s,\"one_over_one_by_one\":%s,"
      "\"quiet_rounds\":%zu,\"quiet_one_over_together\":%s,\"cpu_one_over_busiest\":%s,\"one_over_split\":%s}\n",
      programs, procs, rounds, unroll, median(one_s), median(coop_s), median(by_one_s), stat(ratio).c_str(),
      stat(by_one_ratio).c_str(), quiet_ratio.size(), stat(quiet_ratio).c_str(), stat(cpu_ratio).c_str(),
      stat(split_ratio).c_str());
  std::string rm = "rm -rf '" + tmp + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", tmp.c_str());
  return 0;
}

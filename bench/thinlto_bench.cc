// ThinLTO links through llvm::lto::LTO (tests/integrations/llvm/thinlto_link.h)
// of real C as ThinLTO bitcode (the inputs of llvm_thinlto_test), with
// llvm::localCache and with kcache::llvm::localCache, in one run:
//
//   none        no cache (the baseline of the cold ratios)
//   cold        an empty cache folder
//   warm        the same folder again (a FileCache and Cache of its own)
//   4 at once   four processes linking at once on an empty folder: how many
//               module compiles they ran between them, and the wall time
//
// Each of --reps rounds runs every variant once, alternating which cache
// goes first; medians are printed, then one JSON line.
//   kcache_bench_thinlto [--reps N] [--threads N]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <llvm/Support/TargetSelect.h>

#include "kcache/llvm_file_cache.h"
#include "thinlto_link.h"

namespace kl = kcache::llvm;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "thinlto_bench: %s\n", why.c_str());
  std::exit(1);
}

std::vector<std::string> read_inputs() {
  std::vector<std::string> out;
  std::stringstream list(KCACHE_THINLTO_INPUTS);
  std::string path;
  while (std::getline(list, path, ':')) {
    std::ifstream f(path, std::ios::binary);
    if (!f) die("cannot read " + path);
    std::stringstream s;
    s << f.rdbuf();
    out.push_back(s.str());
  }
  return out;
}

std::string fresh_dir() {
  std::string d = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kcache-thinlto-XXXXXX";
  if (!::mkdtemp(d.data())) die("mkdtemp");
  return d;
}

void remove_dir(const std::string& d) { (void)std::system(("rm -rf '" + d + "'").c_str()); }

// localCache with its misses counted (the AddStreamFns it returns).
llvm::FileCache counting(llvm::FileCache inner, std::shared_ptr<std::atomic<uint64_t>> compiles) {
  return
      [inner, compiles](unsigned task, llvm::StringRef key, const auto&... name) -> llvm::Expected<llvm::AddStreamFn> {
        auto r = inner(task, key, name...);
        if (r && *r) compiles->fetch_add(1);
        return r;
      };
}

// kcache_noflush: kcache with FileCacheOptions::flush_on_commit off (what
// waiting for the disk at each commit costs a cold link).
enum class Which { none, llvm, kcache, kcache_noflush };

// One link over `dir`; returns the seconds it took and adds the compiles it
// ran to *compiles.
double link(const std::vector<std::string>& in, Which which, const std::string& dir, unsigned threads,
            uint64_t* compiles) {
  kcache_thinlto::Link l;
  double t0 = now_s();
  llvm::FileCache cache;
  auto llvm_compiles = std::make_shared<std::atomic<uint64_t>>(0);
  auto counters = std::make_shared<kl::FileCacheCounters>();
  if (which == Which::llvm) {
    auto c = llvm::localCache("ThinLTO", "Thin", dir, l.buffer_sink());
    if (!c) die(llvm::toString(c.takeError()));
    cache = counting(std::move(*c), llvm_compiles);
  } else if (which == Which::kcache || which == Which::kcache_noflush) {
    kl::FileCacheOptions o;
    o.counters = counters;
    o.flush_on_commit = which == Which::kcache;
    kcache::Options co;
    co.dir = dir;
    cache = kl::localCache(kcache::Cache::open(kcache::Options::from_env(co)), "ThinLTO", l.buffer_sink(), o);
  }
  if (!l.run(in, cache, threads)) die("link: " + l.result.error);
  cache = llvm::FileCache();  // closes the kcache store, as a linker's exit would
  double dt = now_s() - t0;
  if (compiles)
    *compiles += which == Which::llvm   ? llvm_compiles->load()
                 : which != Which::none ? counters->streams.load()
                                        : in.size();
  return dt;
}

// Four processes linking at once on an empty folder: wall seconds; their
// compiles summed into *compiles.
double four_at_once(const std::vector<std::string>& in, Which which, unsigned threads, uint64_t* compiles) {
  std::string dir = fresh_dir();
  int go[2], counts[2];
  if (::pipe(go) || ::pipe(counts)) die("pipe");
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      ::close(go[1]);
      ::close(counts[0]);
      char c;
      if (::read(go[0], &c, 1) != 0) ::_exit(3);
      uint64_t n = 0;
      link(in, which, dir, threads, &n);
      if (::write(counts[1], &n, sizeof n) != sizeof n) ::_exit(4);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(counts[1]);
  double t0 = now_s();
  ::close(go[1]);  // all four start
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("a linking process failed");
  }
  double dt = now_s() - t0;
  uint64_t n = 0;
  while (::read(counts[0], &n, sizeof n) == sizeof n) *compiles += n;
  ::close(counts[0]);
  remove_dir(dir);
  return dt;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  unsigned threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--threads")) threads = std::max(1, std::atoi(argv[i + 1]));
  }
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::InitializeNativeTargetAsmParser();
  const auto in = read_inputs();
  if (in.empty()) die("no inputs (llvm_thinlto_test's bitcode was not built)");

  link(in, Which::none, "", threads, nullptr);  // warm-up: LLVM's first link pays for its set-up
  std::map<std::string, std::vector<double>> t;
  std::map<std::string, uint64_t> compiles;  // last round's
  for (int r = 0; r < reps; ++r) {
    t["none"].push_back(link(in, Which::none, "", threads, nullptr));
    for (int k = 0; k < 2; ++k) {
      Which w = (k + r) % 2 ? Which::llvm : Which::kcache;
      std::string name = w == Which::llvm ? "llvm" : "kcache";
      std::string dir = fresh_dir();
      uint64_t cold_n = 0, warm_n = 0, four_n = 0;
      t[name + " cold"].push_back(link(in, w, dir, threads, &cold_n));
      t[name + " warm"].push_back(link(in, w, dir, threads, &warm_n));
      remove_dir(dir);
      t[name + " 4 at once"].push_back(four_at_once(in, w, threads, &four_n));
      compiles[name + " cold"] = cold_n;
      compiles[name + " warm"] = warm_n;
      compiles[name + " 4 at once"] = four_n;
    }
    std::string dir = fresh_dir();
    uint64_t n = 0;
    t["kcache cold, no flush"].push_back(link(in, Which::kcache_noflush, dir, threads, &n));
    compiles["kcache cold, no flush"] = n;
    remove_dir(dir);
    // This round's own ratios (paired: less moved by a drifting machine).
    size_t i = t["none"].size() - 1;
    t["paired kcache/llvm cold"].push_back(t["kcache cold"][i] / t["llvm cold"][i]);
    t["paired kcache/llvm warm"].push_back(t["kcache warm"][i] / t["llvm warm"][i]);
  }
  double none = median(t["none"]);
  std::printf("ThinLTO link of %zu modules, %u backend threads, LLVM %s, medians of %d rounds\n", in.size(), threads,
              LLVM_VERSION_STRING, reps);
  std::printf("%-22s %10s %12s %10s\n", "", "seconds", "/ no cache", "compiles");
  std::printf("%-22s %10.4f %12s %10zu\n", "no cache", none, "1.000", in.size());
  for (const char* name : {"llvm cold", "kcache cold", "kcache cold, no flush", "llvm warm", "kcache warm",
                           "llvm 4 at once", "kcache 4 at once"}) {
    double m = median(t[name]);
    std::printf("%-22s %10.4f %12.3f %10llu\n", name, m, m / none, static_cast<unsigned long long>(compiles[name]));
  }
  double lc = median(t["llvm cold"]), kc = median(t["kcache cold"]);
  double lw = median(t["llvm warm"]), kw = median(t["kcache warm"]);
  std::printf("kcache cold / llvm cold: %.3f (paired %.3f); kcache warm / llvm warm: %.3f (paired %.3f)\n", kc / lc,
              median(t["paired kcache/llvm cold"]), kw / lw, median(t["paired kcache/llvm warm"]));
  std::printf(
      "{\"llvm\":\"%s\",\"modules\":%zu,\"reps\":%d,\"none_s\":%.5f,\"llvm_cold_s\":%.5f,\"kcache_cold_s\":%.5f,"
      "\"kcache_cold_noflush_s\":%.5f,\"llvm_warm_s\":%.5f,\"kcache_warm_s\":%.5f,\"llvm_four_s\":%.5f,\"kcache_four_"
      "s\":%.5f,"
      "\"llvm_four_compiles\":%llu,\"kcache_four_compiles\":%llu}\n",
      LLVM_VERSION_STRING, in.size(), reps, none, lc, kc, median(t["kcache cold, no flush"]), lw, kw,
      median(t["llvm 4 at once"]), median(t["kcache 4 at once"]),
      static_cast<unsigned long long>(compiles["llvm 4 at once"]),
      static_cast<unsigned long long>(compiles["kcache 4 at once"]));
  return 0;
}

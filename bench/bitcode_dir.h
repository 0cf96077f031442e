// What the bitcode benchmarks (kcache_bench_lua_jit,
// kcache_bench_llvm_codebase) share: clocks, a fatal error, and the .bc
// files of a folder in a stable order.
#ifndef KCACHE_BENCH_BITCODE_DIR_H_
#define KCACHE_BENCH_BITCODE_DIR_H_

#include <dirent.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace kcache::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A clock of clock_gettime (CLOCK_PROCESS_CPUTIME_ID, ...) in seconds.
inline double clock_s(clockid_t id) {
  timespec ts;
  ::clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

[[noreturn]] inline void die(const char* program, const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", program, msg.c_str());
  std::exit(1);
}

// The .bc files directly in `dir`, sorted by name.
inline std::vector<std::string> bc_files(const char* program, const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) die(program, "cannot open " + dir);
  while (auto* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 3 && n.compare(n.size() - 3, 3, ".bc") == 0) out.push_back(dir + "/" + n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kcache::bench

#endif  // KCACHE_BENCH_BITCODE_DIR_H_

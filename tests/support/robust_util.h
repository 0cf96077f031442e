// Helpers for the disk-tier robustness tests: the engines as a test
// parameter, forked children whose crashes become exit codes, a watchdog
// that ends (and prints the stacks of) a child that does not finish,
// sanitizer detection to scale trial counts down.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "kcache/tier.h"
#include "test_util.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define KCACHE_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define KCACHE_TEST_SANITIZED 1
#endif
#ifndef KCACHE_TEST_SANITIZED
#define KCACHE_TEST_SANITIZED 0
#endif

namespace kcache::test {

// Trial counts shrink under sanitizers, where every step is 5-20x slower.
inline int trials(int normal, int sanitized) { return KCACHE_TEST_SANITIZED ? sanitized : normal; }

struct DiskEngine {
  std::string name;
  std::function<Expected<std::shared_ptr<Tier>>(const std::string&, const DiskTierOptions&)> open;
};
inline void PrintTo(const DiskEngine& e, std::ostream* os) { *os << e.name; }

inline std::vector<DiskEngine> disk_engines() {
  std::vector<DiskEngine> v;
#if KCACHE_HAVE_LMDB
  v.push_back({"lmdb", [](const std::string& d, const DiskTierOptions& o) { return open_lmdb_tier(d, o); }});
#endif
  v.push_back({"files", [](const std::string& d, const DiskTierOptions& o) { return open_files_tier(d, o); }});
  return v;
}

inline std::string disk_engine_name(const ::testing::TestParamInfo<DiskEngine>& i) { return i.param.name; }

// Waits (up to 2 s) until every other thread of this process is asleep.
// glibc's malloc takes its locks around fork(); AddressSanitizer's
// allocator (GCC 12) does not, so a fork while another thread is inside it
// (typically a thread just started: the sanitizer allocates its thread
// state) leaves the child an allocator lock that is never released, and
// the child hangs on its next allocation of that size.
inline void settle_threads() {
  const pid_t self = static_cast<pid_t>(::syscall(SYS_gettid));
  for (int round = 0; round < 200; ++round) {
    bool busy = false;
    if (DIR* d = ::opendir("/proc/self/task")) {
      while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.' || std::atoi(e->d_name) == self) continue;
        char buf[512] = {};
        std::string path = std::string("/proc/self/task/") + e->d_name + "/stat";
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = ::read(fd, buf, sizeof buf - 1);
        ::close(fd);
        const char* close_paren = n > 0 ? std::strrchr(buf, ')') : nullptr;
        if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'R') busy = true;
      }
      ::closedir(d);
    }
    if (!busy) return;
    ::usleep(10000);
  }
}

// Runs fn in a forked child; returns its wait status. The child leaves with
// _exit, so no destructor of the parent's objects runs twice.
// REQUIRES: the calling process has no other threads (ThreadSanitizer does
// not support threads started in a child of a multi-threaded process).
inline int run_child(const std::function<int()>& fn) {
  fflush(nullptr);
  settle_threads();
  pid_t pid = ::fork();
  if (pid == 0) _exit(fn());
  int ws = 0;
  while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {}
  return ws;
}

// The stacks of every thread of `pid`, from gdb if it is installed (empty
// otherwise). Bounded: gdb itself gets 60 seconds.
inline std::string stacks_of(pid_t pid) {
  if (::access("/usr/bin/gdb", X_OK) != 0) return "";
  std::string cmd = "timeout 60 /usr/bin/gdb -p " + std::to_string(pid) +
                    " -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' 2>&1";
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    ::pclose(f);
  }
  return out;
}

// Waits for child `pid` at most `limit_ms`. Returns true with its wait
// status in *ws when it ended in time; otherwise prints its threads' stacks
// (stacks_of), kills and reaps it, and returns false: a hang is a failure
// the test sees, never a test that waits forever.
inline bool wait_or_kill(pid_t pid, int limit_ms, int* ws, const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  for (int nap_us = 50;; nap_us = std::min(nap_us * 2, 5000)) {
    pid_t r = ::waitpid(pid, ws, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return true;
    if (std::chrono::steady_clock::now() >= deadline) break;
    ::usleep(static_cast<useconds_t>(nap_us));
  }
  std::string st = stacks_of(pid);
  fprintf(stderr, "HANG: %s: process %d still running after %d ms; its stacks:\n%s\n", what.c_str(),
          static_cast<int>(pid), limit_ms, st.empty() ? "(gdb not installed)" : st.c_str());
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, ws, 0) < 0 && errno == EINTR) {}
  return false;
}

// Lets a debugger attach to this process (where Yama restricts ptrace to
// ancestors); called first thing in children that the watchdog may inspect.
inline void allow_tracing() {
#ifdef PR_SET_PTRACER
  (void)::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

// run_child with a watchdog: returns the wait status, or -1 if the child
// did not end within limit_ms (its stacks printed, the child killed).
inline int run_child_bounded(const std::function<int()>& fn, int limit_ms, const std::string& what) {
  fflush(nullptr);
  settle_threads();
  pid_t pid = ::fork();
  if (pid == 0) {
    allow_tracing();
    _exit(fn());
  }
  int ws = 0;
  return wait_or_kill(pid, limit_ms, &ws, what) ? ws : -1;
}

inline std::string describe_wait(int ws) {
  if (ws == -1) return "hung (killed by the watchdog)";
  if (WIFEXITED(ws)) return "exit " + std::to_string(WEXITSTATUS(ws));
  if (WIFSIGNALED(ws)) return std::string("signal ") + strsignal(WTERMSIG(ws));
  return "status " + std::to_string(ws);
}

// Writes all of buf to fd (pipes to and from children).
inline bool write_all(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Entries stored and counters agree with a fresh walk of the store.
struct Walk {
  uint64_t entries = 0, bytes = 0;
};
inline Walk walk(Tier& t) {
  Walk w;
  Status st = t.admin()->list([&](const ListItem& it) {
    ++w.entries;
    w.bytes += it.size;
    return true;
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return w;
}

}  // namespace kcache::test

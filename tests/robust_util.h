// Helpers for the disk-tier robustness tests: the engines as a test
// parameter, forked children whose crashes become exit codes, sanitizer
// detection to scale trial counts down.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

// Runs fn in a forked child; returns its wait status. The child leaves with
// _exit, so no destructor of the parent's objects runs twice.
// REQUIRES: the calling process has no other threads (ThreadSanitizer does
// not support threads started in a child of a multi-threaded process).
inline int run_child(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) _exit(fn());
  int ws = 0;
  while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  return ws;
}

inline std::string describe_wait(int ws) {
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
  Status st = t.list([&](const ListItem& it) {
    ++w.entries;
    w.bytes += it.size;
    return true;
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return w;
}

}  // namespace kcache::test

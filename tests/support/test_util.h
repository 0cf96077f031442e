// Helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"

// ThreadSanitizer cannot follow a child of a multi-threaded fork() that
// starts threads of its own (it stops such a child with "starting new
// threads after multi-threaded fork is not supported").
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() GTEST_SKIP() << "ThreadSanitizer does not support threads started after a multi-threaded fork"
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

namespace kcache::test {

// A fresh folder under the test temp dir, removed at destruction.
// Goes back to the working folder it found when it leaves scope (for a
// test that chdir()s).
class ScopedCwd {
 public:
  ScopedCwd() {
    char buf[4096];
    if (::getcwd(buf, sizeof buf)) dir_ = buf;
  }
  ~ScopedCwd() {
    if (!dir_.empty()) (void)::chdir(dir_.c_str());
  }
  ScopedCwd(const ScopedCwd&) = delete;
  ScopedCwd& operator=(const ScopedCwd&) = delete;
  bool ok() const { return !dir_.empty(); }

 private:
  std::string dir_;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "kcache-test-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p) path_ = p;
  }
  ~TempDir() {
    if (!path_.empty() && std::getenv("KCACHE_TEST_KEEP_DIRS") == nullptr) {
      std::string cmd = "chmod -R u+w '" + path_ + "' 2>/dev/null; rm -rf '" + path_ + "'";
      (void)::system(cmd.c_str());
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The disk engines built in, by name, for tests parameterised over them.
inline std::vector<std::string> engine_names() {
#if KCACHE_HAVE_LMDB
  return {"lmdb", "files"};
#else
  return {"files"};
#endif
}

// Options for a cache in `dir` that logs only errors.
inline Options disk_options(const std::string& dir, bool memory = true) {
  Options o;
  o.dir = dir;
  o.memory_tier = memory;
  o.log_level = LogLevel::error;
  return o;
}

inline Key key_of(uint64_t i) { return KeyBuilder("test").add_u64("i", i).finish()->key; }

// Deterministic bytes for key i (so any process can check them).
inline std::string bytes_for(uint64_t i, size_t n) {
  std::string s(n, '\0');
  uint64_t x = i * 0x9e3779b97f4a7c15ull + 1;
  for (size_t j = 0; j < n; ++j) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[j] = static_cast<char>(x);
  }
  return s;
}

inline Entry make_entry(uint64_t i, size_t n = 1000, Compression c = Compression::none) {
  EntryBuilder b(key_of(i));
  b.add("obj", bytes_for(i, n)).add("sig", "kernel_" + std::to_string(i));
  EntryMeta m;
  m.created_unix_ms = 1700000000000ull;
  m.compile_cost_us = 1234;
  m.producer = "test";
  b.meta(m).compression(c);
  auto e = b.build();
  EXPECT_TRUE(e.has_value());
  return *e;
}

inline bool entry_ok(const Entry& e, uint64_t i, size_t n = 1000) {
  auto o = e.artifact("obj");
  auto s = e.artifact("sig");
  return e.key() == key_of(i) && o && *o == bytes_for(i, n) && s && *s == "kernel_" + std::to_string(i);
}

// The lines of a log file (Options::log_file) that contain `needle`; every
// line when it is empty.
inline std::vector<std::string> log_lines(const std::string& path, const std::string& needle = {}) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

}  // namespace kcache::test

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "kcache/cache.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

namespace {
CompileFn value_fn(std::atomic<int>* calls, std::string v) {
  return [=]() -> Expected<std::vector<Artifact>> {
    calls->fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return std::vector<Artifact>{{"obj", v}};
  };
}
}  // namespace

TEST(Batch, ResultsInRequestOrderWithProgressAndErrorsInPlace) {
  TempDir d;
  Options o;
  o.dir = d.path();
  o.log_level = LogLevel::error;
  auto c = Cache::open(o);
  std::atomic<int> calls{0};
  // Pre-store three so some are hits.
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(
        c->get_or_compile(*KeyBuilder("b").add_u64("i", i).finish(), value_fn(&calls, "v" + std::to_string(i))));
  calls = 0;
  std::vector<BatchItem> items;
  for (int i = 0; i < 40; ++i) {
    if (i == 17) {
      items.push_back({*KeyBuilder("b").add_u64("i", i).finish(), []() -> Expected<std::vector<Artifact>> {
                         return Status(Errc::compile_failed, "error in kernel 17");
                       }});
    } else {
      items.push_back({*KeyBuilder("b").add_u64("i", i).finish(), value_fn(&calls, "v" + std::to_string(i))});
    }
  }
  // The same key twice in one batch compiles once.
  items.push_back({*KeyBuilder("b").add_u64("i", 5).finish(), value_fn(&calls, "v5")});
  std::mutex mu;
  std::vector<size_t> seen;
  size_t last_done = 0;
  BatchOptions bo;
  bo.threads = 4;
  bo.progress = [&](size_t done, size_t total, size_t index, Source) {
    std::lock_guard lk(mu);
    EXPECT_EQ(total, items.size());
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    seen.push_back(index);
  };
  std::vector<Source> src;
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->get_or_compile_batch(items, bo, &src);
  ASSERT_EQ(r.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (i == 17) {
      ASSERT_FALSE(r[i].has_value());
      EXPECT_EQ(r[i].error().message(), "error in kernel 17");
      continue;
    }
    ASSERT_TRUE(r[i].has_value()) << i;
    int id = i == 40 ? 5 : static_cast<int>(i);
    EXPECT_EQ(*r[i]->artifact("obj"), "v" + std::to_string(id));
  }
  EXPECT_EQ(seen.size(), items.size());
  EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), items.size());
  EXPECT_EQ(calls.load(), 36);  // 40 - 3 hits - 1 failure; the duplicate of 5 shares
  EXPECT_EQ(src[0], Source::memory);
  (void)t0;
}

TEST(Batch, UsesSeveralWorkers) {
  auto c = Cache::with_tiers({make_memory_tier()});
  std::atomic<int> running{0}, peak{0};
  std::vector<BatchItem> items;
  for (int i = 0; i < 16; ++i)
    items.push_back({*KeyBuilder("w").add_u64("i", i).finish(), [&]() -> Expected<std::vector<Artifact>> {
                       int now = ++running;
                       int p = peak.load();
                       while (now > p && !peak.compare_exchange_weak(p, now)) {}
                       std::this_thread::sleep_for(std::chrono::milliseconds(30));
                       --running;
                       return std::vector<Artifact>{{"obj", "x"}};
                     }});
  BatchOptions bo;
  bo.threads = 4;
  auto r = c->get_or_compile_batch(items, bo);
  for (auto& x : r) EXPECT_TRUE(x.has_value());
  EXPECT_GE(peak.load(), 2);
  EXPECT_LE(peak.load(), 4);
}

// Regression: an exception thrown by a compile function inside a batch
// escaped a worker thread and terminated the process.
TEST(BatchRegression, ThrowingCompileReachesTheCallerNotTerminate) {
  auto c = Cache::with_tiers({make_memory_tier()});
  std::vector<BatchItem> items;
  std::atomic<int> ran{0};
  for (int i = 0; i < 12; ++i)
    items.push_back({*KeyBuilder("throw").add_u64("i", i).finish(), [&, i]() -> Expected<std::vector<Artifact>> {
                       ++ran;
                       if (i == 5) throw std::runtime_error("boom in batch");
                       std::this_thread::sleep_for(std::chrono::milliseconds(5));
                       return std::vector<Artifact>{{"obj", "x"}};
                     }});
  BatchOptions bo;
  bo.threads = 3;
  try {
    (void)c->get_or_compile_batch(items, bo);
    FAIL() << "expected the compile function's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom in batch");
  }
  // The key that threw was not left with a dead flight: it compiles again.
  std::atomic<int> calls{0};
  auto again = c->get_or_compile(items[5].key, value_fn(&calls, "fine"));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again->artifact("obj"), "fine");
  // A throwing progress callback is rethrown the same way.
  BatchOptions bad;
  bad.threads = 2;
  bad.progress = [](size_t, size_t, size_t, Source) { throw std::logic_error("progress"); };
  std::vector<BatchItem> fresh;
  for (int i = 100; i < 104; ++i)
    fresh.push_back({*KeyBuilder("throw").add_u64("i", i).finish(), value_fn(&calls, "y")});
  EXPECT_THROW((void)c->get_or_compile_batch(fresh, bad), std::logic_error);
}

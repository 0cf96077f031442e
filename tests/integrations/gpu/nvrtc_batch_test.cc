// nvrtc::Compiler::compile_all across processes: N processes (children of
// fork()) compile overlapping lists of real CUDA programs with real NVRTC on
// one empty store, in the same order and in different orders. Every program
// is compiled exactly once in all (the children's compiled results add up to
// the number of programs) and every child gets the same PTX for each; a
// batch compiles what nobody else holds before it waits for a program
// another process is compiling, and takes over a holder killed with
// SIGKILL; a program that fails keeps its error in its slot.
//
// The parent runs no NVRTC before its children are forked; the last test
// (in this process) compares compile_all with uncached compiles.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "integrations/nvrtc/flight.h"
#include "kcache/cache.h"
#include "kcache/nvrtc.h"
#include "process_sync.h"
#include "test_util.h"

namespace kcache {
namespace {

using test::Signal;
using test::TempDir;

constexpr int kPrograms = 12;

// Program i: a kernel k<i> with constants of its own and a loop NVRTC
// unrolls, so that a compile takes a while and processes overlap.
nvrtc::Program program(int i) {
  nvrtc::Program p;
  p.name = "k" + std::to_string(i) + ".cu";
  p.source = "extern \"C\" __global__ void k" + std::to_string(i) +
             "(float* out, const float* in, int n) {\n"
             "  int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (t >= n) return;\n"
             "  float acc = in[t];\n"
             "#pragma unroll\n"
             "  for (int j = 0; j < 64; ++j) acc = acc * " +
             std::to_string(i + 2) + ".5f + __sinf(acc + j);\n  out[t] = acc + " + std::to_string(1000 + i) +
             ".0f;\n}\n";
  p.options = {"-arch=compute_80", "-default-device"};
  return p;
}

std::vector<nvrtc::Program> programs(int n) {
  std::vector<nvrtc::Program> v;
  for (int i = 0; i < n; ++i) v.push_back(program(i));
  return v;
}

std::unique_ptr<Cache> open_cache(const std::string& dir) {
  Options o;
  o.dir = dir;
  o.log_level = LogLevel::error;
  return Cache::open(o);
}

// What a child reports through its pipe, per program by its number.
struct Report {
  int compiled[kPrograms] = {};       // results this child compiled (Source::compiled)
  uint64_t ptx_hash[kPrograms] = {};  // first bytes of the digest of each program's PTX
  uint64_t commits = 0;               // the child's CacheStats::compiles
  uint64_t takeovers = 0;
  uint64_t lease_waits = 0;
  int wrong = -1;  // results missing or wrong (or -1: the child failed first)
};

// Compiles `order` (program numbers) with compile_all on `threads` workers
// and checks each PTX names its kernel. `waiting`, when given, is posted
// once the cache waits for another process's lease.
Report compile_list(const std::string& store, const std::vector<int>& order, unsigned threads,
                    const Signal* waiting = nullptr) {
  Report r;
  auto cache = open_cache(store);
  std::optional<test::OnLeaseWait> on_wait;
  if (waiting) on_wait.emplace(*cache, [waiting] { waiting->post(); });
  nvrtc::Compiler c(*cache);
  std::vector<nvrtc::Program> ps;
  for (int i : order) ps.push_back(program(i));
  auto results = c.compile_all(ps, threads);
  on_wait.reset();
  if (results.size() != order.size()) return r;
  r.wrong = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    if (!results[k]) {
      std::fprintf(stderr, "k%d: %s\n", i, results[k].error().to_string().c_str());
      ++r.wrong;
      continue;
    }
    const std::string ptx(results[k]->ptx);
    if (ptx.find(".entry k" + std::to_string(i) + "(") == std::string::npos) ++r.wrong;
    if (results[k]->source == Source::compiled) ++r.compiled[i];
    Digest d = hash_bytes(ptx);
    std::memcpy(&r.ptx_hash[i], d.bytes.data(), sizeof(uint64_t));
  }
  (void)cache->flush();
  auto st = cache->stats();
  r.commits = st.compiles;
  r.takeovers = st.lease_takeovers;
  r.lease_waits = st.lease_waits;
  return r;
}

using Child = kcache::test::Forked<Report>;

// `orders.size()` children started together, child k on orders[k].
std::vector<Report> run_together(const std::string& store, const std::vector<std::vector<int>>& orders,
                                 unsigned threads) {
  Signal go;
  std::vector<Child> kids;
  for (const auto& order : orders) {
    kids.push_back(kcache::test::fork_report([&] {
      go.wait();
      return compile_list(store, order, threads);
    }));
  }
  for (size_t k = 0; k < orders.size(); ++k) go.post();
  std::vector<Report> reports;
  for (auto& c : kids) reports.push_back(kcache::test::join_report(c));
  return reports;
}

// Each program compiled exactly once in all, and every child that has a
// program got the same PTX for it.
void expect_once_each(const std::vector<Report>& reports) {
  for (int i = 0; i < kPrograms; ++i) {
    int compiled = 0;
    uint64_t hash = 0;
    for (const auto& r : reports) {
      compiled += r.compiled[i];
      if (!r.ptx_hash[i]) continue;
      if (!hash) hash = r.ptx_hash[i];
      EXPECT_EQ(r.ptx_hash[i], hash) << "k" << i;
    }
    EXPECT_EQ(compiled, 1) << "k" << i;
  }
  uint64_t commits = 0;
  for (const auto& r : reports) {
    EXPECT_EQ(r.wrong, 0);
    commits += r.commits;
  }
  EXPECT_EQ(commits, static_cast<uint64_t>(kPrograms));
}

std::vector<int> all_programs() {
  std::vector<int> v(kPrograms);
  for (int i = 0; i < kPrograms; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// Four processes, one list in one order: each program compiled once in
// all; a second round on the warm store compiles nothing.
TEST(NvrtcBatch, FourProcessesSameOrderCompileEachProgramOnce) {
  TempDir d;
  const std::string store = d.path() + "/cache";
  auto reports = run_together(store, std::vector<std::vector<int>>(4, all_programs()), 2);
  expect_once_each(reports);
  auto warm = run_together(store, std::vector<std::vector<int>>(2, all_programs()), 2);
  for (const auto& r : warm) {
    EXPECT_EQ(r.wrong, 0);
    EXPECT_EQ(r.commits, 0u);
    for (int i = 0; i < kPrograms; ++i) EXPECT_EQ(r.compiled[i], 0) << "k" << i;
  }
}

// Four processes, overlapping lists in four orders (all reversed, the
// first two thirds rotated, odd ones first, the last two thirds): still
// each program once, every PTX the same.
TEST(NvrtcBatch, FourProcessesOverlappingListsInDifferentOrdersCompileEachProgramOnce) {
  TempDir d;
  std::vector<std::vector<int>> orders(4, all_programs());
  std::reverse(orders[0].begin(), orders[0].end());
  orders[1].resize(kPrograms * 2 / 3);
  std::rotate(orders[1].begin(), orders[1].begin() + kPrograms / 3, orders[1].end());
  orders[2].clear();
  for (int first : {1, 0})
    for (int i = first; i < kPrograms; i += 2) orders[2].push_back(i);
  orders[3].erase(orders[3].begin(), orders[3].begin() + kPrograms / 3);
  auto reports = run_together(d.path() + "/cache", orders, 1);
  expect_once_each(reports);
}

// A process holds program 0's flight (a Flight on the key compile_all uses
// for a program nothing is stored for, as a compiling process holds it). A
// batch given the whole list compiles every other program before it waits
// for that one; the holder then gives the key up (`kill` false: the batch
// compiles program 0 once it is free) or is killed while holding it (the
// batch takes the lease over and compiles it); either only once the batch
// waits for it. One worker: a batch that waited for program 0 first would
// never reach the others.
void held_first_program(bool kill) {
  TempDir d;
  const std::string store = d.path() + "/cache";
  Signal held, waiting;
  Child holder = kcache::test::fork_report([&] {
    Report r;
    auto cache = open_cache(store);
    nvrtc::Compiler c(*cache);
    auto inputs = c.key(program(0));  // nothing stored: the inputs key
    if (!inputs) return r;
    auto fk = nvrtc::detail::flight_key(inputs->key, Digest{}, nullptr);
    if (!fk) return r;
    Flight f = cache->begin(*fk);
    if (!f.owner()) return r;
    held.post();
    // Until the batch has stored every other program: it did not wait.
    bool others = test::wait_until(
        [&] {
          for (int i = 1; i < kPrograms; ++i) {
            auto k = c.key(program(i));
            if (!k || k->manifest.ns != nvrtc::kNamespace || !cache->get(k->key)) return false;
          }
          return true;
        },
        120000);
    if (!others) return r;
    // Program 0 is still not compiled: the batch waits for this process.
    auto k0 = c.key(program(0));
    if (!k0 || k0->manifest.ns == nvrtc::kNamespace) return r;
    if (!waiting.wait(120000)) return r;
    if (kill) ::raise(SIGKILL);  // holding the lease
    f.abandon();
    r.wrong = 0;
    return r;
  });
  ASSERT_TRUE(held.wait(120000));
  Child batch = kcache::test::fork_report([&] { return compile_list(store, all_programs(), 1, &waiting); });
  // The holder first: a killed one is reaped at once, so its PID is gone
  // while the batch waits (a zombie would still look alive).
  Report h = kcache::test::join_report(holder);
  Report b = kcache::test::join_report(batch);
  EXPECT_EQ(h.wrong, kill ? -1 : 0);  // a killed holder reports nothing
  EXPECT_EQ(b.wrong, 0);
  for (int i = 0; i < kPrograms; ++i) EXPECT_EQ(b.compiled[i], 1) << "k" << i;
  EXPECT_EQ(b.commits, static_cast<uint64_t>(kPrograms));
  EXPECT_GE(b.lease_waits, 1u);
  if (kill) {
    EXPECT_GE(b.takeovers, 1u);
  }
}

TEST(NvrtcBatch, CompilesWhatNobodyHoldsThenWaitsForTheHolder) { held_first_program(false); }

TEST(NvrtcBatch, AHolderKilledWhileHoldingIsTakenOver) { held_first_program(true); }

// In this process, last (the others fork): a program that does not compile
// keeps NVRTC's error in its slot; the others are compiled, byte for byte
// what NVRTC gives without the cache, and are hits the second time, from
// memory and from a fresh cache on the store.
TEST(NvrtcBatch, AFailingProgramKeepsItsErrorInItsSlot) {
  TempDir d;
  const std::string store = d.path() + "/cache";
  auto ps = programs(5);
  ps[2].source = "__global__ void broken() { this is not cuda; }\n";
  ps[2].name = "broken.cu";
  std::vector<std::string> want(ps.size());  // NVRTC's PTX without the cache
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 2) continue;
    auto arts = nvrtc::compile_uncached(ps[i]);
    ASSERT_TRUE(arts.has_value());
    ASSERT_EQ((*arts)[0].name, "ptx");
    want[i] = (*arts)[0].data;
    want[i].pop_back();  // its NUL
  }
  for (int round = 0; round < 3; ++round) {
    auto cache = open_cache(store);
    nvrtc::Compiler c(*cache);
    for (int again = 0; again < (round == 0 ? 2 : 1); ++again) {
      auto results = c.compile_all(ps, 2);
      ASSERT_EQ(results.size(), ps.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        if (i == 2) {
          ASSERT_FALSE(results[i].has_value());
          EXPECT_EQ(results[i].error().code(), Errc::compile_failed);
          EXPECT_NE(results[i].error().message().find("broken.cu"), std::string::npos) << results[i].error().message();
          continue;
        }
        ASSERT_TRUE(results[i].has_value()) << i << ": " << results[i].error().to_string();
        const bool cold = round == 0 && again == 0;
        EXPECT_EQ(results[i]->source == Source::compiled, cold) << i << " " << source_name(results[i]->source);
        EXPECT_EQ(results[i]->ptx, want[i]) << i;
      }
    }
  }
}

// An empty list is an empty answer.
TEST(NvrtcBatch, AnEmptyListCompilesNothing) {
  TempDir d;
  auto cache = open_cache(d.path() + "/cache");
  nvrtc::Compiler c(*cache);
  EXPECT_TRUE(c.compile_all({}).empty());
  EXPECT_EQ(cache->stats().compiles, 0u);
}

}  // namespace
}  // namespace kcache

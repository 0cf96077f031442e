// Stage keys (kcache/stage.h) on a real disk store: a toy two-stage pipeline
// whose front end strips comments and blanks from a "source" (so different
// sources can give one IR) and whose backend turns the IR into an "object".
#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "kcache/stage.h"
#include "test_util.h"

namespace {

using kcache::Cache;
using kcache::Entry;
using kcache::Expected;
using kcache::KeyBuilder;
using kcache::KeyInfo;
using kcache::StageOutput;
using kcache::test::TempDir;

// "IR": the source without '#' comments and without blanks.
std::string front_end(const std::string& src) {
  std::string ir;
  bool comment = false;
  for (char c : src) {
    if (c == '#') comment = true;
    if (c == '\n') comment = false;
    if (!comment && !std::isspace(static_cast<unsigned char>(c))) ir.push_back(c);
  }
  return ir;
}

// "Object": the IR reversed, with a marker.
std::string back_end(const std::string& ir) { return "obj:" + std::string(ir.rbegin(), ir.rend()); }

struct Pipeline {
  Cache& cache;
  std::string target = "x86_64";
  int frontend_runs = 0;
  int backend_runs = 0;

  KeyInfo front_key(const std::string& src) const {
    return *KeyBuilder("stage-test-front/1").add_bytes("source", src).add_string("target", target).finish();
  }

  Expected<kcache::StagedResult> build(const std::string& src) {
    std::string ir;
    auto fe = [&]() -> Expected<StageOutput> {
      ++frontend_runs;
      ir = front_end(src);
      StageOutput out;
      out.ir = kcache::hash_bytes(ir);
      auto k = KeyBuilder("stage-test-back/1").add_digest("ir", out.ir).add_string("target", target).finish();
      if (!k) return k.error();
      out.backend = *k;
      return out;
    };
    auto be = [&]() -> Expected<std::vector<kcache::Artifact>> {
      ++backend_runs;
      return std::vector<kcache::Artifact>{{"obj", back_end(ir)}};
    };
    return kcache::get_or_compile_staged(cache, front_key(src), fe, be);
  }
};

std::string obj_of(const kcache::StagedResult& r) { return std::string(*r.entry.artifact("obj")); }

const std::string kSrc = "a + b  # add\n* c\n";
const std::string kSameIr = "a+b\n   *c   # same IR, other text\n";
const std::string kOtherIr = "a - b * c\n";

TEST(StageTest, HitByFrontEndKeyRunsNeitherStage) {
  TempDir d;
  {
    auto cache = Cache::open(kcache::test::disk_options(d.path(), false));
    Pipeline p{*cache};
    auto r = p.build(kSrc);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_TRUE(r->frontend_ran);
    EXPECT_TRUE(r->backend_ran);
    EXPECT_EQ(r->source, kcache::Source::compiled);
    EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
    EXPECT_EQ(p.frontend_runs, 1);
    EXPECT_EQ(p.backend_runs, 1);
    (void)cache->flush();
  }
  // A new Cache on the same folder: the link and the object are on disk.
  auto cache = Cache::open(kcache::test::disk_options(d.path(), false));
  Pipeline p{*cache};
  auto r = p.build(kSrc);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->frontend_ran);
  EXPECT_FALSE(r->backend_ran);
  EXPECT_EQ(r->source, kcache::Source::disk);
  EXPECT_EQ(p.frontend_runs, 0);
  EXPECT_EQ(p.backend_runs, 0);
  EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
  EXPECT_EQ(r->link.front, p.front_key(kSrc).key);
  EXPECT_EQ(r->link.ir, kcache::hash_bytes(front_end(kSrc)));
  EXPECT_EQ(r->link.backend, r->entry.key());

  // The lower-level calls agree.
  auto link = kcache::find_stage_link(*cache, p.front_key(kSrc).key);
  ASSERT_TRUE(link);
  EXPECT_EQ(link->backend, r->entry.key());
  auto e = kcache::get_staged(*cache, p.front_key(kSrc).key);
  ASSERT_TRUE(e);
  EXPECT_EQ(*e->artifact("obj"), back_end(front_end(kSrc)));
  EXPECT_FALSE(kcache::get_staged(*cache, p.front_key(kOtherIr).key));
}

TEST(StageTest, ChangedSourceWithSameIrRunsFrontEndOnly) {
  TempDir d;
  auto cache = Cache::open(kcache::test::disk_options(d.path()));
  Pipeline p{*cache};
  ASSERT_TRUE(p.build(kSrc));
  ASSERT_EQ(front_end(kSrc), front_end(kSameIr));
  auto r = p.build(kSameIr);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->frontend_ran);
  EXPECT_FALSE(r->backend_ran);
  EXPECT_NE(r->source, kcache::Source::compiled);
  EXPECT_EQ(p.frontend_runs, 2);
  EXPECT_EQ(p.backend_runs, 1);
  EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
  // The new source got its own link: next time neither stage runs.
  auto again = p.build(kSameIr);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->frontend_ran);
  EXPECT_EQ(p.frontend_runs, 2);
  EXPECT_EQ(p.backend_runs, 1);
}

TEST(StageTest, ChangedIrRunsBothStages) {
  TempDir d;
  auto cache = Cache::open(kcache::test::disk_options(d.path()));
  Pipeline p{*cache};
  ASSERT_TRUE(p.build(kSrc));
  auto r = p.build(kOtherIr);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->frontend_ran);
  EXPECT_TRUE(r->backend_ran);
  EXPECT_EQ(p.frontend_runs, 2);
  EXPECT_EQ(p.backend_runs, 2);
  EXPECT_EQ(obj_of(*r), back_end(front_end(kOtherIr)));
  EXPECT_NE(obj_of(*r), back_end(front_end(kSrc)));
}

TEST(StageTest, BackendInputsInFrontKeySeparateTargets) {
  TempDir d;
  auto cache = Cache::open(kcache::test::disk_options(d.path()));
  Pipeline x86{*cache};
  Pipeline arm{*cache, "aarch64"};
  ASSERT_TRUE(x86.build(kSrc));
  auto r = arm.build(kSrc);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->frontend_ran);
  EXPECT_TRUE(r->backend_ran);
}

TEST(StageTest, StaleLinkIsAMissNeverAWrongArtifact) {
  TempDir d;
  auto cache = Cache::open(kcache::test::disk_options(d.path(), false));
  Pipeline p{*cache};
  auto first = p.build(kSrc);
  ASSERT_TRUE(first);
  (void)cache->flush();
  // The object is evicted; the link stays and points to nothing.
  for (auto& t : cache->tiers()) ASSERT_TRUE(t->remove(first->entry.key()).is_ok());
  ASSERT_TRUE(kcache::find_stage_link(*cache, p.front_key(kSrc).key));
  EXPECT_FALSE(kcache::get_staged(*cache, p.front_key(kSrc).key));
  auto r = p.build(kSrc);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->frontend_ran);
  EXPECT_TRUE(r->backend_ran);
  EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
  EXPECT_EQ(p.backend_runs, 2);
}

TEST(StageTest, CorruptLinkIsAMissNeverAWrongArtifact) {
  TempDir d;
  auto cache = Cache::open(kcache::test::disk_options(d.path(), false));
  Pipeline p{*cache};
  ASSERT_TRUE(p.build(kSrc));
  auto other = p.build(kOtherIr);
  ASSERT_TRUE(other);
  (void)cache->flush();
  const KeyInfo front = p.front_key(kSrc);
  KeyInfo link_key;
  link_key.key = kcache::stage_link_key(front.key);
  link_key.manifest.ns = "kcache-stage-link/1";

  auto expect_rebuilt = [&](const char* what) {
    SCOPED_TRACE(what);
    (void)cache->flush();  // without a memory tier, get() sees what the disk has
    int fe = p.frontend_runs;
    EXPECT_FALSE(kcache::find_stage_link(*cache, front.key));
    auto r = p.build(kSrc);
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->frontend_ran);
    EXPECT_EQ(p.frontend_runs, fe + 1);
    EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
    (void)cache->flush();
    // And the link was replaced by a good one.
    auto l = kcache::find_stage_link(*cache, front.key);
    ASSERT_TRUE(l);
    EXPECT_EQ(l->backend, r->entry.key());
  };

  // Garbage of the right size.
  ASSERT_TRUE(cache->put(link_key, {{"stage-link", std::string(52, 'x')}}));
  expect_rebuilt("garbage");
  // Truncated.
  auto good = cache->get(link_key.key);
  ASSERT_TRUE(good);
  std::string bytes(*good->artifact("stage-link"));
  ASSERT_TRUE(cache->put(link_key, {{"stage-link", bytes.substr(0, 40)}}));
  expect_rebuilt("truncated");
  // Another version.
  std::string v2 = bytes;
  v2[4] = 2;
  ASSERT_TRUE(cache->put(link_key, {{"stage-link", v2}}));
  expect_rebuilt("version");
  // A well-formed link made for another front-end key, pointing to another
  // source's object: it must not be followed.
  std::string foreign = bytes;
  auto other_front = p.front_key(kOtherIr).key;
  std::memcpy(foreign.data() + 8, other_front.bytes.data(), 16);
  std::memcpy(foreign.data() + 40, other->entry.key().bytes.data(), 16);
  ASSERT_TRUE(cache->put(link_key, {{"stage-link", foreign}}));
  expect_rebuilt("foreign");
  // No artifact of that name.
  ASSERT_TRUE(cache->put(link_key, {{"obj", "obj:whatever"}}));
  expect_rebuilt("no link artifact");
}

TEST(StageTest, CorruptLinkBytesOnDiskAreAMiss) {
  TempDir d;
  auto o = kcache::test::disk_options(d.path(), false);
  o.engine = kcache::Engine::files;
  const std::string link_hex = [&] {
    auto c = Cache::open(o);
    Pipeline p{*c};
    EXPECT_TRUE(p.build(kSrc));
    (void)c->flush();
    return kcache::stage_link_key(p.front_key(kSrc).key).hex();
  }();
  // Flip one byte in the middle of the stored link file.
  std::string path = d.path() + "/files/" + link_hex.substr(0, 2) + "/" + link_hex + ".kce";
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  ASSERT_GT(n, 100);
  std::fseek(f, n - 30, SEEK_SET);
  int c = std::fgetc(f);
  std::fseek(f, n - 30, SEEK_SET);
  std::fputc(c ^ 0x5a, f);
  std::fclose(f);

  auto cache = Cache::open(o);
  Pipeline p{*cache};
  auto r = p.build(kSrc);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->frontend_ran);  // the link was a miss
  EXPECT_FALSE(r->backend_ran);  // the object itself is fine
  EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
  EXPECT_GE(cache->stats().faults + cache->stats().tiers[0].stats.corrupt, 1u);
}

TEST(StageTest, FrontEndAndBackendErrorsReachTheCaller) {
  TempDir d;
  auto cache = Cache::open(kcache::test::disk_options(d.path()));
  auto front = *KeyBuilder("stage-test-front/1").add_string("source", "bad").finish();
  auto r = kcache::get_or_compile_staged(
      *cache, front, []() -> Expected<StageOutput> { return kcache::Status(kcache::Errc::compile_failed, "syntax"); },
      []() -> Expected<std::vector<kcache::Artifact>> {
        return std::vector<kcache::Artifact>{{"obj", "x"}};
      });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), kcache::Errc::compile_failed);
  EXPECT_FALSE(kcache::find_stage_link(*cache, front.key));

  auto r2 = kcache::get_or_compile_staged(
      *cache, front,
      []() -> Expected<StageOutput> {
        StageOutput o;
        o.ir = kcache::hash_bytes("ir");
        o.backend = *KeyBuilder("stage-test-back/1").add_digest("ir", o.ir).finish();
        return o;
      },
      []() -> Expected<std::vector<kcache::Artifact>> { return kcache::Status(kcache::Errc::compile_failed, "isel"); });
  ASSERT_FALSE(r2);
  EXPECT_FALSE(kcache::find_stage_link(*cache, front.key));
}

TEST(StageTest, DisabledCacheRunsBothStagesEveryTime) {
  TempDir d;
  auto o = kcache::test::disk_options(d.path());
  o.disabled = true;
  auto cache = Cache::open(o);
  Pipeline p{*cache};
  for (int i = 0; i < 2; ++i) {
    auto r = p.build(kSrc);
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->frontend_ran);
    EXPECT_TRUE(r->backend_ran);
    EXPECT_EQ(obj_of(*r), back_end(front_end(kSrc)));
  }
  EXPECT_EQ(p.backend_runs, 2);
}

}  // namespace

// Readable values, private components and labels (kcache/key.h): kept for
// display, never hashed, carried by entries (old entries still read), and
// what describe() prints of a difference.
#include <gtest/gtest.h>

#include <dirent.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "golden_key.h"
#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/manifest.h"
#include "test_util.h"

namespace kcache {
namespace {

const ManifestItem* item(const Manifest& m, std::string_view name) {
  for (const auto& it : m.items)
    if (it.name == name) return &it;
  return nullptr;
}

TEST(ExplainKey, GoldenKeyUnchangedAndValuesKept) {
  auto g = golden_key();
  ASSERT_TRUE(g);
  EXPECT_EQ(g->key.hex(), GOLDEN_KEY_HEX);  // values and labels are not hashed
  EXPECT_EQ(item(g->manifest, "cpu")->value, "skylake");
  EXPECT_EQ(item(g->manifest, "triple")->value, "x86_64-pc-linux-gnu");
  EXPECT_EQ(item(g->manifest, "opt_level")->value, "2");
  EXPECT_EQ(item(g->manifest, "offset")->value, "-7");
  EXPECT_EQ(item(g->manifest, "fast_math")->value, "false");
  for (const char* none : {"ir", "features", "options", "stage0"})
    EXPECT_FALSE(item(g->manifest, none)->value) << none;  // bytes, list, map, digest: digests only
}

TEST(ExplainKey, LongStringsKeepNoValue) {
  std::string at_limit(kMaxReadableValue, 'a'), over(kMaxReadableValue + 1, 'a');
  auto k = KeyBuilder("t/1").add_string("a", at_limit).add_string("b", over).finish();
  ASSERT_TRUE(k);
  EXPECT_EQ(item(k->manifest, "a")->value, at_limit);
  EXPECT_FALSE(item(k->manifest, "b")->value);
}

TEST(ExplainKey, PrivateAndLabelDoNotChangeTheKey) {
  auto plain = KeyBuilder("t/1").add_string("token", "s3cr3t").add_u64("n", 5).finish();
  auto hidden =
      KeyBuilder("t/1").mark_private("token").add_string("token", "s3cr3t").add_u64("n", 5).label("kern").finish();
  auto hidden_after = KeyBuilder("t/1").add_string("token", "s3cr3t").add_u64("n", 5).mark_private("token").finish();
  ASSERT_TRUE(plain && hidden && hidden_after);
  EXPECT_EQ(plain->key, hidden->key);
  EXPECT_EQ(plain->key, hidden_after->key);
  EXPECT_EQ(item(plain->manifest, "token")->value, "s3cr3t");
  EXPECT_FALSE(item(hidden->manifest, "token")->value);
  EXPECT_FALSE(item(hidden_after->manifest, "token")->value);
  EXPECT_EQ(item(hidden->manifest, "n")->value, "5");
  EXPECT_EQ(hidden->label, "kern");
  EXPECT_EQ(plain->label, "");
  // Values are not compared: a manifest without them equals one with them.
  Manifest bare = plain->manifest;
  for (auto& it : bare.items) it.value.reset();
  EXPECT_EQ(bare, plain->manifest);
  EXPECT_EQ(bare.key(), plain->key);
}

TEST(ExplainKey, DescribeShowsValues) {
  auto a = *KeyBuilder("llvm/1").add_string("cpu", "znver3").add_i64("ir_opt_level", 2).add_bytes("ir", "x").finish();
  auto b = *KeyBuilder("llvm/1")
                .add_string("cpu", "x86-64")
                .add_i64("ir_opt_level", 3)
                .add_bytes("ir", "y")
                .add_bool("fast", true)
                .finish();
  auto d = diff_manifests(a.manifest, b.manifest);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(describe(d[0]), "cpu: znver3 \u2192 x86-64");
  EXPECT_EQ(describe(d[1]), "fast: added (true)");
  EXPECT_EQ(describe(d[2]).rfind("ir: changed (stored ", 0), 0u) << describe(d[2]);  // bytes: digests
  EXPECT_EQ(describe(d[3]), "ir_opt_level: 2 \u2192 3");
  EXPECT_EQ(shown_value(d[3].stored_value, d[3].stored), "2");
  EXPECT_EQ(shown_value(d[2].stored_value, d[2].stored), d[2].stored->hex());
  // JSON carries values and reads them back.
  auto back = parse_manifest(manifest_to_json(b.manifest));
  ASSERT_TRUE(back);
  EXPECT_EQ(item(*back, "cpu")->value, "x86-64");
  EXPECT_NE(manifest_to_json(b.manifest)
                .find("\"name\":\"ir_opt_level\",\"type\":\"i64\",\"digest\":\"" +
                      item(b.manifest, "ir_opt_level")->digest.hex() + "\",\"value\":\"3\""),
            std::string::npos);
}

TEST(ExplainKey, EntriesCarryLabelAndValues) {
  auto k = *KeyBuilder("t/1").add_string("cpu", "znver3").add_u64("opt", 3).add_bytes("ir", "abc").finish();
  EntryMeta m;
  m.label = "lexer";
  for (std::string data : {std::string(), std::string("hello"), std::string(100000, 'x')}) {
    auto e = EntryBuilder(k.key).add("obj", data).add("ptx", "p").meta(m).manifest(k.manifest).build();
    ASSERT_TRUE(e);
    auto d = Entry::decode(make_heap_buffer(std::string(e->encoded())), &k.key);
    ASSERT_TRUE(d) << d.error().to_string();
    EXPECT_EQ(d->meta().label, "lexer");
    EXPECT_EQ(item(d->manifest(), "cpu")->value, "znver3");
    EXPECT_EQ(item(d->manifest(), "opt")->value, "3");
    EXPECT_FALSE(item(d->manifest(), "ir")->value);
    EXPECT_EQ(*d->artifact("obj"), data);
    EXPECT_EQ(*d->artifact("ptx"), "p");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(e->artifact("obj")->data()) % 64, 0u);  // still aligned
  }
}

TEST(ExplainKey, EntriesWithoutLabelOrValuesKeepTheOldBytes) {
  // docs/format.md's worked example: a manifest without values and no label
  // encodes exactly as before the extension existed (197 bytes), so entries
  // written by older builds and by this one read alike.
  auto k = *KeyBuilder("demo/1").add_string("src", "x").finish();
  EXPECT_EQ(k.key.hex(), "abd25595384735bf76aca9e404228730");
  Manifest bare = k.manifest;
  for (auto& it : bare.items) it.value.reset();
  EntryMeta m{1700000000000ull, 1500, "demo", ""};
  auto e = EntryBuilder(k.key).add("obj", "hello").meta(m).manifest(bare).build();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->encoded().size(), 197u);
  EXPECT_EQ(e->encoded().find("KCX1"), std::string_view::npos);
  EXPECT_EQ(e->meta().label, "");
  // With the value it gains the extension, and stays readable.
  auto e2 = EntryBuilder(k.key).add("obj", "hello").meta(m).manifest(k.manifest).build();
  ASSERT_TRUE(e2);
  EXPECT_NE(e2->encoded().find("KCX1"), std::string_view::npos);
  EXPECT_EQ(e2->encoded().size(), 197u);  // docs/format.md: the block fits in the padding
  EXPECT_EQ(e2->encoded().substr(64 + 128, 5), "hello");
  EXPECT_EQ(*e2->artifact("obj"), "hello");
  EXPECT_EQ(item(e2->manifest(), "src")->value, "x");
}

TEST(ExplainKey, ArtifactBytesThatLookLikeTheExtensionAreNotTakenForIt) {
  // An entry with no extension whose first artifact starts right at the end
  // of the artifact table (a 64-byte aligned table end) and begins with the
  // extension's magic: the artifact stays an artifact.
  for (size_t pad = 0; pad < 64; ++pad) {
    auto k = *KeyBuilder(std::string("n/") + std::string(pad, 'p')).add_bytes("b", "x").finish();
    std::string art = std::string("KCX1") + std::string("\x10\0\0\0", 4) + std::string(8, '\0');
    auto e = EntryBuilder(k.key).add("obj", art).manifest(k.manifest).build();
    ASSERT_TRUE(e);
    EXPECT_EQ(*e->artifact("obj"), art);
    EXPECT_EQ(e->meta().label, "");
  }
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every regular file under `dir`, read whole.
void each_file(const std::string& dir, const std::function<void(const std::string&, const std::string&)>& fn) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n == "." || n == "..") continue;
    std::string p = dir + "/" + n;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      each_file(p, fn);
    else if (S_ISREG(st.st_mode))
      fn(p, read_all(p));
  }
  ::closedir(d);
}

class ExplainPrivate : public ::testing::TestWithParam<std::string> {};

TEST_P(ExplainPrivate, PrivateValueNeverReachesTheStore) {
  test::TempDir tmp;
  Options o = test::disk_options(tmp.path() + "/cache");
  o.engine = parse_engine(GetParam());
  const std::string secret = "tok-7f3a9c-never-stored", visible = "visible-value-31415";
  {
    auto cache = Cache::open(o);
    auto k = *KeyBuilder("priv/1")
                  .add_string("token", secret)
                  .mark_private("token")
                  .add_string("shown", visible)
                  .label("kernel_a")
                  .finish();
    auto r = cache->get_or_compile(k, [] { return std::vector<Artifact>{{"obj", "code"}}; });
    ASSERT_TRUE(r);
    // A second key of the namespace misses too (journal record).
    auto k2 = *KeyBuilder("priv/1")
                   .add_string("token", secret + "2")
                   .mark_private("token")
                   .add_string("shown", visible)
                   .finish();
    ASSERT_TRUE(cache->get_or_compile(k2, [] { return std::vector<Artifact>{{"obj", "code2"}}; }));
    (void)cache->flush();
  }
  size_t files = 0;
  bool saw_visible = false;
  each_file(tmp.path() + "/cache", [&](const std::string& path, const std::string& bytes) {
    ++files;
    EXPECT_EQ(bytes.find(secret.substr(0, 12)), std::string::npos) << path;
    saw_visible |= bytes.find(visible) != std::string::npos;
  });
  EXPECT_GT(files, 0u);
  EXPECT_TRUE(saw_visible);  // the check above looked where values are stored
}

INSTANTIATE_TEST_SUITE_P(Engines, ExplainPrivate, ::testing::ValuesIn(test::engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache

// Manifests as text and JSON and their differences (kcache/manifest.h), and
// the JSON writer and reader under them (util/json.h), including the exact
// bytes of tier_stats_json that `kcache stats --json` and the C ABI print.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kcache/manifest.h"
#include "kcache/tier.h"
#include "test_util.h"
#include "util/json.h"

namespace kcache::test {
namespace {

KeyInfo kernel(const std::string& opt, bool fast_math = false) {
  KeyBuilder b("mytriton/3");
  b.add_bytes("ir", "define void @k() { ret void }").add_string("opt", opt).add_u64("compiler", 14);
  b.add_map("env", {{"A", "1"}}).add_list("flags", {"-g"});
  if (fast_math) b.add_bool("fast_math", true);
  return *b.finish();
}

// ---- JSON writer and reader ---------------------------------------------------

TEST(JsonWriter, WritesCompactNestedDocuments) {
  util::JsonWriter w;
  w.begin_object()
      .field("s", "a\"b\\c\n\x01")
      .field("n", uint64_t{18446744073709551615ull})
      .field("i", -3)
      .field("t", true)
      .field("f", false)
      .key("z")
      .null()
      .key("r")
      .number(0.123456, 4)
      .key("a")
      .begin_array()
      .value(1)
      .begin_object()
      .end_object()
      .begin_array()
      .end_array()
      .raw("{\"x\":1}")
      .end_array()
      .key("o")
      .begin_object()
      .field("k", std::string("v"))
      .end_object()
      .end_object();
  EXPECT_EQ(w.str(),
            "{\"s\":\"a\\\"b\\\\c\\n\\u0001\",\"n\":18446744073709551615,\"i\":-3,\"t\":true,\"f\":false,\"z\":null,"
            "\"r\":0.1235,\"a\":[1,{},[],{\"x\":1}],\"o\":{\"k\":\"v\"}}");
  // What it writes, the reader reads back.
  auto v = util::parse_json(w.str());
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->member("s")->string, "a\"b\\c\n\x01");
  EXPECT_EQ(v->member("i")->number, -3);
  EXPECT_TRUE(v->member("t")->boolean);
  EXPECT_EQ(v->member("z")->type, util::JsonValue::Type::null);
  ASSERT_EQ(v->member("a")->array.size(), 4u);
  EXPECT_EQ(v->member("a")->array[3].member("x")->number, 1);
  EXPECT_EQ(v->member("o")->member("k")->string, "v");
  EXPECT_EQ(v->member("missing"), nullptr);
}

TEST(JsonWriter, TopLevelArrayAndScalars) {
  util::JsonWriter w;
  w.begin_array().value("a").value(2).value(true).end_array();
  EXPECT_EQ(w.take(), "[\"a\",2,true]");
  util::JsonWriter s;
  s.value("only");
  EXPECT_EQ(s.str(), "\"only\"");
}

TEST(JsonReader, ReportsWhatIsWrongAndWhere) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : {Case{"{\"a\": 1} x", "trailing characters at offset 9"}, Case{"{\"a\": ", "unexpected end"},
                        Case{"[1, 2", "expected ',' or ']'"}, Case{"{\"a\" 1}", "expected ':'"},
                        Case{"\"abc", "unterminated string"}, Case{"\"\\q\"", "bad escape"},
                        Case{"\"\\ud800\"", "lone surrogate"}, Case{"tru", "bad literal"}, Case{"-", "bad number"}}) {
    auto v = util::parse_json(c.text);
    ASSERT_FALSE(v.has_value()) << c.text;
    EXPECT_EQ(v.error().code(), Errc::invalid_argument);
    EXPECT_NE(v.error().message().find(c.error), std::string::npos) << c.text << ": " << v.error().message();
  }
  std::string deep(100, '[');
  EXPECT_FALSE(util::parse_json(deep + std::string(100, ']')).has_value());
  auto v = util::parse_json("\"\\u00e9\\ud83d\\ude00\\/\"");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->string, "\xc3\xa9\xf0\x9f\x98\x80/");
}

TEST(JsonWriter, TierStatsJsonKeepsItsBytes) {
  TierStats s;
  s.hits = 1;
  s.misses = 2;
  s.puts = 3;
  s.evictions = 4;
  s.corrupt = 5;
  s.errors = 6;
  s.rejected = 7;
  s.entries = 8;
  s.bytes = 9000000000ull;
  s.skipped = 10;
  s.dropped = 11;
  EXPECT_EQ(tier_stats_json(s),
            "{\"hits\":1,\"misses\":2,\"puts\":3,\"evictions\":4,\"corrupt\":5,\"errors\":6,\"rejected\":7,"
            "\"entries\":8,\"bytes\":9000000000,\"skipped\":10,\"dropped\":11}");
}

// ---- reading and writing manifests --------------------------------------------

TEST(Manifest, ComponentTypesReadBackByName) {
  for (int t = 1; t <= 9; ++t) {
    auto ct = static_cast<ComponentType>(t);
    EXPECT_EQ(parse_component_type(component_type_name(ct)), ct);
  }
  EXPECT_FALSE(parse_component_type("float").has_value());
  EXPECT_FALSE(parse_component_type("").has_value());
}

TEST(Manifest, TextAndJsonRoundTripToTheSameKey) {
  KeyInfo info = kernel("-O2");
  std::string text = manifest_to_text(info.manifest);
  EXPECT_EQ(text.rfind("namespace mytriton/3\n", 0), 0u) << text;
  EXPECT_NE(text.find("opt string " + info.manifest.items[4].digest.hex() + "\n"), std::string::npos) << text;
  auto from_text = parse_manifest(text);
  ASSERT_TRUE(from_text.has_value()) << from_text.error().to_string();
  EXPECT_EQ(*from_text, info.manifest);
  EXPECT_EQ(from_text->key(), info.key);

  std::string json = manifest_to_json(info.manifest);
  auto from_json = parse_manifest(json);
  ASSERT_TRUE(from_json.has_value()) << from_json.error().to_string();
  EXPECT_EQ(*from_json, info.manifest);
  // A document holding it as its "manifest" member (`kcache show --json`).
  auto wrapped = parse_manifest("  {\"key\": \"x\", \"manifest\": " + json + ", \"size\": 3}\n");
  ASSERT_TRUE(wrapped.has_value()) << wrapped.error().to_string();
  EXPECT_EQ(wrapped->key(), info.key);
}

TEST(Manifest, JsonIsCompactInTheManifestsOrder) {
  Manifest m;
  m.ns = "ns \"q\"";
  m.items.push_back({"b", ComponentType::u64, *Digest::from_hex("000102030405060708090a0b0c0d0e0f")});
  m.items.push_back({"a", ComponentType::file, *Digest::from_hex("ffffffffffffffffffffffffffffffff")});
  EXPECT_EQ(manifest_to_json(m),
            "{\"namespace\":\"ns \\\"q\\\"\",\"items\":["
            "{\"name\":\"b\",\"type\":\"u64\",\"digest\":\"000102030405060708090a0b0c0d0e0f\"},"
            "{\"name\":\"a\",\"type\":\"file\",\"digest\":\"ffffffffffffffffffffffffffffffff\"}]}");
  EXPECT_EQ(manifest_to_json(Manifest{}), "{\"namespace\":\"\",\"items\":[]}");
}

TEST(Manifest, TextAllowsCommentsBlanksAndAnyOrder) {
  KeyInfo info = kernel("-O3");
  std::string text = "# the lookup that missed\n\n";
  for (auto it = info.manifest.items.rbegin(); it != info.manifest.items.rend(); ++it)
    text += "  " + it->name + "\t" + std::string(component_type_name(it->type)) + "   " + it->digest.hex() +
            "  # trailing comment\r\n";
  text += "namespace mytriton/3\n";
  auto m = parse_manifest(text);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(m->key(), info.key);
  EXPECT_EQ(m->items.front().name, "compiler");  // sorted by name
}

TEST(Manifest, BadInputIsInvalidArgumentNamingTheProblem) {
  const std::string d = "00112233445566778899aabbccddeeff";
  struct Case {
    std::string text;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"opt string nothex\n", "line 1: component 'opt': digest is not 32 hex digits"},
           {"namespace x\nopt float " + d + "\n", "line 2: component 'opt': unknown type 'float'"},
           {"opt string\n", "line 1: want `namespace NS` or `NAME TYPE HEXDIGEST`"},
           {"a u64 " + d + "\na string " + d + "\n", "component 'a' appears twice"},
           {"{\"namespace\": \"x\", \"items\": [", "not valid JSON"},
           {"{\"items\": []}", "no \"namespace\" string"},
           {"{\"namespace\": \"x\"}", "no \"items\" array"},
           {"{\"namespace\": \"x\", \"items\": [{\"name\": \"a\", \"type\": \"u64\"}]}", "each item needs"},
           {"{\"namespace\": \"x\", \"items\": [{\"name\": \"\", \"type\": \"u64\", \"digest\": \"" + d + "\"}]}",
            "empty name"},
           {"{\"manifest\": 3}", "no manifest object"},
       }) {
    auto m = parse_manifest(c.text);
    ASSERT_FALSE(m.has_value()) << c.text;
    EXPECT_EQ(m.error().code(), Errc::invalid_argument) << c.text;
    EXPECT_NE(m.error().message().find(c.error), std::string::npos) << c.text << " -> " << m.error().message();
  }
  // An empty text is an empty manifest (the caller decides whether that is enough).
  auto empty = parse_manifest("# nothing\n");
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->ns.empty() && empty->items.empty());
}

TEST(Manifest, ReadManifestNamesTheFile) {
  TempDir t;
  auto missing = read_manifest(t.path() + "/nope.txt");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), Errc::not_found);
  std::string p = t.path() + "/bad.txt";
  {
    std::FILE* f = std::fopen(p.c_str(), "w");
    std::fputs("x y\n", f);
    std::fclose(f);
  }
  auto bad = read_manifest(p);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message().rfind(p + ": line 1:", 0), 0u) << bad.error().message();
  KeyInfo info = kernel("-O2");
  {
    std::FILE* f = std::fopen(p.c_str(), "w");
    std::fputs(manifest_to_json(info.manifest).c_str(), f);
    std::fclose(f);
  }
  auto good = read_manifest(p);
  ASSERT_TRUE(good.has_value()) << good.error().to_string();
  EXPECT_EQ(good->key(), info.key);
}

// ---- differences --------------------------------------------------------------

TEST(ManifestDiff, NamesEachChangeWithBothDigests) {
  KeyInfo stored = kernel("-O2");
  EXPECT_TRUE(diff_manifests(stored.manifest, stored.manifest).empty());

  KeyInfo lookup = kernel("-O3", /*fast_math=*/true);
  auto d = diff_manifests(stored.manifest, lookup.manifest);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "fast_math");
  EXPECT_EQ(d[0].change, ManifestChange::added);
  EXPECT_FALSE(d[0].stored.has_value());
  EXPECT_EQ(d[0].lookup, lookup.manifest.items[2].digest);  // compiler, env, fast_math, ...
  EXPECT_EQ(d[0].lookup_type, ComponentType::boolean);
  EXPECT_EQ(d[1].name, "opt");
  EXPECT_EQ(d[1].change, ManifestChange::changed);
  EXPECT_EQ(d[1].stored, stored.manifest.items[4].digest);
  EXPECT_EQ(d[1].lookup, lookup.manifest.items[5].digest);
  EXPECT_NE(*d[1].stored, *d[1].lookup);

  // The other way round, fast_math is only in the stored manifest.
  auto back = diff_manifests(lookup.manifest, stored.manifest);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].change, ManifestChange::missing);
  EXPECT_TRUE(back[0].stored.has_value());
  EXPECT_FALSE(back[0].lookup.has_value());
  EXPECT_EQ(manifest_change_name(back[0].change), "missing");
  EXPECT_EQ(manifest_change_name(ManifestChange::added), "added");
  EXPECT_EQ(manifest_change_name(ManifestChange::changed), "changed");
}

TEST(ManifestDiff, TypeChangesAndUnsortedInput) {
  Digest same = *Digest::from_hex("0123456789abcdef0123456789abcdef");
  Manifest a, b;
  a.ns = b.ns = "x/1";
  a.items = {{"z", ComponentType::string, same}, {"k", ComponentType::u64, same}};
  b.items = {{"k", ComponentType::i64, same}, {"z", ComponentType::string, same}};
  auto d = diff_manifests(a, b);
  ASSERT_EQ(d.size(), 1u);
  // A change of type is a change, with both types.
  EXPECT_EQ(d[0],
            (ManifestDifference{"k", ManifestChange::changed, same, same, ComponentType::u64, ComponentType::i64}));
  EXPECT_TRUE(d[0].type_changed());
  EXPECT_EQ(describe(d[0]),
            "k: changed (stored u64 0123456789abcdef0123456789abcdef, lookup i64 "
            "0123456789abcdef0123456789abcdef)");
  // Namespaces are the caller's to compare.
  b.ns = "y/2";
  EXPECT_EQ(diff_manifests(a, b).size(), 1u);
}

TEST(ManifestDiff, DescribeSaysWhatChanged) {
  Digest one = *Digest::from_hex("11111111111111111111111111111111");
  Digest three = *Digest::from_hex("33333333333333333333333333333333");
  EXPECT_EQ(describe({"opt", ManifestChange::changed, one, three, ComponentType::string, ComponentType::string}),
            "opt: changed (stored 11111111111111111111111111111111, lookup 33333333333333333333333333333333)");
  EXPECT_EQ(describe({"fast_math", ManifestChange::added, std::nullopt, one, std::nullopt, ComponentType::boolean}),
            "fast_math: added (bool 11111111111111111111111111111111)");
  EXPECT_EQ(describe({"ir", ManifestChange::missing, three, std::nullopt, ComponentType::bytes, std::nullopt}),
            "ir: missing (bytes 33333333333333333333333333333333)");
  // The same type on both sides is no change of type.
  EXPECT_FALSE(
      (ManifestDifference{"opt", ManifestChange::changed, one, three, ComponentType::string, ComponentType::string})
          .type_changed());
}

}  // namespace
}  // namespace kcache::test

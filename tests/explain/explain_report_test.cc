// The miss report (kcache/explain.h): filled once from the lookup and the
// nearest stored manifest, in one vocabulary (changed / added / missing),
// and rendered as text (block, line, verdict) and JSON, with values where
// the keys kept them and digests where they did not.
#include <gtest/gtest.h>

#include "kcache/explain.h"
#include "kcache/manifest.h"

namespace kcache {
namespace {

const KeyInfo& stored_key() {
  static const KeyInfo k = *KeyBuilder("t/1")
                                .add_u64("compiler", 14)
                                .add_string("cpu", "znver3")
                                .add_u64("gone", 1)
                                .add_bytes("ir", "a")
                                .label("k")
                                .finish();
  return k;
}

const KeyInfo& lookup_key() {
  static const KeyInfo k = *KeyBuilder("t/1")
                                .add_i64("compiler", 14)
                                .add_string("cpu", "x86-64")
                                .add_bool("fast", true)
                                .add_bytes("ir", "b")
                                .label("k")
                                .finish();
  return k;
}

Digest digest_of(const KeyInfo& k, const std::string& name) {
  for (const auto& it : k.manifest.items)
    if (it.name == name) return it.digest;
  ADD_FAILURE() << "no component " << name;
  return Digest{};
}

NearestSearch found(const KeyInfo& s, uint64_t created_ms) {
  NearestSearch n;
  n.entry = StoredManifest{s.key, s.label, s.manifest, created_ms, 0};
  n.compared = 3;
  n.other_namespaces = {{"x/1", 2}};
  return n;
}

MissRecord miss(const KeyInfo& k, uint64_t time_ms) { return MissRecord{k.key, k.label, k.manifest, time_ms, 7, "t"}; }

TEST(MissReport, OneReportOfEachKindOfDifference) {
  const KeyInfo &s = stored_key(), &l = lookup_key();
  MissReport r = make_miss_report(miss(l, 4000), found(s, 1000));
  EXPECT_EQ(r.key, l.key);
  EXPECT_EQ(r.label, "k");
  EXPECT_EQ(r.ns, "t/1");
  EXPECT_EQ(r.components, 4u);
  EXPECT_EQ(r.compared, 3u);
  ASSERT_TRUE(r.nearest);
  EXPECT_EQ(r.nearest->key, s.key);
  EXPECT_EQ(r.nearest->label, "k");
  EXPECT_EQ(r.nearest->age_ms, 3000u);
  EXPECT_TRUE(r.nearest->same_label);
  // The differences are diff_manifests', ordered by name.
  EXPECT_EQ(r.differences, diff_manifests(s.manifest, l.manifest));
  ASSERT_EQ(r.differences.size(), 5u);
  EXPECT_EQ(r.differences[0].name, "compiler");
  EXPECT_EQ(r.differences[0].change, ManifestChange::changed);
  EXPECT_TRUE(r.differences[0].type_changed());
  EXPECT_EQ(r.differences[1].name, "cpu");
  EXPECT_EQ(r.differences[1].change, ManifestChange::changed);
  EXPECT_FALSE(r.differences[1].type_changed());
  EXPECT_EQ(r.differences[2].name, "fast");
  EXPECT_EQ(r.differences[2].change, ManifestChange::added);
  EXPECT_EQ(r.differences[3].name, "gone");
  EXPECT_EQ(r.differences[3].change, ManifestChange::missing);
  EXPECT_EQ(r.differences[4].name, "ir");
  EXPECT_EQ(r.differences[4].change, ManifestChange::changed);

  const std::string ha = digest_of(s, "ir").hex(), hb = digest_of(l, "ir").hex();
  EXPECT_EQ(to_text(r),
            "compared with 3 stored entries of namespace \"t/1\"\n"
            "nearest " +
                s.key.hex() +
                ": 5 of 5 components differ (label \"k\", as the lookup's)\n"
                "  compiler             changed  u64 14 \u2192 i64 14\n"
                "  cpu                  changed  znver3 \u2192 x86-64\n"
                "  fast                 added    only in the lookup (true)\n"
                "  gone                 missing  only in the stored entry (1)\n"
                "  ir                   changed  stored " +
                ha + ", lookup " + hb + "\n");
  const std::string diffs =
      "compiler: u64 14 \u2192 i64 14; cpu: znver3 \u2192 x86-64; fast: added (true); "
      "gone: missing (1); ir: changed (stored " +
      ha + ", lookup " + hb + ")";
  EXPECT_EQ(to_text(r, TextForm::verdict), "nearest " + s.key.hex() + " \"k\": " + diffs);
  EXPECT_EQ(to_text(r, TextForm::line),
            "miss " + l.key.hex() + " \"k\" (t/1): nearest " + s.key.hex() + " \"k\": " + diffs);
  EXPECT_EQ(miss_cause(r),
            "compiler u64 14 \u2192 i64 14, cpu znver3 \u2192 x86-64, fast added (true), gone missing (1), ir changed");
  EXPECT_EQ(to_json(r), "{\"key\":\"" + l.key.hex() +
                            "\",\"label\":\"k\",\"namespace\":\"t/1\",\"compared\":3,"
                            "\"nearest\":{\"key\":\"" +
                            s.key.hex() +
                            "\",\"label\":\"k\",\"components\":4,\"differences\":["
                            "{\"name\":\"compiler\",\"change\":\"changed\",\"stored\":\"14\",\"lookup\":\"14\","
                            "\"stored_type\":\"u64\",\"lookup_type\":\"i64\"},"
                            "{\"name\":\"cpu\",\"change\":\"changed\",\"stored\":\"znver3\",\"lookup\":\"x86-64\"},"
                            "{\"name\":\"fast\",\"change\":\"added\",\"stored\":null,\"lookup\":\"true\"},"
                            "{\"name\":\"gone\",\"change\":\"missing\",\"stored\":\"1\",\"lookup\":null},"
                            "{\"name\":\"ir\",\"change\":\"changed\",\"stored\":\"" +
                            ha + "\",\"lookup\":\"" + hb +
                            "\"}],\"age_ms\":3000},"
                            "\"other_namespaces\":{\"x/1\":2}}");
}

// A lookup whose manifest kept no values (read from the text format): its
// side shows digests, with the type where the value would have been; the
// stored side still shows its values.
TEST(MissReport, DigestsWhereNoValueWasKept) {
  const KeyInfo &s = stored_key(), &l = lookup_key();
  auto bare = parse_manifest(manifest_to_text(l.manifest));
  ASSERT_TRUE(bare) << bare.error().to_string();
  MissRecord m{l.key, "k", *bare, 4000, 1, "t"};
  MissReport r = make_miss_report(m, found(s, 1000));
  ASSERT_EQ(r.differences.size(), 5u);
  const std::string cpu = digest_of(l, "cpu").hex(), fast = digest_of(l, "fast").hex();
  EXPECT_EQ(to_text(r.differences[1]), "cpu: changed (stored znver3, lookup " + cpu + ")");
  EXPECT_EQ(to_text(r.differences[2]), "fast: added (bool " + fast + ")");
  EXPECT_EQ(describe(r.differences[2]), to_text(r.differences[2]));  // describe is the same rendering
  EXPECT_EQ(to_text(r.differences[3]), "gone: missing (1)");
  std::string block = to_text(r);
  EXPECT_NE(block.find("  cpu                  changed  stored znver3, lookup " + cpu + "\n"), std::string::npos)
      << block;
  EXPECT_NE(block.find("  fast                 added    only in the lookup\n"), std::string::npos) << block;
  EXPECT_EQ(block.find("x86-64"), std::string::npos) << block;  // never kept, never shown
  EXPECT_EQ(miss_cause(r), "compiler changed, cpu changed, fast added, gone missing (1), ir changed");
  std::string json = to_json(r);
  EXPECT_NE(json.find("{\"name\":\"cpu\",\"change\":\"changed\",\"stored\":\"znver3\",\"lookup\":\"" + cpu + "\"}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("{\"name\":\"fast\",\"change\":\"added\",\"stored\":null,\"lookup\":\"" + fast + "\"}"),
            std::string::npos)
      << json;
}

TEST(MissReport, NoNearestEntry) {
  const KeyInfo& l = lookup_key();
  NearestSearch none;
  none.other_namespaces = {{"x/1", 2}, {"y/2", 1}};
  MissReport r = make_miss_report(miss(l, 4000), none);
  EXPECT_FALSE(r.nearest);
  EXPECT_TRUE(r.differences.empty());
  EXPECT_EQ(r.compared, 0u);
  EXPECT_EQ(to_text(r), "no stored entry has namespace \"t/1\" (stored namespaces: \"x/1\" x2 \"y/2\" x1)\n");
  EXPECT_EQ(to_text(r, TextForm::line), "miss " + l.key.hex() + " \"k\" (t/1): no earlier entry of namespace \"t/1\"");
  EXPECT_EQ(to_text(r, TextForm::verdict), "no earlier entry of namespace \"t/1\"");
  EXPECT_EQ(miss_cause(r), "no earlier entry of its label");
  r.label.clear();
  EXPECT_EQ(miss_cause(r), "no earlier entry of namespace \"t/1\"");
  EXPECT_EQ(to_json(r), "{\"key\":\"" + l.key.hex() +
                            "\",\"label\":\"\",\"namespace\":\"t/1\",\"compared\":0,\"nearest\":null,"
                            "\"other_namespaces\":{\"x/1\":2,\"y/2\":1}}");
  // Nothing stored anywhere: no list of namespaces.
  EXPECT_EQ(to_text(make_miss_report(miss(l, 4000), NearestSearch{})), "no stored entry has namespace \"t/1\"\n");
}

// The nearest entry of another label (a first compile of this one), and one
// with the same components under another key.
TEST(MissReport, AnotherLabelAndTheSameComponents) {
  const KeyInfo &s = stored_key(), &l = lookup_key();
  MissRecord m = miss(l, 500);  // made after the stored entry: no age
  m.label = "other";
  MissReport r = make_miss_report(m, found(s, 1000));
  ASSERT_TRUE(r.nearest);
  EXPECT_FALSE(r.nearest->same_label);
  EXPECT_EQ(r.nearest->age_ms, 0u);
  EXPECT_EQ(to_text(r, TextForm::verdict)
                .rfind("no earlier entry of its label; nearest of another label " + s.key.hex() +
                           " \"k\": compiler: u64 14 \u2192 i64 14; ",
                       0),
            0u)
      << to_text(r, TextForm::verdict);
  EXPECT_NE(to_text(r).find("5 of 5 components differ (label \"k\")\n"), std::string::npos) << to_text(r);
  EXPECT_EQ(miss_cause(r), "no earlier entry of its label");

  MissReport same = make_miss_report(miss(s, 2000), found(s, 1000));
  EXPECT_TRUE(same.differences.empty());
  EXPECT_EQ(to_text(same, TextForm::verdict),
            "nearest " + s.key.hex() + " \"k\": same components (stored under another key)");
  EXPECT_NE(to_text(same).find(": 0 of 4 components differ (label \"k\", as the lookup's)\n"
                               "  (same manifest: the entry is stored under another key)\n"),
            std::string::npos)
      << to_text(same);
  EXPECT_EQ(miss_cause(same), "same components as a stored entry");
}

}  // namespace
}  // namespace kcache

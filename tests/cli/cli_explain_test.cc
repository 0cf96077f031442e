// `kcache explain`: why a key misses, named component by component against
// the nearest stored manifest, for each disk engine.
#include <string>
#include <vector>

#include "cli_util.h"

namespace kcache::test {
namespace {

TEST_P(CliTest, ExplainNamesTheComponentThatDiffers) {
  KeyInfo stored = kernel_key("-O2");
  KeyInfo other_target = kernel_key("-O1", "sm_80");
  put(stored.key, "ptx-O2", write_text_manifest(file("stored.txt"), stored));
  put(other_target.key, "ptx-O1", write_text_manifest(file("other.txt"), other_target));
  put(key_of(99), "no manifest at all");

  // A stored key is a hit: exit 0.
  Result r = run({"explain", "--key", stored.key.hex()});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("is stored"), std::string::npos) << r.out;

  // The lookup changed only -O2 -> -O3: the nearest entry is `stored`, and
  // exactly "opt" differs.
  KeyInfo lookup = kernel_key("-O3");
  std::string mf = write_text_manifest(file("lookup.txt"), lookup);
  r = run({"explain", "--key", lookup.key.hex(), "--manifest", mf});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.out.find("nearest " + stored.key.hex() + ": 1 of 4 components differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  opt "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  target "), std::string::npos) << r.out;

  r = run({"explain", "--manifest", mf, "--json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("\"nearest\":{\"key\":\"" + stored.key.hex() + "\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"differences\":[{\"name\":\"opt\",\"change\":\"changed\""), std::string::npos) << r.out;
  EXPECT_EQ(json_num(r.out, "compared"), 2);

  // A lookup with an extra component: "added".
  KeyInfo extra = *KeyBuilder("clitest/1")
                       .add_bytes("ir", "define void @k() { ret void }")
                       .add_string("opt", "-O2")
                       .add_string("target", "sm_90")
                       .add_u64("compiler", 14)
                       .add_bool("fast_math", true)
                       .finish();
  r = run({"explain", "--manifest", write_text_manifest(file("extra.txt"), extra)});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("fast_math"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("added"), std::string::npos) << r.out;

  // show --json output feeds explain directly.
  r = run({"show", "--key", stored.key.hex(), "--json"});
  ASSERT_EQ(r.rc, 0);
  spit(file("show.json"), r.out);
  r = run({"explain", "--manifest", file("show.json")});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(stored.key.hex() + " is stored"), std::string::npos) << r.out;

  // Another namespace: nothing to compare with, said plainly.
  KeyInfo foreign = *KeyBuilder("elsewhere/2").add_string("opt", "-O2").finish();
  r = run({"explain", "--manifest", write_text_manifest(file("foreign.txt"), foreign)});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("no stored entry has namespace \"elsewhere/2\""), std::string::npos) << r.out;

  // Entries stored without a manifest (key_of(99)) are not candidates, and
  // an empty manifest file is bad usage.
  EXPECT_NE(r.out.find("(stored namespaces: \"clitest/1\" x2)"), std::string::npos) << r.out;
  spit(file("empty.txt"), "# nothing\n");
  expect_failure(run({"explain", "--manifest", file("empty.txt")}), 2, "no component");

  // A malformed manifest is bad usage.
  spit(file("bad.txt"), "opt string nothex\n");
  expect_failure(run({"explain", "--manifest", file("bad.txt")}), 2, "digest");
  spit(file("bad.json"), "{\"namespace\": \"x\", \"items\": [");
  expect_failure(run({"explain", "--manifest", file("bad.json")}), 2, "JSON");
}

// A component whose type changed (u64 -> i64) is a change shown with both
// types; one only the stored entry has is "missing".
TEST_P(CliTest, ExplainTellsATypeChangeAndAMissingComponent) {
  KeyInfo stored =
      *KeyBuilder("clitest/1").add_u64("compiler", 14).add_string("opt", "-O2").add_u64("gone", 1).finish();
  put(stored.key, "ptx", write_text_manifest(file("stored.txt"), stored));
  KeyInfo lookup = *KeyBuilder("clitest/1").add_i64("compiler", 14).add_string("opt", "-O2").finish();
  std::string mf = write_text_manifest(file("lookup.txt"), lookup);
  Result r = run({"explain", "--manifest", mf, "--json"});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(
      r.out.find("\"nearest\":{\"key\":\"" + stored.key.hex() +
                 "\",\"label\":\"\",\"components\":2,\"differences\":["
                 "{\"name\":\"compiler\",\"change\":\"changed\",\"stored\":\"" +
                 stored.manifest.items[0].digest.hex() + "\",\"lookup\":\"" + lookup.manifest.items[0].digest.hex() +
                 "\",\"stored_type\":\"u64\",\"lookup_type\":\"i64\"},"
                 "{\"name\":\"gone\",\"change\":\"missing\",\"stored\":\"" +
                 stored.manifest.items[1].digest.hex() + "\",\"lookup\":null}],\"age_ms\":"),
      std::string::npos)
      << r.out;
  r = run({"explain", "--manifest", mf});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("nearest " + stored.key.hex() + ": 2 of 3 components differ\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  compiler             changed  stored u64 " + stored.manifest.items[0].digest.hex() +
                       ", lookup i64 " + lookup.manifest.items[0].digest.hex() + "\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  gone                 missing  only in the stored entry\n"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Engines, CliTest, ::testing::ValuesIn(engine_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kcache::test

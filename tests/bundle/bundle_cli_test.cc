// `kcache mark` and `kcache bundle ...` run as the real tool, on both engines:
// a delta since a mark, signed bundles verified against KCACHE_BUNDLE_TRUST,
// import into another store, ls --json, usage errors.
#include "cli_util.h"

using namespace kcache::test;

namespace {

class BundleCli : public CliTest {
 protected:
  void put(const std::string& key_hex, const std::string& text) {
    spit(file("in.o"), text);
    Result r = run({"put", "--key", key_hex, "obj=" + file("in.o")});
    ASSERT_EQ(r.rc, 0) << r.err;
  }
};

const std::string kOne = "00000000000000000000000000000001", kTwo = "00000000000000000000000000000002";

}  // namespace

TEST_P(BundleCli, MarkThenDeltaSignedVerifiedAndImported) {
  put(kOne, "one");
  Result m = run({"mark"});
  ASSERT_EQ(m.rc, 0) << m.err;
  ASSERT_EQ(lines(m.out), 1u);
  std::string mark = m.out.substr(0, m.out.size() - 1);
  ASSERT_FALSE(mark.empty());
  EXPECT_EQ(mark.find_first_not_of("0123456789"), std::string::npos) << "the mark alone: " << m.out;
  put(kTwo, "two");

  Result kg = run({"bundle", "keygen", file("key")}, false);
  ASSERT_EQ(kg.rc, 0) << kg.err;
  Result c = run({"bundle", "create", "-o", file("d.kcb"), "--since", mark, "--sign", file("key"), "--json"});
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(json_num(c.out, "entries"), 1);
  Result ls = run({"bundle", "ls", file("d.kcb"), "--json"}, false);
  ASSERT_EQ(ls.rc, 0) << ls.err;
  EXPECT_NE(ls.out.find("\"entries\":[{\"key\":\"" + kTwo + "\""), std::string::npos) << ls.out;
  EXPECT_EQ(ls.out.find(kOne), std::string::npos) << ls.out;

  std::map<std::string, std::string> trust = {{"KCACHE_BUNDLE_TRUST", file("key.pub")}};
  Result v = run({"bundle", "verify", file("d.kcb"), "--json"}, false, trust);
  EXPECT_EQ(v.rc, 0) << v.err;
  EXPECT_NE(v.out.find("\"trusted\":true"), std::string::npos) << v.out;
  ASSERT_EQ(run({"bundle", "create", "-o", file("all.kcb")}).rc, 0);
  Result unsigned_v = run({"bundle", "verify", file("all.kcb")}, false, trust);
  EXPECT_EQ(unsigned_v.rc, 1);
  EXPECT_NE(unsigned_v.err.find("not signed"), std::string::npos) << unsigned_v.err;
  Result show = run({"bundle", "show", file("all.kcb"), "--json"}, false);
  EXPECT_EQ(json_num(show.out, "entries"), 2);

  std::string other = file("other");
  Result imp = run_in(other, {"bundle", "import", file("all.kcb")});
  ASSERT_EQ(imp.rc, 0) << imp.err;
  Result got = run_in(other, {"get", "--key", kTwo, "--artifact", "obj"});
  EXPECT_EQ(got.rc, 0) << got.err;
  EXPECT_EQ(got.out, "two");
}

TEST_P(BundleCli, UsageErrors) {
  EXPECT_EQ(run({"bundle"}).rc, 2);
  EXPECT_EQ(run({"bundle", "frob", "x"}).rc, 2);
  EXPECT_EQ(run({"bundle", "ls"}).rc, 2);
  EXPECT_EQ(run({"bundle", "create"}).rc, 2) << "create needs -o";
  EXPECT_EQ(run({"bundle", "create", "-o", file("x"), "--since", "soon"}).rc, 2);
  EXPECT_EQ(run({"bundle", "ls", file("x"), "--since", "1"}).rc, 2);
  Result missing = run({"bundle", "show", file("missing.kcb")}, false);
  EXPECT_NE(missing.rc, 0);
  EXPECT_EQ(lines(missing.err), 1u) << missing.err;
}

INSTANTIATE_TEST_SUITE_P(Engines, BundleCli, ::testing::Values("lmdb", "files"));

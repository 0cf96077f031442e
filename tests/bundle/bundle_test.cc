// Bundles: round trips through files and bytes, selections (namespace, keys,
// since a mark across processes), signatures accepted and refused, entries
// of another format or compiler, mounting through Cache::open with
// KCACHE_BUNDLES, load_bundle, import and verify.
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "bundle_util.h"
#include "kcache/kcache.h"

extern char** environ;

using namespace kcache;
using namespace kcache::test;

namespace {

std::set<Key> keys_of(Tier& t) {
  std::set<Key> out;
  EXPECT_TRUE(t.admin()
                  ->list([&](const ListItem& it) {
                    out.insert(it.key);
                    return true;
                  })
                  .is_ok());
  return out;
}
std::set<Key> keys_of(std::initializer_list<std::pair<uint64_t, uint64_t>> ranges) {
  std::set<Key> out;
  for (auto [a, b] : ranges)
    for (uint64_t i = a; i < b; ++i) out.insert(key_of(i));
  return out;
}

bool hit_ok(Tier& t, uint64_t i, size_t size = 1000) {
  auto r = t.get(key_of(i));
  return r && r->has_value() && entry_ok(**r, i, size);
}

// Runs this test binary's child test with `op` on `dir`; returns its exit status.
int run_child(const std::string& op, const std::string& dir) {
  std::string filter = "--gtest_filter=BundleChild.DISABLED_Run";
  std::string also = "--gtest_also_run_disabled_tests";
  std::string e_op = "BUNDLE_CHILD_OP=" + op, e_dir = "BUNDLE_CHILD_DIR=" + dir;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(e_op.data());
  envp.push_back(e_dir.data());
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(KCACHE_TEST_BIN), filter.data(), also.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, KCACHE_TEST_BIN, nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

// The other process of MarkDeltaAcrossProcesses.
TEST(BundleChild, DISABLED_Run) {
  std::string op = util::getenv_str("BUNDLE_CHILD_OP"), dir = util::getenv_str("BUNDLE_CHILD_DIR");
  ASSERT_FALSE(dir.empty());
  auto cache = Cache::open(disk_options(dir, /*memory=*/false));
  if (op == "mark") {
    auto m = cache->mark();
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    spit(dir + "/mark", std::to_string(*m));
  } else if (op == "work") {
    for (uint64_t i = 10; i < 20; ++i) ASSERT_TRUE(cache->put(make_entry(i)));
    Source s;
    for (uint64_t i : {3, 4}) {
      auto e = cache->get(key_of(i), &s);
      ASSERT_TRUE(e && entry_ok(*e, i));
      ASSERT_EQ(s, Source::disk);
    }
  } else {
    FAIL() << "unknown op " << op;
  }
}

TEST(Bundle, RoundTripThroughFileAndBytes) {
  TempDir d;
  auto store = open_store(d.path());
  fill(*store, 0, 50);
  std::string path = d.path() + "/all.kcb";
  auto info = write_bundle(*store, BundleSelection{}, path);
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_EQ(info->entries, 50u);
  EXPECT_FALSE(info->is_signed);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(info->bytes, static_cast<uint64_t>(st.st_size));

  auto b = open_bundle(path);
  ASSERT_TRUE(b.has_value()) << b.error().to_string();
  EXPECT_EQ((*b)->kind(), TierKind::bundle);
  EXPECT_FALSE((*b)->writable());
  for (uint64_t i = 0; i < 50; ++i) EXPECT_TRUE(hit_ok(**b, i)) << i;
  auto miss = (*b)->get(key_of(50));
  ASSERT_TRUE(miss.has_value());
  EXPECT_FALSE(miss->has_value());
  // Artifacts are 64-byte aligned in the mapping.
  auto e = (*b)->get(key_of(7));
  EXPECT_EQ(reinterpret_cast<uintptr_t>((**e).artifact("obj")->data()) % 64, 0u);
  EXPECT_EQ((*b)->put(make_entry(99)).code(), Errc::read_only);
  TierStats s = (*b)->stats();
  EXPECT_EQ(s.hits, 51u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.entries, 50u);
  EXPECT_EQ(s.rejected, 1u);

  auto bytes = save_bundle(*store, BundleSelection{});
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(bytes->size(), info->bytes);
  auto mb = open_bundle_bytes(*bytes);
  ASSERT_TRUE(mb.has_value()) << mb.error().to_string();
  for (uint64_t i = 0; i < 50; ++i) EXPECT_TRUE(hit_ok(**mb, i)) << i;
  EXPECT_EQ(keys_of(**mb), keys_of({{0, 50}}));

  // An empty selection is a valid, empty bundle.
  BundleSelection none;
  none.keys = {key_of(1000)};
  auto empty = save_bundle(*store, none);
  ASSERT_TRUE(empty.has_value());
  auto eb = open_bundle_bytes(*empty);
  ASSERT_TRUE(eb.has_value()) << eb.error().to_string();
  EXPECT_EQ((*eb)->stats().entries, 0u);
  EXPECT_FALSE((*(*eb)->get(key_of(1))).has_value());
}

TEST(Bundle, SelectsByNamespaceAndKeys) {
  TempDir d;
  auto store = open_store(d.path());
  fill(*store, 0, 10);
  std::set<Key> other, third;
  for (int i = 0; i < 8; ++i) {
    auto k = KeyBuilder(i < 5 ? "other/1" : "third/1").add_u64("i", i).finish();
    auto e = EntryBuilder(k->key).add("obj", "x").manifest(k->manifest).build();
    ASSERT_TRUE(store->put(*e).is_ok());
    (i < 5 ? other : third).insert(k->key);
  }
  BundleSelection by_ns;
  by_ns.namespaces = {"other/1"};
  auto b1 = open_bundle_bytes(*save_bundle(*store, by_ns));
  ASSERT_TRUE(b1.has_value());
  EXPECT_EQ(keys_of(**b1), other);
  by_ns.namespaces = {"other/1", "third/1"};
  auto b2 = open_bundle_bytes(*save_bundle(*store, by_ns));
  std::set<Key> both = other;
  both.insert(third.begin(), third.end());
  EXPECT_EQ(keys_of(**b2), both);

  BundleSelection by_keys;
  by_keys.keys = {key_of(2), key_of(5), key_of(12345)};
  auto b3 = open_bundle_bytes(*save_bundle(*store, by_keys));
  EXPECT_EQ(keys_of(**b3), (std::set<Key>{key_of(2), key_of(5)}));
  // Conditions combine: these keys, in this namespace.
  by_keys.keys.push_back(*other.begin());
  by_keys.namespaces = {"other/1"};
  auto b4 = open_bundle_bytes(*save_bundle(*store, by_keys));
  EXPECT_EQ(keys_of(**b4), (std::set<Key>{*other.begin()}));
}

TEST(Bundle, MarkDeltaAcrossProcesses) {
  TempDir d;
  {
    auto cache = Cache::open(disk_options(d.path()));
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(cache->put(make_entry(i)));
  }
  ASSERT_EQ(run_child("mark", d.path()), 0);
  auto mark = parse_mark(slurp(d.path() + "/mark"));
  ASSERT_TRUE(mark.has_value());
  ASSERT_EQ(run_child("work", d.path()), 0);

  auto cache = Cache::open(disk_options(d.path()));
  std::string path = d.path() + "/delta.kcb";
  auto info = write_bundle(*cache, bundle_since(*mark), path);
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  auto b = open_bundle(path);
  ASSERT_TRUE(b.has_value());
  // Exactly what the other process created (10..19) or used (3, 4).
  EXPECT_EQ(keys_of(**b), keys_of({{3, 5}, {10, 20}}));
  for (uint64_t i : {3, 4, 10, 19}) EXPECT_TRUE(hit_ok(**b, i)) << i;

  // Making the bundle was no use of its entries: the same delta again.
  auto again = open_bundle_bytes(*save_bundle(*cache, bundle_since(*mark)));
  EXPECT_EQ(keys_of(**again), keys_of({{3, 5}, {10, 20}}));
  // A use in this process joins the delta; a later mark excludes it all.
  ASSERT_TRUE(cache->get(key_of(7)).has_value());
  auto with7 = open_bundle_bytes(*save_bundle(*cache, bundle_since(*mark)));
  EXPECT_EQ(keys_of(**with7), keys_of({{3, 5}, {7, 8}, {10, 20}}));
  auto later = cache->mark();
  ASSERT_TRUE(later.has_value());
  EXPECT_GT(*later, *mark);
  auto none = open_bundle_bytes(*save_bundle(*cache, bundle_since(*later)));
  EXPECT_EQ((*none)->stats().entries, 0u);
}

TEST(Bundle, MarkOnTheFilesEngine) {
  TempDir d;
  auto t = open_files_tier(d.path() + "/files");
  ASSERT_TRUE(t.has_value());
  fill(**t, 0, 5);
  auto m = (*t)->admin()->mark();
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  fill(**t, 5, 8);
  ASSERT_TRUE((*t)->get(key_of(1)).has_value());
  ASSERT_TRUE((*t)->flush().is_ok());
  // Reading through a read-only view records no use.
  auto ro = make_read_only(*t);
  auto b = open_bundle_bytes(*save_bundle(*ro, bundle_since(*m)));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(keys_of(**b), keys_of({{1, 2}, {5, 8}}));
  // The memory tier keeps no recency records to mark.
  EXPECT_EQ(make_memory_tier()->admin()->mark().error().code(), Errc::unavailable);
}

TEST(Bundle, OtherFormatVersionAndOtherCompilerMiss) {
  TempDir d;
  auto store = open_store(d.path());
  auto key_for = [](const char* compiler) {
    return KeyBuilder("jit").add_string("compiler", compiler).add_string("src", "k").finish();
  };
  auto k14 = key_for("clang-14"), k15 = key_for("clang-15");
  ASSERT_TRUE(store->put(*EntryBuilder(k14->key).add("obj", "code14").manifest(k14->manifest).build()).is_ok());
  fill(*store, 0, 3);
  auto bytes = save_bundle(*store, BundleSelection{});
  ASSERT_TRUE(bytes.has_value());
  {
    auto b = open_bundle_bytes(*bytes);
    ASSERT_TRUE(b.has_value());
    auto hit = (*b)->get(k14->key);
    ASSERT_TRUE(hit && hit->has_value());
    EXPECT_EQ(*(**hit).artifact("obj"), "code14");
    // Another compiler identity is another key: a plain miss.
    auto miss = (*b)->get(k15->key);
    ASSERT_TRUE(miss.has_value());
    EXPECT_FALSE(miss->has_value());
  }
  // Entry 1 restamped as entry format version 2, valid otherwise.
  std::string b2 = *bytes;
  auto [off, len] = entry_span(b2, key_of(1));
  ASSERT_GT(len, 0u);
  b2[off + 8] = 2;
  reseal_entry(b2.data() + off, len);
  reseal_bundle(b2);
  auto b = open_bundle_bytes(b2);
  ASSERT_TRUE(b.has_value()) << b.error().to_string();
  auto r = (*b)->get(key_of(1));
  ASSERT_TRUE(r.has_value()) << "another format version is a miss, not an error";
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ((*b)->stats().corrupt, 0u);
  EXPECT_EQ((*b)->stats().misses, 1u);
  EXPECT_TRUE(hit_ok(**b, 2));
  // A bundle of another bundle format version is refused as such.
  std::string v2 = *bytes;
  v2[bundle::h_version] = 2;
  reseal_bundle(v2);
  auto refused = open_bundle_bytes(v2);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), Errc::stale_format);
}

class BundleSigned : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = open_store(d_.path());
    fill(*store_, 0, 20);
    key_ = d_.path() + "/key";
    other_ = d_.path() + "/other";
    ASSERT_TRUE(bundle_keygen(key_).is_ok());
    ASSERT_TRUE(bundle_keygen(other_).is_ok());
  }
  std::string make(const std::string& key_file) {
    BundleWriteOptions o;
    o.sign_key_file = key_file;
    auto b = save_bundle(*store_, BundleSelection{}, o);
    EXPECT_TRUE(b.has_value()) << b.error().to_string();
    return b ? *b : std::string();
  }
  TempDir d_;
  std::shared_ptr<Tier> store_;
  std::string key_, other_;
};

TEST_F(BundleSigned, KeygenWritesAPrivateFileAndRefusesToOverwrite) {
  struct stat st;
  ASSERT_EQ(::stat(key_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((key_ + ".pub").c_str(), &st), 0);
  EXPECT_NE(slurp(key_ + ".pub").find("BEGIN PUBLIC KEY"), std::string::npos);
  std::string before = slurp(key_);
  EXPECT_FALSE(bundle_keygen(key_).is_ok());
  EXPECT_EQ(slurp(key_), before);
}

TEST_F(BundleSigned, TrustedSignatureIsAccepted) {
  std::string b = make(key_);
  auto t = open_bundle_bytes(b, {key_ + ".pub"});
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(hit_ok(**t, i)) << i;
  // Signed, no trust configured: mounted (the signature still verifies).
  EXPECT_TRUE(open_bundle_bytes(b).has_value());
  // Either of several trusted keys will do.
  EXPECT_TRUE(open_bundle_bytes(b, {other_ + ".pub", key_ + ".pub"}).has_value());
  std::string path = d_.path() + "/s.kcb";
  spit(path, b);
  auto info = bundle_info(path, {key_ + ".pub"});
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->is_signed);
  EXPECT_TRUE(info->trusted);
  EXPECT_EQ(info->signer.size(), 64u);
}

TEST_F(BundleSigned, UnsignedWrongKeyAndTamperedAreRefused) {
  std::string pub = key_ + ".pub";
  auto unsigned_b = open_bundle_bytes(make(""), {pub});
  ASSERT_FALSE(unsigned_b.has_value());
  EXPECT_NE(unsigned_b.error().message().find("not signed"), std::string::npos);
  auto wrong = open_bundle_bytes(make(other_), {pub});
  ASSERT_FALSE(wrong.has_value());
  EXPECT_NE(wrong.error().message().find("untrusted"), std::string::npos);

  std::string good = make(key_);
  uint64_t sig_off = util::get_u64(good.data() + bundle::h_sig_offset);
  std::string bad_sig = good;
  bad_sig[sig_off + 48 + 10] ^= 1;  // a byte of the signature
  EXPECT_FALSE(open_bundle_bytes(bad_sig, {pub}).has_value());
  EXPECT_FALSE(open_bundle_bytes(bad_sig).has_value()) << "a signature that fails is refused even without trust";
  std::string swapped_key = good;
  std::string other_sig = make(other_);
  std::memcpy(swapped_key.data() + sig_off + 16, other_sig.data() + sig_off + 16, 32);  // the other public key
  EXPECT_FALSE(open_bundle_bytes(swapped_key).has_value());

  // An entry changed and every checksum recomputed (what a forger can do
  // without the private key): the header still verifies, the entry's
  // SHA-256 in the signed index does not.
  std::string forged = good;
  auto [off, len] = entry_span(forged, key_of(3));
  forged[off + len - 1] ^= 0x40;
  reseal_entry(forged.data() + off, len);
  // Keep the record's SHA-256 (signed): reseal only the entry itself.
  auto t = open_bundle_bytes(forged, {pub});
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  auto r = (*t)->get(key_of(3));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Errc::corrupt);
  EXPECT_TRUE(hit_ok(**t, 4));
  // Resealing the index too changes the signed block digest: refused.
  reseal_bundle(forged);
  EXPECT_FALSE(open_bundle_bytes(forged, {pub}).has_value());

  // A trust list naming a key file that cannot be read refuses every bundle.
  EXPECT_FALSE(open_bundle_bytes(good, {d_.path() + "/missing.pub"}).has_value());
  EXPECT_FALSE(open_bundle_bytes(good, {key_}).has_value()) << "a private key file is not a trusted public key";
}

TEST(Bundle, ServedThroughCacheOpenWithEnvironment) {
  TempDir src, empty;
  {
    auto store = open_store(src.path());
    fill(*store, 0, 30);
    ASSERT_TRUE(write_bundle(*store, BundleSelection{}, src.path() + "/a.kcb").has_value());
  }
  ::setenv("KCACHE_BUNDLES", (src.path() + "/missing.kcb:" + src.path() + "/a.kcb").c_str(), 1);
  ::setenv("KCACHE_DIR", empty.path().c_str(), 1);
  Options base;
  base.log_level = LogLevel::error;
  Options o = Options::from_env(base);
  ::unsetenv("KCACHE_BUNDLES");
  ::unsetenv("KCACHE_DIR");
  ASSERT_EQ(o.bundles.files.size(), 2u);
  auto cache = Cache::open(o);
  ASSERT_EQ(cache->tiers().size(), 3u) << "memory, the bundle that opened, disk";
  EXPECT_EQ(cache->tiers()[1]->kind(), TierKind::bundle);
  for (uint64_t i = 0; i < 30; ++i) {
    Source s = Source::compiled;
    auto e = cache->get_or_compile(
        KeyInfo{key_of(i), {}},
        [] { return Expected<std::vector<Artifact>>(Status(Errc::compile_failed, "must not compile")); }, &s);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_TRUE(entry_ok(*e, i));
    EXPECT_EQ(s, Source::bundle);
  }
  Source s;
  ASSERT_TRUE(cache->get(key_of(0), &s).has_value());
  EXPECT_EQ(s, Source::memory) << "a bundle hit is promoted into memory";
  // The disk store got nothing from the bundle; new compiles go there.
  EXPECT_EQ(cache->tiers()[2]->stats().entries, 0u);
  auto n = cache->get_or_compile(KeyInfo{key_of(100), {}}, [] {
    return Expected<std::vector<Artifact>>(std::vector<Artifact>{{"obj", "new"}});
  });
  ASSERT_TRUE(n.has_value());
  (void)cache->flush();  // slower tiers are written in the background
  EXPECT_EQ(cache->tiers()[2]->stats().entries, 1u);
  EXPECT_EQ(cache->tiers()[1]->stats().hits, 30u);
}

TEST(Bundle, TrustFromEnvironmentRefusesUnsigned) {
  TempDir d;
  auto store = open_store(d.path());
  fill(*store, 0, 3);
  ASSERT_TRUE(write_bundle(*store, BundleSelection{}, d.path() + "/u.kcb").has_value());
  ASSERT_TRUE(bundle_keygen(d.path() + "/k").is_ok());
  ::setenv("KCACHE_BUNDLES", (d.path() + "/u.kcb").c_str(), 1);
  ::setenv("KCACHE_BUNDLE_TRUST", (d.path() + "/k.pub").c_str(), 1);
  Options base = disk_options(d.path() + "/cache");
  base.log_level = LogLevel::off;
  Options o = Options::from_env(base);
  ::unsetenv("KCACHE_BUNDLES");
  ::unsetenv("KCACHE_BUNDLE_TRUST");
  auto cache = Cache::open(o);
  for (const auto& t : cache->tiers()) EXPECT_NE(t->kind(), TierKind::bundle);
  EXPECT_FALSE(cache->get(key_of(1)).has_value());
}

TEST(Bundle, LoadBytesIntoACacheAndImport) {
  TempDir src, dst;
  auto store = open_store(src.path());
  fill(*store, 0, 10);
  auto bytes = save_bundle(*store, BundleSelection{});
  ASSERT_TRUE(bytes.has_value());

  auto cache = Cache::open(disk_options(dst.path()));
  ASSERT_TRUE(load_bundle(*cache, *bytes).is_ok());
  ASSERT_EQ(cache->tiers().size(), 3u);
  EXPECT_EQ(cache->tiers()[1]->kind(), TierKind::bundle);
  Source s;
  auto e = cache->get(key_of(4), &s);
  ASSERT_TRUE(e && entry_ok(*e, 4));
  EXPECT_EQ(s, Source::bundle);
  std::string damaged = *bytes;
  damaged[20] ^= 1;
  EXPECT_FALSE(load_bundle(*cache, damaged).is_ok());
  EXPECT_EQ(cache->tiers().size(), 3u);

  // Import copies the entries into a disk store.
  std::string path = src.path() + "/b.kcb";
  spit(path, *bytes);
  auto disk = open_store(dst.path() + "/imported");
  auto n = import_bundle(path, *disk);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  EXPECT_EQ(*n, 10u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(hit_ok(*disk, i)) << i;
}

TEST(Bundle, VerifyChecksEveryEntry) {
  TempDir d;
  auto store = open_store(d.path());
  fill(*store, 0, 12);
  auto bytes = *save_bundle(*store, BundleSelection{});
  std::string path = d.path() + "/v.kcb";
  spit(path, bytes);
  auto rep = verify_bundle(path);
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->checked, 12u);
  EXPECT_TRUE(rep->bad.empty());
  uint64_t calls = 0, last = 0;
  auto [off, len] = entry_span(bytes, key_of(5));
  bytes[off + len / 2] ^= 0x10;
  spit(path, bytes);
  rep = verify_bundle(path, {}, [&](uint64_t done, uint64_t total) {
    ++calls;
    last = done;
    EXPECT_EQ(total, 12u);
  });
  ASSERT_TRUE(rep.has_value());
  ASSERT_EQ(rep->bad.size(), 1u);
  EXPECT_EQ(rep->bad[0].first, key_of(5));
  EXPECT_GE(calls, 1u);
  EXPECT_EQ(last, 12u);
}

TEST(Bundle, CApi) {
  TempDir d;
  ::setenv("KCACHE_DIR", d.path().c_str(), 1);
  kcache_cache* c = nullptr;
  ASSERT_EQ(kcache_open(nullptr, &c), KCACHE_OK);
  ::unsetenv("KCACHE_DIR");
  uint64_t m = 0;
  ASSERT_EQ(kcache_mark(c, &m), KCACHE_OK);
  EXPECT_GT(m, 0u);
  kcache_key k;
  kcache_hash_bytes("k", 1, &k);
  kcache_artifact a{"obj", "bytes", 5};
  ASSERT_EQ(kcache_put(c, &k, &a, 1), KCACHE_OK);
  void* data = nullptr;
  size_t size = 0;
  ASSERT_EQ(kcache_bundle_save(c, m, nullptr, &data, &size), KCACHE_OK) << kcache_last_error();
  ASSERT_GT(size, 0u);
  std::string bytes(static_cast<const char*>(data), size);
  kcache_free(data);
  auto b = open_bundle_bytes(bytes);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)->stats().entries, 1u);
  std::string key_file = d.path() + "/ck";
  ASSERT_EQ(kcache_bundle_keygen(key_file.c_str()), KCACHE_OK);
  std::string path = d.path() + "/c.kcb";
  ASSERT_EQ(kcache_bundle_write(c, 0, key_file.c_str(), path.c_str()), KCACHE_OK) << kcache_last_error();
  kcache_close(c);

  TempDir d2;
  ::setenv("KCACHE_DIR", d2.path().c_str(), 1);
  ASSERT_EQ(kcache_open(nullptr, &c), KCACHE_OK);
  ::unsetenv("KCACHE_DIR");
  ASSERT_EQ(kcache_bundle_load(c, bytes.data(), bytes.size()), KCACHE_OK) << kcache_last_error();
  EXPECT_EQ(kcache_bundle_load(c, bytes.data(), 10), KCACHE_CORRUPT);
  kcache_entry* e = nullptr;
  ASSERT_EQ(kcache_get(c, &k, &e), KCACHE_OK);
  kcache_entry_free(e);
  uint64_t stored = 0;
  ASSERT_EQ(kcache_bundle_import(c, path.c_str(), &stored), KCACHE_OK) << kcache_last_error();
  EXPECT_EQ(stored, 1u);
  kcache_close(c);
}

// The sizes docs/format.md gives for a bundle of its worked-example entry.
TEST(Bundle, WorkedExampleSizes) {
  TempDir d;
  auto k = KeyBuilder("demo/1").add_string("src", "x").finish();
  EntryMeta m;
  m.created_unix_ms = 1700000000000ull;
  m.compile_cost_us = 1500;
  m.producer = "demo";
  auto e = EntryBuilder(k->key).add("obj", "hello").meta(m).manifest(k->manifest).build();
  ASSERT_EQ(e->encoded().size(), 197u);
  auto mem = make_memory_tier();
  ASSERT_TRUE(mem->put(*e).is_ok());
  auto plain = save_bundle(*mem, BundleSelection{});
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->size(), 453u);
  EXPECT_EQ(util::get_u64(plain->data() + bundle::h_data_offset), 256u);
  ASSERT_TRUE(bundle_keygen(d.path() + "/k").is_ok());
  BundleWriteOptions o;
  o.sign_key_file = d.path() + "/k";
  auto sig = save_bundle(*mem, BundleSelection{}, o);
  ASSERT_TRUE(sig.has_value());
  EXPECT_EQ(sig->size(), 581u);
  EXPECT_EQ(util::get_u64(sig->data() + bundle::h_sig_offset), 224u);
  EXPECT_EQ(util::get_u64(sig->data() + bundle::h_data_offset), 384u);
}

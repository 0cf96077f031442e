#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "kcache/entry.h"
#include "test_util.h"

using namespace kcache;
using namespace kcache::test;

TEST(Entry, RoundTrip) {
  KeyInfo ki = *KeyBuilder("ns").add_string("a", "b").finish();
  EntryBuilder b(ki.key);
  b.add("ptx", "PTX TEXT").add("cubin", std::string(5000, '\x7f')).add("empty", "");
  b.meta(EntryMeta{123, 456, "nvrtc 12"}).manifest(ki.manifest);
  auto e = b.build();
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  auto d = Entry::decode(make_heap_buffer(std::string(e->encoded())), &ki.key);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_EQ(*d->artifact("ptx"), "PTX TEXT");
  EXPECT_EQ(*d->artifact("cubin"), std::string(5000, '\x7f'));
  EXPECT_EQ(*d->artifact("empty"), "");
  EXPECT_FALSE(d->artifact("nope"));
  EXPECT_EQ(d->meta().created_unix_ms, 123u);
  EXPECT_EQ(d->meta().compile_cost_us, 456u);
  EXPECT_EQ(d->meta().producer, "nvrtc 12");
  EXPECT_EQ(d->manifest(), ki.manifest);
  EXPECT_EQ(d->artifacts().size(), 3u);
}

// The metadata and manifest are parsed from the bytes on first use. Copies
// share the parse, so threads reading them at once all see the same one,
// for a plain and a compressed entry; an empty Entry describes nothing.
TEST(Entry, TheDescriptionIsParsedOnceForAllCopiesAndThreads) {
  KeyInfo ki = *KeyBuilder("ns").add_string("cpu", "znver5").add_u64("level", 2).finish();
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "add r" + std::to_string(i % 13) + ";\n";
  for (Compression c : {Compression::none, Compression::zstd}) {
    EntryMeta m{77, 88, "producer/1"};
    m.label = "kernel_a";
    auto e = EntryBuilder(ki.key).add("obj", text).meta(m).manifest(ki.manifest).compression(c).build();
    ASSERT_TRUE(e.has_value()) << e.error().to_string();
    auto d = Entry::decode(make_heap_buffer(std::string(e->encoded())), &ki.key);
    ASSERT_TRUE(d.has_value()) << d.error().to_string();
    std::vector<Entry> copies(8, *d);
    std::vector<const Manifest*> seen(copies.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < copies.size(); ++i)
      ts.emplace_back([&, i] {
        seen[i] = &copies[i].manifest();
        EXPECT_EQ(copies[i].meta().label, "kernel_a");
      });
    for (auto& t : ts) t.join();
    for (size_t i = 0; i < copies.size(); ++i) {
      EXPECT_EQ(seen[i], &d->manifest()) << "copy " << i << " parsed its own";
      EXPECT_EQ(*seen[i], ki.manifest);
    }
    EXPECT_EQ(d->manifest().items.at(0).value, std::optional<std::string>("znver5"));
    EXPECT_EQ(d->meta().created_unix_ms, 77u);
    EXPECT_EQ(d->meta().compile_cost_us, 88u);
    EXPECT_EQ(d->meta().producer, "producer/1");
    EXPECT_EQ(*d->artifact("obj"), text);
#if !KCACHE_HAVE_ZSTD
    break;
#endif
  }
  Entry none;
  EXPECT_TRUE(none.manifest().items.empty());
  EXPECT_TRUE(none.meta().producer.empty());
}

TEST(Entry, ArtifactsAre64ByteAlignedWithinTheEntry) {
  Entry e = make_entry(1, 333);
  for (const auto& a : e.artifacts()) EXPECT_EQ((a.data.data() - e.encoded().data()) % 64, 0) << a.name;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(e.encoded().data()) % 64, 0u);
}

TEST(Entry, RejectsBadNames) {
  EXPECT_FALSE(EntryBuilder(key_of(1)).add("a", "1").add("a", "2").build().has_value());
  EXPECT_FALSE(EntryBuilder(key_of(1)).add("", "1").build().has_value());
  EXPECT_FALSE(EntryBuilder(key_of(1)).add(std::string(256, 'n'), "1").build().has_value());
}

TEST(Entry, WrongKeyIsCorrupt) {
  Entry e = make_entry(1);
  Key other = key_of(2);
  auto d = Entry::decode(make_heap_buffer(std::string(e.encoded())), &other);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), Errc::corrupt);
}

// Every single-bit flip and every truncation is detected: never wrong bytes.
TEST(Entry, EveryBitFlipAndTruncationIsDetected) {
  Entry e = make_entry(7, 200);
  std::string enc(e.encoded());
  Key k = key_of(7);
  for (size_t i = 0; i < enc.size(); ++i) {
    for (int bit = 0; bit < 8; bit += 3) {
      std::string bad = enc;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      auto d = Entry::decode(make_heap_buffer(bad), &k);
      ASSERT_FALSE(d.has_value()) << "flip at " << i;
      // The version field (bytes 8..11) cannot be checked against a
      // checksum whose algorithm is the version's to choose: a flip there
      // reads as another format version, which is a plain miss.
      if (i >= 8 && i < 12)
        EXPECT_EQ(d.error().code(), Errc::stale_format);
      else
        EXPECT_EQ(d.error().code(), Errc::corrupt);
    }
  }
  for (size_t n = 0; n < enc.size(); ++n) {
    auto d = Entry::decode(make_heap_buffer(enc.substr(0, n)), &k);
    ASSERT_FALSE(d.has_value()) << "truncated to " << n;
  }
  auto longer = Entry::decode(make_heap_buffer(enc + "x"), &k);
  EXPECT_FALSE(longer.has_value());
}

TEST(Entry, HostileLengthsDoNotAllocate) {
  // A header claiming a huge raw length with a valid-looking layout must be
  // refused before any allocation of that size.
  Entry e = make_entry(3, 100);
  std::string enc(e.encoded());
  for (int i = 0; i < 8; ++i) enc[40 + i] = '\xff';  // raw_len = 2^64-1
  auto d = Entry::decode(make_heap_buffer(enc));
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), Errc::corrupt);
}

#if KCACHE_HAVE_ZSTD
TEST(Entry, ZstdCompressesWhenItPays) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "mov r" + std::to_string(i % 17) + ", r1;\n";
  auto e = EntryBuilder(key_of(9)).add("ptx", text).compression(Compression::automatic).build();
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->compressed());
  EXPECT_LT(e->encoded().size(), text.size() / 2);
  auto d = Entry::decode(make_heap_buffer(std::string(e->encoded())));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d->artifact("ptx"), text);
  // Incompressible bytes stay raw.
  auto r = EntryBuilder(key_of(9)).add("bin", bytes_for(1, 100000)).compression(Compression::automatic).build();
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->compressed());
  // Small payloads are not compressed under `automatic`.
  auto s = EntryBuilder(key_of(9)).add("ptx", text.substr(0, 1000)).compression(Compression::automatic).build();
  EXPECT_FALSE(s->compressed());
}
#endif

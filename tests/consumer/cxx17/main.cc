// A C++17 client of the installed library: the headers a host includes
// compile as C++17, and work. Opens a Cache in a fresh folder, puts an
// entry and gets it back, from memory and then from disk after reopening;
// with kcache::llvm, keys an object with kcache/llvm.h and runs one key
// through the llvm::FileCache drop-in (a miss committed, then a hit).
// Exits 0 when every check holds.
#include <kcache/cache.h>
#include <kcache/key.h>
#if KCACHE_CONSUMER_WITH_LLVM
#include <kcache/llvm.h>
#include <kcache/llvm_file_cache.h>
#endif

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

static_assert(__cplusplus == 201703L, "this client is built as C++17");

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer (C++17): FAILED: %s\n", what);
    ++failures;
  }
}

// An object file's bytes, a NUL among them.
const std::string kObject(
    "\x7f"
    "ELF\0object",
    11);

// Whether `cache` holds the object under `key`, found in the tier `want`.
bool holds_object(kcache::Cache& cache, const kcache::KeyInfo& key, kcache::Source want) {
  kcache::Source source = kcache::Source::other;
  auto e = cache.get(key, &source);
  return e && e->artifact("obj") == std::string_view(kObject) && source == want;
}

// put, then get from memory; reopened, get from disk.
void put_get(const std::string& dir) {
  kcache::Options options;
  options.dir = dir;
  auto key = kcache::KeyBuilder("consumer17/1").add_string("source", "kernel void k() {}").finish();
  check(key.has_value(), "key built");
  if (!key) return;
  {
    auto cache = kcache::Cache::open(options);
    check(cache->put(*key, {{"obj", kObject}}).has_value(), "put");
    check(holds_object(*cache, *key, kcache::Source::memory), "the bytes, from the memory tier");
    check(cache->flush().is_ok(), "flush");
  }
  check(holds_object(*kcache::Cache::open(options), *key, kcache::Source::disk),
        "the bytes after reopening, from the disk tier");

  // Keys compare and order as values (kcache/key.h without <=>).
  auto other = kcache::KeyBuilder("consumer17/1").add_string("source", "kernel void j() {}").finish();
  check(other && other->key != key->key && !(other->key == key->key), "keys differ");
  std::map<kcache::Key, int> ordered{{key->key, 1}, {other->key, 2}};
  check(ordered.size() == 2 && (key->key < other->key) != (other->key < key->key), "keys order");
  check(key->manifest == key->manifest && key->manifest != other->manifest, "manifests compare");
  std::printf("consumer (C++17): put, then memory and disk hits\n");
}

#if KCACHE_CONSUMER_WITH_LLVM
namespace compat = kcache::llvm::compat;

// An object key from kcache/llvm.h, compiled once through get_or_compile;
// then one key through the FileCache, as LLD's ThinLTO cache asks it.
void llvm_parts(const std::string& dir) {
  kcache::Options options;
  options.dir = dir;
  std::shared_ptr<kcache::Cache> cache = kcache::Cache::open(options);
  kcache::llvm::TargetDesc target;
  target.triple = "x86_64-unknown-linux-gnu";
  target.cpu = "x86-64";
  auto key = kcache::llvm::object_key(kcache::hash_bytes("define i32 @f() { ret i32 7 }"), target);
  check(key.has_value(), "object key");
  if (!key) return;
  int compiles = 0;
  const kcache::CompileFn compile = [&]() -> kcache::Expected<std::vector<kcache::Artifact>> {
    ++compiles;
    return std::vector<kcache::Artifact>{{"obj", "object code"}};
  };
  check(cache->get_or_compile(*key, compile).has_value(), "compiled");
  auto again = cache->get_or_compile(*key, compile);
  check(again && again->artifact("obj") == std::string_view("object code") && compiles == 1, "compiled once");

  std::string got;
  auto sink = compat::make_add_buffer(
      [&](unsigned, std::string, std::unique_ptr<::llvm::MemoryBuffer> mb) { got = mb->getBuffer().str(); });
  auto counters = std::make_shared<kcache::llvm::FileCacheCounters>();
  kcache::llvm::FileCacheOptions fo;
  fo.counters = counters;
  ::llvm::FileCache fc = kcache::llvm::localCache(cache, "ThinLTO", sink, fo);
  auto add = compat::call_cache(fc, 1, "thin-key", "module");
  if (!add) {
    check(false, ::llvm::toString(add.takeError()).c_str());
    return;
  }
  check(static_cast<bool>(*add), "the first lookup misses");
  if (*add) {
    auto stream = compat::call_add_stream(*add, 1, "module");
    if (!stream) {
      check(false, ::llvm::toString(stream.takeError()).c_str());
      return;
    }
    *(*stream)->OS << "thin object";
    stream->reset();  // commits, as hosts up to LLVM 20 do
  }
  got.clear();
  auto hit = compat::call_cache(fc, 2, "thin-key", "module");
  if (!hit) {
    check(false, ::llvm::toString(hit.takeError()).c_str());
    return;
  }
  check(!*hit && got == "thin object", "the second lookup hits");
  check(counters->commits == 1 && counters->hits == 1, "FileCache counters");
  std::printf("consumer (C++17, LLVM %s): object key compiled once; FileCache miss committed, then a hit\n",
              LLVM_VERSION_STRING);
}
#endif

}  // namespace

int main() {
  std::string base = (std::filesystem::temp_directory_path() / "kcache-consumer17-XXXXXX").string();
  if (!mkdtemp(base.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  put_get(base + "/cache");
#if KCACHE_CONSUMER_WITH_LLVM
  llvm_parts(base + "/llvm");
#endif
  std::filesystem::remove_all(base);
  if (failures) return 1;
  std::printf("consumer (C++17): ok\n");
  return 0;
}

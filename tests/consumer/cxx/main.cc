// A C++ client of the installed library: opens a Cache in a fresh folder on
// each disk engine built, compiles one entry through get_or_compile, then
// reopens the folder and reads the same bytes back from disk without
// compiling. Exits 0 when every check holds.
#include <kcache/cache.h>
#include <kcache/key.h>
#include <kcache/tier.h>

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer (C++): FAILED: %s\n", what);
    ++failures;
  }
}

// An "object file" with every byte value, NULs included.
std::string object_bytes() {
  std::string s;
  for (int i = 0; i < 4096; ++i) s.push_back(static_cast<char>((i * 37 + 11) & 0xff));
  return s;
}

void run(const std::string& dir, kcache::Engine engine) {
  kcache::Options options;
  options.dir = dir;
  options.engine = engine;
  const std::string object = object_bytes();
  auto key = kcache::KeyBuilder("consumer/1").add_string("source", "kernel void k() {}").add_u64("opt", 2).finish();
  check(key.has_value(), "key built");
  if (!key) return;

  int compiles = 0;
  const kcache::CompileFn compile = [&]() -> kcache::Expected<std::vector<kcache::Artifact>> {
    ++compiles;
    return std::vector<kcache::Artifact>{{"obj", object}, {"entry", "k"}};
  };

  {
    auto cache = kcache::Cache::open(options);
    check(cache != nullptr, "cache opened");
    if (!cache) return;
    kcache::Source source = kcache::Source::other;
    auto entry = cache->get_or_compile(*key, compile, &source);
    check(entry.has_value(), "first get_or_compile succeeded");
    check(source == kcache::Source::compiled, "first request compiled");
    check(entry && entry->artifact("obj") == std::string_view(object), "compiled bytes");
    auto again = cache->get_or_compile(*key, compile, &source);
    check(again && again->artifact("entry") == std::string_view("k"), "second request bytes");
    check(source == kcache::Source::memory, "second request from the memory tier");
  }
  {
    auto cache = kcache::Cache::open(options);
    check(cache != nullptr, "cache reopened");
    if (!cache) return;
    kcache::Source source = kcache::Source::other;
    auto entry = cache->get_or_compile(*key, compile, &source);
    check(entry && entry->artifact("obj") == std::string_view(object), "bytes after reopening");
    check(source == kcache::Source::disk, "request after reopening from the disk tier");
    check(cache->stats().hits == 1 && cache->stats().compiles == 0, "stats after reopening");
  }
  check(compiles == 1, "one compile in all");
  std::printf("consumer (C++): %s engine: compiled once, then memory and disk hits\n",
              std::string(kcache::engine_name(engine)).c_str());
}

}  // namespace

int main() {
  std::string base = (std::filesystem::temp_directory_path() / "kcache-consumer-XXXXXX").string();
  if (!mkdtemp(base.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  for (kcache::Engine e : {kcache::Engine::lmdb, kcache::Engine::files}) {
    if (kcache::engine_built(e)) run(base + "/" + std::string(kcache::engine_name(e)), e);
  }
  std::filesystem::remove_all(base);
  if (failures) return 1;
  std::printf("consumer (C++): ok\n");
  return 0;
}

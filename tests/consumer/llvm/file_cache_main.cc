// A host that compiles kcache's llvm::FileCache from its installed source
// (see CMakeLists.txt): one key missed, written and committed, then found
// by a second FileCache on the same folder. Exits 0 when every check holds.
#include <kcache/llvm_file_cache.h>

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

static_assert(__cplusplus == 201703L, "the FileCache source is built here as C++17, as LLD builds");

namespace compat = kcache::llvm::compat;

int main() {
  std::string dir = (std::filesystem::temp_directory_path() / "kcache-consumer-fc-XXXXXX").string();
  if (!mkdtemp(dir.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string got;
  auto sink = compat::make_add_buffer(
      [&](unsigned, std::string, std::unique_ptr<llvm::MemoryBuffer> mb) { got = mb->getBuffer().str(); });
  bool missed = false, hit = false;
  {
    auto cache = kcache::llvm::localCache("ThinLTO", "Thin", dir, sink);
    if (!cache) return 1;
    auto add = compat::call_cache(*cache, 1, "key", "module");
    if (add && *add) {
      missed = true;
      auto stream = compat::call_add_stream(*add, 1, "module");
      if (!stream) return 1;
      *(*stream)->OS << "object bytes";
      stream->reset();  // commits, as hosts up to LLVM 20 do
    }
  }
  got.clear();
  {
    auto cache = kcache::llvm::localCache("ThinLTO", "Thin", dir, sink);
    if (!cache) return 1;
    auto add = compat::call_cache(*cache, 2, "key", "module");
    hit = add && !*add && got == "object bytes";
  }
  std::filesystem::remove_all(dir);
  if (!missed || !hit) {
    std::fprintf(stderr, "consumer (FileCache from source): FAILED: missed=%d hit=%d\n", missed, hit);
    return 1;
  }
  std::printf("consumer (FileCache from source, LLVM %s): a miss committed, then a hit\n", LLVM_VERSION_STRING);
  return 0;
}

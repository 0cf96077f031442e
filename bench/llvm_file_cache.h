// The baseline the core benchmarks compare against: llvm::localCache, LLVM's
// file-per-entry cache (the one ThinLTO uses), behind a plain interface.
//
// libLLVM is built without RTTI, so only llvm_file_cache.cc includes LLVM
// headers and it is compiled with -fno-rtti; the benchmark itself stays an
// ordinary translation unit.
//
// Thread-safety: none; one benchmark thread uses one instance.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace kcache_bench {

class LlvmFileCache {
 public:
  // nullptr when localCache refuses the folder (*error says why).
  static std::unique_ptr<LlvmFileCache> open(const std::string& dir, std::string* error);
  virtual ~LlvmFileCache() = default;

  // A lookup as ThinLTO does it: on a hit the cache hands a MemoryBuffer to
  // the AddBuffer callback. The view stays valid until release() (or the
  // next get/put). An empty view with ok=false is a miss.
  virtual std::string_view get(std::string_view key, bool* ok) = 0;
  virtual void release() = 0;

  // A store as ThinLTO does it: a lookup that misses, then the bytes written
  // through the returned stream, committed by rename when the stream is
  // destroyed (which also hands the new file to AddBuffer).
  virtual bool put(std::string_view key, std::string_view data) = 0;
};

}  // namespace kcache_bench

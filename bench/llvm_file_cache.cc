// Wraps llvm::localCache (llvm/Support/Caching.h, LLVM 14 to 19). Compiled with
// -fno-rtti to match libLLVM.
#include "llvm_file_cache.h"

#include <llvm/Support/Caching.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include "kcache/llvm_compat.h"

namespace kcache_bench {
namespace {

class Impl final : public LlvmFileCache {
 public:
  bool init(const std::string& dir, std::string* error) {
    // AddBuffer is fixed when the cache is made, so it parks the buffer in
    // a member where get()/put() pick it up.
    auto c = llvm::localCache(
        "kcache-bench", "kcache-bench-tmp", dir,
        kcache::llvm::compat::make_add_buffer(
            [this](unsigned, std::string, std::unique_ptr<llvm::MemoryBuffer> mb) { slot_ = std::move(mb); }));
    if (!c) {
      *error = llvm::toString(c.takeError());
      return false;
    }
    cache_ = std::move(*c);
    return true;
  }

  std::string_view get(std::string_view key, bool* ok) override {
    slot_.reset();
    auto add_stream = kcache::llvm::compat::call_cache(cache_, 0, llvm::StringRef(key.data(), key.size()));
    if (!add_stream) {
      llvm::consumeError(add_stream.takeError());
      *ok = false;
      return {};
    }
    // A non-empty AddStreamFn means a miss.
    if (*add_stream || !slot_) {
      *ok = false;
      return {};
    }
    *ok = true;
    return std::string_view(slot_->getBufferStart(), slot_->getBufferSize());
  }

  void release() override { slot_.reset(); }

  bool put(std::string_view key, std::string_view data) override {
    slot_.reset();
    auto add_stream = kcache::llvm::compat::call_cache(cache_, 0, llvm::StringRef(key.data(), key.size()));
    if (!add_stream) {
      llvm::consumeError(add_stream.takeError());
      return false;
    }
    if (!*add_stream) return true;  // already there: localCache never replaces
    auto stream = kcache::llvm::compat::call_add_stream(*add_stream, 0);
    if (!stream) {
      llvm::consumeError(stream.takeError());
      return false;
    }
    (*stream)->OS->write(data.data(), data.size());
    stream->reset();  // commits: rename into place, then AddBuffer
    bool ok = slot_ && slot_->getBufferSize() == data.size();
    slot_.reset();
    return ok;
  }

 private:
  llvm::FileCache cache_;
  std::unique_ptr<llvm::MemoryBuffer> slot_;
};

}  // namespace

std::unique_ptr<LlvmFileCache> LlvmFileCache::open(const std::string& dir, std::string* error) {
  auto c = std::make_unique<Impl>();
  if (!c->init(dir, error)) return nullptr;
  return c;
}

}  // namespace kcache_bench

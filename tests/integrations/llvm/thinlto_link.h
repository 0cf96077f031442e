// A ThinLTO link as LLD's ELF port drives it, through llvm::lto::LTO: every
// input's symbols resolved (the first definition of a name prevails, all
// kept visible, as for a shared library), the in-process ThinLTO backend,
// and a FileCache handed to LTO::run. The result is one object per task.
// Used by the ThinLTO test and benchmark, with llvm::localCache or kcache's
// drop-in as the cache.
//
// REQUIRES: the native target, its asm printer and asm parser initialised.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <llvm/LTO/Config.h>
#include <llvm/LTO/LTO.h>
#include <llvm/Support/Caching.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Threading.h>
#include <llvm/Support/raw_ostream.h>

#include "kcache/llvm_compat.h"

namespace kcache_thinlto {

struct LinkResult {
  std::string error;                      // empty when the link succeeded
  std::map<unsigned, std::string> files;  // task -> object, compiled or from the cache
};

// Links `inputs` (bitcode made by clang -flto=thin, as file contents) with
// `threads` backend threads. `cache` may be empty (no cache). Objects the
// cache hands over arrive through `add_buffer_sink`, which the caller made
// the cache's AddBuffer with (see buffer_sink()).
struct Link {
  std::mutex mu;
  LinkResult result;

  // The AddBuffer of a cache whose hits and commits go into this link's result.
  llvm::AddBufferFn buffer_sink() {
    return kcache::llvm::compat::make_add_buffer(
        [this](unsigned task, std::string, std::unique_ptr<llvm::MemoryBuffer> mb) {
          std::lock_guard lk(mu);
          result.files[task] = mb->getBuffer().str();
        });
  }

  bool run(const std::vector<std::string>& inputs, const llvm::FileCache& cache, unsigned threads) {
    llvm::lto::Config conf;
    conf.CPU = "x86-64";
    conf.RelocModel = llvm::Reloc::PIC_;
    conf.OptLevel = 2;
    llvm::lto::LTO lto(std::move(conf),
                       llvm::lto::createInProcessThinBackend(llvm::heavyweight_hardware_concurrency(threads)));
    std::set<std::string> defined;
    // The names are the modules' identifiers: they live as long as the LTO.
    std::vector<std::string> names;
    for (size_t i = 0; i < inputs.size(); ++i) names.push_back("input" + std::to_string(i) + ".o");
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto in = llvm::lto::InputFile::create(llvm::MemoryBufferRef(inputs[i], names[i]));
      if (!in) return fail(llvm::toString(in.takeError()));
      std::vector<llvm::lto::SymbolResolution> res;
      for (const auto& sym : (*in)->symbols()) {
        llvm::lto::SymbolResolution r;
        bool def = !sym.isUndefined();
        r.Prevailing = def && defined.insert(sym.getName().str()).second;
        r.VisibleToRegularObj = true;
        r.FinalDefinitionInLinkageUnit = r.Prevailing;
        res.push_back(r);
      }
      if (auto err = lto.add(std::move(*in), res)) return fail(llvm::toString(std::move(err)));
    }
    // What the backend compiles (a miss, or no cache) is written here.
    std::map<unsigned, llvm::SmallVector<char, 0>> streams;
    std::mutex streams_mu;
    llvm::AddStreamFn add_stream = [&](unsigned task,
                                       const auto&...) -> llvm::Expected<std::unique_ptr<llvm::CachedFileStream>> {
      std::lock_guard lk(streams_mu);
      return std::make_unique<llvm::CachedFileStream>(std::make_unique<llvm::raw_svector_ostream>(streams[task]));
    };
    if (auto err = lto.run(add_stream, cache)) return fail(llvm::toString(std::move(err)));
    std::lock_guard lk(mu);
    for (auto& [task, bytes] : streams)
      if (!bytes.empty() || !result.files.count(task)) result.files[task] = std::string(bytes.data(), bytes.size());
    return true;
  }

 private:
  bool fail(std::string why) {
    result.error = std::move(why);
    return false;
  }
};

}  // namespace kcache_thinlto

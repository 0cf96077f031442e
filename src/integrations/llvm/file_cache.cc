// An llvm::FileCache over a kcache::Cache (include/kcache/llvm_file_cache.h).
//
// Per lookup: the key string -> a kcache key -> Cache::begin, which answers
// with the entry (stored, or compiled meanwhile by another thread or
// process) or makes this caller the key's owner. An owner's AddStreamFn and
// stream share one Miss, which holds the Flight: the stream's commit stores
// the object through it; a Miss that ends with the flight still owned
// abandons it, so waiting callers take over.
//
// Needs only llvm/Support and the public kcache headers, so a host with its
// own LLVM build can compile this file alone (it is installed for that).
#include "kcache/llvm_file_cache.h"

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <llvm/ADT/SmallVector.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

namespace kcache::llvm {

namespace {

uint64_t now_us() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// What every lookup of one FileCache shares.
struct Shared {
  std::shared_ptr<Cache> cache;
  std::string name;  // the cache name, part of every key
  ::llvm::AddBufferFn add_buffer;
  FileCacheOptions options;
  std::shared_ptr<FileCacheCounters> counters;

  void add(unsigned task, const std::string& module, std::unique_ptr<::llvm::MemoryBuffer> buffer) const {
    if (add_buffer) compat::call_add_buffer(add_buffer, task, module, std::move(buffer));
  }
};

// An object in a cache entry, sharing the entry's memory: the Entry it
// holds keeps that memory alive for as long as the host keeps the buffer.
class EntryBuffer final : public ::llvm::MemoryBuffer {
 public:
  EntryBuffer(Entry entry, std::string_view bytes, std::string id) : entry_(std::move(entry)), id_(std::move(id)) {
    init(bytes.data(), bytes.data() + bytes.size(), /*RequiresNullTerminator=*/false);
  }
  BufferKind getBufferKind() const override { return MemoryBuffer_Malloc; }
  ::llvm::StringRef getBufferIdentifier() const override { return id_; }

 private:
  Entry entry_;
  std::string id_;
};

// The object of `entry` as a buffer the host may keep: the entry's own
// memory when it is heap memory (or `pin` allows mapped pages) and 8-byte
// aligned, as object file parsers want; else a copy.
std::unique_ptr<::llvm::MemoryBuffer> buffer_of(const Entry& entry, std::string_view obj, bool pin) {
  std::string id = "kcache:" + entry.key().hex();
  bool aligned = (reinterpret_cast<uintptr_t>(obj.data()) & 7) == 0;
  if (aligned && (pin || !entry.pinned())) return std::make_unique<EntryBuffer>(entry, obj, std::move(id));
  return ::llvm::MemoryBuffer::getMemBufferCopy(::llvm::StringRef(obj.data(), obj.size()), id);
}

// One miss: the key's flight, when this caller owns it (none for a miss
// the cache could not take part in), until a stream commits or it ends.
struct Miss {
  std::shared_ptr<const Shared> shared;  // first: outlives the flight
  std::optional<Flight> flight;
  unsigned task = 0;
  std::string module;
  std::mutex mu;
  bool stream_made = false;  // GUARDED_BY(mu)

  Miss(std::shared_ptr<const Shared> s, std::optional<Flight> f, unsigned t, std::string m)
      : shared(std::move(s)), flight(std::move(f)), task(t), module(std::move(m)) {}
  ~Miss() { abandon(); }

  void abandon() {
    if (!flight || !flight->owner()) return;
    flight->abandon();
    shared->counters->abandons.fetch_add(1, std::memory_order_relaxed);
  }
};

// The bytes a stream collects; a base class of Stream so that they exist
// before CachedFileStream's stream is made over them.
struct StreamBytes {
  ::llvm::SmallVector<char, 0> bytes;
};

class Stream final : private StreamBytes, public ::llvm::CachedFileStream {
 public:
  Stream(std::shared_ptr<Miss> miss, bool owns, unsigned task, std::string module)
      : CachedFileStream(std::make_unique<::llvm::raw_svector_ostream>(bytes)),
        miss_(std::move(miss)),
        owns_(owns),
        task_(task),
        module_(std::move(module)),
        start_us_(now_us()) {}

  ~Stream() override {
    if (!done_) finish(miss_->shared->options.commit_on_destroy);
  }

  // Stores what was written and hands it to AddBuffer. Never an error.
  ::llvm::Error commit() KCACHE_LLVM_COMMIT_OVERRIDE {
    if (!done_) finish(true);
    return ::llvm::Error::success();
  }

 private:
  void finish(bool keep) {
    done_ = true;
    const Shared& s = *miss_->shared;
    if (!keep) {
      if (owns_) miss_->abandon();
      return;
    }
    std::string_view obj(bytes.data(), bytes.size());
    std::unique_ptr<::llvm::MemoryBuffer> buffer;
    if (owns_ && miss_->flight && miss_->flight->owner()) {
      std::vector<Artifact> arts;
      arts.push_back({"obj", std::string(obj)});
      auto entry = miss_->flight->commit(std::move(arts), now_us() - start_us_);
      if (entry) {
        s.counters->commits.fetch_add(1, std::memory_order_relaxed);
        // The host may _exit once it has the buffer (LLD does).
        if (s.options.flush_on_commit) (void)s.cache->flush();
        if (auto stored = entry->artifact("obj"); stored && stored->size() == obj.size())
          buffer = buffer_of(*entry, *stored, s.options.pin_hits);
      } else {
        s.counters->faults.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (!buffer) buffer = ::llvm::MemoryBuffer::getMemBufferCopy(::llvm::StringRef(obj.data(), obj.size()), "kcache");
    s.add(task_, module_, std::move(buffer));
  }

  std::shared_ptr<Miss> miss_;
  bool owns_;  // this stream holds the miss's flight
  unsigned task_;
  std::string module_;
  uint64_t start_us_;
  bool done_ = false;
};

// The AddStreamFn of a miss. The first stream it makes owns the flight;
// another (which LLVM's callers never ask for) only hands its bytes on.
::llvm::AddStreamFn add_stream_of(std::shared_ptr<Miss> miss) {
  return [miss](unsigned task, const auto&... name) -> ::llvm::Expected<std::unique_ptr<::llvm::CachedFileStream>> {
    bool owns;
    {
      std::lock_guard lk(miss->mu);
      owns = !miss->stream_made;
      miss->stream_made = true;
    }
    std::string module = compat::module_name(name...);
    if (module.empty()) module = miss->module;
    return std::make_unique<Stream>(miss, owns, task, std::move(module));
  };
}

::llvm::Expected<::llvm::AddStreamFn> look_up(const std::shared_ptr<const Shared>& s, unsigned task,
                                              ::llvm::StringRef key_string, std::string module) {
  FileCacheCounters& C = *s->counters;
  C.lookups.fetch_add(1, std::memory_order_relaxed);
  KeyBuilder kb(kFileCacheNamespace);
  kb.add_string("cache_name", s->name).add_string("key", std::string_view(key_string.data(), key_string.size()));
  if (!s->options.extra.empty()) kb.add_map("extra", s->options.extra);
  kb.label(module);
  auto key = std::move(kb).finish();
  std::optional<Flight> flight;
  if (key) {
    flight.emplace(s->cache->begin(*key));
    if (flight->has_entry()) {
      if (auto obj = flight->entry().artifact("obj")) {
        C.hits.fetch_add(1, std::memory_order_relaxed);
        if (flight->source() == Source::waited) C.waited.fetch_add(1, std::memory_order_relaxed);
        s->add(task, module, buffer_of(flight->entry(), *obj, s->options.pin_hits));
        return ::llvm::AddStreamFn();
      }
      flight.reset();  // an entry without an object: compile, uncached
    } else if (!flight->owner()) {
      flight.reset();
    }
  }
  if (!flight) C.faults.fetch_add(1, std::memory_order_relaxed);
  C.streams.fetch_add(1, std::memory_order_relaxed);
  return add_stream_of(std::make_shared<Miss>(s, std::move(flight), task, std::move(module)));
}

}  // namespace

::llvm::FileCache localCache(std::shared_ptr<Cache> cache, const ::llvm::Twine& CacheNameRef,
                             ::llvm::AddBufferFn AddBuffer, FileCacheOptions options) {
  auto s = std::make_shared<Shared>();
  s->cache = std::move(cache);
  s->name = CacheNameRef.str();
  s->add_buffer = std::move(AddBuffer);
  s->counters = options.counters ? options.counters : std::make_shared<FileCacheCounters>();
  s->options = std::move(options);
  std::shared_ptr<const Shared> shared = std::move(s);
  return [shared](unsigned task, ::llvm::StringRef key, const auto&... name) -> ::llvm::Expected<::llvm::AddStreamFn> {
    return look_up(shared, task, key, compat::module_name(name...));
  };
}

::llvm::Expected<::llvm::FileCache> localCache(const ::llvm::Twine& CacheNameRef,
                                               const ::llvm::Twine& TempFilePrefixRef,
                                               const ::llvm::Twine& CacheDirectoryPathRef,
                                               ::llvm::AddBufferFn AddBuffer) {
  (void)TempFilePrefixRef;
  Options o;
  o.dir = CacheDirectoryPathRef.str();
  std::shared_ptr<Cache> cache = Cache::open(Options::from_env(std::move(o)));
  return localCache(std::move(cache), CacheNameRef, std::move(AddBuffer));
}

}  // namespace kcache::llvm

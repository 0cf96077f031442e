// LLVM integration, stored objects: a cache entry's bytes as an object
// buffer the linker takes (a view that holds the entry, or a copy; checked
// to parse as an object for the target), found by object key for MCJIT
// (ObjectCache) or through a front-end key's stage link (FrontendKeys::find).
#include <string>
#include <utility>
#include <vector>

#include <llvm/Object/ObjectFile.h>

#include "integrations/llvm/internal.h"
#include "kcache/llvm.h"
#include "util/util.h"

namespace kcache::llvm {

namespace detail {

namespace {

// An object file in a cache entry's bytes. Holding the Entry keeps the
// tier's memory (heap, or an LMDB read transaction) alive while ORC links.
class EntryObjectBuffer final : public ::llvm::MemoryBuffer {
 public:
  EntryObjectBuffer(Entry entry, std::string_view bytes) : entry_(std::move(entry)) {
    init(bytes.data(), bytes.data() + bytes.size(), /*RequiresNullTerminator=*/false);
  }
  BufferKind getBufferKind() const override { return MemoryBuffer_Malloc; }
  // Made on demand: the hit path should not pay for a name nobody reads.
  ::llvm::StringRef getBufferIdentifier() const override {
    if (id_.empty()) id_ = "kcache:" + entry_.key().hex();
    return id_;
  }

 private:
  Entry entry_;
  mutable std::string id_;
};

// The entry's object as a buffer: the entry's own bytes when zero_copy
// (and they are 8-byte aligned, as a parser wants), else a copy.
std::unique_ptr<::llvm::MemoryBuffer> buffer_of(Entry&& e, std::string_view obj, bool zero_copy) {
  bool aligned = (reinterpret_cast<uintptr_t>(obj.data()) & 7) == 0;
  if (zero_copy && aligned) return std::make_unique<EntryObjectBuffer>(std::move(e), obj);
  return ::llvm::MemoryBuffer::getMemBufferCopy(::llvm::StringRef(obj.data(), obj.size()), "kcache:" + e.key().hex());
}

}  // namespace

std::unique_ptr<::llvm::MemoryBuffer> object_buffer(Entry&& e, ::llvm::Triple::ArchType arch, bool zero_copy,
                                                    std::string* why, bool check) {
  auto obj = e.artifact("obj");
  if (!obj) {
    *why = "entry has no 'obj' artifact";
    return nullptr;
  }
  if (!check) return buffer_of(std::move(e), *obj, zero_copy);
  auto parsed = ::llvm::object::ObjectFile::createObjectFile(
      ::llvm::MemoryBufferRef(::llvm::StringRef(obj->data(), obj->size()), "kcache"));
  if (!parsed) {
    *why = ::llvm::toString(parsed.takeError());
    return nullptr;
  }
  if ((*parsed)->getArch() != arch) {
    *why = "object is for another architecture";
    return nullptr;
  }
  return buffer_of(std::move(e), *obj, zero_copy);
}

::llvm::Error make_error(const std::string& msg) {
  return ::llvm::make_error<::llvm::StringError>(msg, ::llvm::inconvertibleErrorCode());
}

std::vector<Artifact> object_artifacts(::llvm::StringRef obj) {
  std::vector<Artifact> arts;
  arts.push_back({"obj", obj.str()});
  return arts;
}

}  // namespace detail

using namespace detail;

std::unique_ptr<::llvm::MemoryBuffer> FrontendKeys::find(Cache& cache, const Key& front,
                                                         CompileCounters* counters) const {
  Tally tally(counters);
  Clocks t0 = tally.now();
  std::unique_ptr<::llvm::MemoryBuffer> buf;
  if (auto e = get_staged(cache, link_front(front))) {
    std::string why;
    Key k = e->key();
    // ORC frees an object buffer once it is linked, so a pinned view is fine.
    buf = object_buffer(std::move(*e), arch_, /*zero_copy=*/true, &why);
    if (!buf) {
      tally.bad_objects = 1;
      KCACHE_LOG(LogLevel::warn, "llvm: stored object %s rejected: %s", k.hex().c_str(), why.c_str());
    }
  }
  // A miss is counted by the compiler the module goes to next.
  if (buf) tally.lookups = tally.hits = tally.frontend_hits = 1;
  tally.charge(tally.lookup, t0);
  return buf;
}

// ---- ObjectCache -------------------------------------------------------------

ObjectCache::ObjectCache(Cache& cache, TargetDesc target, ObjectCacheOptions options)
    : cache_(cache), target_(std::move(target)), opt_(std::move(options)), key_base_(target_part(target_, opt_.key)) {
  arch_ = ::llvm::Triple(target_.triple).getArch();
  counters_ = opt_.counters ? opt_.counters : std::make_shared<CompileCounters>();
}

ObjectCache::~ObjectCache() = default;

std::unique_ptr<::llvm::MemoryBuffer> ObjectCache::getObject(const ::llvm::Module* cm) {
  if (!cm) return nullptr;
  Tally tally(counters_.get());
  tally.lookups = 1;
  Clocks t0 = tally.now();
  // The JIT owns the module and is compiling it on this thread; the key
  // function renames and restores two fields (see object_key). A module
  // tagged with its IR digest is keyed on that (the tag stays: this
  // interface may not change the module).
  auto ird = cm->getNamedMetadata(kIrDigestMd) ? read_digest_md(*cm, kIrDigestMd) : std::nullopt;
  auto key = key_of_module(const_cast<::llvm::Module&>(*cm), ird, key_base_);
  Clocks t1 = tally.charge(tally.key, t0);
  if (!key) {
    KCACHE_LOG(LogLevel::warn, "llvm: no key for module: %s (compiling uncached)", key.error().to_string().c_str());
    tally.misses = 1;
    return nullptr;
  }
  std::unique_ptr<::llvm::MemoryBuffer> buf;
  if (auto e = cache_.get(*key)) {  // a miss is journaled with the key's manifest
    std::string why;
    bool zero_copy = opt_.zero_copy && (!e->pinned() || opt_.short_lived_buffers);
    buf = object_buffer(std::move(*e), arch_, zero_copy, &why);
    if (!buf) {
      tally.bad_objects = 1;
      KCACHE_LOG(LogLevel::warn, "llvm: stored object %s rejected: %s (recompiling)", key->key.hex().c_str(),
                 why.c_str());
    }
  }
  tally.charge(tally.lookup, t1);
  if (buf) {
    tally.hits = 1;
    return buf;
  }
  tally.misses = 1;
  std::lock_guard lk(mu_);
  pending_[cm] = Pending{std::move(key).value(), util::now_mono_us()};
  return nullptr;
}

void ObjectCache::notifyObjectCompiled(const ::llvm::Module* cm, ::llvm::MemoryBufferRef obj) {
  if (!cm) return;
  Tally tally(counters_.get());
  tally.codegen_runs = 1;
  Pending p;
  bool found = false;
  {
    std::lock_guard lk(mu_);
    auto it = pending_.find(cm);
    if (it != pending_.end()) {
      p = std::move(it->second);
      pending_.erase(it);
      found = true;
    }
  }
  if (!found) {
    // The JIT compiled without asking first. Code generation has changed
    // the module since, so its key now is not the key of its input: storing
    // under it could never hit and only wastes space.
    KCACHE_LOG(LogLevel::info, "llvm: object for a module never looked up; not stored");
    return;
  }
  Clocks t0 = tally.now();
  uint64_t cost = util::now_mono_us() - p.start_us;
  cache_.put(p.key, object_artifacts(obj.getBuffer()), cost);
  tally.charge(tally.lookup, t0);
}

}  // namespace kcache::llvm

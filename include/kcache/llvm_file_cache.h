// kcache/llvm_file_cache.h — an llvm::FileCache backed by a kcache::Cache:
// a drop-in for llvm::localCache (llvm/Support/Caching.h).
//
// Hosts that cache through llvm::FileCache — LLD's ThinLTO cache
// (--thinlto-cache-dir, /lldltocache:, --cache_path_lto), llvm-lto2
// --cache-dir, the gold plugin, Julia's native code cache — switch by
// replacing one call:
//
//   llvm::localCache(name, prefix, dir, add_buffer)
//   kcache::llvm::localCache(name, prefix, dir, add_buffer)
//
// with the same arguments and result, for LLVM 14 to 19. What they gain
// over one file per key: N threads or processes asking for one key at once
// compile it once (the others wait and get its object), the size limit and
// eviction, entries verified before use, and what the Cache is configured
// with (KCACHE_* variables: a shared remote, bundles, KCACHE_DISABLE, ...).
//
// What a call does, as localCache's callers expect:
//  * cache(task, key, name) looks up the key string (with the cache name
//    and FileCacheOptions::extra) as a kcache key labelled with the module
//    name. A hit goes to AddBuffer(task, name, buffer) and the call returns
//    an empty AddStreamFn. Another thread or process compiling the key makes
//    the call wait for its object (a hit). Otherwise this caller owns the
//    key: the call returns an AddStreamFn.
//  * add_stream(task, name) returns a stream; what the host writes into it
//    is stored when the stream commits (commit(), or, as LLVM up to 20
//    does it, its destruction: FileCacheOptions::commit_on_destroy), and
//    then handed to AddBuffer like a hit.
//  * An AddStreamFn dropped without a stream, or a stream dropped without
//    a commit where destruction does not commit, abandons the key: nothing
//    is stored and a waiting caller compiles it.
//
// The cache never fails the host: LLD and Julia abort on any error a
// FileCache returns, so none is ever returned. A fault of the cache is a
// miss (the host compiles), an object that could not be stored is still
// handed to AddBuffer, and FileCacheCounters::faults counts what went
// wrong besides the Cache's own counters and log.
//
// Buffers handed to AddBuffer stay valid for as long as the host keeps
// them (LLD keeps every one until the link ends): a hit from the disk
// store is copied out of LMDB's map (FileCacheOptions::pin_hits hands out
// the mapped bytes instead), a hit from heap memory shares that memory.
//
// Durability: by default each commit waits until its entry is in the disk
// store (Cache::flush), since hosts such as LLD leave through _exit, which
// skips destructors.
//
// Thread-safety: the FileCache and the AddStreamFns it returns may be
// called from many threads at once (LLD's backend threads do); one stream
// is used by one thread. REQUIRES: a caller that owns a key (holds its
// AddStreamFn or an uncommitted stream) does not look the same key up
// again on the same thread before it commits or drops it: the lookup would
// wait for that caller itself (up to Options::wait_bound_ms across
// processes, without end within the process). LLVM's hosts look each key
// up once per task, and compile it on the thread that looked it up.
//
// For a host with its own LLVM: this header, kcache/llvm_compat.h and one
// source file (src/integrations/llvm/file_cache.cc, installed as
// share/kcache/llvm_file_cache.cc) need only llvm/Support and the kcache
// core (kcache::kcache); kcache::llvm holds them too.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kcache/cache.h"
#include "kcache/llvm_compat.h"

#include <llvm/ADT/Twine.h>
#include <llvm/Support/Caching.h>
#include <llvm/Support/Error.h>

namespace kcache::llvm {

// Namespace of the keys made here; bump when the key's meaning changes.
inline constexpr const char* kFileCacheNamespace = "kcache-llvm-filecache/1";

// What the FileCache did; every field only grows.
struct FileCacheCounters {
  std::atomic<uint64_t> lookups{0};   // cache(task, key, name) calls
  std::atomic<uint64_t> hits{0};      // answered with AddBuffer (stored, or compiled by another caller)
  std::atomic<uint64_t> waited{0};    // of the hits, compiled meanwhile by another thread or process
  std::atomic<uint64_t> streams{0};   // AddStreamFns returned: compiles the host ran
  std::atomic<uint64_t> commits{0};   // objects stored
  std::atomic<uint64_t> abandons{0};  // keys given up without an object
  std::atomic<uint64_t> faults{0};    // cache faults turned into misses or unstored objects
};

struct FileCacheOptions {
  // Components added to every key (the host's version, options its key
  // string leaves out). Default none.
  std::map<std::string, std::string> extra;
  // A stream destroyed without commit() commits. Default: true up to LLVM
  // 20, whose hosts commit by destroying the stream; false where
  // CachedFileStream has commit() (a stream dropped without it abandons).
  bool commit_on_destroy = LLVM_VERSION_MAJOR < 21;
  // Wait after each commit until its entry is in the disk store. Default
  // true (see "Durability" above).
  bool flush_on_commit = true;
  // Hand hits from the disk store out as views into LMDB's map (which keep
  // a read transaction pinned while the host holds the buffer) instead of
  // copies. Default false.
  bool pin_hits = false;
  // Counters to update; null: the FileCache keeps its own, unseen.
  std::shared_ptr<FileCacheCounters> counters;
};

// llvm::localCache's drop-in: a FileCache over a Cache opened on
// `CacheDirectoryPathRef` (Options::dir, then the KCACHE_* variables, as
// Options::from_env applies them). `TempFilePrefixRef` is accepted for the
// signature's sake; no temporary files are made. `AddBuffer` may be empty.
// Never an error: a folder kcache cannot use leaves the Cache without a
// disk store, said once in its log (hits then come from memory only).
::llvm::Expected<::llvm::FileCache> localCache(const ::llvm::Twine& CacheNameRef,
                                               const ::llvm::Twine& TempFilePrefixRef,
                                               const ::llvm::Twine& CacheDirectoryPathRef,
                                               ::llvm::AddBufferFn AddBuffer = {});

// The same over a Cache the caller opened (the FileCache keeps it alive),
// with options.
::llvm::FileCache localCache(std::shared_ptr<Cache> cache, const ::llvm::Twine& CacheNameRef,
                             ::llvm::AddBufferFn AddBuffer = {}, FileCacheOptions options = {});

}  // namespace kcache::llvm

/* kcache/kcache.h — the C ABI, for hosts that are not C++ (Julia, Python,
 * Rust, plain C JITs).
 *
 * A plain C99 header over the C++ library. Every object is an opaque handle
 * that the caller frees with its own *_free / kcache_close function. No C++
 * exception ever crosses this boundary: each function returns an int code
 * (enum kcache_code; 0 is success) and, on failure, leaves a one-line message
 * for the calling thread in kcache_last_error().
 *
 * Arguments: a pointer may be NULL only where its function says so (the
 * *_free functions, kcache_close, kcache_open's options, the `source`
 * out-parameters, and data pointers whose size is 0). Any other NULL is
 * refused with KCACHE_INVALID_ARGUMENT, never dereferenced.
 *
 * The last error: every function that returns an int code sets
 * kcache_last_error() to a non-empty message when it returns non-zero and
 * clears it ("") when it returns KCACHE_OK, so code and message always
 * agree, even after nested calls made inside a compile callback.
 * kcache_key_builder_new and kcache_stats_json (which return pointers) set
 * it when they return NULL and clear it otherwise. The functions that
 * return neither (kcache_version, kcache_features, kcache_code_name, the
 * *_free functions, kcache_close, kcache_entry_artifact_count) leave it
 * alone.
 *
 * The cache keeps its promise here too: a cache fault (corrupt entry, full
 * disk, read-only folder) is a miss plus a counter, never an error returned
 * from kcache_get_or_compile(); the only failures it returns are the compile
 * callback's own (KCACHE_COMPILE_FAILED) and bad arguments.
 *
 * Thread-safety: a kcache_cache may be used from many threads at once
 * (kcache_get_or_compile() compiles a key once at a time across them). A
 * kcache_entry is immutable and may be read from any thread. Options, key
 * builders and artifact sinks are not thread-safe: use one per thread.
 *
 * Memory: entries returned by kcache_get / kcache_get_or_compile own their
 * bytes (they do not pin the disk store, so they may be held for long);
 * pointers into an entry stay valid until kcache_entry_free(). Strings the
 * library returns are freed with kcache_free().
 */
#ifndef KCACHE_KCACHE_H_
#define KCACHE_KCACHE_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define KCACHE_EXPORT __declspec(dllexport)
#else
#define KCACHE_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes. The values equal kcache::Errc's and never change. */
enum kcache_code {
  KCACHE_OK = 0,
  KCACHE_NOT_FOUND = 1,        /* a miss, or no such artifact */
  KCACHE_INVALID_ARGUMENT = 2, /* a documented precondition was broken */
  KCACHE_CORRUPT = 3,
  KCACHE_IO_ERROR = 4,
  KCACHE_NO_SPACE = 5,
  KCACHE_READ_ONLY = 6,
  KCACHE_UNAVAILABLE = 7,
  KCACHE_TIMEOUT = 8,
  KCACHE_TOO_LARGE = 9,
  KCACHE_COMPILE_FAILED = 10, /* the compile callback returned non-zero */
  KCACHE_INTERNAL = 11,       /* a bug in kcache, or out of memory */
  KCACHE_STALE_FORMAT = 12,   /* stored by another entry format version */
};

/* Where a kcache_get_or_compile() result came from (kcache::Source). */
enum kcache_source {
  KCACHE_SOURCE_COMPILED = 0,
  KCACHE_SOURCE_MEMORY = 1,
  KCACHE_SOURCE_DISK = 2,
  KCACHE_SOURCE_REMOTE = 3,
  KCACHE_SOURCE_OTHER = 4,
  KCACHE_SOURCE_WAITED = 5, /* another thread compiled it meanwhile */
  KCACHE_SOURCE_BUNDLE = 6, /* a mounted bundle (KCACHE_BUNDLES, kcache_bundle_load) */
};

/* A 128-bit key (kcache::Key), bytes[0] first when printed as hex. */
typedef struct kcache_key {
  uint8_t bytes[16];
} kcache_key;

typedef struct kcache_options kcache_options;
typedef struct kcache_cache kcache_cache;
typedef struct kcache_entry kcache_entry;
typedef struct kcache_key_builder kcache_key_builder;
typedef struct kcache_artifacts kcache_artifacts;
typedef struct kcache_flight kcache_flight;

/* An artifact handed to kcache_put(): `size` bytes at `data`, named `name`. */
typedef struct kcache_artifact {
  const char* name;
  const void* data;
  size_t size;
} kcache_artifact;

/* ---- errors and versions -------------------------------------------------- */

/* "ok", "not found", ... ; "unknown" for other values. Static storage. */
KCACHE_EXPORT const char* kcache_code_name(int code);
/* The message of the last failed call on this thread ("" when none). Valid
 * until the next kcache call on this thread. */
KCACHE_EXPORT const char* kcache_last_error(void);
/* "0.1.0". Static storage. */
KCACHE_EXPORT const char* kcache_version(void);
/* Features built in, space-separated ("lmdb files zstd ..."). Static. */
KCACHE_EXPORT const char* kcache_features(void);
/* Frees a string this library returned (kcache_stats_json). NULL is fine. */
KCACHE_EXPORT void kcache_free(void* p);

/* ---- options ---------------------------------------------------------------- */

/* Default options (see kcache::Options); NULL when out of memory. */
KCACHE_EXPORT kcache_options* kcache_options_new(void);
KCACHE_EXPORT void kcache_options_free(kcache_options* o);
/* Sets one option by name, through the library's one parser
 * (kcache::Options::set): every option of kcache::Options is reachable, by
 * the names of docs/design.md's option table, among them
 *   "dir"          cache folder                       (default: per user)
 *   "engine"       "lmdb" or "files"
 *   "max_size"     disk size limit, e.g. "2G"         (default 4G)
 *   "memory_size"  memory tier size, e.g. "256M"; "0" leaves the tier out
 *   "disk"         "0" leaves the disk tier out
 *   "read_only"    "1": look up, never store
 *   "disabled"     "1": no lookups, every call compiles
 *   "recompile"    "1": no lookups, compile and overwrite
 *   "shared_group" group that shares the disk store
 *   "remote"       remote tier URL, "redis://host:port"
 *   "remote_secret_file", "bundles", "bundle_trust", "explain",
 *   "miss_journal", "lease_ttl_ms", "wait_bound_ms", "log", ...
 *   "sync_commit"  "1": each compile is synced before it returns (they are
 *                  on disk anyway), each kcache_put on disk and synced
 *   "producer"     free text stored in each entry's metadata
 *   "compression"  "none", "zstd" or "auto"
 * and the C ABI's own:
 *   "env"          "0": ignore KCACHE_* variables     (default: they apply)
 * Precedence (the same in every binding): defaults, then what the program
 * set here, then the KCACHE_* variables (unless "env" is "0"), so that the
 * operator's KCACHE_DISABLE or KCACHE_DIR reaches every program.
 * KCACHE_INVALID_ARGUMENT for an unknown name or unparsable value (the
 * message names what the option takes); the options are then unchanged. */
KCACHE_EXPORT int kcache_options_set(kcache_options* o, const char* name, const char* value);
/* The option's value in the form kcache_options_set takes, as a string the
 * caller frees with kcache_free (the program's settings only: the
 * environment is applied by kcache_open). KCACHE_INVALID_ARGUMENT for an
 * unknown name. */
KCACHE_EXPORT int kcache_options_get(const kcache_options* o, const char* name, char** value);

/* ---- keys --------------------------------------------------------------------- */

/* Builds a key from a namespace and named components (kcache::KeyBuilder).
 * NULL when `ns` is NULL or out of memory (kcache_last_error says which).
 * A component with an empty or repeated name is reported by
 * kcache_key_builder_finish. */
KCACHE_EXPORT kcache_key_builder* kcache_key_builder_new(const char* ns);
KCACHE_EXPORT void kcache_key_builder_free(kcache_key_builder* b);
KCACHE_EXPORT int kcache_key_add_bytes(kcache_key_builder* b, const char* name, const void* data, size_t size);
KCACHE_EXPORT int kcache_key_add_string(kcache_key_builder* b, const char* name, const char* value);
KCACHE_EXPORT int kcache_key_add_u64(kcache_key_builder* b, const char* name, uint64_t value);
KCACHE_EXPORT int kcache_key_add_i64(kcache_key_builder* b, const char* name, int64_t value);
KCACHE_EXPORT int kcache_key_add_bool(kcache_key_builder* b, const char* name, int value);
KCACHE_EXPORT int kcache_key_add_digest(kcache_key_builder* b, const char* name, const kcache_key* value);
/* Hashes the file's contents (not its path). */
KCACHE_EXPORT int kcache_key_add_file(kcache_key_builder* b, const char* name, const char* path);
/* The label of what is compiled (a kernel's or module's name, cut at 1024
 * bytes): not part of the key; it names the entry in `kcache misses`,
 * `explain` and debug logs. */
KCACHE_EXPORT int kcache_key_set_label(kcache_key_builder* b, const char* label);
/* Keeps component `name` (added before or after this call) out of the stored
 * manifest and the miss journal: only its digest is kept (tokens, user names,
 * paths). kcache_key_builder_finish fails with KCACHE_INVALID_ARGUMENT when no
 * component has that name. */
KCACHE_EXPORT int kcache_key_mark_private(kcache_key_builder* b, const char* name);
/* The key; KCACHE_INVALID_ARGUMENT on a repeated or empty component name,
 * KCACHE_IO_ERROR / KCACHE_NOT_FOUND when an added file could not be read. */
KCACHE_EXPORT int kcache_key_builder_finish(const kcache_key_builder* b, kcache_key* out);
/* Digest of arbitrary bytes (e.g. a previous stage's output). `data` may be
 * NULL when size is 0. */
KCACHE_EXPORT int kcache_hash_bytes(const void* data, size_t size, kcache_key* out);
/* 32 lowercase hex digits and a NUL into out[33]. With a NULL key, out
 * (when not NULL) is set to "" and KCACHE_INVALID_ARGUMENT returned. */
KCACHE_EXPORT int kcache_key_to_hex(const kcache_key* key, char out[33]);
/* Exactly 32 hex digits; KCACHE_INVALID_ARGUMENT otherwise. */
KCACHE_EXPORT int kcache_key_from_hex(const char* hex, kcache_key* out);

/* ---- the cache ------------------------------------------------------------------ */

/* Opens a cache (kcache::Cache::open). `options` may be NULL (defaults plus
 * KCACHE_* variables). Never fails for a cache folder that cannot be used:
 * the cache then runs without a disk tier. */
KCACHE_EXPORT int kcache_open(const kcache_options* options, kcache_cache** out);
/* Flushes and closes. NULL is fine. */
KCACHE_EXPORT void kcache_close(kcache_cache* c);
/* Waits until every entry stored so far (kcache_put, kcache_get_or_compile,
 * kcache_flight_commit) is written to the disk and remote tiers, as
 * durably as the "durability" option makes a commit: after it returns, a
 * SIGKILL or _exit() loses none of them. What a compile produced
 * (kcache_get_or_compile, kcache_flight_commit) is on disk before that
 * call returns already; kcache_put's entries reach the disk through a
 * background thread that lets a group gather for up to 100 ms. A process
 * that returns from main or calls exit() flushes every open cache by
 * itself (an atexit handler), but one that ends with _exit() or is killed
 * keeps its last puts only after kcache_flush, or with the option
 * "sync_commit" = "1", which makes every put wait for its write.
 * The result says whether those entries are on disk: KCACHE_OK, or the
 * first failure's code (KCACHE_NO_SPACE, KCACHE_READ_ONLY,
 * KCACHE_IO_ERROR, ...) with kcache_last_error() saying how many entries
 * since the last kcache_flush were not written and why. With
 * "sync_commit" = "1", kcache_put itself returns that failure for its own
 * entry. KCACHE_INVALID_ARGUMENT for NULL. */
KCACHE_EXPORT int kcache_flush(kcache_cache* c);

/* KCACHE_OK and *out set on a hit; KCACHE_NOT_FOUND and *out = NULL on a
 * miss (a cache fault is a miss). */
KCACHE_EXPORT int kcache_get(kcache_cache* c, const kcache_key* key, kcache_entry** out);
/* Stores an entry made of `n` artifacts. KCACHE_OK when some tier took it,
 * KCACHE_UNAVAILABLE when none did (faults are counted, never fatal),
 * KCACHE_INVALID_ARGUMENT for a NULL pointer or an artifact name that is
 * empty, longer than 255 bytes or repeated (nothing is stored then). */
KCACHE_EXPORT int kcache_put(kcache_cache* c, const kcache_key* key, const kcache_artifact* artifacts, size_t n);

/* The compile callback: adds the artifacts it produced with
 * kcache_artifacts_add() and returns 0, or returns non-zero for a failed
 * compile (reported as KCACHE_COMPILE_FAILED; nothing is stored). */
typedef int (*kcache_compile_fn)(void* user_data, kcache_artifacts* out);
/* Copies `size` bytes at `data` as artifact `name` of the entry being built.
 * KCACHE_INVALID_ARGUMENT (and nothing added) for a NULL pointer, a name
 * that is empty, longer than 255 bytes, or already added. A callback that
 * returns 0 after a refused add makes the compile fail with
 * KCACHE_INVALID_ARGUMENT (nothing is stored): an entry never silently
 * lacks an artifact its compiler meant to add. */
KCACHE_EXPORT int kcache_artifacts_add(kcache_artifacts* a, const char* name, const void* data, size_t size);

/* The entry for `key`: from a tier, or from `compile` (run at most once at a
 * time per key in this process) and then stored: in the disk tier before
 * this returns, so other processes see it and it is kept however this one
 * ends (_exit, SIGTERM, SIGKILL). `source` may be NULL.
 * Re-entry: called from inside the compile callback of the same key (the
 * thread compiling the key asking for it again), it returns
 * KCACHE_INVALID_ARGUMENT at once instead of waiting for itself; so does
 * kcache_begin on a key whose flight the calling thread owns. */
KCACHE_EXPORT int kcache_get_or_compile(kcache_cache* c, const kcache_key* key, kcache_compile_fn compile,
                                        void* user_data, kcache_entry** out, int* source);
/* The same, keyed by a builder: the entry also records the key's manifest,
 * so `kcache explain` can say why a later lookup missed. */
KCACHE_EXPORT int kcache_get_or_compile_built(kcache_cache* c, const kcache_key_builder* key, kcache_compile_fn compile,
                                              void* user_data, kcache_entry** out, int* source);

/* ---- flights: the caller compiles between two calls (kcache::Flight) ----------------
 *
 *   kcache_flight* f;
 *   kcache_begin(c, key, &f);
 *   if (kcache_flight_hit(f)) kcache_flight_entry(f, &e, &source);
 *   else { ...compile...; kcache_flight_commit(f, artifacts, n, &e); }
 *   kcache_flight_free(f);
 *
 * kcache_begin answers with a hit, or makes the caller the owner of the
 * key's compile (one per key across threads and processes; the others wait
 * in kcache_begin). The owner commits or abandons; freeing an owning flight
 * abandons it, and a waiter then becomes the owner. A flight must be freed
 * before its cache is closed. */
/* KCACHE_OK and *out set (a hit or the ownership); KCACHE_INVALID_ARGUMENT
 * for a NULL pointer, a key builder that cannot finish, or a key the
 * calling thread is compiling itself (it owns a flight of the key not yet
 * committed or abandoned, or calls from the key's compile callback):
 * *out is then NULL, at once, where waiting would never end. */
KCACHE_EXPORT int kcache_begin(kcache_cache* c, const kcache_key_builder* key, kcache_flight** out);
/* 1 when the flight holds the stored entry, 0 otherwise (and for NULL). */
KCACHE_EXPORT int kcache_flight_hit(const kcache_flight* f);
/* 1 when the caller owns the compile (commit or abandon), 0 otherwise. */
KCACHE_EXPORT int kcache_flight_owner(const kcache_flight* f);
/* The entry of a hit or of a committed flight, as a new handle (free with
 * kcache_entry_free); `source` may be NULL. KCACHE_NOT_FOUND when the
 * flight holds none (it owns the compile, or was abandoned). */
KCACHE_EXPORT int kcache_flight_entry(const kcache_flight* f, kcache_entry** out, int* source);
/* Stores the entry made of `n` artifacts (in the disk tier before it
 * returns, as kcache_get_or_compile) and hands it to the waiters;
 * `out` may be NULL. KCACHE_INVALID_ARGUMENT for a NULL pointer, a bad
 * artifact name (as kcache_put) or a flight that does not own its key; a
 * bad artifact abandons the flight. */
KCACHE_EXPORT int kcache_flight_commit(kcache_flight* f, const kcache_artifact* artifacts, size_t n,
                                       kcache_entry** out);
/* Gives the key up without an entry. NULL and non-owning flights are fine. */
KCACHE_EXPORT void kcache_flight_abandon(kcache_flight* f);
/* Abandons if still owning, then frees. NULL is fine. */
KCACHE_EXPORT void kcache_flight_free(kcache_flight* f);

/* Statistics as JSON (kcache::CacheStats::to_json); free with kcache_free.
 * NULL for a NULL cache or when out of memory. */
KCACHE_EXPORT char* kcache_stats_json(kcache_cache* c);

/* ---- entries --------------------------------------------------------------------- */

KCACHE_EXPORT void kcache_entry_free(kcache_entry* e);
KCACHE_EXPORT int kcache_entry_key(const kcache_entry* e, kcache_key* out);
/* The artifact's bytes; KCACHE_NOT_FOUND if the entry has none by that name.
 * The pointer is valid until kcache_entry_free(e). */
KCACHE_EXPORT int kcache_entry_artifact(const kcache_entry* e, const char* name, const void** data, size_t* size);
/* 0 for a NULL entry. */
KCACHE_EXPORT size_t kcache_entry_artifact_count(const kcache_entry* e);
/* The i-th artifact (0 <= i < count); `name` is NUL-terminated. */
KCACHE_EXPORT int kcache_entry_artifact_at(const kcache_entry* e, size_t i, const char** name, const void** data,
                                           size_t* size);

/* ---- bundles (kcache/bundle.h) ---------------------------------------------------- */

/* A position in the disk store's recency records (kcache::Cache::mark): a
 * number any process may pass later as `since`. KCACHE_UNAVAILABLE without
 * a disk store. */
KCACHE_EXPORT int kcache_mark(kcache_cache* c, uint64_t* out);
/* A bundle of the cache's disk store: the entries created or used at or
 * after `since` (0: the whole store), signed with the Ed25519 private key
 * file `sign_key_file` unless it is NULL. As bytes (*data freed with
 * kcache_free), or written to `path`. */
KCACHE_EXPORT int kcache_bundle_save(kcache_cache* c, uint64_t since, const char* sign_key_file, void** data,
                                     size_t* size);
KCACHE_EXPORT int kcache_bundle_write(kcache_cache* c, uint64_t since, const char* sign_key_file, const char* path);
/* Mounts bundle bytes (copied) in the cache, after its memory tier and
 * before its disk store; call before the cache is shared between threads.
 * KCACHE_CORRUPT when the bundle is refused (damaged, or not signed by a key
 * of KCACHE_BUNDLE_TRUST when that is set). */
KCACHE_EXPORT int kcache_bundle_load(kcache_cache* c, const void* data, size_t size);
/* Copies every entry of the bundle file `path` into the disk store;
 * *stored (may be NULL) says how many. */
KCACHE_EXPORT int kcache_bundle_import(kcache_cache* c, const char* path, uint64_t* stored);
/* Writes an Ed25519 key pair: `key_file` (private, 0600) and `key_file`.pub. */
KCACHE_EXPORT int kcache_bundle_keygen(const char* key_file);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KCACHE_KCACHE_H_ */

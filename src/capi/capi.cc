// The C ABI over the C++ library (include/kcache/kcache.h).
//
// Every exported function runs its body inside guard(), which turns any C++
// exception (std::bad_alloc, or one thrown by a misbehaving callback) into
// KCACHE_INTERNAL plus a message, so nothing propagates into C frames.
// Handles are plain heap structs around the C++ values.
//
// One concept, the translation to C, in one file: each exported function is
// a few lines of argument checks and conversion around one library call,
// and they share the handle structs, guard() and the error text; split by
// subject they would each repeat that frame.
#include "kcache/kcache.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "kcache/bundle.h"
#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/status.h"
#include "kcache/tier.h"
#include "util/util.h"

using kcache::Errc;

struct kcache_options {
  kcache::Options opt;
  bool env = true;
};

struct kcache_cache {
  std::unique_ptr<kcache::Cache> cache;
};

struct kcache_entry {
  kcache::Entry e;
};

struct kcache_key_builder {
  explicit kcache_key_builder(const char* ns) : b(ns) {}
  kcache::KeyBuilder b;
};

struct kcache_flight {
  kcache::Flight f;
};

struct kcache_artifacts {
  std::vector<kcache::Artifact> items;
  std::string rejected;  // the first add refused, if any (the compile then fails)
};

namespace {

static_assert(static_cast<int>(Errc::internal) == KCACHE_INTERNAL, "C codes mirror kcache::Errc");
static_assert(static_cast<int>(Errc::compile_failed) == KCACHE_COMPILE_FAILED, "C codes mirror kcache::Errc");
static_assert(static_cast<int>(Errc::stale_format) == KCACHE_STALE_FORMAT, "C codes mirror kcache::Errc");
static_assert(static_cast<int>(kcache::Source::waited) == KCACHE_SOURCE_WAITED, "C sources mirror kcache::Source");
static_assert(static_cast<int>(kcache::Source::bundle) == KCACHE_SOURCE_BUNDLE, "C sources mirror kcache::Source");
static_assert(sizeof(kcache_key) == sizeof(kcache::Key), "kcache_key is a Key's 16 bytes");

thread_local std::string t_last_error;

// Never throws: a message that cannot be stored (out of memory) is dropped.
int set_error(int code, std::string_view msg) noexcept {
  try {
    t_last_error.assign(msg);
  } catch (...) {
    t_last_error.clear();
  }
  return code;
}
int set_error(const kcache::Status& st) { return set_error(static_cast<int>(st.code()), st.to_string()); }
int set_error(int code, const std::string& msg) noexcept { return set_error(code, std::string_view(msg)); }
int set_error(int code, const char* msg) noexcept { return set_error(code, std::string_view(msg)); }

// Runs one exported call: the last error is cleared on success and set on
// failure, so the code returned and kcache_last_error() always agree (a
// message left by a nested call, e.g. from inside a compile callback, never
// outlives a call that succeeded).
template <class F>
int guard(F&& f) noexcept {
  try {
    // Every entry handed to C is a copy (wrap): hits are copied inside the
    // lookup's SIGBUS guard, so no read of a map happens after it.
    kcache::util::CopiedHits copied;
    t_last_error.clear();
    int rc = f();
    if (rc == KCACHE_OK)
      t_last_error.clear();
    else if (t_last_error.empty())
      set_error(rc, std::string_view("failed without a message"));
    return rc;
  } catch (const std::bad_alloc&) {
    return set_error(KCACHE_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return set_error(KCACHE_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return set_error(KCACHE_INTERNAL, "internal error: unknown exception");
  }
}

kcache::Key to_key(const kcache_key* k) {
  kcache::Key out;
  std::memcpy(out.bytes.data(), k->bytes, 16);
  return out;
}
void from_key(const kcache::Key& k, kcache_key* out) { std::memcpy(out->bytes, k.bytes.data(), 16); }

// The rules EntryBuilder::build applies, checked when an artifact is added
// so the caller hears of a bad name where it made it.
kcache::Status check_artifact_name(const char* name, const std::vector<kcache::Artifact>& have) {
  size_t n = std::strlen(name);
  if (n == 0 || n > 255)
    return kcache::Status(Errc::invalid_argument,
                          "artifact name must be 1 to 255 bytes (got " + std::to_string(n) + ")");
  for (const auto& a : have)
    if (a.name == name)
      return kcache::Status(Errc::invalid_argument, std::string("artifact '") + name + "' added twice");
  return kcache::Status();
}

bool flag(const char* v, bool* out) {
  auto b = kcache::util::parse_bool(v);
  if (b) *out = *b;
  return b.has_value();
}

// Entries handed to C may be held for long: never let them pin an LMDB read
// snapshot (each pin holds one of a bounded number of reader slots). The
// copy out of the map is guarded (Entry::detach): a store file truncated
// under this process gives KCACHE_UNAVAILABLE here, never a SIGBUS.
int wrap(kcache::Entry e, kcache_entry** out) {
  if (e.pinned()) {
    auto d = e.detach();
    if (!d) return set_error(d.error());
    e = std::move(d).value();
  }
  *out = new kcache_entry;
  (*out)->e = std::move(e);
  return KCACHE_OK;
}

// Runs a lookup and hands its entry to C; once more when the hit could not
// be copied out of its map: by then the store is known to be lost, so the
// second lookup misses (or compiles) instead.
template <class Lookup>
int lookup_and_wrap(Lookup&& lookup, kcache_entry** out) {
  int rc = lookup(out);
  return rc == KCACHE_UNAVAILABLE && !*out ? lookup(out) : rc;
}

kcache::CompileFn compile_fn(kcache_compile_fn fn, void* user) {
  return [fn, user]() -> kcache::Expected<std::vector<kcache::Artifact>> {
    kcache_artifacts arts;
    int rc;
    try {
      rc = fn(user, &arts);
    } catch (...) {
      return kcache::Status(Errc::compile_failed, "compile callback threw an exception");
    }
    if (rc != 0) return kcache::Status(Errc::compile_failed, "compile callback returned " + std::to_string(rc));
    // A callback that ignored a refused kcache_artifacts_add would store an
    // entry without that artifact: fail instead, and store nothing.
    if (!arts.rejected.empty())
      return kcache::Status(Errc::invalid_argument,
                            "compile callback returned 0 after a refused "
                            "kcache_artifacts_add: " +
                                arts.rejected);
    return std::move(arts.items);
  };
}

int finish_get_or_compile(kcache::Expected<kcache::Entry> r, kcache::Source src, kcache_entry** out, int* source) {
  if (!r) return set_error(r.error());
  if (source) *source = static_cast<int>(src);
  return wrap(std::move(r).value(), out);
}

}  // namespace

extern "C" {

const char* kcache_code_name(int code) {
  if (code < 0 || code > KCACHE_STALE_FORMAT) return "unknown";
  // errc_name returns views of string literals, so .data() is NUL-terminated.
  return kcache::errc_name(static_cast<Errc>(code)).data();
}

const char* kcache_last_error(void) { return t_last_error.c_str(); }

const char* kcache_version(void) { return kcache::version_string(); }

const char* kcache_features(void) {
  static const std::string s = [] {
    std::string out;
    for (const auto& f : kcache::features()) out += (out.empty() ? "" : " ") + f;
    return out;
  }();
  return s.c_str();
}

void kcache_free(void* p) { std::free(p); }

kcache_options* kcache_options_new(void) { return new (std::nothrow) kcache_options; }
void kcache_options_free(kcache_options* o) { delete o; }

int kcache_options_set(kcache_options* o, const char* name, const char* value) {
  return guard([&] {
    if (!o || !name || !value) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_options_set: NULL argument");
    // "env" is the C ABI's own: whether kcache_open applies KCACHE_*.
    if (std::string_view(name) == "env") {
      bool b = false;
      if (!flag(value, &b))
        return set_error(KCACHE_INVALID_ARGUMENT, std::string("option env: '") + value + "' is not 1 or 0");
      o->env = b;
      return static_cast<int>(KCACHE_OK);
    }
    if (kcache::Status st = o->opt.set(name, value); !st.is_ok())
      return set_error(KCACHE_INVALID_ARGUMENT, st.message());
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_options_get(const kcache_options* o, const char* name, char** value) {
  return guard([&] {
    if (!o || !name || !value) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_options_get: NULL argument");
    *value = nullptr;
    std::string v;
    if (std::string_view(name) == "env") {
      v = o->env ? "1" : "0";
    } else {
      auto r = o->opt.get(name);
      if (!r) return set_error(KCACHE_INVALID_ARGUMENT, r.error().message());
      v = std::move(r).value();
    }
    *value = static_cast<char*>(std::malloc(v.size() + 1));
    if (!*value) return set_error(KCACHE_INTERNAL, "out of memory");
    std::memcpy(*value, v.c_str(), v.size() + 1);
    return static_cast<int>(KCACHE_OK);
  });
}

kcache_key_builder* kcache_key_builder_new(const char* ns) {
  kcache_key_builder* out = nullptr;
  guard([&] {
    if (!ns) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_builder_new: NULL namespace");
    out = new kcache_key_builder(ns);
    return static_cast<int>(KCACHE_OK);
  });
  return out;
}
void kcache_key_builder_free(kcache_key_builder* b) { delete b; }

#define KCACHE_BUILDER_ADD(expr)                                                              \
  return guard([&] {                                                                          \
    if (!b || !name) return set_error(KCACHE_INVALID_ARGUMENT, "key builder: NULL argument"); \
    expr;                                                                                     \
    return static_cast<int>(KCACHE_OK);                                                       \
  })

int kcache_key_add_bytes(kcache_key_builder* b, const char* name, const void* data, size_t size) {
  if (size && !data) return guard([] { return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_add_bytes: NULL data"); });
  KCACHE_BUILDER_ADD(b->b.add_bytes(name, std::string_view(static_cast<const char*>(data), size)));
}
int kcache_key_add_string(kcache_key_builder* b, const char* name, const char* value) {
  if (!value) return guard([] { return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_add_string: NULL value"); });
  KCACHE_BUILDER_ADD(b->b.add_string(name, value));
}
int kcache_key_add_u64(kcache_key_builder* b, const char* name, uint64_t value) {
  KCACHE_BUILDER_ADD(b->b.add_u64(name, value));
}
int kcache_key_add_i64(kcache_key_builder* b, const char* name, int64_t value) {
  KCACHE_BUILDER_ADD(b->b.add_i64(name, value));
}
int kcache_key_add_bool(kcache_key_builder* b, const char* name, int value) {
  KCACHE_BUILDER_ADD(b->b.add_bool(name, value != 0));
}
int kcache_key_add_digest(kcache_key_builder* b, const char* name, const kcache_key* value) {
  if (!value) return guard([] { return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_add_digest: NULL value"); });
  KCACHE_BUILDER_ADD(b->b.add_digest(name, to_key(value)));
}
int kcache_key_add_file(kcache_key_builder* b, const char* name, const char* path) {
  if (!path) return guard([] { return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_add_file: NULL path"); });
  KCACHE_BUILDER_ADD(b->b.add_file(name, path));
}

int kcache_key_set_label(kcache_key_builder* b, const char* label) {
  return guard([&] {
    if (!b || !label) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_set_label: NULL argument");
    b->b.label(label);
    return static_cast<int>(KCACHE_OK);
  });
}
int kcache_key_mark_private(kcache_key_builder* b, const char* name) { KCACHE_BUILDER_ADD(b->b.mark_private(name)); }

int kcache_key_builder_finish(const kcache_key_builder* b, kcache_key* out) {
  return guard([&] {
    if (!b || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_builder_finish: NULL argument");
    auto info = b->b.finish();
    if (!info) return set_error(info.error());
    from_key(info->key, out);
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_hash_bytes(const void* data, size_t size, kcache_key* out) {
  return guard([&] {
    if (!out || (size && !data)) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_hash_bytes: NULL argument");
    from_key(kcache::hash_bytes(std::string_view(static_cast<const char*>(data), size)), out);
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_key_to_hex(const kcache_key* key, char out[33]) {
  return guard([&] {
    if (!out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_to_hex: NULL out");
    out[0] = '\0';
    if (!key) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_to_hex: NULL key");
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; ++i) {
      out[2 * i] = digits[key->bytes[i] >> 4];
      out[2 * i + 1] = digits[key->bytes[i] & 15];
    }
    out[32] = '\0';
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_key_from_hex(const char* hex, kcache_key* out) {
  return guard([&] {
    if (!hex || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_key_from_hex: NULL argument");
    auto d = kcache::Digest::from_hex(hex);
    if (!d) return set_error(KCACHE_INVALID_ARGUMENT, "not a 32-digit hex key");
    from_key(*d, out);
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_open(const kcache_options* options, kcache_cache** out) {
  return guard([&] {
    if (!out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_open: NULL out");
    *out = nullptr;
    kcache::Options opt = options ? options->opt : kcache::Options();
    if (!options || options->env) opt = kcache::Options::from_env(opt);
    auto c = std::make_unique<kcache_cache>();
    c->cache = kcache::Cache::open(opt);
    *out = c.release();
    return static_cast<int>(KCACHE_OK);
  });
}

void kcache_close(kcache_cache* c) {
  // The Cache destructor flushes; it does not throw, but keep C frames safe.
  try {
    delete c;
  } catch (...) {}
}

int kcache_flush(kcache_cache* c) {
  return guard([&] {
    if (!c) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_flush: NULL cache");
    kcache::Status st = c->cache->flush();
    return st.is_ok() ? static_cast<int>(KCACHE_OK) : set_error(st);
  });
}

int kcache_get(kcache_cache* c, const kcache_key* key, kcache_entry** out) {
  return guard([&] {
    if (!c || !key || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_get: NULL argument");
    *out = nullptr;
    int rc = lookup_and_wrap(
        [&](kcache_entry** o) {
          auto e = c->cache->get(to_key(key));
          if (!e) return set_error(KCACHE_NOT_FOUND, "no entry for key " + to_key(key).hex());
          return wrap(std::move(*e), o);
        },
        out);
    // A hit that vanished under the copy twice is still a miss.
    if (rc != KCACHE_UNAVAILABLE) return rc;
    std::string why = kcache_last_error();
    return set_error(KCACHE_NOT_FOUND, why);
  });
}

int kcache_put(kcache_cache* c, const kcache_key* key, const kcache_artifact* artifacts, size_t n) {
  return guard([&] {
    if (!c || !key || (n && !artifacts)) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_put: NULL argument");
    kcache::EntryBuilder b(to_key(key));
    std::vector<kcache::Artifact> seen;
    for (size_t i = 0; i < n; ++i) {
      const kcache_artifact& a = artifacts[i];
      if (!a.name || (a.size && !a.data))
        return set_error(KCACHE_INVALID_ARGUMENT, "kcache_put: artifact " + std::to_string(i) + " has a NULL pointer");
      if (auto st = check_artifact_name(a.name, seen); !st.is_ok())
        return set_error(KCACHE_INVALID_ARGUMENT, "kcache_put: artifact " + std::to_string(i) + ": " + st.message());
      seen.push_back({a.name, std::string()});
      b.add(a.name, std::string(static_cast<const char*>(a.data), a.size));
    }
    const kcache::Options& opt = c->cache->options();
    kcache::EntryMeta m;
    m.created_unix_ms = kcache::util::now_unix_ms();
    m.producer = opt.producer;
    b.meta(std::move(m)).compression(opt.compression);
    auto e = b.build();
    if (!e) return set_error(e.error());
    kcache::Status st = c->cache->put(*e);
    return st.is_ok() ? static_cast<int>(KCACHE_OK) : set_error(st);
  });
}

int kcache_artifacts_add(kcache_artifacts* a, const char* name, const void* data, size_t size) {
  return guard([&] {
    if (!a) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_artifacts_add: NULL sink");
    std::string why;
    if (!name || (size && !data))
      why = "NULL argument";
    else if (auto st = check_artifact_name(name, a->items); !st.is_ok())
      why = st.message();
    if (!why.empty()) {
      if (a->rejected.empty()) a->rejected = why;
      return set_error(KCACHE_INVALID_ARGUMENT, "kcache_artifacts_add: " + why);
    }
    a->items.push_back({name, std::string(static_cast<const char*>(data), size)});
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_get_or_compile(kcache_cache* c, const kcache_key* key, kcache_compile_fn compile, void* user_data,
                          kcache_entry** out, int* source) {
  return guard([&] {
    if (!c || !key || !compile || !out)
      return set_error(KCACHE_INVALID_ARGUMENT, "kcache_get_or_compile: NULL argument");
    *out = nullptr;
    kcache::Source src = kcache::Source::compiled;
    return lookup_and_wrap(
        [&](kcache_entry** o) {
          auto r = c->cache->get_or_compile(to_key(key), compile_fn(compile, user_data), &src);
          return finish_get_or_compile(std::move(r), src, o, source);
        },
        out);
  });
}

int kcache_get_or_compile_built(kcache_cache* c, const kcache_key_builder* key, kcache_compile_fn compile,
                                void* user_data, kcache_entry** out, int* source) {
  return guard([&] {
    if (!c || !key || !compile || !out)
      return set_error(KCACHE_INVALID_ARGUMENT, "kcache_get_or_compile_built: NULL argument");
    *out = nullptr;
    auto info = key->b.finish();
    if (!info) return set_error(info.error());
    kcache::Source src = kcache::Source::compiled;
    return lookup_and_wrap(
        [&](kcache_entry** o) {
          auto r = c->cache->get_or_compile(*info, compile_fn(compile, user_data), &src);
          return finish_get_or_compile(std::move(r), src, o, source);
        },
        out);
  });
}

int kcache_begin(kcache_cache* c, const kcache_key_builder* key, kcache_flight** out) {
  return guard([&] {
    if (!c || !key || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_begin: NULL argument");
    *out = nullptr;
    auto info = key->b.finish();
    if (!info) return set_error(info.error());
    kcache::Flight f = c->cache->begin(*info);
    if (!f.error().is_ok()) return set_error(f.error());
    *out = new kcache_flight{std::move(f)};
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_flight_hit(const kcache_flight* f) { return f && f->f.hit() ? 1 : 0; }
int kcache_flight_owner(const kcache_flight* f) { return f && f->f.owner() ? 1 : 0; }

int kcache_flight_entry(const kcache_flight* f, kcache_entry** out, int* source) {
  return guard([&] {
    if (!f || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_flight_entry: NULL argument");
    *out = nullptr;
    if (!f->f.has_entry()) return set_error(KCACHE_NOT_FOUND, "the flight holds no entry");
    if (source) *source = static_cast<int>(f->f.source());
    return wrap(f->f.entry(), out);
  });
}

int kcache_flight_commit(kcache_flight* f, const kcache_artifact* artifacts, size_t n, kcache_entry** out) {
  return guard([&] {
    if (out) *out = nullptr;
    if (!f || (n && !artifacts)) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_flight_commit: NULL argument");
    if (!f->f.owner())
      return set_error(KCACHE_INVALID_ARGUMENT, "kcache_flight_commit: the flight does not own its key");
    std::vector<kcache::Artifact> arts;
    for (size_t i = 0; i < n; ++i) {
      const kcache_artifact& a = artifacts[i];
      kcache::Status st;
      if (!a.name || (a.size && !a.data))
        st = kcache::Status(Errc::invalid_argument, "has a NULL pointer");
      else
        st = check_artifact_name(a.name, arts);
      if (!st.is_ok()) {
        f->f.abandon();
        return set_error(KCACHE_INVALID_ARGUMENT,
                         "kcache_flight_commit: artifact " + std::to_string(i) + ": " + st.message());
      }
      arts.push_back({a.name, std::string(static_cast<const char*>(a.data), a.size)});
    }
    auto e = f->f.commit(std::move(arts));
    if (!e) return set_error(e.error());
    if (!out) return static_cast<int>(KCACHE_OK);
    return wrap(std::move(e).value(), out);
  });
}

void kcache_flight_abandon(kcache_flight* f) {
  if (f) f->f.abandon();
}

void kcache_flight_free(kcache_flight* f) { delete f; }

char* kcache_stats_json(kcache_cache* c) {
  char* out = nullptr;
  guard([&] {
    if (!c) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_stats_json: NULL cache");
    std::string s = c->cache->stats().to_json();
    out = static_cast<char*>(std::malloc(s.size() + 1));
    if (!out) return set_error(KCACHE_INTERNAL, "out of memory");
    std::memcpy(out, s.c_str(), s.size() + 1);
    return static_cast<int>(KCACHE_OK);
  });
  return out;
}

void kcache_entry_free(kcache_entry* e) { delete e; }

int kcache_entry_key(const kcache_entry* e, kcache_key* out) {
  return guard([&] {
    if (!e || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_entry_key: NULL argument");
    from_key(e->e.key(), out);
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_entry_artifact(const kcache_entry* e, const char* name, const void** data, size_t* size) {
  return guard([&] {
    if (!e || !name || !data || !size)
      return set_error(KCACHE_INVALID_ARGUMENT, "kcache_entry_artifact: NULL argument");
    auto a = e->e.artifact(name);
    if (!a) {
      *data = nullptr;
      *size = 0;
      return set_error(KCACHE_NOT_FOUND, std::string("no artifact '") + name + "'");
    }
    *data = a->data();
    *size = a->size();
    return static_cast<int>(KCACHE_OK);
  });
}

size_t kcache_entry_artifact_count(const kcache_entry* e) { return e ? e->e.artifacts().size() : 0; }

int kcache_entry_artifact_at(const kcache_entry* e, size_t i, const char** name, const void** data, size_t* size) {
  return guard([&] {
    if (!e || !name || !data || !size)
      return set_error(KCACHE_INVALID_ARGUMENT, "kcache_entry_artifact_at: NULL argument");
    if (i >= e->e.artifacts().size()) return set_error(KCACHE_NOT_FOUND, "artifact index out of range");
    const auto& a = e->e.artifacts()[i];
    *name = a.name.c_str();
    *data = a.data.data();
    *size = a.data.size();
    return static_cast<int>(KCACHE_OK);
  });
}

// ---- bundles ---------------------------------------------------------------

namespace {
kcache::BundleSelection since_selection(uint64_t since) {
  kcache::BundleSelection s;
  if (since) s.since = since;
  return s;
}
kcache::BundleWriteOptions sign_options(const char* key_file) {
  kcache::BundleWriteOptions o;
  if (key_file) o.sign_key_file = key_file;
  return o;
}
}  // namespace

int kcache_mark(kcache_cache* c, uint64_t* out) {
  return guard([&] {
    if (!c || !out) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_mark: NULL argument");
    auto m = c->cache->mark();
    if (!m) return set_error(m.error());
    *out = *m;
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_bundle_save(kcache_cache* c, uint64_t since, const char* sign_key_file, void** data, size_t* size) {
  return guard([&] {
    if (!c || !data || !size) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_bundle_save: NULL argument");
    *data = nullptr;
    *size = 0;
    auto b = kcache::save_bundle(*c->cache, since_selection(since), sign_options(sign_key_file));
    if (!b) return set_error(b.error());
    void* out = std::malloc(b->size() ? b->size() : 1);
    if (!out) return set_error(KCACHE_INTERNAL, "out of memory");
    std::memcpy(out, b->data(), b->size());
    *data = out;
    *size = b->size();
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_bundle_write(kcache_cache* c, uint64_t since, const char* sign_key_file, const char* path) {
  return guard([&] {
    if (!c || !path) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_bundle_write: NULL argument");
    auto b = kcache::write_bundle(*c->cache, since_selection(since), path, sign_options(sign_key_file));
    return b ? static_cast<int>(KCACHE_OK) : set_error(b.error());
  });
}

int kcache_bundle_load(kcache_cache* c, const void* data, size_t size) {
  return guard([&] {
    if (!c || (!data && size)) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_bundle_load: NULL argument");
    kcache::Status st = kcache::load_bundle(*c->cache, std::string(static_cast<const char*>(data), size));
    return st.is_ok() ? static_cast<int>(KCACHE_OK) : set_error(st);
  });
}

int kcache_bundle_import(kcache_cache* c, const char* path, uint64_t* stored) {
  return guard([&] {
    if (!c || !path) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_bundle_import: NULL argument");
    std::shared_ptr<kcache::Tier> disk;
    for (const auto& t : c->cache->tiers())
      if (t->kind() == kcache::TierKind::disk && t->writable()) disk = t;
    if (!disk) return set_error(KCACHE_UNAVAILABLE, "the cache has no writable disk store to import into");
    auto n = kcache::import_bundle(path, *disk, c->cache->options().bundles.trusted_keys);
    if (!n) return set_error(n.error());
    if (stored) *stored = *n;
    return static_cast<int>(KCACHE_OK);
  });
}

int kcache_bundle_keygen(const char* key_file) {
  return guard([&] {
    if (!key_file) return set_error(KCACHE_INVALID_ARGUMENT, "kcache_bundle_keygen: NULL argument");
    kcache::Status st = kcache::bundle_keygen(key_file);
    return st.is_ok() ? static_cast<int>(KCACHE_OK) : set_error(st);
  });
}

}  // extern "C"

// Cache: the Python Cache over the library's, opened through the options
// pipeline, reopened in a forked child, with lookups, stores, compiles
// (get_or_compile with a Python compile function), flights, stats and
// bundles, the GIL released while the library works.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/assembly.h"
#include "ext.h"
#include "kcache/bundle.h"
#include "kcache/evict.h"
#include "kcache/tier.h"
#include "util/util.h"

namespace kcache::python {

using namespace nb::literals;

namespace {

// Asks the remote tier for a key that is never stored (Access::peek: no
// counter of hits or misses moves), so that a remote that cannot be reached
// is said when the Cache opens, in the remote tier's own one log line per
// outage, rather than never when every lookup is answered by a faster tier.
// Bounded by the remote's connect and command timeouts.
void probe_remotes(kcache::Cache& c) {
  static const kcache::Key kProbe = [] {
    kcache::Key k;
    for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(0xa5 ^ i);
    return k;
  }();
  for (const auto& t : c.tiers())
    if (t->kind() == kcache::TierKind::remote) (void)t->get(kProbe, kcache::Access::peek);
}

void note_open() {
  if (g_hooks.on_open.is_valid()) g_hooks.on_open();
}

// A Python Cache. A child of fork() that uses a Cache its parent opened
// gets one of its own, opened with the same options on its first call (a
// Cache belongs to the process that opened it; the inherited one would
// answer misses and store nothing), so a module-level Cache works in
// forked workers as it does in spawned ones.
class PyCache {
 public:
  PyCache(std::shared_ptr<kcache::Cache> c, kcache::Options o)
      : c_(std::move(c)), opt_(std::move(o)), gen_(kcache::util::fork_generation()) {}

  // REQUIRES: the GIL held (it serialises the reopening in a child).
  std::shared_ptr<kcache::Cache> get_cache() {
    std::shared_ptr<kcache::Cache> c = std::atomic_load(&c_);
    if (!c) throw nb::value_error("kcache.Cache: the cache is closed");
    if (gen_ != kcache::util::fork_generation()) c = reopen(std::move(c));
    return c;
  }
  void close() {
    std::shared_ptr<kcache::Cache> c = std::atomic_exchange(&c_, std::shared_ptr<kcache::Cache>());
    if (c) {
      nb::gil_scoped_release nogil;
      if (gen_ == kcache::util::fork_generation()) (void)c->flush();  // failures are in the log
      c.reset();
    }
  }
  // At the end of a process (multiprocessing's finalizers, atexit): what
  // this process stored goes to disk. A Cache it only inherited and never
  // used holds nothing of its own: left alone, not reopened.
  void flush_at_exit() {
    std::shared_ptr<kcache::Cache> c = std::atomic_load(&c_);
    if (!c || gen_ != kcache::util::fork_generation()) return;
    nb::gil_scoped_release nogil;
    (void)c->flush();  // failures are in the log
  }
  bool closed() const { return !std::atomic_load(&c_); }

  // Mounts bundle bytes (kcache::load_bundle); kept, so that a forked
  // child's reopened Cache mounts them too.
  void load_bundle(std::string bytes) {
    auto c = get_cache();
    kcache::Status st;
    {
      nb::gil_scoped_release nogil;
      st = kcache::load_bundle(*c, bytes);
    }
    if (!st.is_ok()) raise_status("Cache.load_bundle", st);
    bundles_.push_back(std::move(bytes));
  }

 private:
  std::shared_ptr<kcache::Cache> reopen(std::shared_ptr<kcache::Cache> inherited) {
    // The inherited Cache is kept (flights of the parent may point to it;
    // it writes nothing here), never flushed.
    inherited_.push_back(std::move(inherited));
    std::shared_ptr<kcache::Cache> fresh;
    {
      nb::gil_scoped_release nogil;
      fresh = kcache::Cache::open(opt_);
      for (const auto& b : bundles_) (void)kcache::load_bundle(*fresh, b);
    }
    std::atomic_store(&c_, fresh);
    gen_ = kcache::util::fork_generation();
    note_open();
    return fresh;
  }

  std::shared_ptr<kcache::Cache> c_;
  const kcache::Options opt_;  // as opened, environment applied
  uint64_t gen_;               // the fork generation c_ was opened in
  std::vector<std::shared_ptr<kcache::Cache>> inherited_;
  std::vector<std::string> bundles_;  // loaded with load_bundle, in order
};

// The options pipeline of kcache/cache.h: the settings the program passed
// (name, text) through Options::set, in order, then the environment on
// top unless env is false. A name or value that is not valid text, or holds
// a NUL, is refused (ValueError) before the library sees it.
std::unique_ptr<PyCache> open_cache(nb::list settings, bool env, bool signed_remote_only) {
  kcache::Options o;
  for (nb::handle item : settings) {
    nb::tuple t = nb::borrow<nb::tuple>(item);
    std::string name = text_of(t[0], "kcache.Cache: an option name", true);
    std::string value = text_of(t[1], "kcache.Cache: option " + name, true);
    if (kcache::Status st = o.set(name, value); !st.is_ok())
      throw nb::value_error(("kcache.Cache: " + st.message()).c_str());
  }
  if (env) o = kcache::Options::from_env(o);
  if (signed_remote_only && !o.remote_url.empty() && o.remote_secret_file.empty()) {
    // What this Cache loads is code (pickles, executables, shared
    // objects): a remote whose values nobody signs is not used.
    KCACHE_LOG(kcache::LogLevel::warn,
               "remote tier left out: this cache's entries are loaded as code, and remote values are signed only "
               "with remote_secret_file (KCACHE_REMOTE_SECRET_FILE) set");
    o.remote_url.clear();
  }
  std::unique_ptr<kcache::Cache> c;
  {
    nb::gil_scoped_release nogil;
    c = kcache::Cache::open(o);
    probe_remotes(*c);
  }
  return std::make_unique<PyCache>(std::shared_ptr<kcache::Cache>(std::move(c)), std::move(o));
}

nb::dict tier_stats_dict(const kcache::TierStats& s) {
  nb::dict d;
  for (const auto& f : kcache::TierStats::kFields) d[nb::str(f.name.data(), f.name.size())] = s.*f.member;
  return d;
}

// Counters of the cache, and of each tier as a list, fastest first, of
// {"name", "kind", "stats"}: the shape of the C ABI's kcache_stats_json and
// `kcache stats --json` (two bundles may share a name).
nb::dict stats_dict(const kcache::CacheStats& s, const std::vector<std::shared_ptr<kcache::Tier>>& tiers) {
  nb::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["compiles"] = s.compiles;
  d["compile_failures"] = s.compile_failures;
  d["waits"] = s.waits;
  d["faults"] = s.faults;
  d["compile_us"] = s.compile_us;
  d["lease_waits"] = s.lease_waits;
  d["lease_timeouts"] = s.lease_timeouts;
  d["lease_takeovers"] = s.lease_takeovers;
  nb::list out;
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    const auto& t = s.tiers[i];
    nb::dict td;
    td["name"] = t.name;
    kcache::TierKind kind = kcache::TierKind::other;
    if (i < tiers.size() && tiers[i]->name() == t.name) kind = tiers[i]->kind();
    td["kind"] = std::string(kcache::tier_kind_name(kind));
    td["stats"] = tier_stats_dict(t.stats);
    out.append(td);
  }
  d["tiers"] = out;
  return d;
}

// Thrown through the library by a compile function that was interrupted
// (KeyboardInterrupt, SystemExit: a BaseException that is not an Exception).
// The library is exception-safe for compile functions: the key's flight is
// given up unfinished, so threads waiting on the key compile it themselves
// instead of sharing an interrupt that was not theirs.
struct Interrupted {};

// The compile function of get_or_compile: calls Python with the GIL taken; a
// Python exception is kept for the caller (and reported to threads waiting
// on the same key as a failed compile, unless it is an interrupt).
struct PyCompile {
  nb::handle fn;
  std::optional<nb::python_error>* error;
  kcache::Expected<std::vector<kcache::Artifact>> operator()() const {
    nb::gil_scoped_acquire gil;
    try {
      nb::object r = fn();
      return to_artifacts(r, "compile function result");
    } catch (nb::python_error& e) {
      const bool interrupt = !e.matches(PyExc_Exception);
      std::string what = e.what();
      error->emplace(std::move(e));
      if (interrupt) throw Interrupted{};
      return kcache::Status(kcache::Errc::compile_failed, what);
    } catch (const nb::builtin_exception& e) {
      std::string what = e.what();
      // Turn it into a Python exception so the caller sees the real type.
      e.type() == nb::exception_type::type_error ? PyErr_SetString(PyExc_TypeError, e.what())
                                                 : PyErr_SetString(PyExc_ValueError, e.what());
      error->emplace();
      return kcache::Status(kcache::Errc::compile_failed, what);
    } catch (const std::exception& e) {
      // Nothing may unwind through the library, which does not use exceptions.
      PyErr_SetString(PyExc_RuntimeError, e.what());
      error->emplace();
      return kcache::Status(kcache::Errc::compile_failed, e.what());
    }
  }
};

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<PyCache>(m, "Cache")
      .def_static("_open", &open_cache, "settings"_a, "env"_a, "signed_remote_only"_a = false)
      .def(
          "get",
          [](PyCache& self, const PyKey& key) -> std::optional<PyEntry> {
            auto c = self.get_cache();
            // A hit that could not be copied out of its map is looked up
            // once more: the store is then known lost, and that is a miss.
            for (int attempt = 0; attempt < 2; ++attempt) {
              std::optional<kcache::Entry> e;
              kcache::Source s = kcache::Source::other;
              {
                nb::gil_scoped_release nogil;
                kcache::util::CopiedHits copied;  // Python holds copies (held())
                e = c->get(key.info.key, &s);
              }
              if (!e) return std::nullopt;
              if (auto h = held(std::move(*e), s)) return h;
            }
            return std::nullopt;
          },
          "key"_a)
      .def(
          "put",
          [](PyCache& self, const PyKey& key, nb::handle artifacts) -> std::optional<PyEntry> {
            auto c = self.get_cache();
            std::vector<kcache::Artifact> a = to_artifacts(artifacts, "Cache.put");
            std::optional<kcache::Entry> e;
            {
              nb::gil_scoped_release nogil;
              e = c->put(key.info, std::move(a));
            }
            if (!e) return std::nullopt;
            return make_entry(std::move(*e), kcache::Source::compiled);
          },
          "key"_a, "artifacts"_a)
      .def(
          "get_or_compile",
          [](PyCache& self, const PyKey& key, nb::object fn) {
            if (!PyCallable_Check(fn.ptr())) throw nb::type_error("Cache.get_or_compile: compile must be callable");
            auto c = self.get_cache();
            for (int attempt = 0;; ++attempt) {
              std::optional<nb::python_error> error;
              kcache::Source s = kcache::Source::other;
              std::optional<kcache::Expected<kcache::Entry>> r;
              try {
                nb::gil_scoped_release nogil;
                kcache::util::CopiedHits copied;
                r.emplace(c->get_or_compile(key.info, PyCompile{fn, &error}, &s));
              } catch (const Interrupted&) {
                // The interrupt is this thread's own, re-raised below.
              }
              if (error) {
                error->restore();
                throw nb::python_error();
              }
              if (!*r) raise_compile_error(r->error());
              // As in get: a hit that vanished under the copy is looked up
              // once more, and then misses and compiles.
              if (attempt == 1) return make_entry(std::move(**r), s);
              if (auto h = held(std::move(**r), s)) return std::move(*h);
            }
          },
          "key"_a, "compile"_a)
      .def(
          "begin", [](PyCache& self, const PyKey& key) { return begin_flight(self.get_cache(), key.info); }, "key"_a)
      .def("stats",
           [](PyCache& self) {
             auto c = self.get_cache();
             kcache::CacheStats s;
             std::vector<std::shared_ptr<kcache::Tier>> tiers;
             {
               nb::gil_scoped_release nogil;
               s = c->stats();
               tiers = c->tiers();
             }
             return stats_dict(s, tiers);
           })
      .def("flush",
           [](PyCache& self) {
             auto c = self.get_cache();
             kcache::Status st;
             {
               nb::gil_scoped_release nogil;
               st = c->flush();
             }
             if (!st.is_ok()) raise_status("Cache.flush", st);
           })
      .def("tiers",
           [](PyCache& self) {
             nb::list l;
             for (const auto& t : self.get_cache()->tiers()) l.append(nb::str(std::string(t->name()).c_str()));
             return l;
           })
      // The cache folder of the disk store in effect (Options::dir, or the
      // default folder when that is empty); None when no disk tier is open.
      .def_prop_ro("dir",
                   [](PyCache& self) -> std::optional<std::string> {
                     auto c = self.get_cache();
                     for (const auto& t : c->tiers())
                       if (t->kind() == kcache::TierKind::disk) return kcache::disk_store_location(c->options()).dir;
                     return std::nullopt;
                   })
      .def("mark",
           [](PyCache& self) {
             auto c = self.get_cache();
             std::optional<kcache::Expected<uint64_t>> r;
             {
               nb::gil_scoped_release nogil;
               r.emplace(c->mark());
             }
             if (!*r) raise_status("Cache.mark", r->error());
             return **r;
           })
      .def(
          "save_bundle",
          [](PyCache& self, uint64_t since, std::optional<std::string> key_file) {
            auto c = self.get_cache();
            kcache::BundleSelection sel;
            if (since) sel.since = since;
            kcache::BundleWriteOptions wo;
            if (key_file) wo.sign_key_file = *key_file;
            std::optional<kcache::Expected<std::string>> r;
            {
              nb::gil_scoped_release nogil;
              r.emplace(kcache::save_bundle(*c, sel, wo));
            }
            if (!*r) raise_status("Cache.save_bundle", r->error());
            return nb::bytes((*r)->data(), (*r)->size());
          },
          "since"_a, "key_file"_a)
      .def(
          "load_bundle", [](PyCache& self, nb::handle data) { self.load_bundle(buffer_bytes(data)); }, "data"_a)
      // kcache/evict.h: (evicted, bytes) of the disk store's entries not
      // used for older_than_ms and/or of namespace ns.
      .def(
          "evict",
          [](PyCache& self, uint64_t older_than_ms, std::optional<std::string> ns) {
            auto c = self.get_cache();
            kcache::EvictSelection sel;
            sel.older_than_ms = older_than_ms;
            sel.ns = std::move(ns);
            std::optional<kcache::Expected<kcache::EvictResult>> r;
            {
              nb::gil_scoped_release nogil;
              r.emplace(kcache::evict_entries(*c, sel));
            }
            if (!*r) raise_status("Cache.evict", r->error());
            return std::make_pair((*r)->evicted, (*r)->bytes);
          },
          "older_than_ms"_a, "ns"_a)
      .def_prop_ro("closed", &PyCache::closed)
      .def("close", &PyCache::close)
      .def("_flush_at_exit", &PyCache::flush_at_exit);
}

}  // namespace kcache::python

// kcache/_kcache: the Python extension module (nanobind) over the C++ cache.
//
// What it binds: keys (KeyBuilder behind kcache.key()), Entry (artifacts as
// read-only memoryviews over the entry's own bytes), Cache (open, get, put,
// get_or_compile, begin, stats, the bundle calls mark / save_bundle /
// load_bundle) and Flight (the lease-style API for hosts that run their own
// compile between two calls).
//
// The GIL is released during lookups, stores, waits for other threads' or
// processes' compiles, and flights; it is taken again only to run a Python
// compile function. Bad usage raises (TypeError, ValueError); cache faults
// stay misses, as everywhere in kcache. Operations that are not lookups
// (mark, bundles) raise kcache.Error with the library's error code name.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/assembly.h"
#include "kcache/bundle.h"
#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/evict.h"
#include "kcache/key.h"
#include "kcache/tier.h"
#include "util/util.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- keys ------------------------------------------------------------------

struct PyKey {
  kcache::KeyInfo info;
};

// Canonical text of a value inside a dict or list component (set by the
// Python package: json.dumps with sorted keys). Module-lifetime references,
// held as plain handles so that nothing is released after the interpreter.
nb::handle g_encode_value;

std::string buffer_bytes(nb::handle h) {
  Py_buffer view;
  if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
  std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return out;
}

bool is_buffer(nb::handle h) { return PyObject_CheckBuffer(h.ptr()) != 0; }

// The UTF-8 of a str, for every string the binding hands to the library.
// ValueError, naming `what`, for a str that has none (a lone surrogate such
// as '\udcff', which os.fsdecode makes of bytes that are not UTF-8) and,
// with no_nul (paths, option values, names), for one holding a NUL, which
// the library would cut the string at. TypeError for anything but a str.
std::string text_of(nb::handle h, const std::string& what, bool no_nul) {
  if (!PyUnicode_Check(h.ptr())) throw nb::type_error((what + " must be a str").c_str());
  Py_ssize_t len = 0;
  const char* p = PyUnicode_AsUTF8AndSize(h.ptr(), &len);
  if (!p) {
    PyErr_Clear();
    throw nb::value_error((what + " is not valid text: it holds a lone surrogate (such as '\\udcff'), which has no "
                                  "UTF-8 form")
                              .c_str());
  }
  std::string out(p, static_cast<size_t>(len));
  if (no_nul && out.find('\0') != std::string::npos)
    throw nb::value_error((what + " must not contain a NUL character ('\\0')").c_str());
  return out;
}

// The bytes of a buffer-protocol object, for as long as the view lives.
class BufferView {
 public:
  explicit BufferView(nb::handle h) {
    if (PyObject_GetBuffer(h.ptr(), &view_, PyBUF_SIMPLE) != 0) throw nb::python_error();
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(view_.buf), static_cast<size_t>(view_.len)}; }

 private:
  Py_buffer view_;
};

// JSON text of a str, as json.dumps(s, ensure_ascii=False) writes it.
void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  out += kcache::util::json_escape(s);
  out.push_back('"');
}

// Canonical text of a value inside a dict or list component: the JSON the
// Python package's encoder writes (sorted keys, no spaces). Scalars are
// written here; anything else goes to the encoder.
std::string encode_value(nb::handle v) {
  if (PyBool_Check(v.ptr())) return v.ptr() == Py_True ? "true" : "false";
  if (PyLong_CheckExact(v.ptr())) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow == 0 && !(n == -1 && PyErr_Occurred())) return std::to_string(n);
    PyErr_Clear();
  } else if (PyUnicode_CheckExact(v.ptr())) {
    std::string t = text_of(v, "kcache.key: a str inside a dict or list component", false);
    std::string out;
    out.reserve(t.size() + 2);
    append_json_string(out, t);
    return out;
  }
  return text_of(g_encode_value(v), "kcache.key: a value inside a dict or list component", false);
}

PyKey make_key(nb::handle ns_obj, nb::dict components, nb::handle label_obj, nb::handle private_obj) {
  std::string ns = text_of(ns_obj, "kcache.key: the namespace", true);
  if (ns.empty()) throw nb::value_error("kcache.key: the namespace must not be empty");
  kcache::KeyBuilder b(ns);
  if (!label_obj.is_none()) {
    if (!nb::isinstance<nb::str>(label_obj)) throw nb::type_error("kcache.key: the label must be a str");
    b.label(text_of(label_obj, "kcache.key: the label", false));
  }
  if (nb::isinstance<nb::str>(private_obj))
    throw nb::type_error("kcache.key: private must be a list of component names, not a str");
  for (nb::handle p : private_obj) {
    if (!nb::isinstance<nb::str>(p)) throw nb::type_error("kcache.key: private names must be str");
    std::string name = text_of(p, "kcache.key: a private name", true);
    if (!components.contains(p))
      throw nb::value_error(("kcache.key: private component '" + name + "' is not a component").c_str());
    b.mark_private(name);
  }
  for (auto [name_h, v] : components) {
    std::string name = text_of(name_h, "kcache.key: a component name", true);
    if (v.is_none()) throw nb::type_error(("kcache.key: component '" + name + "' is None").c_str());
    if (PyBool_Check(v.ptr())) {
      b.add_bool(name, v.ptr() == Py_True);
    } else if (PyLong_Check(v.ptr())) {
      int overflow = 0;
      long long s = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
      if (overflow == 0 && s < 0) {
        b.add_i64(name, static_cast<int64_t>(s));
      } else {
        unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
        if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
          PyErr_Clear();
          throw nb::value_error(("kcache.key: component '" + name + "' does not fit in 64 bits").c_str());
        }
        b.add_u64(name, u);
      }
    } else if (nb::isinstance<nb::str>(v)) {
      b.add_string(name, text_of(v, "kcache.key: component '" + name + "'", false));
    } else if (nb::isinstance<PyKey>(v)) {
      b.add_digest(name, nb::cast<const PyKey&>(v).info.key);
    } else if (is_buffer(v)) {
      BufferView view(v);
      b.add_bytes(name, view.bytes());
    } else if (nb::isinstance<nb::dict>(v)) {
      std::map<std::string, std::string> m;
      for (auto [k, x] : nb::borrow<nb::dict>(v)) {
        if (!nb::isinstance<nb::str>(k))
          throw nb::type_error(("kcache.key: keys of dict component '" + name + "' must be str").c_str());
        m[text_of(k, "kcache.key: a key of dict component '" + name + "'", false)] = encode_value(x);
      }
      b.add_map(name, m);
    } else if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
      std::vector<std::string> l;
      for (nb::handle x : v) l.push_back(encode_value(x));
      b.add_list(name, l);
    } else {
      std::string tn = nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(v.ptr())))));
      throw nb::type_error(("kcache.key: component '" + name + "' has unsupported type " + tn +
                            " (bytes, str, int, bool, dict, list or kcache.Key)")
                               .c_str());
    }
  }
  auto r = b.finish();
  if (!r) throw nb::value_error(("kcache.key: " + r.error().to_string()).c_str());
  return PyKey{std::move(*r)};
}

nb::list manifest_list(const kcache::Manifest& m) {
  nb::list out;
  for (const auto& it : m.items)
    out.append(nb::make_tuple(it.name, std::string(kcache::component_type_name(it.type)), it.digest.hex()));
  return out;
}

// ---- entries -----------------------------------------------------------------

struct PyEntry {
  kcache::Entry entry;
  kcache::Source source = kcache::Source::other;
};

// One artifact's bytes, exported through the buffer protocol; it holds a copy
// of the Entry (a reference to its shared bytes), so a memoryview over it
// stays valid as long as it lives.
struct ArtifactView {
  kcache::Entry entry;
  std::string_view data;
};

int artifact_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  ArtifactView* a = nb::inst_ptr<ArtifactView>(self);
  return PyBuffer_FillInfo(view, self, const_cast<char*>(a->data.data()), static_cast<Py_ssize_t>(a->data.size()),
                           /*readonly=*/1, flags);
}

void artifact_releasebuffer(PyObject*, Py_buffer*) {}

PyType_Slot artifact_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(artifact_getbuffer)},
    {Py_bf_releasebuffer, reinterpret_cast<void*>(artifact_releasebuffer)},
    {0, nullptr},
};

nb::object artifact_memoryview(const kcache::Entry& e, std::string_view data) {
  nb::object holder = nb::cast(ArtifactView{e, data});
  PyObject* mv = PyMemoryView_FromObject(holder.ptr());
  if (!mv) throw nb::python_error();
  return nb::steal(mv);
}

// LMDB hits pin a read transaction; Python may keep an Entry for as long as it
// likes, so such entries are copied to the heap first. Heap entries (memory
// tier, promotions, fresh compiles) are handed out without a copy. The copy
// is guarded (Entry::detach): nullopt when the store file shrank under it.
std::optional<PyEntry> held(kcache::Entry e, kcache::Source s) {
  if (e.pinned()) {
    auto d = e.detach();
    if (!d) return std::nullopt;
    e = std::move(d).value();
  }
  return PyEntry{std::move(e), s};
}

[[noreturn]] void raise_status(const std::string& what, const kcache::Status& st);

PyEntry make_entry(kcache::Entry e, kcache::Source s) {
  auto h = held(std::move(e), s);
  if (!h) raise_status("Entry", kcache::Status(kcache::Errc::unavailable, "the store file shrank under this process"));
  return std::move(*h);
}

// ---- artifacts from Python -------------------------------------------------

std::vector<kcache::Artifact> to_artifacts(nb::handle obj, const char* what) {
  if (!nb::hasattr(obj, "items") || nb::isinstance<nb::str>(obj) || is_buffer(obj))
    throw nb::type_error((std::string(what) + ": artifacts must be a mapping of name to bytes or str").c_str());
  std::vector<kcache::Artifact> out;
  nb::object items = obj.attr("items")();
  for (nb::handle it : items) {
    nb::handle k = it[0], v = it[1];
    if (!nb::isinstance<nb::str>(k)) throw nb::type_error((std::string(what) + ": artifact names must be str").c_str());
    std::string name = text_of(k, std::string(what) + ": an artifact name", true);
    if (name.empty() || name.size() > 255)
      throw nb::value_error((std::string(what) + ": artifact names must be 1 to 255 bytes").c_str());
    if (nb::isinstance<nb::str>(v)) {
      std::string bytes = text_of(v, std::string(what) + ": artifact '" + name + "'", false);
      out.push_back({std::move(name), std::move(bytes)});
    } else if (is_buffer(v)) {
      out.push_back({std::move(name), buffer_bytes(v)});
    } else {
      throw nb::type_error((std::string(what) + ": artifact '" + name + "' must be bytes-like or str").c_str());
    }
  }
  return out;
}

// ---- errors ----------------------------------------------------------------

nb::handle g_error;  // kcache.Error(message, code)

// The name of an error code as the C ABI spells it, lowercase and without
// the KCACHE_ prefix (KCACHE_NOT_FOUND: "not_found").
const char* code_name(kcache::Errc e) {
  switch (e) {
    case kcache::Errc::ok:
      return "ok";
    case kcache::Errc::not_found:
      return "not_found";
    case kcache::Errc::invalid_argument:
      return "invalid_argument";
    case kcache::Errc::corrupt:
      return "corrupt";
    case kcache::Errc::io_error:
      return "io_error";
    case kcache::Errc::no_space:
      return "no_space";
    case kcache::Errc::read_only:
      return "read_only";
    case kcache::Errc::unavailable:
      return "unavailable";
    case kcache::Errc::timeout:
      return "timeout";
    case kcache::Errc::too_large:
      return "too_large";
    case kcache::Errc::compile_failed:
      return "compile_failed";
    case kcache::Errc::internal:
      return "internal";
    case kcache::Errc::stale_format:
      return "stale_format";
  }
  return "internal";
}

// An operation that is not a lookup (mark, bundles) failed: ValueError for
// bad usage (Errc::invalid_argument), else kcache.Error carrying the code
// the C ABI returns for the same failure ("unavailable", "corrupt",
// "io_error", ...).
[[noreturn]] void raise_status(const std::string& what, const kcache::Status& st) {
  std::string msg = what + ": " + st.message();
  if (st.code() == kcache::Errc::invalid_argument) throw nb::value_error(msg.c_str());
  nb::object err = g_error(msg, std::string(code_name(st.code())));
  PyErr_SetObject(g_error.ptr(), err.ptr());
  throw nb::python_error();
}

// ---- the cache -------------------------------------------------------------

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

struct PyFlight;

// Called (with the GIL) each time a process opens a Cache, its first own
// one included: the package registers its exit flushes for that process
// there (kcache/__init__.py, _note_open).
nb::handle g_on_open;

void note_open() {
  if (g_on_open.is_valid()) g_on_open();
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

nb::handle g_compile_error;  // kcache.CompileError
nb::handle g_reentry_error;  // kcache.ReentryError

[[noreturn]] void raise_reentry_error(const std::string& msg) {
  PyErr_SetString(g_reentry_error.ptr(), msg.c_str());
  throw nb::python_error();
}

// The library refuses, at once, a request for a key that the calling thread
// is compiling itself (kcache/cache.h, "Re-entry"); any other error is the
// compile's.
[[noreturn]] void raise_compile_error(const kcache::Status& st) {
  if (kcache::is_reentry(st)) raise_reentry_error(st.message());
  PyErr_SetString(g_compile_error.ptr(), st.message().c_str());
  throw nb::python_error();
}

// ---- flights -------------------------------------------------------------
//
// A Python Flight wraps the library's Flight (Cache::begin). The Cache is
// kept alive by the flight, since a Flight must not outlive its Cache. Python
// may hand one flight to several threads, so calls on it are serialised.

// Keys whose compile a Python thread owns, and which thread: begin() on a key
// its own thread owns would wait for itself forever, so it raises instead.
std::mutex g_owned_mu;
std::unordered_map<kcache::Digest, std::thread::id> g_owned;

void release_owned(const kcache::Digest& k) {
  std::lock_guard<std::mutex> l(g_owned_mu);
  g_owned.erase(k);
}

struct PyFlight {
  std::shared_ptr<kcache::Cache> cache;  // declared first: destroyed after `flight`
  kcache::KeyInfo key;
  std::optional<kcache::Flight> flight;  // while this caller owns the compile
  std::mutex m;
  enum State { hit, owner, committed, abandoned } state = hit;
  std::optional<kcache::Entry> entry;
  kcache::Source source = kcache::Source::other;

  ~PyFlight() {
    // Dropped or garbage-collected without a commit: abandon, so that the
    // callers waiting for this key try again.
    if (flight) {
      flight->abandon();
      release_owned(key.key);
    }
  }
};

std::unique_ptr<PyFlight> begin_flight(std::shared_ptr<kcache::Cache> cache, const kcache::KeyInfo& key) {
  {
    std::lock_guard<std::mutex> l(g_owned_mu);
    auto it = g_owned.find(key.key);
    if (it != g_owned.end() && it->second == std::this_thread::get_id())
      raise_reentry_error("Cache.begin: this thread already owns a flight for this key; commit or abandon it first");
  }
  auto f = std::make_unique<PyFlight>();
  f->cache = cache;
  f->key = key;
  std::optional<kcache::Flight> began;
  {
    nb::gil_scoped_release nogil;
    began.emplace(cache->begin(key));
  }
  kcache::Flight fl = std::move(*began);
  // From inside the key's own compile function (get_or_compile's).
  if (!fl.error().is_ok()) raise_reentry_error("Cache.begin: " + fl.error().message());
  nb::gil_scoped_release nogil;
  if (fl.owner()) {
    {
      std::lock_guard<std::mutex> l(g_owned_mu);
      g_owned[key.key] = std::this_thread::get_id();
    }
    f->flight.emplace(std::move(fl));
    f->state = PyFlight::owner;
    return f;
  }
  f->entry = fl.entry();
  f->source = fl.source();
  f->state = PyFlight::hit;
  return f;
}

PyEntry commit_flight(PyFlight& f, nb::handle artifacts_obj) {
  std::vector<kcache::Artifact> artifacts;
  {
    std::lock_guard<std::mutex> l(f.m);
    if (f.state != PyFlight::owner)
      throw nb::value_error(f.state == PyFlight::hit ? "Flight.commit: the flight was a hit; there is nothing to commit"
                                                     : "Flight.commit: the flight is already finished");
  }
  // Checked before the library sees them: a bad argument leaves the caller
  // the owner.
  artifacts = to_artifacts(artifacts_obj, "Flight.commit");
  std::optional<kcache::Expected<kcache::Entry>> r;
  {
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(f.m);
    if (f.state == PyFlight::owner) {
      r.emplace(f.flight->commit(std::move(artifacts)));
      f.flight.reset();
      release_owned(f.key.key);
      f.state = PyFlight::committed;
    }
  }
  if (!r) throw nb::value_error("Flight.commit: the flight is already finished");
  if (!*r) {
    f.state = PyFlight::abandoned;
    if (r->error().code() == kcache::Errc::invalid_argument)
      throw nb::value_error(("Flight.commit: " + r->error().to_string()).c_str());
    raise_compile_error(r->error());
  }
  f.entry = std::move(**r);
  f.source = kcache::Source::compiled;
  return make_entry(*f.entry, kcache::Source::compiled);
}

void abandon_flight(PyFlight& f) {
  nb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> l(f.m);
  if (f.state != PyFlight::owner) return;
  f.flight->abandon();
  f.flight.reset();
  release_owned(f.key.key);
  f.state = PyFlight::abandoned;
}

}  // namespace

NB_MODULE(_kcache, m) {
  m.doc() = "kcache core bindings (use the kcache package, not this module)";

  m.def("_set_encoder",
        [](nb::object enc, nb::object compile_error, nb::object reentry_error, nb::object on_open, nb::object error) {
          g_encode_value = enc.release();
          g_compile_error = compile_error.release();
          g_reentry_error = reentry_error.release();
          g_on_open = on_open.release();
          g_error = error.release();
        });
  m.def("version", [] { return std::string(KCACHE_VERSION_STRING); });
  // kcache::features(): the list `kcache --version` prints, in its order.
  m.def("features", [] {
    nb::list l;
    for (const auto& f : kcache::features()) l.append(nb::str(f.c_str()));
    return nb::tuple(l);
  });
  m.def("bundle_keygen", [](const std::string& key_file) {
    kcache::Status st;
    {
      nb::gil_scoped_release nogil;
      st = kcache::bundle_keygen(key_file);
    }
    if (!st.is_ok()) raise_status("kcache.bundle_keygen", st);
  });
  m.def("options", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const auto& i : kcache::option_table())
      out.emplace_back(std::string(i.name), std::string(i.env), std::string(i.help));
    return out;
  });

  nb::class_<PyKey>(m, "Key",
                    "A cache key (made by kcache.key): a 128-bit digest of a namespace and named components, "
                    "with the manifest it was made from. Hashable and comparable; bytes(key) is the digest.")
      .def_prop_ro(
          "hex", [](const PyKey& k) { return k.info.key.hex(); }, "The digest as 32 lowercase hex digits.")
      .def_prop_ro(
          "namespace", [](const PyKey& k) { return k.info.manifest.ns; }, "The namespace the key was made in.")
      .def_prop_ro(
          "manifest", [](const PyKey& k) { return manifest_list(k.info.manifest); },
          "The components, sorted by name: a list of (name, type, digest hex).")
      .def_prop_ro(
          "label", [](const PyKey& k) { return k.info.label; },
          "The label given to kcache.key (not part of the key); empty when none was given.")
      .def(
          "__bytes__",
          [](const PyKey& k) {
            return nb::bytes(reinterpret_cast<const char*>(k.info.key.bytes.data()), k.info.key.bytes.size());
          },
          "The 16 bytes of the digest.")
      .def("__eq__",
           [](const PyKey& a, nb::handle b) {
             return nb::isinstance<PyKey>(b) && a.info.key == nb::cast<const PyKey&>(b).info.key;
           })
      .def("__hash__", [](const PyKey& k) { return static_cast<Py_ssize_t>(std::hash<kcache::Digest>()(k.info.key)); })
      .def("__repr__", [](const PyKey& k) {
        std::string r = "kcache.Key('" + k.info.manifest.ns + "', " + k.info.key.hex();
        if (!k.info.label.empty()) r += ", label='" + k.info.label + "'";
        return r + ")";
      });

  m.def("key", &make_key, "namespace"_a, "components"_a, "label"_a = nb::none(), "private"_a = nb::tuple());

  static_assert(sizeof(ArtifactView) > 0);
  nb::class_<ArtifactView>(m, "_ArtifactBytes", nb::type_slots(artifact_slots));

  nb::class_<PyEntry>(m, "Entry",
                      "A cache entry: named artifacts (read-only mapping of name to memoryview) and where it came "
                      "from. The memoryviews stay valid as long as they are referenced, whatever happens to the "
                      "cache.")
      .def(
          "__getitem__",
          [](const PyEntry& e, nb::handle name_obj) {
            std::string name = text_of(name_obj, "Entry: an artifact name", false);
            auto a = e.entry.artifact(name);
            if (!a) throw nb::key_error(name.c_str());
            return artifact_memoryview(e.entry, *a);
          },
          "The bytes of artifact `name` as a read-only memoryview; KeyError when there is none.")
      .def(
          "get",
          [](const PyEntry& e, nb::handle name_obj, nb::object dflt) -> nb::object {
            std::string name = text_of(name_obj, "Entry.get: the artifact name", false);
            auto a = e.entry.artifact(name);
            if (!a) return dflt;
            return artifact_memoryview(e.entry, *a);
          },
          "name"_a, "default"_a = nb::none(), "The bytes of artifact `name` (a memoryview), or `default`.")
      .def("__contains__",
           [](const PyEntry& e, nb::handle name) {
             if (!nb::isinstance<nb::str>(name)) return false;
             Py_ssize_t len = 0;
             const char* p = PyUnicode_AsUTF8AndSize(name.ptr(), &len);
             if (!p) {
               PyErr_Clear();  // no UTF-8 form: no artifact has that name
               return false;
             }
             return e.entry.artifact(std::string_view(p, static_cast<size_t>(len))).has_value();
           })
      .def("__len__", [](const PyEntry& e) { return e.entry.artifacts().size(); })
      .def(
          "keys",
          [](const PyEntry& e) {
            nb::list l;
            for (const auto& a : e.entry.artifacts()) l.append(nb::str(a.name.c_str()));
            return l;
          },
          "The artifact names, in stored order.")
      .def("__iter__",
           [](const PyEntry& e) {
             nb::list l;
             for (const auto& a : e.entry.artifacts()) l.append(nb::str(a.name.c_str()));
             return nb::iter(l);
           })
      .def(
          "items",
          [](const PyEntry& e) {
            nb::list l;
            for (const auto& a : e.entry.artifacts())
              l.append(nb::make_tuple(nb::str(a.name.c_str()), artifact_memoryview(e.entry, a.data)));
            return l;
          },
          "(name, memoryview) of every artifact.")
      .def(
          "to_dict",
          [](const PyEntry& e) {
            nb::dict d;
            for (const auto& a : e.entry.artifacts())
              d[nb::str(a.name.c_str())] = nb::bytes(a.data.data(), a.data.size());
            return d;
          },
          "A dict of name to bytes (copies).")
      .def_prop_ro(
          "source", [](const PyEntry& e) { return std::string(kcache::source_name(e.source)); },
          "Where it came from: \"compiled\", \"memory\", \"disk\", \"remote\", \"bundle\", \"waited\" or "
          "\"other\".")
      .def_prop_ro(
          "key_hex", [](const PyEntry& e) { return e.entry.key().hex(); }, "The key's digest as hex.")
      .def_prop_ro(
          "size", [](const PyEntry& e) { return e.entry.payload_size(); }, "Bytes of all artifacts together.")
      .def_prop_ro(
          "created_unix_ms", [](const PyEntry& e) { return e.entry.meta().created_unix_ms; },
          "When the entry was made (ms since the Unix epoch).")
      .def_prop_ro(
          "compile_cost_us", [](const PyEntry& e) { return e.entry.meta().compile_cost_us; },
          "How long its compile took (us), as the producer recorded it.")
      .def_prop_ro(
          "producer", [](const PyEntry& e) { return e.entry.meta().producer; },
          "Who stored it (Options::producer, \"python\" by default here).")
      .def_prop_ro(
          "manifest", [](const PyEntry& e) { return manifest_list(e.entry.manifest()); },
          "The key's components: a list of (name, type, digest hex).")
      .def("__repr__", [](const PyEntry& e) {
        std::string names;
        for (const auto& a : e.entry.artifacts()) names += (names.empty() ? "" : ", ") + a.name;
        return "kcache.Entry(" + e.entry.key().hex() + ", source=" + std::string(kcache::source_name(e.source)) +
               ", artifacts=[" + names + "], " + std::to_string(e.entry.payload_size()) + " bytes)";
      });

  nb::class_<PyFlight>(m, "Flight", nb::is_weak_referenceable(),
                       "A request started with Cache.begin(key): either a hit (hit is True, entry holds it) or this "
                       "caller owns the compile (owner is True) and must commit(artifacts) or abandon(); until it "
                       "does, other threads and processes asking for the key wait. Leaving a `with` block or "
                       "dropping the flight without a commit abandons it.")
      .def_prop_ro(
          "hit", [](const PyFlight& f) { return f.state == PyFlight::hit; }, "True when begin() found an entry.")
      .def_prop_ro(
          "owner", [](const PyFlight& f) { return f.state == PyFlight::owner; },
          "True while this caller owns the compile (not yet committed or abandoned).")
      .def_prop_ro(
          "done", [](const PyFlight& f) { return f.state != PyFlight::owner; },
          "True once there is nothing left to do: a hit, a commit or an abandon.")
      .def_prop_ro(
          "source",
          [](const PyFlight& f) {
            return f.state == PyFlight::owner ? std::string("pending") : std::string(kcache::source_name(f.source));
          },
          "Where the entry came from (as Entry.source), or \"pending\" while owned.")
      .def_prop_ro(
          "entry",
          [](const PyFlight& f) -> std::optional<PyEntry> {
            if (!f.entry) return std::nullopt;
            return make_entry(*f.entry, f.source);
          },
          "The entry of a hit or of the commit; None while owned or after an abandon.")
      .def_prop_ro(
          "key", [](const PyFlight& f) { return PyKey{f.key}; }, "The key this flight is for.")
      .def("commit", &commit_flight, "artifacts"_a,
           "Stores the compiled artifacts (name -> bytes or str) and hands them to the waiters; returns the "
           "Entry. ValueError when the flight is not owned (a hit, or already finished).")
      .def("abandon", &abandon_flight,
           "Gives up the compile without storing anything; a waiter compiles instead. Does nothing when not owned.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__",
           [](PyFlight& f, nb::args) {
             // Leaving the block without a commit abandons: the lease goes and
             // another process may compile.
             abandon_flight(f);
             return false;
           })
      .def("__repr__", [](const PyFlight& f) {
        std::string state;
        switch (f.state) {
          case PyFlight::hit:
            state = "hit from " + std::string(kcache::source_name(f.source));
            break;
          case PyFlight::owner:
            state = "owner";
            break;
          case PyFlight::committed:
            state = "committed";
            break;
          case PyFlight::abandoned:
            state = "abandoned";
            break;
        }
        return "kcache.Flight('" + f.key.manifest.ns + "', " + f.key.key.hex() + ", " + state + ")";
      });

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

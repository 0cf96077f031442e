// What the files of the Python extension module share: the Python types of
// the bindings, the conversions between Python values and the library's,
// and the errors they raise. kcache_ext.cc defines the module and calls
// each file's bind_*: keys.cc (kcache.key, Key), entries.cc (Entry and its
// artifacts), flights.cc (Flight), cache.cc (Cache: lookups, compiles,
// stats, bundles); errors.cc raises the package's exceptions.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "kcache/entry.h"
#include "kcache/key.h"

namespace kcache::python {

namespace nb = nanobind;

// Module-lifetime references to objects of the Python package, set once by
// _set_encoder and held as plain handles so that nothing is released after
// the interpreter.
struct PackageHooks {
  nb::handle encode_value;   // canonical text of a value inside a dict or list component
  nb::handle compile_error;  // kcache.CompileError
  nb::handle reentry_error;  // kcache.ReentryError
  nb::handle on_open;        // called (with the GIL) each time a process opens a Cache
  nb::handle error;          // kcache.Error(message, code)
};
extern PackageHooks g_hooks;

// ---- values from Python (keys.cc, entries.cc) ------------------------------

// The bytes of a buffer-protocol object, copied.
std::string buffer_bytes(nb::handle h);
bool is_buffer(nb::handle h);

// The UTF-8 of a str, for every string the binding hands to the library.
// ValueError, naming `what`, for a str that has none (a lone surrogate such
// as '\udcff', which os.fsdecode makes of bytes that are not UTF-8) and,
// with no_nul (paths, option values, names), for one holding a NUL, which
// the library would cut the string at. TypeError for anything but a str.
std::string text_of(nb::handle h, const std::string& what, bool no_nul);

// A mapping of artifact name to bytes or str, as the library's artifacts;
// TypeError or ValueError naming `what` for anything else.
std::vector<kcache::Artifact> to_artifacts(nb::handle obj, const char* what);

// ---- keys and entries (keys.cc, entries.cc) --------------------------------

struct PyKey {
  kcache::KeyInfo info;
};

struct PyEntry {
  kcache::Entry entry;
  kcache::Source source = kcache::Source::other;
};

// A manifest's components as a list of (name, type, digest hex).
nb::list manifest_list(const kcache::Manifest& m);

// LMDB hits pin a read transaction; Python may keep an Entry for as long as it
// likes, so such entries are copied to the heap first. Heap entries (memory
// tier, promotions, fresh compiles) are handed out without a copy. The copy
// is guarded (Entry::detach): nullopt when the store file shrank under it.
std::optional<PyEntry> held(kcache::Entry e, kcache::Source s);
// The same; kcache.Error ("unavailable") when the copy failed.
PyEntry make_entry(kcache::Entry e, kcache::Source s);

// ---- errors (errors.cc) ------------------------------------------------------

// An operation that is not a lookup (mark, bundles) failed: ValueError for
// bad usage (Errc::invalid_argument), else kcache.Error carrying the code
// the C ABI returns for the same failure ("unavailable", "corrupt",
// "io_error", ...).
[[noreturn]] void raise_status(const std::string& what, const kcache::Status& st);
[[noreturn]] void raise_reentry_error(const std::string& msg);
// The library refuses, at once, a request for a key that the calling thread
// is compiling itself (kcache/cache.h, "Re-entry"); any other error is the
// compile's.
[[noreturn]] void raise_compile_error(const kcache::Status& st);

// ---- flights (flights.cc) ----------------------------------------------------

// A Python Flight wraps the library's Flight (Cache::begin). The Cache is
// kept alive by the flight, since a Flight must not outlive its Cache. Python
// may hand one flight to several threads, so calls on it are serialised.
struct PyFlight {
  std::shared_ptr<kcache::Cache> cache;  // declared first: destroyed after `flight`
  kcache::KeyInfo key;
  std::optional<kcache::Flight> flight;  // while this caller owns the compile
  std::mutex m;
  enum State { hit, owner, committed, abandoned } state = hit;
  std::optional<kcache::Entry> entry;
  kcache::Source source = kcache::Source::other;

  ~PyFlight();
};

std::unique_ptr<PyFlight> begin_flight(std::shared_ptr<kcache::Cache> cache, const kcache::KeyInfo& key);

// ---- the module's classes ----------------------------------------------------

void bind_keys(nb::module_& m);
void bind_entries(nb::module_& m);
void bind_flights(nb::module_& m);
void bind_cache(nb::module_& m);

}  // namespace kcache::python

// Flight: the lease-style API (Cache.begin) for hosts that run their own
// compile between two calls, commit or abandon, with the GIL released while
// the library waits; a thread that asks again for a key it owns is refused.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ext.h"
#include "util/util.h"

namespace kcache::python {

using namespace nb::literals;

namespace {

// Keys whose compile a Python thread owns, and which thread: begin() on a key
// its own thread owns would wait for itself forever, so it raises instead.
std::mutex g_owned_mu;
std::unordered_map<kcache::Digest, std::thread::id> g_owned;

void release_owned(const kcache::Digest& k) {
  std::lock_guard<std::mutex> l(g_owned_mu);
  g_owned.erase(k);
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

PyFlight::~PyFlight() {
  // Dropped or garbage-collected without a commit: abandon, so that the
  // callers waiting for this key try again.
  if (flight) {
    flight->abandon();
    release_owned(key.key);
  }
}

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
    kcache::util::CopiedHits copied;
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

void bind_flights(nb::module_& m) {
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
}

}  // namespace kcache::python

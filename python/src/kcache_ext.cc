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
//
// This file defines the module and its functions; each class is bound in a
// file of its own (ext.h says which).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "ext.h"
#include "kcache/bundle.h"
#include "kcache/cache.h"

namespace nb = nanobind;
using namespace kcache::python;

NB_MODULE(_kcache, m) {
  m.doc() = "kcache core bindings (use the kcache package, not this module)";

  m.def("_set_encoder",
        [](nb::object enc, nb::object compile_error, nb::object reentry_error, nb::object on_open, nb::object error) {
          g_hooks.encode_value = enc.release();
          g_hooks.compile_error = compile_error.release();
          g_hooks.reentry_error = reentry_error.release();
          g_hooks.on_open = on_open.release();
          g_hooks.error = error.release();
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

  bind_keys(m);
  bind_entries(m);
  bind_flights(m);
  bind_cache(m);
}

// Entry and its artifacts: a cache entry's artifacts as read-only
// memoryviews over the entry's own bytes, and artifacts from Python (a
// mapping of name to bytes or str) as the library's.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <string_view>
#include <vector>

#include "ext.h"

namespace kcache::python {

using namespace nb::literals;

namespace {

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

}  // namespace

std::optional<PyEntry> held(kcache::Entry e, kcache::Source s) {
  if (e.pinned()) {
    auto d = e.detach();
    if (!d) return std::nullopt;
    e = std::move(d).value();
  }
  return PyEntry{std::move(e), s};
}

PyEntry make_entry(kcache::Entry e, kcache::Source s) {
  auto h = held(std::move(e), s);
  if (!h) raise_status("Entry", kcache::Status(kcache::Errc::unavailable, "the store file shrank under this process"));
  return std::move(*h);
}

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

void bind_entries(nb::module_& m) {
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
}

}  // namespace kcache::python

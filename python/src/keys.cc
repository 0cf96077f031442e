// kcache.key and Key: keys made from a namespace and named Python values
// (bytes, str, int, bool, dict, list, kcache.Key), each written the way the
// library's KeyBuilder takes it, dicts and lists as canonical JSON.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <map>
#include <string>
#include <vector>

#include "ext.h"
#include "util/util.h"

namespace kcache::python {

using namespace nb::literals;

namespace {

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
  return text_of(g_hooks.encode_value(v), "kcache.key: a value inside a dict or list component", false);
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

}  // namespace

std::string buffer_bytes(nb::handle h) {
  Py_buffer view;
  if (PyObject_GetBuffer(h.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
  std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return out;
}

bool is_buffer(nb::handle h) { return PyObject_CheckBuffer(h.ptr()) != 0; }

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

nb::list manifest_list(const kcache::Manifest& m) {
  nb::list out;
  for (const auto& it : m.items)
    out.append(nb::make_tuple(it.name, std::string(kcache::component_type_name(it.type)), it.digest.hex()));
  return out;
}

void bind_keys(nb::module_& m) {
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
}

}  // namespace kcache::python

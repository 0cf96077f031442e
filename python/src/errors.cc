// The exceptions the bindings raise for the library's errors: kcache.Error
// with the C ABI's code name, kcache.CompileError, kcache.ReentryError, and
// ValueError for bad usage.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "ext.h"

namespace kcache::python {

PackageHooks g_hooks;

namespace {

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

}  // namespace

[[noreturn]] void raise_status(const std::string& what, const kcache::Status& st) {
  std::string msg = what + ": " + st.message();
  if (st.code() == kcache::Errc::invalid_argument) throw nb::value_error(msg.c_str());
  nb::object err = g_hooks.error(msg, std::string(code_name(st.code())));
  PyErr_SetObject(g_hooks.error.ptr(), err.ptr());
  throw nb::python_error();
}

[[noreturn]] void raise_reentry_error(const std::string& msg) {
  PyErr_SetString(g_hooks.reentry_error.ptr(), msg.c_str());
  throw nb::python_error();
}

[[noreturn]] void raise_compile_error(const kcache::Status& st) {
  if (kcache::is_reentry(st)) raise_reentry_error(st.message());
  PyErr_SetString(g_hooks.compile_error.ptr(), st.message().c_str());
  throw nb::python_error();
}

}  // namespace kcache::python

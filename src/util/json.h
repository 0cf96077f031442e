// JSON for kcache's own output and input: a compact writer (the `--json`
// output of the `kcache` tool, tier and cache statistics) and a small
// reader (manifest files). Private to the library and its tools.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kcache/status.h"

namespace kcache::util {

// Writes one JSON document without blanks, members in the order written:
//
//   JsonWriter w;
//   w.begin_object().field("count", 2).key("items").begin_array();
//   ...
//   w.end_array().end_object();
//   std::string s = w.take();   // {"count":2,"items":[...]}
//
// Commas and quoting are the writer's; the caller says what comes next.
// Misuse (a value where a member name is due, unbalanced ends) is a bug in
// the caller and is not checked beyond what keeps the output well-formed.
class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  // The name of the next member of the open object.
  JsonWriter& key(std::string_view name);

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b);
  template <std::integral T>
  requires(!std::same_as<T, bool>) JsonWriter& value(T v) { return raw(std::to_string(v)); }
  // A finite number with `decimals` digits after the point ("%.*f").
  JsonWriter& number(double v, int decimals);
  JsonWriter& null();
  // A value that is already JSON text (e.g. another writer's output).
  JsonWriter& raw(std::string_view json);

  // key(name) then value(v).
  template <typename T>
  JsonWriter& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  const std::string& str() const noexcept { return out_; }
  std::string take() noexcept { return std::move(out_); }

 private:
  void before_value();
  std::string out_;
  std::vector<bool> has_members_;  // per open object/array: something written already
  bool after_key_ = false;
};

// A parsed JSON value. Numbers are doubles; object members keep their order.
struct JsonValue {
  enum class Type : uint8_t { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;

  // The first member called `name`, or null when there is none (or this is
  // not an object).
  const JsonValue* member(std::string_view name) const;
};

// Parses one complete JSON document (nesting up to 64 deep). Errors are
// invalid_argument, naming what was wrong and the byte offset.
Expected<JsonValue> parse_json(std::string_view text);

}  // namespace kcache::util

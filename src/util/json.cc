// The JSON writer and reader of util/json.h.
#include "util/json.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/util.h"

namespace kcache::util {

// ---- writer ------------------------------------------------------------------

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_members_.empty()) {
    if (has_members_.back()) out_ += ',';
    has_members_.back() = true;
  }
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  has_members_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  out_ += '}';
  if (!has_members_.empty()) has_members_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  has_members_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  out_ += ']';
  if (!has_members_.empty()) has_members_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  before_value();
  out_ += '"';
  out_ += json_escape(name);
  out_ += "\":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value();
  out_ += '"';
  out_ += json_escape(s);
  out_ += '"';
  return *this;
}

JsonWriter& JsonWriter::value(bool b) { return raw(b ? "true" : "false"); }

JsonWriter& JsonWriter::number(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return raw(buf);
}

JsonWriter& JsonWriter::null() { return raw("null"); }

JsonWriter& JsonWriter::raw(std::string_view json) {
  before_value();
  out_ += json;
  return *this;
}

// ---- reader ------------------------------------------------------------------

const JsonValue* JsonValue::member(std::string_view name) const {
  if (type != Type::object) return nullptr;
  for (const auto& [k, v] : object)
    if (k == name) return &v;
  return nullptr;
}

namespace {

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  Status parse(JsonValue* out) {
    if (!value(out, 0)) return error();
    blanks();
    if (i_ != s_.size()) {
      fail("trailing characters");
      return error();
    }
    return Status();
  }

 private:
  Status error() const { return Status(Errc::invalid_argument, err_); }
  bool fail(const char* what) {
    if (err_.empty()) err_ = std::string(what) + " at offset " + std::to_string(i_);
    return false;
  }
  void blanks() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return fail("bad literal");
    i_ += w.size();
    return true;
  }
  bool value(JsonValue* v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    blanks();
    if (i_ >= s_.size()) return fail("unexpected end");
    char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->type = JsonValue::Type::string;
      return string(&v->string);
    }
    if (c == 't' || c == 'f') {
      v->type = JsonValue::Type::boolean;
      v->boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return literal("null");
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i_;
      while (j < s_.size() && std::strchr("+-.eE0123456789", s_[j])) ++j;
      std::string num(s_.substr(i_, j - i_));
      char* end = nullptr;
      v->number = std::strtod(num.c_str(), &end);
      if (end != num.c_str() + num.size()) return fail("bad number");
      v->type = JsonValue::Type::number;
      i_ = j;
      return true;
    }
    return fail("unexpected character");
  }
  // After an element of an object or array: true with *done set at `close`,
  // true at ',', false otherwise.
  bool next(char close, bool* done) {
    blanks();
    if (i_ < s_.size() && s_[i_] == ',') {
      ++i_;
      return true;
    }
    if (i_ < s_.size() && s_[i_] == close) {
      ++i_;
      *done = true;
      return true;
    }
    return fail(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
  }
  bool object(JsonValue* v, int depth) {
    v->type = JsonValue::Type::object;
    ++i_;
    blanks();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (bool done = false; !done;) {
      blanks();
      std::string k;
      if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a member name");
      if (!string(&k)) return false;
      blanks();
      if (i_ >= s_.size() || s_[i_] != ':') return fail("expected ':'");
      ++i_;
      JsonValue m;
      if (!value(&m, depth + 1)) return false;
      v->object.emplace_back(std::move(k), std::move(m));
      if (!next('}', &done)) return false;
    }
    return true;
  }
  bool array(JsonValue* v, int depth) {
    v->type = JsonValue::Type::array;
    ++i_;
    blanks();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (bool done = false; !done;) {
      JsonValue e;
      if (!value(&e, depth + 1)) return false;
      v->array.push_back(std::move(e));
      if (!next(']', &done)) return false;
    }
    return true;
  }
  static void utf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xc0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xe0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      *out += static_cast<char>(0xf0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  bool hex4(uint32_t* out) {
    if (i_ + 4 > s_.size()) return fail("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return fail("bad \\u escape");
    }
    *out = v;
    return true;
  }
  bool string(std::string* out) {
    ++i_;  // the opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      char e = s_[i_++];
      switch (e) {
        case '"':
          *out += '"';
          break;
        case '\\':
          *out += '\\';
          break;
        case '/':
          *out += '/';
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'n':
          *out += '\n';
          break;
        case 'r':
          *out += '\r';
          break;
        case 't':
          *out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {  // a surrogate pair
            uint32_t lo = 0;
            if (s_.substr(i_, 2) != "\\u") return fail("lone surrogate");
            i_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xdc00 || lo >= 0xe000) return fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return fail("lone surrogate");
          }
          utf8(out, cp);
          break;
        }
        default:
          return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string err_;
};

}  // namespace

Expected<JsonValue> parse_json(std::string_view text) {
  JsonValue v;
  Reader r(text);
  KCACHE_RETURN_IF_ERROR(r.parse(&v));
  return v;
}

}  // namespace kcache::util

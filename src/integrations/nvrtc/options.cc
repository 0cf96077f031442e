// The options of an NVRTC compile as NVRTC reads them (manifest.h,
// parse_options): every spelling of -D, -U, -I and -include parsed, macros
// reduced to the last operation on each name.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "integrations/nvrtc/manifest.h"

namespace kcache::nvrtc::detail {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

std::string skip_blanks(std::string_view v) {
  size_t i = 0;
  while (i < v.size() && is_space(v[i])) ++i;
  return std::string(v.substr(i));
}

}  // namespace

ParsedOptions parse_options(const std::vector<std::string>& options) {
  ParsedOptions p;
  // name -> the last macro operation on it ("-DNAME=VALUE" or "-UNAME").
  std::map<std::string, std::string> macro_ops;
  auto value = [&](size_t* i, std::string_view short_form, std::string_view long_form,
                   bool glued) -> std::optional<std::string> {
    const std::string& o = options[*i];
    if (o == short_form || o == long_form) {
      if (*i + 1 >= options.size()) return std::nullopt;
      return skip_blanks(options[++*i]);
    }
    if (starts_with(o, std::string(long_form) + "=")) return o.substr(long_form.size() + 1);
    if (starts_with(o, std::string(short_form) + "=")) return o.substr(short_form.size() + 1);
    if (glued && starts_with(o, short_form)) {
      std::string v = skip_blanks(std::string_view(o).substr(short_form.size()));
      if (!v.empty() && v[0] == '=') v.erase(0, 1);
      return v;
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string& o = options[i];
    if (auto d = value(&i, "-D", "--define-macro", true)) {
      std::string def = *d;
      size_t end = std::min(def.find('='), def.find('('));
      std::string name = def.substr(0, end);
      if (def.find('=') == std::string::npos) def += "=1";
      macro_ops[name] = "-D" + def;
    } else if (auto u = value(&i, "-U", "--undefine-macro", true)) {
      macro_ops[*u] = "-U" + *u;
    } else if (auto inc = value(&i, "-I", "--include-path", true)) {
      p.include_dirs.push_back(*inc);
    } else if (auto pre = value(&i, "-include", "--pre-include", false)) {
      p.pre_includes.push_back(*pre);
    } else {
      p.other.push_back(o);
    }
  }
  for (auto& [name, op] : macro_ops) p.macros.push_back(std::move(op));
  return p;
}

}  // namespace kcache::nvrtc::detail

// A strict reader of what `kcache stats --format openmetrics|prometheus`
// prints. OpenMetrics (1.0): every line a HELP, a TYPE, a sample or the
// final "# EOF"; a counter family is named without _total and its samples
// are FAMILY_total (and FAMILY_created, when it started counting) (the official parser refuses a family named *_total:
// its samples would clash). Prometheus text (0.0.4): no "# EOF", and a counter family is named as its samples, *_total.
// Both: names and label names valid; label values escaped (\\, \", \n only); each family's HELP and TYPE once, before
// its samples, samples of a family together; values numbers.
#pragma once

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace kcache::test {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped
  double value = 0;
};

enum class ExpositionFormat { openmetrics, prometheus };

struct Exposition {
  std::string error;                              // empty when the text is valid
  std::map<std::string, std::string> type, help;  // by family name
  std::vector<Sample> samples;
  // The value of the sample `name` whose labels include `want`; -1 if none.
  double value(const std::string& name, const std::map<std::string, std::string>& want = {}) const {
    for (const auto& s : samples) {
      if (s.name != name) continue;
      bool all = true;
      for (const auto& [k, v] : want) all = all && s.labels.count(k) && s.labels.at(k) == v;
      if (all) return s.value;
    }
    return -1;
  }
};

inline bool valid_name(const std::string& n, bool label) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

inline Exposition parse_exposition(const std::string& text, ExpositionFormat format = ExpositionFormat::openmetrics) {
  const bool om = format == ExpositionFormat::openmetrics;
  Exposition e;
  auto fail = [&](size_t line, const std::string& why) {
    e.error = "line " + std::to_string(line) + ": " + why;
    return e;
  };
  if (text.empty() || text.back() != '\n') return fail(0, "does not end with a newline");
  std::vector<std::string> lines;
  for (size_t p = 0; p < text.size();) {
    size_t nl = text.find('\n', p);
    lines.push_back(text.substr(p, nl - p));
    p = nl + 1;
  }
  if (om && (lines.empty() || lines.back() != "# EOF")) return fail(lines.size(), "last line is not # EOF");
  std::set<std::string> closed;  // families whose samples have ended
  std::string current;           // the family being read
  for (size_t i = 0; i + (om ? 1 : 0) < lines.size(); ++i) {
    const std::string& l = lines[i];
    const size_t n = i + 1;
    if (l.empty()) return fail(n, "empty line");
    if (l == "# EOF") return fail(n, om ? "# EOF before the end" : "# EOF in Prometheus text");
    if (l.rfind("# HELP ", 0) == 0 || l.rfind("# TYPE ", 0) == 0) {
      const bool is_type = l[2] == 'T';
      size_t sp = l.find(' ', 7);
      if (sp == std::string::npos) return fail(n, "no text after the name");
      std::string name = l.substr(7, sp - 7), rest = l.substr(sp + 1);
      if (!valid_name(name, false)) return fail(n, "bad metric name '" + name + "'");
      auto& seen = is_type ? e.type : e.help;
      if (seen.count(name)) return fail(n, "second " + std::string(is_type ? "TYPE" : "HELP") + " of " + name);
      if (closed.count(name)) return fail(n, name + " declared after its samples");
      if (is_type) {
        if (rest != "counter" && rest != "gauge" && rest != "untyped" && rest != "histogram" && rest != "summary")
          return fail(n, "bad type '" + rest + "'");
        if (rest == "counter" && om && ends_with(name, "_total"))
          return fail(n, "counter family " + name + " named *_total (its samples would clash with it)");
        if (rest == "counter" && !om && !ends_with(name, "_total"))
          return fail(n, "counter " + name + " not named *_total");
      }
      for (size_t k = 0; k < rest.size(); ++k)
        if (rest[k] == '\\' && (k + 1 >= rest.size() || (rest[k + 1] != '\\' && rest[k + 1] != 'n')))
          return fail(n, "bad escape in HELP");
      seen[name] = rest;
      if (!current.empty() && current != name) closed.insert(current);
      current = name;
      continue;
    }
    if (l[0] == '#') return fail(n, "a comment other than HELP, TYPE and # EOF");
    Sample s;
    size_t p = 0;
    while (p < l.size() && l[p] != '{' && l[p] != ' ') ++p;
    s.name = l.substr(0, p);
    if (!valid_name(s.name, false)) return fail(n, "bad metric name '" + s.name + "'");
    // The sample's family: in OpenMetrics a counter's samples are FAMILY_total.
    std::string fam = s.name;
    for (const char* suffix : {"_total", "_created"}) {
      if (!om || !ends_with(s.name, suffix)) continue;
      const std::string base = s.name.substr(0, s.name.size() - std::string(suffix).size());
      if (e.type.count(base) && e.type.at(base) == "counter") fam = base;
    }
    if (!e.type.count(fam)) return fail(n, s.name + " has no TYPE before it");
    if (om && e.type.at(fam) == "counter" && fam == s.name)
      return fail(n, "sample " + s.name + " of a counter not named " + fam + "_total");
    if (closed.count(fam)) return fail(n, "samples of " + fam + " are not together");
    if (current != fam) {
      if (!current.empty()) closed.insert(current);
      current = fam;
    }
    if (p < l.size() && l[p] == '{') {
      ++p;
      while (p < l.size() && l[p] != '}') {
        size_t eq = l.find('=', p);
        if (eq == std::string::npos) return fail(n, "label without =");
        std::string key = l.substr(p, eq - p);
        if (!valid_name(key, true)) return fail(n, "bad label name '" + key + "'");
        if (s.labels.count(key)) return fail(n, "label " + key + " twice");
        p = eq + 1;
        if (p >= l.size() || l[p] != '"') return fail(n, "label value not quoted");
        ++p;
        std::string v;
        for (;; ++p) {
          if (p >= l.size()) return fail(n, "unterminated label value");
          char c = l[p];
          if (c == '"') break;
          if (c == '\\') {
            if (p + 1 >= l.size()) return fail(n, "dangling backslash");
            char x = l[++p];
            if (x == '\\')
              v += '\\';
            else if (x == '"')
              v += '"';
            else if (x == 'n')
              v += '\n';
            else
              return fail(n, std::string("bad escape \\") + x);
            continue;
          }
          v += c;
        }
        ++p;  // the closing quote
        s.labels[key] = v;
        if (p < l.size() && l[p] == ',') ++p;
      }
      if (p >= l.size()) return fail(n, "labels not closed");
      ++p;
    }
    if (p >= l.size() || l[p] != ' ') return fail(n, "no space before the value");
    std::string num = l.substr(p + 1);
    char* end = nullptr;
    s.value = std::strtod(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size()) return fail(n, "bad value '" + num + "'");
    e.samples.push_back(std::move(s));
  }
  for (const auto& [name, t] : e.type)
    if (!e.help.count(name)) return fail(0, name + " has a TYPE but no HELP");
  return e;
}

}  // namespace kcache::test

// Why a lookup missed (kcache/explain.h): the report, filled from the
// lookup and its nearest stored manifest, and its renderings as text (a
// block, a log line, a verdict, one difference) and as JSON.
#include "kcache/explain.h"

#include "key/explain_json.h"

namespace kcache {

namespace {

constexpr std::string_view kArrow = " \u2192 ";

std::string type_name(const std::optional<ComponentType>& t) {
  return t ? std::string(component_type_name(*t)) : std::string();
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::string padded(std::string_view s, size_t width) {
  std::string out(s);
  if (out.size() < width) out.append(width - out.size(), ' ');
  return out;
}

bool both_values(const ManifestDifference& d) { return d.stored_value && d.lookup_value; }

// "stored u64 1111..., lookup i64 3333..." (types only when they differ).
std::string both_sides(const ManifestDifference& d) {
  std::string st = d.type_changed() ? type_name(d.stored_type) + " " : std::string();
  std::string lt = d.type_changed() ? type_name(d.lookup_type) + " " : std::string();
  return "stored " + st + shown_value(d.stored_value, d.stored) + ", lookup " + lt +
         shown_value(d.lookup_value, d.lookup);
}

// "2 → 3", or "u64 14 → i64 14" when the type changed. REQUIRES both_values(d).
std::string value_change(const ManifestDifference& d) {
  if (d.type_changed())
    return type_name(d.stored_type) + " " + *d.stored_value + std::string(kArrow) + type_name(d.lookup_type) + " " +
           *d.lookup_value;
  return *d.stored_value + std::string(kArrow) + *d.lookup_value;
}

// One row of the block: "  NAME(20) WORD(7)  DETAIL".
std::string difference_row(const ManifestDifference& d) {
  std::string detail;
  switch (d.change) {
    case ManifestChange::changed:
      detail = both_values(d) ? value_change(d) : both_sides(d);
      break;
    case ManifestChange::added:
      detail = "only in the lookup" + (d.lookup_value ? " (" + *d.lookup_value + ")" : std::string());
      break;
    case ManifestChange::missing:
      detail = "only in the stored entry" + (d.stored_value ? " (" + *d.stored_value + ")" : std::string());
      break;
  }
  return "  " + padded(d.name, 20) + " " + padded(manifest_change_name(d.change), 7) + "  " + detail + "\n";
}

std::string differences_line(const std::vector<ManifestDifference>& ds) {
  if (ds.empty()) return "same components (stored under another key)";
  std::string out;
  for (const auto& d : ds) out += (out.empty() ? "" : "; ") + to_text(d);
  return out;
}

std::string with_label(const Key& k, const std::string& label) {
  return label.empty() ? k.hex() : k.hex() + " " + quoted(label);
}

std::string block(const MissReport& r) {
  if (!r.nearest) {
    std::string out = "no stored entry has namespace " + quoted(r.ns);
    if (!r.other_namespaces.empty()) {
      out += " (stored namespaces:";
      for (const auto& [ns, n] : r.other_namespaces) out += " " + quoted(ns) + " x" + std::to_string(n);
      out += ")";
    }
    return out + "\n";
  }
  const MissReport::Nearest& n = *r.nearest;
  std::string out = "compared with " + std::to_string(r.compared) + " stored entr" + (r.compared == 1 ? "y" : "ies") +
                    " of namespace " + quoted(r.ns) + "\n";
  // Of the components either side has: the lookup's and those missing from it.
  size_t missing = 0;
  for (const auto& d : r.differences) missing += d.change == ManifestChange::missing;
  out += "nearest " + n.key.hex() + ": " + std::to_string(r.differences.size()) + " of " +
         std::to_string(r.components + missing) + " components differ";
  if (!n.label.empty()) out += " (label " + quoted(n.label) + (n.same_label ? ", as the lookup's" : "") + ")";
  out += "\n";
  for (const auto& d : r.differences) out += difference_row(d);
  if (r.differences.empty()) out += "  (same manifest: the entry is stored under another key)\n";
  return out;
}

std::string verdict(const MissReport& r) {
  if (!r.nearest) return "no earlier entry of namespace " + quoted(r.ns);
  std::string out = !r.label.empty() && !r.nearest->same_label
                        ? "no earlier entry of its label; nearest of another label "
                        : "nearest ";
  return out + with_label(r.nearest->key, r.nearest->label) + ": " + differences_line(r.differences);
}

void write_difference(util::JsonWriter& w, const ManifestDifference& d) {
  w.begin_object().field("name", d.name).field("change", manifest_change_name(d.change));
  w.key("stored");
  d.stored ? w.value(shown_value(d.stored_value, d.stored)) : w.null();
  w.key("lookup");
  d.lookup ? w.value(shown_value(d.lookup_value, d.lookup)) : w.null();
  if (d.type_changed()) w.field("stored_type", type_name(d.stored_type)).field("lookup_type", type_name(d.lookup_type));
  w.end_object();
}

}  // namespace

MissReport make_miss_report(const MissRecord& miss, const NearestSearch& found) {
  MissReport r;
  r.key = miss.key;
  r.label = miss.label;
  r.ns = miss.manifest.ns;
  r.components = miss.manifest.items.size();
  r.compared = found.compared;
  r.other_namespaces = found.other_namespaces;
  if (const auto& e = found.entry) {
    uint64_t age = e->created_ms && miss.time_ms > e->created_ms ? miss.time_ms - e->created_ms : 0;
    r.nearest = MissReport::Nearest{e->key, e->label, age, !miss.label.empty() && e->label == miss.label};
    r.differences = diff_manifests(e->manifest, miss.manifest);
  }
  return r;
}

std::string to_text(const ManifestDifference& d) {
  switch (d.change) {
    case ManifestChange::changed:
      if (both_values(d)) return d.name + ": " + value_change(d);
      return d.name + ": changed (" + both_sides(d) + ")";
    case ManifestChange::added:
      if (d.lookup_value) return d.name + ": added (" + *d.lookup_value + ")";
      return d.name + ": added (" + type_name(d.lookup_type) + " " + shown_value(std::nullopt, d.lookup) + ")";
    case ManifestChange::missing:
      if (d.stored_value) return d.name + ": missing (" + *d.stored_value + ")";
      return d.name + ": missing (" + type_name(d.stored_type) + " " + shown_value(std::nullopt, d.stored) + ")";
  }
  return d.name;
}

std::string to_text(const MissReport& r, TextForm form) {
  switch (form) {
    case TextForm::block:
      return block(r);
    case TextForm::line:
      return "miss " + with_label(r.key, r.label) + " (" + r.ns + "): " + verdict(r);
    case TextForm::verdict:
      return verdict(r);
  }
  return verdict(r);
}

std::string miss_cause(const MissReport& r) {
  if (!r.label.empty() && !(r.nearest && r.nearest->same_label)) return "no earlier entry of its label";
  if (!r.nearest) return "no earlier entry of namespace " + quoted(r.ns);
  if (r.differences.empty()) return "same components as a stored entry";
  std::string out;
  for (const auto& d : r.differences) {
    std::string one = d.name + " ";
    if (d.change == ManifestChange::changed && both_values(d)) {
      one += value_change(d);
    } else {
      one += manifest_change_name(d.change);
      if (d.change == ManifestChange::added && d.lookup_value) one += " (" + *d.lookup_value + ")";
      if (d.change == ManifestChange::missing && d.stored_value) one += " (" + *d.stored_value + ")";
    }
    out += (out.empty() ? "" : ", ") + one;
  }
  return out;
}

void write_miss_report(util::JsonWriter& w, const MissReport& r,
                       const std::function<void(util::JsonWriter&)>& context) {
  w.field("key", r.key.hex());
  if (context) context(w);
  w.field("label", r.label).field("namespace", r.ns).field("compared", r.compared).key("nearest");
  if (r.nearest) {
    w.begin_object()
        .field("key", r.nearest->key.hex())
        .field("label", r.nearest->label)
        .field("components", static_cast<uint64_t>(r.components))
        .key("differences")
        .begin_array();
    for (const auto& d : r.differences) write_difference(w, d);
    w.end_array().field("age_ms", r.nearest->age_ms).end_object();
  } else {
    w.null();
  }
  w.key("other_namespaces").begin_object();
  for (const auto& [ns, n] : r.other_namespaces) w.field(ns, n);
  w.end_object();
}

std::string to_json(const MissReport& r) {
  util::JsonWriter w;
  w.begin_object();
  write_miss_report(w, r);
  return w.end_object().take();
}

}  // namespace kcache

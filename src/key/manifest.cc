// Manifests as text and JSON, and their differences (kcache/manifest.h).
#include "kcache/manifest.h"

#include <algorithm>

#include "kcache/explain.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache {

namespace {

Expected<ManifestItem> make_item(std::string name, std::string_view type, std::string_view hex) {
  if (name.empty()) return Status(Errc::invalid_argument, "a component has an empty name");
  auto t = parse_component_type(type);
  if (!t) return Status(Errc::invalid_argument, "component '" + name + "': unknown type '" + std::string(type) + "'");
  auto d = Digest::from_hex(hex);
  if (!d) return Status(Errc::invalid_argument, "component '" + name + "': digest is not 32 hex digits");
  return ManifestItem{std::move(name), *t, *d, std::nullopt};
}

Expected<Manifest> from_json(std::string_view text) {
  auto doc = util::parse_json(text);
  if (!doc) return Status(Errc::invalid_argument, "not valid JSON: " + doc.error().message());
  using T = util::JsonValue::Type;
  const util::JsonValue* m = doc->member("manifest");
  if (!m) m = &*doc;
  if (m->type != T::object) return Status(Errc::invalid_argument, "no manifest object");
  Manifest out;
  const util::JsonValue* ns = m->member("namespace");
  if (!ns || ns->type != T::string) return Status(Errc::invalid_argument, "manifest has no \"namespace\" string");
  out.ns = ns->string;
  const util::JsonValue* items = m->member("items");
  if (!items || items->type != T::array) return Status(Errc::invalid_argument, "manifest has no \"items\" array");
  for (const auto& it : items->array) {
    const util::JsonValue* n = it.member("name");
    const util::JsonValue* t = it.member("type");
    const util::JsonValue* d = it.member("digest");
    if (!n || !t || !d || n->type != T::string || t->type != T::string || d->type != T::string)
      return Status(Errc::invalid_argument, "each item needs string \"name\", \"type\" and \"digest\"");
    KCACHE_TRY(ManifestItem mi, make_item(n->string, t->string, d->string));
    if (const util::JsonValue* v = it.member("value"); v && v->type == T::string) mi.value = v->string;
    out.items.push_back(std::move(mi));
  }
  return out;
}

Expected<Manifest> from_text(std::string_view text) {
  Manifest out;
  size_t lineno = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++lineno;
    if (auto h = line.find('#'); h != std::string_view::npos) line = line.substr(0, h);
    std::vector<std::string_view> tok;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
      if (j > i) tok.push_back(line.substr(i, j - i));
      i = j;
    }
    if (tok.empty()) continue;
    if (tok.size() == 2 && tok[0] == "namespace") {
      out.ns = tok[1];
    } else if (tok.size() == 3) {
      auto mi = make_item(std::string(tok[0]), tok[1], tok[2]);
      if (!mi) return Status(Errc::invalid_argument, "line " + std::to_string(lineno) + ": " + mi.error().message());
      out.items.push_back(std::move(mi).value());
    } else {
      return Status(Errc::invalid_argument,
                    "line " + std::to_string(lineno) + ": want `namespace NS` or `NAME TYPE HEXDIGEST`");
    }
  }
  return out;
}

bool by_name(const ManifestItem& a, const ManifestItem& b) { return a.name < b.name; }

}  // namespace

std::optional<ComponentType> parse_component_type(std::string_view name) noexcept {
  for (int t = 1; t <= 9; ++t) {
    auto ct = static_cast<ComponentType>(t);
    if (component_type_name(ct) == name) return ct;
  }
  return std::nullopt;
}

Expected<Manifest> parse_manifest(std::string_view text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  Expected<Manifest> m = first != std::string_view::npos && text[first] == '{' ? from_json(text) : from_text(text);
  if (!m) return m;
  std::sort(m->items.begin(), m->items.end(), by_name);
  for (size_t i = 1; i < m->items.size(); ++i)
    if (m->items[i].name == m->items[i - 1].name)
      return Status(Errc::invalid_argument, "component '" + m->items[i].name + "' appears twice");
  return m;
}

Expected<Manifest> read_manifest(const std::string& path) {
  auto text = util::read_file(path, 64 << 20);
  if (!text) return text.error();
  auto m = parse_manifest(*text);
  if (!m) return Status(m.error().code(), path + ": " + m.error().message());
  return m;
}

std::string manifest_to_json(const Manifest& m) {
  util::JsonWriter w;
  w.begin_object().field("namespace", m.ns).key("items").begin_array();
  for (const auto& it : m.items) {
    w.begin_object()
        .field("name", it.name)
        .field("type", component_type_name(it.type))
        .field("digest", it.digest.hex());
    if (it.value) w.field("value", *it.value);
    w.end_object();
  }
  return w.end_array().end_object().take();
}

std::string manifest_to_text(const Manifest& m) {
  std::string out = "namespace " + m.ns + "\n";
  for (const auto& it : m.items)
    out += it.name + " " + std::string(component_type_name(it.type)) + " " + it.digest.hex() + "\n";
  return out;
}

std::string_view manifest_change_name(ManifestChange c) noexcept {
  switch (c) {
    case ManifestChange::added:
      return "added";
    case ManifestChange::missing:
      return "missing";
    case ManifestChange::changed:
      return "changed";
  }
  return "changed";
}

std::vector<ManifestDifference> diff_manifests(const Manifest& stored, const Manifest& lookup) {
  std::vector<ManifestItem> a = stored.items, b = lookup.items;
  std::stable_sort(a.begin(), a.end(), by_name);
  std::stable_sort(b.begin(), b.end(), by_name);
  std::vector<ManifestDifference> out;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].name < b[j].name)) {
      out.push_back({a[i].name, ManifestChange::missing, a[i].digest, std::nullopt, a[i].type, std::nullopt, a[i].value,
                     std::nullopt});
      ++i;
    } else if (i == a.size() || b[j].name < a[i].name) {
      out.push_back({b[j].name, ManifestChange::added, std::nullopt, b[j].digest, std::nullopt, b[j].type, std::nullopt,
                     b[j].value});
      ++j;
    } else {
      if (a[i].type != b[j].type || a[i].digest != b[j].digest)
        out.push_back({a[i].name, ManifestChange::changed, a[i].digest, b[j].digest, a[i].type, b[j].type, a[i].value,
                       b[j].value});
      ++i;
      ++j;
    }
  }
  return out;
}

std::string shown_value(const std::optional<std::string>& value, const std::optional<Digest>& digest) {
  if (value) return *value;
  return digest ? digest->hex() : std::string();
}

std::string describe(const ManifestDifference& d) { return to_text(d); }

}  // namespace kcache

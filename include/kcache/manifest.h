// kcache/manifest.h — manifests as text and JSON, and how two differ.
//
// Every entry carries the Manifest of its key (kcache/key.h): the namespace
// and each component's name, type and digest. When a lookup misses although
// "nothing changed", print the lookup's manifest, or compare it with the
// manifest of an entry that is stored, and the component that moved is named:
//
//   auto info = KeyBuilder("mytriton/3")...finish();
//   if (!cache->get(info->key)) {
//     save(manifest_to_text(info->manifest));   // `kcache explain --manifest` reads it
//     // `earlier`: an Entry of the same kernel stored before (Entry::manifest)
//     for (const auto& d : diff_manifests(earlier.manifest(), info->manifest))
//       log(describe(d));                       // "opt: changed (stored ..., lookup ...)"
//     // or the whole report of the miss: make_miss_report (kcache/explain.h)
//   }
//
// The same two formats are read by `kcache put --manifest` and
// `kcache explain --manifest` (docs/cli.md):
//
//   JSON: {"namespace": NS, "items": [{"name": N, "type": T, "digest": HEX}]}
//         (or any object with such a "manifest" member); an item may also
//         carry its readable "value" (a string; display only)
//   text: one `namespace NS` line and one `NAME TYPE HEXDIGEST` line per
//         component; `#` starts a comment, blank lines are ignored.
//
// TYPE is a component_type_name(): bytes string u64 i64 bool map list file
// digest; a digest is 32 hex digits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache {

// The type called `name` by component_type_name ("string", "u64", ...).
std::optional<ComponentType> parse_component_type(std::string_view name) noexcept;

// Parses a manifest in either format (JSON when the first non-blank
// character is '{'). Items come back sorted by name, as KeyBuilder sorts
// them, so the result hashes to the key it describes (Manifest::key()).
// Errors (invalid_argument): malformed JSON or line, unknown type, a digest
// that is not 32 hex digits, an empty or repeated component name.
Expected<Manifest> parse_manifest(std::string_view text);
// Reads and parses a manifest file (at most 64 MiB). Errors name the path;
// a file that does not exist is not_found.
Expected<Manifest> read_manifest(const std::string& path);

// {"namespace":NS,"items":[{"name":N,"type":T,"digest":HEX},...]}, compact,
// items in the manifest's order; an item with a readable value also has
// "value":TEXT.
std::string manifest_to_json(const Manifest& m);
// The text format: "namespace NS\n" and "NAME TYPE HEX\n" per item. Names
// containing blanks or '#' do not read back from it (use JSON for those).
// Readable values are not part of the text format.
std::string manifest_to_text(const Manifest& m);

// How one component differs between a stored manifest and a lookup's: the
// one vocabulary of every explanation of a miss (kcache/explain.h).
enum class ManifestChange : uint8_t {
  added = 0,    // only the lookup has it
  missing = 1,  // only the stored manifest has it
  changed = 2,  // both have it; the digests or the types differ
};
// "added", "missing", "changed".
std::string_view manifest_change_name(ManifestChange c) noexcept;

struct ManifestDifference {
  std::string name;
  ManifestChange change = ManifestChange::changed;
  // The component's digest and type on each side; empty on the side that
  // lacks it (added: no stored, missing: no lookup).
  std::optional<Digest> stored, lookup;
  std::optional<ComponentType> stored_type, lookup_type;
  // The readable values (ManifestItem::value), where each side kept one.
  std::optional<std::string> stored_value = std::nullopt, lookup_value = std::nullopt;
  // A change of the component's type (u64 -> i64), the digests the same or not.
  bool type_changed() const noexcept { return stored_type && lookup_type && *stored_type != *lookup_type; }
  bool operator==(const ManifestDifference& o) const {
    return name == o.name && change == o.change && stored == o.stored && lookup == o.lookup &&
           stored_type == o.stored_type && lookup_type == o.lookup_type && stored_value == o.stored_value &&
           lookup_value == o.lookup_value;
  }
  bool operator!=(const ManifestDifference& o) const { return !(*this == o); }
};

// Every component that differs, ordered by name; empty when the components
// are the same. Items need not be sorted. Namespaces are not compared
// (compare stored.ns and lookup.ns directly). The only place differences
// are computed: explanations of misses (make_miss_report) take theirs from it.
std::vector<ManifestDifference> diff_manifests(const Manifest& stored, const Manifest& lookup);

// One line for people: to_text(d) of kcache/explain.h. With readable values
// on both sides: "cpu: znver3 → x86-64", "fast_math: added (true)",
// "gone: missing (1)"; else digests: "opt: changed (stored 1111...,
// lookup 3333...)", "fast_math: added (bool 5d1a...)", "k: changed (stored
// u64 11.., lookup i64 33..)".
std::string describe(const ManifestDifference& d);

// How one side of a difference reads: the readable value when kept, else
// the digest's hex; "" when that side lacks the component.
std::string shown_value(const std::optional<std::string>& value, const std::optional<Digest>& digest);

}  // namespace kcache

// kcache/explain.h — why did a lookup miss? One report, two renderings.
//
// A MissReport says which key missed (and its label), which stored entry is
// nearest to it (its key, label and age), and how each component differs
// from that entry, in one vocabulary (ManifestChange, kcache/manifest.h):
//
//   changed  both have the component, its digest (or type) differs
//   added    only the lookup has it
//   missing  only the stored entry has it
//
// with the readable values where the keys kept them (KeyBuilder's values),
// digests elsewhere. make_miss_report fills it from the lookup and the
// nearest stored manifest; to_text and to_json render it. The library's
// KCACHE_EXPLAIN log line, `kcache explain` and `kcache misses` all print
// these renderings (docs/cli.md):
//
//   MissRecord miss{info->key, info->label, info->manifest, now_ms};
//   NearestSearch found;
//   found.entry = StoredManifest{earlier.key(), earlier.meta().label,
//                                earlier.manifest(), earlier.meta().created_unix_ms};
//   MissReport r = make_miss_report(miss, found);
//   log(to_text(r, TextForm::line));
//   // miss 7eb2... "k17" (tour/1): nearest 36d1... "k17": opt: -O2 → -O3
//
// The miss journal that records a store's misses is read with
// read_miss_journal (kcache/miss_journal.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kcache/key.h"
#include "kcache/manifest.h"

namespace kcache {

// A lookup that missed: what the miss journal records of it.
struct MissRecord {
  Key key;
  std::string label;
  Manifest manifest;     // with the readable values the lookup kept
  uint64_t time_ms = 0;  // wall clock of the miss (0: unknown)
  uint32_t pid = 0;
  std::string process;  // the program's short name
};

// A stored entry's manifest and label, as a candidate for the nearest entry.
struct StoredManifest {
  Key key;
  std::string label;
  Manifest manifest;
  uint64_t created_ms = 0;   // wall clock (EntryMeta::created_unix_ms)
  uint64_t last_use_ms = 0;  // recency record (0 when unknown)
};

// What a search of the stored entries found for one lookup.
struct NearestSearch {
  std::optional<StoredManifest> entry;               // none: no candidate of the namespace
  uint64_t compared = 0;                             // candidates of the lookup's namespace
  std::map<std::string, uint64_t> other_namespaces;  // entries of other namespaces, by namespace
};

struct MissReport {
  // The lookup.
  Key key;
  std::string label;
  std::string ns;
  size_t components = 0;
  // The nearest stored entry.
  struct Nearest {
    Key key;
    std::string label;
    uint64_t age_ms = 0;      // how long before the miss it was made (0: unknown or not before)
    bool same_label = false;  // it has the lookup's (non-empty) label
  };
  std::optional<Nearest> nearest;  // none: nothing of the namespace is stored
  // Each component that differs from the nearest entry, ordered by name
  // (diff_manifests); empty without a nearest entry.
  std::vector<ManifestDifference> differences;
  uint64_t compared = 0;
  std::map<std::string, uint64_t> other_namespaces;
};

// The report of `miss` against what a search found. The differences are
// diff_manifests(found.entry->manifest, miss.manifest).
MissReport make_miss_report(const MissRecord& miss, const NearestSearch& found);

enum class TextForm : uint8_t {
  // Lines for people (`kcache explain`):
  //   compared with 2 stored entries of namespace "tour/1"
  //   nearest 36d1...: 1 of 4 components differ (label "k17", as the lookup's)
  //     (of the components either side has)
  //     opt                  changed  -O2 → -O3
  // or `no stored entry has namespace "NS" (stored namespaces: "x" x2)`.
  block,
  // One line (the KCACHE_EXPLAIN log):
  //   miss 7eb2... "k17" (tour/1): nearest 36d1... "k17": opt: -O2 → -O3
  line,
  // The part of `line` after "miss KEY "LABEL" (NS): " (`kcache misses`):
  //   nearest KEY "LABEL": DIFFS | same components (stored under another key)
  //   no earlier entry of its label; nearest of another label KEY "LABEL": DIFFS
  //   no earlier entry of namespace "NS"
  verdict,
};
std::string to_text(const MissReport& r, TextForm form = TextForm::block);
// {"key":K,"label":L,"namespace":NS,"compared":N,
//  "nearest":{"key":K2,"label":L2,"components":M,"differences":[D...],"age_ms":A} or null,
//  "other_namespaces":{NS2:N2,...}}, compact. Each D is
// {"name","change","stored","lookup"}: change "changed", "added" or
// "missing"; stored and lookup the readable value where kept, else the
// digest's hex, null on the side that lacks the component; a difference of
// types also has "stored_type" and "lookup_type".
std::string to_json(const MissReport& r);

// One difference as a line for people: "cpu: znver3 → x86-64",
// "fast_math: added (true)", "gone: missing (1)"; without values on both
// sides, digests: "opt: changed (stored 1111..., lookup 3333...)",
// "fast_math: added (bool 5d1a...)", "k: changed (stored u64 11..., lookup
// i64 33...)".
std::string to_text(const ManifestDifference& d);

// The cause a miss shares with others, for grouping them: each difference
// by name with its values where kept ("ir_opt_level 2 → 3", "ir changed",
// "fast added (true)", "gone missing"), joined by ", "; "no earlier entry of
// its label" when the lookup has a label the nearest entry lacks (a first
// compile of a module or kernel); "no earlier entry of namespace \"NS\""
// without a nearest entry; "same components as a stored entry".
std::string miss_cause(const MissReport& r);

}  // namespace kcache

// kcache tool — explain: why does a key miss? Looks the key up in every
// tier; when it is not stored, compares the lookup's manifest (from
// --manifest, else from the store's miss journal) with those of the disk
// store's entries (StoredManifests, cache/journal.h) and names the
// components that differ from the nearest one, with values where kept.
#include <algorithm>
#include <cstdint>
#include <map>

#include "cache/journal.h"
#include "cli.h"
#include "kcache/manifest.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

std::string hex_or_empty(const std::optional<Digest>& d) { return d ? d->hex() : std::string(); }

std::string type_or_empty(const std::optional<ComponentType>& t) {
  return t ? std::string(component_type_name(*t)) : std::string();
}

}  // namespace

int cmd_explain(Ctx& c) {
  std::optional<Manifest> want;
  if (const std::string* mf = c.args.get("--manifest")) {
    auto m = read_manifest(*mf);
    if (!m)
      return m.error().code() == Errc::invalid_argument ? usage_error("explain", m.error().message())
                                                        : c.fail(m.error());
    want = std::move(m).value();
    if (want->ns.empty() && want->items.empty())
      return usage_error("explain", *mf + " holds no namespace and no component");
  }
  std::optional<Key> key;
  std::string label;
  if (c.args.has("--key")) {
    key = key_flag(c);
    if (!key) return kExitUsage;
  } else if (want) {
    key = want->key();
  } else {
    return usage_error("explain", "--key HEX or --manifest FILE is required");
  }
  if (int rc = open_tiers(c, {.create = false, .remote = true, .honour_disable = false})) return rc;

  Lookup l = lookup(c, *key);
  bool stored = l.entry.has_value();
  const std::string& corrupt = l.corrupt;
  if (!stored && corrupt.empty() && l.local_fault && l.missed == 0) return report_miss(c, *key, l);
  // Without --manifest, a miss the journal recorded brings its own.
  std::string from_journal;
  if (!stored && !want && !c.store.where.path.empty()) {
    auto recs = MissJournal::read(c.store.where.path, SIZE_MAX);
    if (recs) {
      for (auto it = recs->rbegin(); it != recs->rend(); ++it) {
        if (it->key != *key) continue;
        want = it->manifest;
        label = it->label;
        from_journal = "missed at " + format_time(it->time_ms) + " in " + it->process + " (pid " +
                       std::to_string(it->pid) + "); its manifest is from the miss journal";
        break;
      }
    }
  } else if (stored) {
    label = l.entry->meta().label;
  }
  std::string note;
  if (want && want->key() != *key) note = "the manifest hashes to " + want->key().hex() + ", not to --key";

  if (stored || !want) {
    std::string why = stored ? "stored" : !corrupt.empty() ? "corrupt (" + corrupt + ")" : "not stored";
    if (stored && (!c.store.disk || l.tier != c.store.disk->name())) why += " (in " + l.tier + ")";
    if (stored && !label.empty()) why += " (label \"" + label + "\")";
    if (c.json) {
      util::JsonWriter w;
      w.begin_object().field("key", key->hex()).field("stored", stored);
      if (!corrupt.empty()) w.field("corrupt", corrupt);
      if (!note.empty()) w.field("note", note);
      if (stored) w.field("tier", l.tier);
      if (int rc = c.out(w.end_object().take() + "\n")) return rc;
      return stored ? kExitOk : kExitMiss;
    }
    std::string out = "key " + key->hex() + " is " + why + "\n";
    if (!note.empty()) out += "note: " + note + "\n";
    if (!stored)
      out +=
          "the miss journal has no record of it: pass --manifest FILE (the lookup's manifest) to compare it "
          "with what is stored\n";
    if (int rc = c.out(out)) return rc;
    return stored ? kExitOk : kExitMiss;
  }

  // Not stored: find the disk store's entry of the same namespace whose
  // manifest differs in the fewest components, first among the entries of
  // the same label (ties: the most recently made, then used).
  StoredManifests sm;
  uint64_t unreadable = 0;
  if (c.store.disk) {
    Status st = sm.load(*c.store.disk, &unreadable);
    if (!st.is_ok()) return c.fail(kExitError, "listing " + c.store.where.path + ": " + st.to_string());
  }
  Nearest near = sm.nearest(*want, label, *key);
  uint64_t compared = near.compared;
  const std::map<std::string, uint64_t>& other_ns = near.other_ns;
  std::optional<Key> best;
  std::vector<ManifestDifference> best_diff;
  std::string best_label;
  if (near.entry) {
    best = near.entry->key;
    best_diff = near.entry->differences;
    best_label = near.entry->label;
  }

  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("key", key->hex()).field("stored", false);
    if (!corrupt.empty()) w.field("corrupt", corrupt);
    if (!note.empty()) w.field("note", note);
    if (!label.empty()) w.field("label", label);
    if (!from_journal.empty()) w.field("from_journal", true);
    w.field("namespace", want->ns).field("compared", compared).field("unreadable", unreadable).key("nearest");
    if (best) {
      w.begin_object().field("key", best->hex());
      if (!best_label.empty()) w.field("label", best_label);
      w.field("components", want->items.size()).key("differences").begin_array();
      for (const auto& d : best_diff) {
        w.begin_object().field("name", d.name).field("change", change_word(d.change));
        w.key("stored");
        d.stored ? w.value(shown_value(d.stored_value, d.stored)) : w.null();
        w.key("lookup");
        d.lookup ? w.value(shown_value(d.lookup_value, d.lookup)) : w.null();
        if (d.change == ManifestChange::type_changed)
          w.field("stored_type", type_or_empty(d.stored_type)).field("lookup_type", type_or_empty(d.lookup_type));
        w.end_object();
      }
      w.end_array().end_object();
    } else {
      w.null();
    }
    w.key("other_namespaces").begin_object();
    for (const auto& [ns, n] : other_ns) w.field(ns, n);
    w.end_object();
    if (int rc = c.out(w.end_object().take() + "\n")) return rc;
    return kExitMiss;
  }

  std::string out =
      "key " + key->hex() + " is " + (corrupt.empty() ? "not stored" : "corrupt (" + corrupt + ")") + "\n";
  if (!note.empty()) out += "note: " + note + "\n";
  if (!from_journal.empty()) out += from_journal + "\n";
  if (!best) {
    out += "no stored entry has namespace \"" + want->ns + "\"";
    if (!other_ns.empty()) {
      out += " (stored namespaces:";
      for (const auto& [ns, n] : other_ns) out += " \"" + ns + "\" x" + std::to_string(n);
      out += ")";
    }
    out += "\n";
  } else {
    out += "compared with " + std::to_string(compared) + " stored entr" + (compared == 1 ? "y" : "ies") +
           " of namespace \"" + want->ns + "\"\n";
    out += "nearest " + best->hex() + ": " + std::to_string(best_diff.size()) + " of " +
           std::to_string(want->items.size()) + " components differ";
    if (!best_label.empty())
      out += " (label \"" + best_label + "\"" + (best_label == label ? ", as the lookup's" : "") + ")";
    out += "\n";
    for (const auto& d : best_diff) {
      const char* name = d.name.c_str();
      switch (d.change) {
        case ManifestChange::changed:
          if (d.stored_value && d.lookup_value)
            out += fmt("  %-20s changed  %s \u2192 %s\n", name, d.stored_value->c_str(), d.lookup_value->c_str());
          else
            out += fmt("  %-20s changed  stored %s, lookup %s\n", name, hex_or_empty(d.stored).c_str(),
                       hex_or_empty(d.lookup).c_str());
          break;
        case ManifestChange::type_changed:
          out +=
              fmt("  %-20s type     stored %s %s, lookup %s %s\n", name, type_or_empty(d.stored_type).c_str(),
                  hex_or_empty(d.stored).c_str(), type_or_empty(d.lookup_type).c_str(), hex_or_empty(d.lookup).c_str());
          break;
        case ManifestChange::added:
          out += fmt("  %-20s added    only in the lookup%s\n", name,
                     d.lookup_value ? (" (" + *d.lookup_value + ")").c_str() : "");
          break;
        case ManifestChange::removed:
          out += fmt("  %-20s missing  only in the stored entry%s\n", name,
                     d.stored_value ? (" (" + *d.stored_value + ")").c_str() : "");
          break;
      }
    }
    if (best_diff.empty()) out += "  (same manifest: the entry is stored under another key)\n";
  }
  if (int rc = c.out(out)) return rc;
  return kExitMiss;
}

}  // namespace kcache::cli

// kcache tool — explain: why does a key miss? Looks the key up in every
// tier; when it is not stored, compares the lookup's manifest (from
// --manifest, else from the store's miss journal) with those of the disk
// store's entries (StoredManifests, cache/journal.h) and prints the
// MissReport of the nearest one (kcache/explain.h): the components that
// differ, with values where kept.
#include <cstdint>
#include <optional>
#include <string>

#include "cache/journal.h"
#include "cli.h"
#include "kcache/explain.h"
#include "kcache/manifest.h"
#include "kcache/miss_journal.h"
#include "key/explain_json.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

// What explain knows of the lookup before it compares anything.
struct Subject {
  Key key;
  std::optional<MissRecord> miss;  // its manifest and label, when known
  std::string from_journal;        // how the journal knew them
  std::string note;                // --key and the manifest's own key disagree
};

// --manifest FILE, when given, into `want`. kExitOk, or the exit code after
// saying why.
int read_manifest_flag(const Ctx& c, std::optional<Manifest>& want) {
  const std::string* mf = c.args.get("--manifest");
  if (!mf) return kExitOk;
  auto m = read_manifest(*mf);
  if (!m)
    return m.error().code() == Errc::invalid_argument ? usage_error("explain", m.error().message()) : c.fail(m.error());
  if (m->ns.empty() && m->items.empty()) return usage_error("explain", *mf + " holds no namespace and no component");
  want = std::move(m).value();
  return kExitOk;
}

// --key, else the key the manifest hashes to.
int key_to_explain(const Ctx& c, const std::optional<Manifest>& want, Key& key) {
  if (c.args.has("--key")) {
    auto k = key_flag(c);
    if (!k) return kExitUsage;
    key = *k;
    return kExitOk;
  }
  if (!want) return usage_error("explain", "--key HEX or --manifest FILE is required");
  key = want->key();
  return kExitOk;
}

// The key's latest record in the store's miss journal (none when the
// journal cannot be read: explain then asks for --manifest).
std::optional<MissRecord> journaled_miss(const Ctx& c, const Key& key) {
  if (c.store.where.path.empty()) return std::nullopt;
  auto recs = read_miss_journal(c.store.where.path);
  if (!recs) return std::nullopt;
  for (auto it = recs->rbegin(); it != recs->rend(); ++it)
    if (it->key == key) return std::move(*it);
  return std::nullopt;
}

std::string journal_words(const MissRecord& r) {
  return "missed at " + format_time(r.time_ms) + " in " + r.process + " (pid " + std::to_string(r.pid) +
         "); its manifest is from the miss journal";
}

// The lookup: from --manifest (made now), else, for a key that is not
// stored, from the miss journal.
Subject the_lookup(const Ctx& c, const Key& key, std::optional<Manifest> want, bool stored) {
  Subject x;
  x.key = key;
  if (want) {
    if (want->key() != key) x.note = "the manifest hashes to " + want->key().hex() + ", not to --key";
    x.miss = MissRecord{key, "", std::move(*want), util::now_unix_ms(), 0, ""};
  } else if (!stored) {
    x.miss = journaled_miss(c, key);
    if (x.miss) x.from_journal = journal_words(*x.miss);
  }
  return x;
}

// A stored key, or one missing without a manifest to compare: nothing to
// compare. Exit 0 when stored, 1 otherwise.
int say_uncompared(const Ctx& c, const Subject& x, const Lookup& l) {
  const bool stored = l.entry.has_value();
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("key", x.key.hex()).field("stored", stored);
    if (!l.corrupt.empty()) w.field("corrupt", l.corrupt);
    if (!x.note.empty()) w.field("note", x.note);
    if (stored) w.field("tier", l.tier);
    if (int rc = c.out(w.end_object().take() + "\n")) return rc;
    return stored ? kExitOk : kExitMiss;
  }
  std::string why = stored ? "stored" : !l.corrupt.empty() ? "corrupt (" + l.corrupt + ")" : "not stored";
  if (stored && (!c.store.disk || l.tier != c.store.disk->name())) why += " (in " + l.tier + ")";
  if (stored && !l.entry->meta().label.empty()) why += " (label \"" + l.entry->meta().label + "\")";
  std::string out = "key " + x.key.hex() + " is " + why + "\n";
  if (!x.note.empty()) out += "note: " + x.note + "\n";
  if (!stored)
    out +=
        "the miss journal has no record of it: pass --manifest FILE (the lookup's manifest) to compare it "
        "with what is stored\n";
  if (int rc = c.out(out)) return rc;
  return stored ? kExitOk : kExitMiss;
}

// The report of the lookup against the disk store's entries: the one of the
// same namespace whose manifest differs in the fewest components, first
// among the entries of the same label (ties: the most recently made, then
// used). `unreadable` counts entries that could not be read.
Expected<MissReport> compare_with_store(const Ctx& c, const MissRecord& miss, uint64_t& unreadable) {
  StoredManifests sm;
  if (c.store.disk) {
    Status st = sm.load(*c.store.disk, &unreadable);
    if (!st.is_ok()) return Status(st.code(), "listing " + c.store.where.path + ": " + st.to_string());
  }
  return sm.explain(miss);
}

// The report, as text or JSON. Exit 1: the key is not stored.
int say_report(const Ctx& c, const Subject& x, const Lookup& l, const MissReport& r, uint64_t unreadable) {
  if (c.json) {
    util::JsonWriter w;
    w.begin_object();
    write_miss_report(w, r, [&](util::JsonWriter& j) {
      j.field("stored", false);
      if (!l.corrupt.empty()) j.field("corrupt", l.corrupt);
      if (!x.note.empty()) j.field("note", x.note);
      if (!x.from_journal.empty()) j.field("from_journal", true);
      j.field("unreadable", unreadable);
    });
    if (int rc = c.out(w.end_object().take() + "\n")) return rc;
    return kExitMiss;
  }
  std::string out =
      "key " + x.key.hex() + " is " + (l.corrupt.empty() ? "not stored" : "corrupt (" + l.corrupt + ")") + "\n";
  if (!x.note.empty()) out += "note: " + x.note + "\n";
  if (!x.from_journal.empty()) out += x.from_journal + "\n";
  if (int rc = c.out(out + to_text(r))) return rc;
  return kExitMiss;
}

}  // namespace

int cmd_explain(Ctx& c) {
  std::optional<Manifest> want;
  if (int rc = read_manifest_flag(c, want)) return rc;
  Key key;
  if (int rc = key_to_explain(c, want, key)) return rc;
  if (int rc = open_tiers(c, {.create = false, .remote = true, .honour_disable = false, .inspect = true})) return rc;

  Lookup l = lookup(c, key, Access::peek);
  const bool stored = l.entry.has_value();
  if (!stored && l.corrupt.empty() && l.local_fault && l.missed == 0) return report_miss(c, key, l);
  Subject x = the_lookup(c, key, std::move(want), stored);
  if (stored || !x.miss) return say_uncompared(c, x, l);

  uint64_t unreadable = 0;
  auto r = compare_with_store(c, *x.miss, unreadable);
  if (!r) return c.fail(kExitError, r.error().message());
  return say_report(c, x, l, *r, unreadable);
}

}  // namespace kcache::cli

// kcache tool — misses: the last misses of the store, from its miss journal
// (cache/journal.h), each with its explanation (the nearest entry stored
// before it, and what differs), then grouped by cause: "240 misses:
// ir_opt_level 2 → 3".
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

struct Explained {
  MissRecord rec;
  Nearest near;
  std::string cause;
};

struct Group {
  std::string ns, cause;
  uint64_t count = 0;
  uint64_t last_ms = 0;
};

}  // namespace

int cmd_misses(Ctx& c) {
  size_t limit = 1000;
  if (const std::string* l = c.args.get("--limit")) {
    auto n = util::parse_size(*l);
    if (!n || *n == 0 || l->find_first_not_of("0123456789") != std::string::npos)
      return usage_error("misses", "--limit wants a positive number, not '" + *l + "'");
    limit = static_cast<size_t>(*n);
  }
  if (int rc = open_tiers(c, {.create = false, .remote = false, .honour_disable = false})) return rc;
  auto recs = MissJournal::read(c.store.where.path, limit);
  if (!recs) return c.fail(recs.error());

  StoredManifests sm;
  if (c.store.disk && !recs->empty()) {
    Status st = sm.load(*c.store.disk);
    if (!st.is_ok()) return c.fail(kExitError, "listing " + c.store.where.path + ": " + st.to_string());
  }
  std::vector<Explained> out;
  std::map<std::pair<std::string, std::string>, Group> groups;
  for (auto& r : *recs) {
    // Compared with what was stored when it missed: the entry compiled for
    // the miss, and anything made after it, cannot be why it missed.
    Nearest n = sm.nearest(r.manifest, r.label, r.key, r.time_ms);
    std::string cause = miss_cause(n, r.manifest.ns, r.label);
    Group& g = groups[{r.manifest.ns, cause}];
    g.ns = r.manifest.ns;
    g.cause = cause;
    ++g.count;
    g.last_ms = std::max(g.last_ms, r.time_ms);
    out.push_back({std::move(r), std::move(n), std::move(cause)});
  }
  std::vector<Group> sorted;
  for (auto& [k, g] : groups) sorted.push_back(g);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Group& a, const Group& b) {
    return a.count != b.count ? a.count > b.count : a.last_ms > b.last_ms;
  });

  if (c.json) {
    util::JsonWriter w;
    w.begin_object().key("misses").begin_array();
    for (const auto& x : out) {
      w.begin_object()
          .field("key", x.rec.key.hex())
          .field("label", x.rec.label)
          .field("time_ms", x.rec.time_ms)
          .field("namespace", x.rec.manifest.ns)
          .field("pid", static_cast<uint64_t>(x.rec.pid))
          .field("process", x.rec.process)
          .field("cause", x.cause)
          .key("nearest");
      if (x.near.entry) {
        w.begin_object().field("key", x.near.entry->key.hex()).field("label", x.near.entry->label);
        w.key("differences").begin_array();
        for (const auto& d : x.near.entry->differences) {
          w.begin_object().field("name", d.name).field("change", change_word(d.change));
          w.key("stored");
          d.stored ? w.value(shown_value(d.stored_value, d.stored)) : w.null();
          w.key("lookup");
          d.lookup ? w.value(shown_value(d.lookup_value, d.lookup)) : w.null();
          w.end_object();
        }
        w.end_array().end_object();
      } else {
        w.null();
      }
      w.end_object();
    }
    w.end_array().key("groups").begin_array();
    for (const auto& g : sorted)
      w.begin_object().field("count", g.count).field("namespace", g.ns).field("cause", g.cause).end_object();
    return c.out(w.end_array().end_object().take() + "\n");
  }

  if (out.empty()) return c.out("no misses recorded in " + MissJournal::path_for(c.store.where.path) + "\n");
  std::string text;
  for (const auto& x : out) {
    text += format_time(x.rec.time_ms) + "  " + x.rec.key.hex();
    if (!x.rec.label.empty()) text += "  \"" + x.rec.label + "\"";
    text += "  " + x.rec.manifest.ns + "  " + x.rec.process + "[" + std::to_string(x.rec.pid) + "]\n";
    if (x.near.entry && !x.rec.label.empty() && !x.near.same_label) {
      // A first compile of its label: the nearest entry is another module's.
      text += "    " + x.cause + " (nearest, of another label: " + x.near.entry->key.hex() + ", " +
              std::to_string(x.near.entry->differences.size()) + " components differ)\n";
    } else if (x.near.entry) {
      text += "    nearest " + x.near.entry->key.hex();
      if (!x.near.entry->label.empty()) text += " \"" + x.near.entry->label + "\"";
      text += ": " +
              (x.near.entry->differences.empty() ? std::string("same components (stored under another key)")
                                                 : describe_all(x.near.entry->differences)) +
              "\n";
    } else {
      text += "    nothing of its namespace was stored before it\n";
    }
  }
  text += "\n" + std::to_string(out.size()) + (out.size() == 1 ? " miss" : " misses") + ", by cause:\n";
  for (const auto& g : sorted)
    text += "  " + std::to_string(g.count) + (g.count == 1 ? " miss: " : " misses: ") + g.cause + "  (" + g.ns + ")\n";
  return c.out(text);
}

}  // namespace kcache::cli

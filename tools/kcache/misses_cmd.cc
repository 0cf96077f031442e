// kcache tool — misses: the last misses of the store, from its miss journal
// (read_miss_journal, kcache/miss_journal.h), each with its MissReport
// (kcache/explain.h: the nearest entry stored before it, and what differs),
// then grouped by cause: "240 misses: ir_opt_level 2 → 3".
#include <algorithm>
#include <cstdint>
#include <map>

#include "cache/journal.h"
#include "cli.h"
#include "kcache/explain.h"
#include "kcache/miss_journal.h"
#include "key/explain_json.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

struct Explained {
  MissRecord rec;
  MissReport report;
  std::string cause;
};

struct Group {
  std::string ns, cause;
  uint64_t count = 0;
  uint64_t last_ms = 0;
};

// Each record's report, compared with what was stored when it missed: the
// entry compiled for the miss, and anything made after it, cannot be why
// it missed.
std::vector<Explained> explain_each(std::vector<MissRecord>& recs, const StoredManifests& sm) {
  std::vector<Explained> out;
  out.reserve(recs.size());
  for (auto& r : recs) {
    MissReport report = sm.explain(r, r.time_ms);
    std::string cause = miss_cause(report);
    out.push_back({std::move(r), std::move(report), std::move(cause)});
  }
  return out;
}

// The causes, most frequent first (ties: the most recent).
std::vector<Group> group_by_cause(const std::vector<Explained>& misses) {
  std::map<std::pair<std::string, std::string>, Group> groups;
  for (const auto& x : misses) {
    Group& g = groups[{x.report.ns, x.cause}];
    g.ns = x.report.ns;
    g.cause = x.cause;
    ++g.count;
    g.last_ms = std::max(g.last_ms, x.rec.time_ms);
  }
  std::vector<Group> sorted;
  for (auto& [k, g] : groups) sorted.push_back(g);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Group& a, const Group& b) {
    return a.count != b.count ? a.count > b.count : a.last_ms > b.last_ms;
  });
  return sorted;
}

std::string as_json(const std::vector<Explained>& misses, const std::vector<Group>& groups, uint64_t skipped) {
  util::JsonWriter w;
  w.begin_object().key("misses").begin_array();
  for (const auto& x : misses) {
    w.begin_object();
    write_miss_report(w, x.report, [&](util::JsonWriter& j) {
      j.field("time_ms", x.rec.time_ms)
          .field("pid", static_cast<uint64_t>(x.rec.pid))
          .field("process", x.rec.process)
          .field("cause", x.cause);
    });
    w.end_object();
  }
  w.end_array().key("groups").begin_array();
  for (const auto& g : groups)
    w.begin_object().field("count", g.count).field("namespace", g.ns).field("cause", g.cause).end_object();
  return w.end_array().field("skipped", skipped).end_object().take() + "\n";
}

std::string as_text(const std::vector<Explained>& misses, const std::vector<Group>& groups, uint64_t skipped) {
  std::string text;
  for (const auto& x : misses) {
    text += format_time(x.rec.time_ms) + "  " + x.rec.key.hex();
    if (!x.rec.label.empty()) text += "  \"" + x.rec.label + "\"";
    text += "  " + x.rec.manifest.ns + "  " + x.rec.process + "[" + std::to_string(x.rec.pid) + "]\n";
    text += "    " + to_text(x.report, TextForm::verdict) + "\n";
  }
  text += "\n" + std::to_string(misses.size()) + (misses.size() == 1 ? " miss" : " misses") + ", by cause:\n";
  for (const auto& g : groups)
    text += "  " + std::to_string(g.count) + (g.count == 1 ? " miss: " : " misses: ") + g.cause + "  (" + g.ns + ")\n";
  if (skipped) text += "(" + std::to_string(skipped) + " unreadable journal record(s) skipped)\n";
  return text;
}

}  // namespace

int cmd_misses(Ctx& c) {
  size_t limit = 1000;
  if (const std::string* l = c.args.get("--limit")) {
    auto n = util::parse_size(*l);
    if (!n || *n == 0 || l->find_first_not_of("0123456789") != std::string::npos)
      return usage_error("misses", "--limit wants a positive number, not '" + *l + "'");
    limit = static_cast<size_t>(*n);
  }
  if (int rc = open_tiers(c, {.create = false, .remote = false, .honour_disable = false, .inspect = true})) return rc;
  uint64_t skipped = 0;
  auto recs = read_miss_journal(c.store.where.path, limit, &skipped);
  if (!recs) return c.fail(recs.error());

  StoredManifests sm;
  if (c.store.disk && !recs->empty()) {
    Status st = sm.load(*c.store.disk);
    if (!st.is_ok()) return c.fail(kExitError, "listing " + c.store.where.path + ": " + st.to_string());
  }
  std::vector<Explained> misses = explain_each(*recs, sm);
  std::vector<Group> groups = group_by_cause(misses);
  if (c.json) return c.out(as_json(misses, groups, skipped));
  if (misses.empty() && !skipped) return c.out("no misses recorded in " + miss_journal_path(c.store.where.path) + "\n");
  return c.out(as_text(misses, groups, skipped));
}

}  // namespace kcache::cli

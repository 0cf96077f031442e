// kcache tool — the commands of one entry: put, get, show. They go through
// every tier (disk store, then the remote of KCACHE_REMOTE), as the library
// does: put stores in each, get and show read from the first that has it.
#include <cinttypes>
#include <cstdio>

#include "cli.h"
#include "kcache/manifest.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

// Puts e into tier t and pushes it out (a remote writes in the background:
// its failures show up in its counters once flushed).
Status put_into(Tier& t, const Entry& e) {
  TierStats before = t.stats();
  Status st = t.put(e);
  if (!st.is_ok()) return st;
  st = t.flush();
  if (!st.is_ok()) return st;
  TierStats after = t.stats();
  if (after.errors > before.errors || after.dropped > before.dropped || after.skipped > before.skipped)
    return Status(Errc::unavailable, "its write failed or was dropped");
  return Status();
}

}  // namespace

int cmd_put(Ctx& c) {
  std::optional<Manifest> manifest;
  if (const std::string* mf = c.args.get("--manifest")) {
    auto m = read_manifest(*mf);
    if (!m)
      return m.error().code() == Errc::invalid_argument ? usage_error("put", m.error().message()) : c.fail(m.error());
    manifest = std::move(m).value();
  }
  std::optional<Key> key;
  if (c.args.has("--key")) {
    key = key_flag(c);
    if (!key) return kExitUsage;
  } else if (manifest) {
    key = manifest->key();
  } else {
    return usage_error("put", "--key HEX (or --manifest FILE) is required");
  }
  if (c.args.positional.empty()) return usage_error("put", "name at least one artifact as NAME=PATH");
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& p : c.args.positional) {
    size_t eq = p.find('=');
    if (eq == std::string::npos) return usage_error("put", "'" + p + "' is not NAME=PATH");
    if (eq == 0) return usage_error("put", "'" + p + "' has an empty artifact name");
    if (eq + 1 == p.size()) return usage_error("put", "'" + p + "' has an empty path");
    files.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  EntryBuilder b(*key);
  for (auto& [name, path] : files) {
    auto data = util::read_file(path);
    if (!data) return c.fail(exit_for(data.error()), "artifact '" + name + "': " + data.error().message());
    b.add(name, std::move(data).value());
  }
  EntryMeta meta;
  meta.created_unix_ms = util::now_unix_ms();
  meta.producer = "kcache-cli";
  b.meta(meta);
  if (manifest) b.manifest(*manifest);
  auto e = b.build();
  if (!e) {
    if (e.error().code() == Errc::invalid_argument) return usage_error("put", e.error().message());
    return c.fail(e.error());
  }
  if (int rc = open_tiers(
          c, {.create = true, .remote = true, .honour_disable = true, .needs_disk = false, .reports_disk = true}))
    return rc;
  const auto& tiers = c.store.cache->tiers();
  if (tiers.empty()) return c.fail(kExitError, "not stored: " + disk_failure(c));

  std::vector<std::string> stored, failed;
  for (const auto& t : tiers) {
    Status st = put_into(*t, *e);
    if (st.is_ok()) {
      stored.emplace_back(t->name());
    } else if (st.code() == Errc::read_only) {
      failed.push_back(std::string(t->name()) + ": the cache is read-only (KCACHE_READONLY)");
    } else {
      failed.push_back(std::string(t->name()) + ": " + st.to_string());
    }
  }
  // A disk store or remote that could not be opened is a failure too: put
  // says what it could not do.
  if (!c.store.disk && c.store.options.disk_tier) failed.push_back(disk_failure(c));
  if (!c.store.remote && !c.store.options.remote_url.empty())
    failed.push_back("the remote of KCACHE_REMOTE could not be set up");
  if (!failed.empty()) {
    std::string why;
    for (const auto& f : failed) why += (why.empty() ? "" : "; ") + f;
    std::string done;
    for (const auto& s : stored) done += (done.empty() ? "" : ", ") + s;
    return c.fail(kExitError, "storing " + key->hex() + ": " + why + (done.empty() ? "" : " (stored in " + done + ")"));
  }
  if (c.json) {
    util::JsonWriter w;
    w.begin_object()
        .field("key", key->hex())
        .field("artifacts", e->artifacts().size())
        .field("payload_bytes", e->payload_size())
        .field("size", e->encoded().size())
        .key("tiers")
        .begin_array();
    for (const auto& s : stored) w.value(s);
    return c.report(w.end_array().end_object().take() + "\n");
  }
  std::string out = "stored " + key->hex() + ": " + std::to_string(e->artifacts().size()) + " artifact" +
                    (e->artifacts().size() == 1 ? "" : "s") + ", " + util::format_size(e->payload_size());
  if (stored.size() > 1) {
    out += " (in";
    for (const auto& s : stored) out += " " + s;
    out += ")";
  }
  return c.report(out + "\n");
}

int cmd_get(Ctx& c) {
  auto key = key_flag(c);
  if (!key) return kExitUsage;
  const std::string* name = c.args.get("--artifact");
  if (!name) return usage_error("get", "--artifact NAME is required");
  if (int rc = open_tiers(
          c, {.create = false, .remote = true, .honour_disable = true, .needs_disk = false, .reports_disk = true}))
    return rc;
  Lookup l = lookup(c, *key);
  if (!l.entry) return report_miss(c, *key, l);
  const Entry& e = *l.entry;
  auto data = e.artifact(*name);
  if (!data) {
    std::string have;
    for (const auto& a : e.artifacts()) have += (have.empty() ? "" : ", ") + a.name;
    return c.fail(kExitMiss, "entry " + key->hex() + " has no artifact '" + *name + "' (it has: " + have + ")");
  }
  if (const std::string* o = c.args.get("-o")) {
    Status st = write_output(*o, *data);
    if (!st.is_ok()) return c.fail(st.code() == Errc::not_found ? kExitError : exit_for(st), st.message());
    return kExitOk;
  }
  return c.out(*data);
}

int cmd_show(Ctx& c) {
  auto key = key_flag(c);
  if (!key) return kExitUsage;
  if (int rc = open_tiers(c, {.create = false,
                              .remote = true,
                              .honour_disable = false,
                              .inspect = true,
                              .needs_disk = false,
                              .reports_disk = true}))
    return rc;
  Lookup l = lookup(c, *key, Access::peek);
  if (!l.entry) return report_miss(c, *key, l);
  const Entry& e = *l.entry;
  const EntryMeta& m = e.meta();
  if (c.json) {
    util::JsonWriter w;
    w.begin_object()
        .field("key", e.key().hex())
        .field("size", e.encoded().size())
        .field("payload_bytes", e.payload_size())
        .field("compressed", e.compressed())
        .key("meta")
        .begin_object()
        .field("created_unix_ms", m.created_unix_ms)
        .field("compile_cost_us", m.compile_cost_us)
        .field("producer", m.producer)
        .end_object()
        .key("artifacts")
        .begin_array();
    for (const auto& a : e.artifacts())
      w.begin_object().field("name", a.name).field("size", a.data.size()).end_object();
    w.end_array().key("manifest").raw(manifest_to_json(e.manifest())).field("tier", l.tier);
    return c.out(w.end_object().take() + "\n");
  }
  std::string out;
  out += fmt("key           %s\n", e.key().hex().c_str());
  out += fmt("size          %s stored, %s of artifacts%s\n", util::format_size(e.encoded().size()).c_str(),
             util::format_size(e.payload_size()).c_str(), e.compressed() ? " (compressed)" : "");
  out += fmt("created       %s\n", format_time(m.created_unix_ms).c_str());
  out += fmt("compile cost  %.3f ms\n", m.compile_cost_us / 1000.0);
  out += fmt("producer      %s\n", m.producer.empty() ? "-" : m.producer.c_str());
  out += fmt("found in      %s\n", l.tier.c_str());
  out += fmt("artifacts     %zu\n", e.artifacts().size());
  for (const auto& a : e.artifacts())
    out += fmt("  %-20s %10s\n", a.name.c_str(), util::format_size(a.data.size()).c_str());
  const Manifest& man = e.manifest();
  if (man.ns.empty() && man.items.empty()) {
    out += "manifest      none\n";
  } else {
    out += fmt("manifest      namespace \"%s\", %zu component%s\n", man.ns.c_str(), man.items.size(),
               man.items.size() == 1 ? "" : "s");
    for (const auto& it : man.items)
      out += fmt("  %-20s %-7s %s\n", it.name.c_str(), std::string(component_type_name(it.type)).c_str(),
                 it.digest.hex().c_str());
  }
  return c.out(out);
}

}  // namespace kcache::cli

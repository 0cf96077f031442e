// kcache tool — `doctor`: opens every configured tier and says, one line
// each, whether it works: the disk store (and who owns it, with names), the
// remote (reachable, round trip), its secret (read, a signed value
// round-trips), each bundle (opens, signed by a trusted key). Exit 3 when
// something configured does not work. Also the remote probe that `stats`
// shows.
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli.h"
#include "kcache/bundle.h"
#include "lease/table_layout.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

RemoteProbe probe_remote(Tier& remote) {
  RemoteProbe p;
  // A key nobody stores: a miss costs the server one GET, and a peek counts
  // nothing.
  Key k = *Digest::from_hex(fmt("%016llx%016llx", static_cast<unsigned long long>(util::random_u64()),
                                static_cast<unsigned long long>(util::random_u64())));
  uint64_t t0 = util::now_mono_us();
  auto r = remote.get(k, Access::peek);
  p.rtt_us = util::now_mono_us() - t0;
  p.ok = r.has_value();
  if (!p.ok) p.error = r.error().to_string();
  return p;
}

namespace {

struct Check {
  std::string part;  // "store", "remote", "secret", "bundle", "settings"
  bool ok = true;
  std::string detail;
};

std::string owner_text(const struct stat& st) {
  return "owner " + util::user_label(st.st_uid) + ", group " + util::group_label(st.st_gid) + ", mode " +
         fmt("%04o", static_cast<unsigned>(st.st_mode & 07777));
}

Check check_store(const Ctx& c) {
  const Opened& s = c.store;
  Check ch{"store", true, ""};
  const std::string where = s.where.path + " (" + std::string(engine_name(s.where.engine)) + ")";
  if (!s.options.disk_tier) return {"store", true, "none configured (disk 0)"};
  if (!s.disk_refused.empty()) return {"store", false, s.disk_refused};
  struct stat st;
  if (!s.disk) {
    if (::stat(s.where.dir.c_str(), &st) == 0 && ::access(s.where.dir.c_str(), W_OK) != 0)
      return {"store", false,
              where + ": not created yet, and " + s.where.dir + " is not writable (" + owner_text(st) + ")"};
    return {"store", true, where + ": not created yet (the first put creates it)"};
  }
  if (::stat(s.where.path.c_str(), &st) != 0)
    return {"store", false, where + ": " + util::errno_status(errno, "stat").to_string()};
  TierStats t = s.disk->stats();
  ch.detail = where + ": " + entries_word(t.entries) + ", " + util::format_size(t.bytes) + "; " + owner_text(st);
  if (::access(s.where.path.c_str(), W_OK) != 0) {
    ch.ok = s.options.read_only;
    ch.detail += s.options.read_only ? "; read-only (KCACHE_READONLY)" : "; not writable by this user";
  }
  return ch;
}

// Cross-process single-flight of an LMDB store, a line only while its
// lease table is damaged (the files engine's lease files need no check:
// each is made afresh when stale).
void check_leases(const Ctx& c, std::vector<Check>* out) {
  const Opened& s = c.store;
  if (!s.disk || s.where.engine != Engine::lmdb) return;
  Status st = lease::table::check(s.where.path, /*fix=*/false);
  if (st.is_ok()) return;  // said only while degraded
  out->push_back({"leases", false,
                  "single-flight across processes is degraded: " + st.message() +
                      (st.code() == Errc::corrupt ? " (kcache verify --fix repairs it)" : "")});
}

// The remote and, when one is configured, its secret.
void check_remote(const Ctx& c, std::vector<Check>* out) {
  const Opened& s = c.store;
  const std::string& secret = s.options.remote_secret_file;
  if (s.options.remote_url.empty()) {
    if (!secret.empty()) out->push_back({"secret", false, secret + " is set but no remote is"});
    return;
  }
  if (!s.remote) {
    out->push_back({"remote", false, "not set up: " + s.remote_error.to_string()});
    return;
  }
  RemoteProbe p = probe_remote(*s.remote);
  if (!p.ok) {
    out->push_back({"remote", false, std::string(s.remote->name()) + ": unreachable: " + p.error});
    if (!secret.empty()) out->push_back({"secret", false, secret + ": not checked (the remote is unreachable)"});
    return;
  }
  out->push_back({"remote", true,
                  std::string(s.remote->name()) + ": reachable, round trip " +
                      fmt("%.2f ms", static_cast<double>(p.rtt_us) / 1000.0)});
  if (secret.empty()) {
    out->push_back({"secret", true, "none configured: remote values are not signed"});
    return;
  }
  // The tier opened, so the secret was read. A value signed with it must
  // come back and verify.
  if (s.options.read_only) {
    out->push_back({"secret", true, secret + ": read (not probed: read-only)"});
    return;
  }
  Key k = *Digest::from_hex(fmt("%016llx%016llx", static_cast<unsigned long long>(util::random_u64()),
                                static_cast<unsigned long long>(util::random_u64())));
  EntryBuilder b(k);
  b.add("probe", "kcache doctor");
  auto e = b.build();
  Status st = e ? s.remote->put(*e) : e.error();
  if (st.is_ok()) st = s.remote->flush();
  auto back = st.is_ok() ? s.remote->get(k, Access::peek) : Expected<std::optional<Entry>>(st);
  (void)s.remote->remove(k);
  (void)s.remote->flush();
  if (back && back->has_value())
    out->push_back({"secret", true, secret + ": a value signed with it round-trips"});
  else
    out->push_back({"secret", false,
                    secret + ": a signed probe value did not come back" +
                        (back ? std::string(" (the write was dropped or refused)") : ": " + back.error().to_string())});
}

void check_bundles(const Ctx& c, std::vector<Check>* out) {
  const auto& b = c.store.options.bundles;
  for (const auto& f : b.files) {
    auto info = bundle_info(f, b.trusted_keys);
    if (!info) {
      out->push_back({"bundle", false, f + ": " + info.error().to_string()});
      continue;
    }
    std::string sig = !info->is_signed ? "unsigned"
                                       : "signed by " + info->signer.substr(0, 16) +
                                             (info->trusted ? " (trusted)" : " (no trusted keys configured)");
    out->push_back({"bundle", true, f + ": " + entries_word(info->entries) + ", " + sig});
  }
  if (b.files.empty() && !b.trusted_keys.empty())
    out->push_back({"bundle", true, "trusted keys configured, no bundle mounted"});
}

}  // namespace

int cmd_doctor(Ctx& c) {
  // Opened as a command that looks: nothing created, no counter changed;
  // the store is reported here, not refused by open_tiers.
  if (int rc = open_tiers(c, {.create = false,
                              .remote = true,
                              .honour_disable = false,
                              .inspect = true,
                              .needs_disk = false,
                              .reports_disk = true}))
    return rc;
  std::vector<Check> checks;
  checks.push_back(check_store(c));
  check_leases(c, &checks);
  check_remote(c, &checks);
  check_bundles(c, &checks);
  bool ok = true;
  for (const auto& ch : checks) ok = ok && ch.ok;
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("ok", ok).key("checks").begin_array();
    for (const auto& ch : checks)
      w.begin_object().field("part", ch.part).field("ok", ch.ok).field("detail", ch.detail).end_object();
    if (int rc = c.out(w.end_array().end_object().take() + "\n")) return rc;
  } else {
    std::string text;
    for (const auto& ch : checks)
      text += fmt("%-4s %-7s %s\n", ch.ok ? "ok" : "FAIL", ch.part.c_str(), ch.detail.c_str());
    if (int rc = c.out(text)) return rc;
  }
  if (ok) return kExitOk;
  size_t bad = 0;
  for (const auto& ch : checks) bad += ch.ok ? 0 : 1;
  return c.fail(kExitError, std::to_string(bad) + (bad == 1 ? " part does" : " parts do") + " not work");
}

}  // namespace kcache::cli

// kcache tool — `doctor`: opens every configured tier and says, one line
// each, whether it works: the config files (a line that sets nothing, a
// file not read), the disk store (and who owns it, with names; one not
// created yet judged by the rules its first put applies), the remote
// (reachable, round trip), its secret (read, a signed value round-trips;
// none is a warning: anyone who can write to the server could hand out
// code), each bundle (opens, signed by a trusted key). Exit 3 when
// something configured does not work. Also the remote probe that `stats`
// shows.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli.h"
#include "kcache/bundle.h"
#include "lease/table_layout.h"
#include "tier/core/folder_check.h"
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
  std::string part;  // "config", "store", "leases", "remote", "secret", "bundle"
  bool ok = true;
  std::string detail;
  bool warn = false;  // works, but not as it should (WARN; exit 0)
};

std::string owner_text(const struct stat& st) {
  return "owner " + util::user_label(st.st_uid) + ", group " + util::group_label(st.st_gid) + ", mode " +
         fmt("%04o", static_cast<unsigned>(st.st_mode & 07777));
}

// The config files: a line that sets nothing is a warning; a file that is
// not read fails (every other command refuses to run with it).
void check_config(const Ctx& c, std::vector<Check>* out) {
  for (const auto& p : c.store.setting_problems) {
    if (p.code() == Errc::unavailable)
      out->push_back({"config", false, p.message()});
    else
      out->push_back({"config", true, p.message(), true});
  }
}

// A store not created yet, judged as its first put will judge it
// (open_disk_store): the folders that are missing are made by this user
// (0700, or 02770 for a shared group), then the store's folder and those
// above it must pass check_store_folders, and the folder must be writable.
// So the nearest folder that exists already decides.
Check check_new_store(const Ctx& c, const std::string& where) {
  const Opened& s = c.store;
  std::string existing = s.where.dir;
  struct stat st;
  while (::stat(existing.c_str(), &st) != 0) {
    size_t slash = existing.rfind('/');
    if (slash == std::string::npos) return {"store", false, where + ": not created yet, and no folder above it exists"};
    existing = slash == 0 ? std::string("/") : existing.substr(0, slash);
  }
  auto trust = util::shared_group_trust(s.options.shared_group);
  if (!trust) return {"store", false, where + ": not created yet, and " + trust.error().message()};
  const std::string refused = where + ": not created yet, and the first put would be refused: ";
  if (Status f = check_store_folders(existing, *trust); !f.is_ok()) return {"store", false, refused + f.message()};
  if (::access(existing.c_str(), W_OK) != 0)
    return {"store", false, refused + existing + " is not writable by this user (" + owner_text(st) + ")"};
  return {"store", true, where + ": not created yet (the first put creates it)"};
}

Check check_store(const Ctx& c) {
  const Opened& s = c.store;
  Check ch{"store", true, ""};
  const std::string where = s.where.path + " (" + std::string(engine_name(s.where.engine)) + ")";
  if (!s.options.disk_tier) return {"store", true, "none configured (disk 0)"};
  if (!s.disk_refused.empty()) return {"store", false, s.disk_refused};
  struct stat st;
  if (!s.disk) return check_new_store(c, where);
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
    // Integrations load what the remote hands out as code (a cubin, an
    // object file, an executable).
    out->push_back({"secret", true,
                    "none configured: remote values are not signed, so anyone who can write to the server can "
                    "hand out code to every host that loads it (set KCACHE_REMOTE_SECRET_FILE)",
                    true});
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

namespace {

std::string env_or(const char* var, const std::string& otherwise) {
  std::string v = util::getenv_str(var);
  return v.empty() ? otherwise : v;
}

// `doctor --hosts`: the store each host uses here (README, "Which store
// each host uses"). A dir set by a config file or KCACHE_DIR is every
// host's; else each host has its own default beside its own cache.
int print_hosts(Ctx& c) {
  Options o;
  AppliedSettings applied;
  if (int rc = settings(c, &o, &applied)) return rc;
  struct Row {
    std::string host, store, why;
  };
  std::vector<Row> rows;
  auto it = applied.origin.find("dir");
  const bool everyone = it != applied.origin.end() && it->second.rfind("command line", 0) != 0;
  const std::string lib = everyone ? o.dir : Options::default_dir();
  const std::string lib_why = everyone ? it->second : "default";
  rows.push_back({"library", lib, lib_why + "; C++, C, this tool, kcache.Cache(), kcache.llvmlite, kcache.numba"});
  if (everyone) {
    for (const char* h : {"triton", "jax", "warp", "torch", "wave"}) rows.push_back({h, lib, lib_why});
  } else {
    const std::string home = util::getenv_str("HOME");
    std::string triton = util::getenv_str("TRITON_CACHE_DIR");
    std::string triton_why = "TRITON_CACHE_DIR";
    if (triton.empty()) {
      triton = env_or("TRITON_HOME", home) + "/.triton/cache";
      triton_why = util::getenv_str("TRITON_HOME").empty() ? "Triton's default cache" : "TRITON_HOME";
    }
    rows.push_back({"triton", triton + "/kcache", triton_why});
    std::string jax = util::getenv_str("JAX_COMPILATION_CACHE_DIR");
    rows.push_back({"jax", jax.empty() ? lib : jax + "/kcache",
                    jax.empty() ? "no JAX_COMPILATION_CACHE_DIR (a jax_compilation_cache_dir the program sets "
                                  "puts it in DIR/kcache)"
                                : "JAX_COMPILATION_CACHE_DIR"});
    std::string warp = util::getenv_str("WARP_CACHE_PATH");
    std::string warp_why = "WARP_CACHE_PATH, after wp.init()";
    if (warp.empty()) {
      warp = env_or("XDG_CACHE_HOME", home + "/.cache") + "/warp";
      warp_why = "Warp's default cache, after wp.init()";
    }
    rows.push_back({"warp", warp + "/VERSION/kcache", warp_why + "; before it: " + lib});
    // Inductor's cache folder: TORCHINDUCTOR_CACHE_DIR, else
    // <tempfile.gettempdir()>/torchinductor_<getpass.getuser()>.
    std::string inductor = util::getenv_str("TORCHINDUCTOR_CACHE_DIR");
    std::string inductor_why = "TORCHINDUCTOR_CACHE_DIR";
    if (inductor.empty()) {
      std::string user;
      for (const char* v : {"LOGNAME", "USER", "LNAME", "USERNAME"})
        if (user.empty()) user = util::getenv_str(v);
      if (user.empty()) {
        const passwd* pw = getpwuid(getuid());
        user = pw != nullptr ? pw->pw_name : "uid_" + std::to_string(getuid());
      }
      inductor = env_or("TMPDIR", "/tmp") + "/torchinductor_" + user;
      inductor_why = "Inductor's default cache";
    }
    rows.push_back({"torch", inductor + "/kcache", inductor_why});
    // Wave's cache folder: WAVE_CACHE_DIR, else ~/.wave.
    std::string wave = util::getenv_str("WAVE_CACHE_DIR");
    const bool wave_env = !wave.empty();
    if (!wave_env) wave = home + "/.wave";
    rows.push_back({"wave", wave + "/kcache", wave_env ? "WAVE_CACHE_DIR" : "Wave's default cache"});
  }
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().key("hosts").begin_array();
    for (const auto& r : rows)
      w.begin_object().field("host", r.host).field("store", r.store).field("why", r.why).end_object();
    return c.out(w.end_array().end_object().take() + "\n");
  }
  std::string text;
  for (const auto& r : rows) text += fmt("%-8s %s (%s)\n", r.host.c_str(), r.store.c_str(), r.why.c_str());
  return c.out(text);
}

}  // namespace

int cmd_doctor(Ctx& c) {
  if (c.args.has("--hosts")) return print_hosts(c);
  // Opened as a command that looks: nothing created, no counter changed;
  // the store is reported here, not refused by open_tiers.
  if (int rc = open_tiers(c, {.create = false,
                              .remote = true,
                              .honour_disable = false,
                              .inspect = true,
                              .needs_disk = false,
                              .reports_disk = true,
                              .reports_all = true}))
    return rc;
  std::vector<Check> checks;
  check_config(c, &checks);
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
      w.begin_object()
          .field("part", ch.part)
          .field("ok", ch.ok)
          .field("warning", ch.warn)
          .field("detail", ch.detail)
          .end_object();
    if (int rc = c.out(w.end_array().end_object().take() + "\n")) return rc;
  } else {
    std::string text;
    for (const auto& ch : checks)
      text += fmt("%-4s %-7s %s\n", !ch.ok ? "FAIL" : ch.warn ? "WARN" : "ok", ch.part.c_str(), ch.detail.c_str());
    if (int rc = c.out(text)) return rc;
  }
  if (ok) return kExitOk;
  size_t bad = 0;
  for (const auto& ch : checks) bad += ch.ok ? 0 : 1;
  return c.fail(kExitError, std::to_string(bad) + (bad == 1 ? " part does" : " parts do") + " not work");
}

}  // namespace kcache::cli

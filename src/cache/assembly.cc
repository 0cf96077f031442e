// The one assembly of a cache's tiers from Options (cache/assembly.h):
// memory, the disk store with its leases, and the remote chosen by its URL
// scheme. Cache::open, the C ABI and the `kcache` tool all come here.
#include "cache/assembly.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>

#include "kcache/bundle.h"
#include "lease/table_layout.h"
#include "tier/bundle/bundle_reader.h"
#include "tier/core/folder_check.h"
#include "util/util.h"
#if KCACHE_HAVE_REDIS
#include "kcache/redis.h"
#endif

namespace kcache {

namespace {

#if KCACHE_HAVE_REDIS
Expected<OpenedRemote> open_redis(const std::string& url, const std::string& secret) {
  RedisTierOptions o;
  o.secret = secret;
  KCACHE_TRY(Remote r, make_redis_remote(url, o));
  OpenedRemote opened{r.tier, nullptr};
  if (r.leases)
    opened.leases = [remote = std::move(r.leases)](std::shared_ptr<Leases> local) {
      return make_remote_leases(remote, std::move(local));
    };
  return opened;
}
#endif

constexpr std::array kSchemes = {
#if KCACHE_HAVE_REDIS
    RemoteScheme{"redis", open_redis}, RemoteScheme{"redis+cluster", open_redis},
#endif
    RemoteScheme{"", nullptr},  // keeps the table non-empty in every build
};

}  // namespace

std::span<const RemoteScheme> remote_schemes() noexcept {
  return std::span<const RemoteScheme>(kSchemes.data(), kSchemes.size() - 1);
}

const RemoteScheme* find_remote_scheme(std::string_view url) noexcept {
  auto sep = url.find("://");
  if (sep == std::string_view::npos) return nullptr;
  std::string_view scheme = url.substr(0, sep);
  for (const auto& s : remote_schemes())
    if (s.scheme == scheme) return &s;
  return nullptr;
}

Expected<std::string> read_secret_file(const std::string& path) {
  auto s = util::read_file(path, 1 << 20);
  if (!s) return Status(s.error().code(), "remote secret file: " + s.error().message());
  std::string secret = std::move(s).value();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return Status(Errc::invalid_argument, "remote secret file " + path + " is empty");
  return secret;
}

Expected<OpenedRemote> open_remote(const std::string& url, const std::string& secret_file) {
  const RemoteScheme* scheme = find_remote_scheme(url);
  if (!scheme) {
    std::string known;
    for (const auto& s : remote_schemes()) known += (known.empty() ? "" : ", ") + std::string(s.scheme) + "://";
    // Only the scheme is named: the rest of the URL may hold a password.
    auto sep = url.find("://");
    std::string named = sep == std::string::npos ? "no scheme" : "scheme '" + url.substr(0, sep) + "://'";
    return Status(Errc::invalid_argument, "remote URL has " + named + ", not a known one (built in: " +
                                              (known.empty() ? std::string("none") : known) + ")");
  }
  std::string secret;
  if (!secret_file.empty()) {
    auto s = read_secret_file(secret_file);
    if (!s) return std::move(s).error();
    secret = std::move(s).value();
  }
  return scheme->open(url, secret);
}

namespace {

#if KCACHE_HAVE_LMDB
constexpr auto kOpenLmdb = +[](const std::string& path, const DiskTierOptions& o) { return open_lmdb_tier(path, o); };
#else
constexpr auto kOpenLmdb = +[](const std::string&, const DiskTierOptions&) -> Expected<std::shared_ptr<Tier> > {
  return Status(Errc::unavailable, "this kcache was built without the lmdb engine");
};
#endif

std::vector<std::string> lmdb_paths(const std::string& path) {
  return {path + "/data.mdb", path + "/lock.mdb", path + "/" + lease::table::kFileName, path + ".quarantine-lock"};
}

std::vector<std::string> files_paths(const std::string& path) {
  std::vector<std::string> p;
  for (const char* f : {"/tmp", "/stats", "/leases", "/evict.lock"}) p.push_back(path + f);
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 256; ++i) p.push_back(path + "/" + hex[i >> 4] + hex[i & 15]);
  return p;
}

// In Engine's order.
const std::array kEngines = {
    // A local file system: the lease table beside the store.
    EngineInfo{Engine::lmdb, "lmdb", KCACHE_HAVE_LMDB != 0, kOpenLmdb,
               [](const std::string& path, const DiskTierOptions& o) { return open_table_leases(path, o.env); },
               lmdb_paths},
    // Perhaps NFS: lease files, no locks.
    EngineInfo{Engine::files, "files", true,
               [](const std::string& path, const DiskTierOptions& o) { return open_files_tier(path, o); },
               [](const std::string& path, const DiskTierOptions& o) { return open_file_leases(path, o.env); },
               files_paths},
};

// The files and folders of a store that decide what it hands out.
std::vector<std::string> store_paths(const DiskStore& d) {
  std::vector<std::string> p{d.dir, d.path};
  for (auto& f : engine_info(d.engine).owned_paths(d.path)) p.push_back(std::move(f));
  return p;
}

bool exists(Env& env, const std::string& path) {
  struct stat st;
  return env.stat(path, &st) == 0;
}

// Ok when the folders above the store (check_store_folders) and every
// existing path of the store are trusted.
Status check_store(const DiskStore& d, const util::StoreTrust& trust, Env& env) {
  Status folders = check_store_folders(exists(env, d.path) ? d.path : d.dir, trust, env);
  if (!folders.is_ok() && folders.code() != Errc::not_found) return folders;
  for (const auto& p : store_paths(d)) {
    Status st = util::check_trusted(p, trust, env);
    if (!st.is_ok() && st.code() != Errc::not_found) return st;
  }
  return Status();
}

}  // namespace

std::span<const EngineInfo> engines() noexcept { return kEngines; }

const EngineInfo& engine_info(Engine e) noexcept {
  for (const auto& i : kEngines)
    if (i.engine == e) return i;
  return kEngines[0];
}

namespace {

// Whether this cache takes part in cross-process single-flight: the disk
// store's leases and the remote's both follow it.
bool takes_leases(const Options& o) { return o.process_single_flight && !o.read_only && !o.disabled; }

}  // namespace

DiskStoreSpec DiskStoreSpec::from(const Options& options) {
  DiskStoreSpec s;
  s.dir = options.dir.empty() ? Options::default_dir() : options.dir;
  s.engine = options.engine.value_or(default_engine());
  s.tier = options.disk;
  if (!s.tier.env) s.tier.env = options.env;
  s.shared_group = options.shared_group;
  s.create = options.create_dir;
  s.read_only = options.read_only;
  s.leases = takes_leases(options);
  return s;
}

std::string DiskStoreSpec::path() const {
  return dir.empty() ? std::string() : dir + "/" + std::string(engine_info(engine).name);
}

DiskStore disk_store_location(const Options& options) {
  DiskStoreSpec spec = DiskStoreSpec::from(options);
  DiskStore d;
  d.engine = spec.engine;
  d.dir = spec.dir;
  d.path = spec.path();
  return d;
}

Expected<DiskStore> open_disk_store(const DiskStoreSpec& spec) {
  const EngineInfo& engine = engine_info(spec.engine);
  if (!engine.built)
    return Status(Errc::unavailable, "this kcache was built without the " + std::string(engine.name) + " engine");
  if (spec.dir.empty()) return Status(Errc::unavailable, "no cache folder (HOME and XDG_CACHE_HOME unset)");
  // No file of the store may take a closed descriptor 0, 1 or 2.
  util::reserve_std_fds();
  DiskStore d;
  d.engine = spec.engine;
  d.dir = spec.dir;
  d.path = spec.path();
  KCACHE_TRY(util::StoreTrust trust, util::shared_group_trust(spec.shared_group));
  Env& env = Env::or_posix(spec.tier.env);
  const unsigned dir_mode = trust.shared ? 02770 : 0700;
  // A read-only cache makes nothing: not the folder, not the store (a
  // read-only mount, or a shipped store another user owns, opens as it is).
  if (spec.create && !spec.read_only) {
    const bool fresh = !exists(env, d.dir);
    KCACHE_RETURN_IF_ERROR(util::make_dirs(d.dir, dir_mode, env));
    if (fresh) util::share_with_group(d.dir, trust);
    KCACHE_RETURN_IF_ERROR(check_store(d, trust, env));
    if (env.accessat(AT_FDCWD, d.dir, W_OK) != 0) return util::errno_status(errno, d.dir);
    // The engine folder is made here, so the engines find it shared (or
    // not) and make what they create inside to match.
    if (!exists(env, d.path)) {
      KCACHE_RETURN_IF_ERROR(util::make_dirs(d.path, dir_mode, env));
      util::share_with_group(d.path, trust);
    }
  } else {
    if (!exists(env, d.path)) return Status(Errc::not_found, "no store at " + d.path);
    KCACHE_RETURN_IF_ERROR(check_store(d, trust, env));
  }
  DiskTierOptions tier_options = spec.tier;
  tier_options.read_only = tier_options.read_only || spec.read_only;
  KCACHE_TRY(d.tier, engine.open_tier(d.path, tier_options));
  // Once more, now that the engine has made its files: LMDB's files get the
  // group's write here, since LMDB makes them for this user only.
  if (trust.shared && !spec.read_only)
    for (const auto& p : store_paths(d)) util::share_with_group(p, trust);
  KCACHE_RETURN_IF_ERROR(check_store(d, trust, env));
  // The engine writes nothing of its own; the wrapper refuses the writes
  // others ask for and says "(ro)" in the tier's name.
  if (spec.read_only) d.tier = make_read_only(std::move(d.tier));
  if (spec.leases) {
    auto l = engine.open_leases(d.path, spec.tier);
    if (l)
      d.leases = std::move(l).value();
    else
      KCACHE_LOG(LogLevel::warn, "no cross-process single-flight: %s", l.error().to_string().c_str());
  }
  return d;
}

Assembly assemble(const Options& options) {
  Assembly a;
  if (options.disabled) return a;
  // memory_bytes 0: no memory tier (Options::memory_bytes).
  if (options.memory_tier && options.memory_bytes > 0) {
    MemoryTierOptions mo;
    mo.max_bytes = options.memory_bytes;
    a.tiers.push_back(make_memory_tier(mo));
  }
  // Shipped bundles: read-only, after memory and before the stores. A
  // refused bundle (damaged, or not signed by a trusted key) is left out.
  for (const auto& f : options.bundles.files) {
    auto b = bundle::open_file(f, options.bundles.trusted_keys, options.env);
    if (b) {
      a.tiers.push_back(bundle::make_tier(std::move(b).value()));
    } else {
      a.bundle_errors.push_back(b.error());
      KCACHE_LOG(LogLevel::warn, "%s (left out)", b.error().to_string().c_str());
    }
  }
  if (options.disk_tier) {
    auto disk = open_disk_store(DiskStoreSpec::from(options));
    if (disk) {
      a.tiers.push_back(disk->tier);
      a.leases = disk->leases;
      a.disk = std::move(disk).value();
    } else {
      a.disk_error = disk.error();
      if (!(disk.error().code() == Errc::not_found && !options.create_dir))
        KCACHE_LOG(LogLevel::warn, "running without a disk tier: %s", disk.error().to_string().c_str());
    }
  }
  if (!options.remote_url.empty()) {
    auto remote = open_remote(options.remote_url, options.remote_secret_file);
    if (remote) {
      a.remote = remote->tier;
      a.tiers.push_back(a.remote);
      // Machines sharing the remote also share single-flight through it.
      if (takes_leases(options) && remote->leases) a.leases = remote->leases(std::move(a.leases));
    } else {
      a.remote_error = remote.error();
      KCACHE_LOG(LogLevel::warn, "running without the remote tier: %s", remote.error().to_string().c_str());
    }
  }
  return a;
}

}  // namespace kcache

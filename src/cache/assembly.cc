// The one assembly of a cache's tiers from Options (kcache/assembly.h):
// memory, the disk store with its leases, and the remote chosen by its URL
// scheme. Cache::open, the C ABI and the `kcache` tool all come here.
#include "kcache/assembly.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>

#include "kcache/bundle.h"
#include "lease/table_layout.h"
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

// The files and folders of a store that decide what it hands out.
std::vector<std::string> store_paths(const DiskStore& d) {
  std::vector<std::string> p{d.dir, d.path};
  switch (d.engine) {
    case Engine::lmdb:
      for (const char* f : {"/data.mdb", "/lock.mdb"}) p.push_back(d.path + f);
      p.push_back(d.path + "/" + lease::table::kFileName);
      p.push_back(d.path + ".quarantine-lock");
      break;
    case Engine::files: {
      for (const char* f : {"/tmp", "/stats", "/leases", "/evict.lease"}) p.push_back(d.path + f);
      static const char hex[] = "0123456789abcdef";
      for (int i = 0; i < 256; ++i) p.push_back(d.path + "/" + hex[i >> 4] + hex[i & 15]);
      break;
    }
  }
  return p;
}

// Ok when every existing path of the store is trusted.
Status check_store(const DiskStore& d, const util::StoreTrust& trust) {
  for (const auto& p : store_paths(d)) {
    Status st = util::check_trusted(p, trust);
    if (!st.is_ok() && st.code() != Errc::not_found) return st;
  }
  return Status();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

DiskStore disk_store_location(const Options& options) {
  DiskStore d;
  d.engine = options.engine.value_or(default_engine());
  d.dir = options.dir.empty() ? Options::default_dir() : options.dir;
  if (!d.dir.empty()) d.path = d.dir + "/" + std::string(engine_name(d.engine));
  return d;
}

Expected<DiskStore> open_disk_store(const std::string& dir, Engine engine, const DiskTierOptions& options, bool leases,
                                    bool create, const std::string& shared_group) {
  if (!engine_built(engine))
    return Status(Errc::unavailable,
                  "this kcache was built without the " + std::string(engine_name(engine)) + " engine");
  if (dir.empty()) return Status(Errc::unavailable, "no cache folder (HOME and XDG_CACHE_HOME unset)");
  DiskStore d;
  d.engine = engine;
  d.dir = dir;
  d.path = dir + "/" + std::string(engine_name(engine));
  KCACHE_TRY(util::StoreTrust trust, util::shared_group_trust(shared_group));
  const unsigned dir_mode = trust.shared ? 02770 : 0700;
  if (create) {
    const bool fresh = !exists(dir);
    KCACHE_RETURN_IF_ERROR(util::make_dirs(dir, dir_mode));
    if (fresh) util::share_with_group(dir, trust);
    KCACHE_RETURN_IF_ERROR(check_store(d, trust));
    if (::access(dir.c_str(), W_OK) != 0) return util::errno_status(errno, dir);
    // The engine folder is made here, so the engines find it shared (or
    // not) and make what they create inside to match.
    if (!exists(d.path)) {
      KCACHE_RETURN_IF_ERROR(util::make_dirs(d.path, dir_mode));
      util::share_with_group(d.path, trust);
    }
  } else {
    if (!exists(d.path)) return Status(Errc::not_found, "no store at " + d.path);
    KCACHE_RETURN_IF_ERROR(check_store(d, trust));
  }
  Expected<std::shared_ptr<Tier>> tier = Status(Errc::unavailable, "no engine");
  switch (engine) {
    case Engine::files:
      tier = open_files_tier(d.path, options);
      break;
    case Engine::lmdb:
#if KCACHE_HAVE_LMDB
      tier = open_lmdb_tier(d.path, options);
#endif
      break;
  }
  if (!tier) return std::move(tier).error();
  // Once more, now that the engine has made its files: LMDB's files get the
  // group's write here, since LMDB makes them for this user only.
  if (trust.shared)
    for (const auto& p : store_paths(d)) util::share_with_group(p, trust);
  KCACHE_RETURN_IF_ERROR(check_store(d, trust));
  d.tier = std::move(tier).value();
  if (leases) {
    auto l = open_leases(engine, d.path);
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
  const bool coordinate = options.process_single_flight && !options.read_only;
  if (options.memory_tier) {
    MemoryTierOptions mo;
    mo.max_bytes = options.memory_bytes;
    a.tiers.push_back(make_memory_tier(mo));
  }
  // Shipped bundles: read-only, after memory and before the stores. A
  // refused bundle (damaged, or not signed by a trusted key) is left out.
  for (const auto& f : options.bundles.files) {
    auto b = open_bundle(f, options.bundles.trusted_keys);
    if (b)
      a.tiers.push_back(std::move(b).value());
    else
      KCACHE_LOG(LogLevel::warn, "%s (left out)", b.error().to_string().c_str());
  }
  if (options.disk_tier) {
    DiskStore where = disk_store_location(options);
    auto disk =
        open_disk_store(where.dir, where.engine, options.disk, coordinate, options.create_dir, options.shared_group);
    if (disk) {
      a.tiers.push_back(disk->tier);
      a.leases = disk->leases;
      a.disk = std::move(disk).value();
    } else if (!(disk.error().code() == Errc::not_found && !options.create_dir)) {
      KCACHE_LOG(LogLevel::warn, "running without a disk tier: %s", disk.error().to_string().c_str());
    }
  }
  if (!options.remote_url.empty()) {
    auto remote = open_remote(options.remote_url, options.remote_secret_file);
    if (remote) {
      a.remote = remote->tier;
      a.tiers.push_back(a.remote);
      // Machines sharing the remote also share single-flight through it.
      if (coordinate && remote->leases) a.leases = remote->leases(std::move(a.leases));
    } else {
      KCACHE_LOG(LogLevel::warn, "running without the remote tier: %s", remote.error().to_string().c_str());
    }
  }
  return a;
}

}  // namespace kcache

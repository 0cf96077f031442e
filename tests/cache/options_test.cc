// The options pipeline (kcache/cache.h, Options): one table of names, one
// parser, one precedence (defaults, the program, the environment), and one
// policy gate that every lookup and store path asks.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "fault_env.h"
#include "kcache/assembly.h"
#include "kcache/bundle.h"
#include "kcache/cache.h"
#include "kcache/options.h"
#include "kcache/stage.h"
#include "test_util.h"
#include "util/util.h"

using namespace kcache;

namespace {

// Sets (or unsets, with nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

CompileFn compile_to(std::string bytes, int* runs) {
  return [bytes, runs]() -> Expected<std::vector<Artifact>> {
    ++*runs;
    return std::vector<Artifact>{{"obj", bytes}};
  };
}

std::string obj(const Entry& e) { return std::string(*e.artifact("obj")); }

std::string slurp(const std::string& path) {
  auto t = util::read_file(path);
  return t ? *t : std::string();
}
void spit(const std::string& path, const std::string& text) {
  ASSERT_TRUE(util::write_file_atomic(path, text).is_ok());
}

}  // namespace

TEST(OptionsTest, DefaultsAreTheInitialisers) {
  Options o;
  EXPECT_EQ(o.memory_bytes, uint64_t(256) << 20);
  EXPECT_EQ(o.lease_ttl_ms, 10000u);
  EXPECT_EQ(o.wait_bound_ms, 300000u);
  EXPECT_EQ(o.disk.max_bytes, uint64_t(4) << 30);
  EXPECT_EQ(o.disk.max_entries, 200000u);
  EXPECT_DOUBLE_EQ(o.disk.low_water, 0.8);
  EXPECT_EQ(o.disk.recency_batch, 256u);
  EXPECT_EQ(*o.get("max_size"), "4G");
  EXPECT_EQ(*o.get("memory_size"), "256M");
  EXPECT_EQ(*o.get("log"), "warn");
}

TEST(OptionsTest, EveryOptionRoundTripsThroughItsText) {
  Options o;
  ASSERT_GE(option_table().size(), 25u);
  for (const auto& info : option_table()) {
    auto v = o.get(info.name);
    ASSERT_TRUE(v.has_value()) << info.name;
    Options copy = o;
    Status st = copy.set(info.name, *v);
    // An empty text means "unset" for the string options; dir refuses it.
    if (info.name == "dir") {
      EXPECT_EQ(st.code(), Errc::invalid_argument);
      continue;
    }
    ASSERT_TRUE(st.is_ok()) << info.name << ": " << st.to_string();
    EXPECT_EQ(*copy.get(info.name), *v) << info.name;
    EXPECT_FALSE(info.help.empty()) << info.name;
  }
}

TEST(OptionsTest, SetParsesEachKindAndRefusesBadValuesWithoutChangingAnything) {
  Options o;
  ASSERT_TRUE(o.set("max_size", "2G").is_ok());
  EXPECT_EQ(o.disk.max_bytes, uint64_t(2) << 30);
  ASSERT_TRUE(o.set("read_only", "yes").is_ok());
  EXPECT_TRUE(o.read_only);
  ASSERT_TRUE(o.set("read_only", "OFF").is_ok());
  EXPECT_FALSE(o.read_only);
  ASSERT_TRUE(o.set("engine", "FILES").is_ok());
  EXPECT_EQ(o.engine, Engine::files);
  ASSERT_TRUE(o.set("bundles", "a.kcb::b.kcb").is_ok());
  EXPECT_EQ(o.bundles.files, (std::vector<std::string>{"a.kcb", "b.kcb"}));
  ASSERT_TRUE(o.set("log", "debug:/tmp/x.log").is_ok());
  EXPECT_EQ(o.log_level, LogLevel::debug);
  EXPECT_EQ(o.log_file, "/tmp/x.log");
  ASSERT_TRUE(o.set("memory_size", "0").is_ok());
  EXPECT_FALSE(o.memory_tier);
  ASSERT_TRUE(o.set("shared_group", "staff").is_ok());
  EXPECT_EQ(o.shared_group, "staff");
  ASSERT_TRUE(o.set("wait_bound_ms", "0").is_ok());
  EXPECT_EQ(o.wait_bound_ms, 0u);

  Options before = o;
  Status st = o.set("max_size", "lots");
  EXPECT_EQ(st.code(), Errc::invalid_argument);
  EXPECT_NE(st.message().find("max_size"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'lots'"), std::string::npos) << st.message();
  EXPECT_EQ(o.disk.max_bytes, before.disk.max_bytes);
  EXPECT_EQ(o.set("max_size", "0").code(), Errc::invalid_argument);
  EXPECT_EQ(o.set("lease_ttl_ms", "0").code(), Errc::invalid_argument);
  EXPECT_EQ(o.set("lease_ttl_ms", "-5").code(), Errc::invalid_argument);
  EXPECT_EQ(o.set("engine", "bdb").code(), Errc::invalid_argument);
  EXPECT_EQ(o.set("log", "loud").code(), Errc::invalid_argument);
  EXPECT_EQ(o.disk.max_bytes, before.disk.max_bytes);
  EXPECT_EQ(o.lease_ttl_ms, before.lease_ttl_ms);

  // Bounds that keep deadlines far from overflowing.
  EXPECT_EQ(o.set("wait_bound_ms", "18446744073709552").code(), Errc::invalid_argument);
  EXPECT_EQ(o.set("lease_ttl_ms", "86400001").code(), Errc::invalid_argument);
  ASSERT_TRUE(o.set("lease_ttl_ms", "86400000").is_ok());
  // A level alone keeps the program's destination; a size never brings
  // back a memory tier the program left out.
  Options logs;
  logs.log_file = "/var/log/jit.log";
  ASSERT_TRUE(logs.set("log", "debug").is_ok());
  EXPECT_EQ(logs.log_file, "/var/log/jit.log");
  ASSERT_TRUE(logs.set("memory", "0").is_ok());
  ASSERT_TRUE(logs.set("memory_size", "64M").is_ok());
  EXPECT_FALSE(logs.memory_tier);

  st = o.set("read_onyl", "1");
  EXPECT_EQ(st.code(), Errc::invalid_argument);
  EXPECT_NE(st.message().find("read_only"), std::string::npos) << "lists the known names: " << st.message();
  EXPECT_EQ(o.get("nope").error().code(), Errc::not_found);
}

// Defaults < the program's settings < KCACHE_* variables.
TEST(OptionsTest, TheEnvironmentOverridesTheProgram) {
  ScopedEnv dir("KCACHE_DIR", "/from/env");
  ScopedEnv ro("KCACHE_READONLY", "1");
  ScopedEnv size("KCACHE_MAX_SIZE", nullptr);
  Options program;
  ASSERT_TRUE(program.set("dir", "/from/program").is_ok());
  program.read_only = false;
  program.disk.max_bytes = 12345;
  Options o = Options::from_env(program);
  EXPECT_EQ(o.dir, "/from/env");
  EXPECT_TRUE(o.read_only);
  EXPECT_EQ(o.disk.max_bytes, 12345u) << "an unset variable leaves the program's setting";
}

// An empty folder is refused wherever it comes from, so an unset shell
// variable in `--dir "$X"` or KCACHE_DIR="$X" never means the default
// store; an unset KCACHE_DIR still does.
TEST(OptionsTest, AnEmptyFolderIsRefusedAndAnUnsetOneIsTheDefault) {
  Options o;
  Status st = o.set("dir", "");
  EXPECT_EQ(st.code(), Errc::invalid_argument);
  EXPECT_NE(st.message().find("dir"), std::string::npos) << st.message();
  {
    ScopedEnv dir("KCACHE_DIR", "");
    Options e;
    e.dir = "/from/program";
    auto problems = e.apply_env();
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_EQ(problems[0].code(), Errc::invalid_argument);
    EXPECT_NE(problems[0].message().find("KCACHE_DIR"), std::string::npos) << problems[0].message();
    EXPECT_EQ(e.dir, "/from/program") << "the refused value changes nothing";
  }
  ScopedEnv dir("KCACHE_DIR", nullptr);
  Options u;
  EXPECT_TRUE(u.apply_env().empty());
  EXPECT_EQ(u.dir, "") << "unset: the default folder";
}

TEST(OptionsTest, ApplyEnvReportsBadValuesAndUnknownVariables) {
  ScopedEnv size("KCACHE_MAX_SIZE", "huge");
  ScopedEnv typo("KCACHE_READ_ONLY", "1");
  ScopedEnv engine("KCACHE_ENGINE", "LMDB");
  Options o;
  o.disk.max_bytes = 777;
  auto problems = o.apply_env();
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].code(), Errc::invalid_argument);
  EXPECT_NE(problems[0].message().find("KCACHE_MAX_SIZE: 'huge'"), std::string::npos) << problems[0].message();
  EXPECT_EQ(problems[1].code(), Errc::not_found);
  EXPECT_NE(problems[1].message().find("KCACHE_READ_ONLY"), std::string::npos) << problems[1].message();
  EXPECT_EQ(o.disk.max_bytes, 777u);
  EXPECT_FALSE(o.read_only);
  if (engine_built(Engine::lmdb)) {
    EXPECT_EQ(o.engine, Engine::lmdb);
  }
}

// Config files sit between the program and the environment: the user-wide
// one, then the store folder's, then KCACHE_*, then a command line; each
// setting says where it came from.
TEST(ConfigTest, FilesSitBetweenTheProgramAndTheEnvironment) {
  test::TempDir tmp;
  ScopedEnv xdg("XDG_CONFIG_HOME", (tmp.path() + "/xdg").c_str());
  ScopedEnv dur("KCACHE_DURABILITY", "NONE");
  ScopedEnv kdir("KCACHE_DIR", nullptr);
  const std::string user = tmp.path() + "/xdg/kcache/config";
  const std::string store = tmp.path() + "/cache/config";
  EXPECT_EQ(user_config_path(), user);
  ASSERT_TRUE(write_config_setting(user, "max_size", "3G", false).is_ok());
  ASSERT_TRUE(write_config_setting(user, "remote", "redis://127.0.0.1:1", false).is_ok());
  ASSERT_TRUE(write_config_setting(store, "MAX-SIZE", "1G", true).is_ok());
  ASSERT_TRUE(write_config_setting(store, "durability", "full", true).is_ok());
  EXPECT_EQ(write_config_setting(store, "dir", "/elsewhere", true).code(), Errc::invalid_argument);
  EXPECT_EQ(write_config_setting(store, "max_size", "lots", true).code(), Errc::invalid_argument);
  Status typo = write_config_setting(store, "max_sise", "1G", true);
  EXPECT_NE(typo.message().find("did you mean max_size?"), std::string::npos) << typo.message();

  Options o;
  o.dir = tmp.path() + "/cache";
  o.memory_bytes = 1 << 20;  // the program's own
  auto applied = apply_settings(o, {{"engine", "FILES"}});
  EXPECT_TRUE(applied.problems.empty()) << applied.problems.front().message();
  EXPECT_EQ(o.disk.max_bytes, uint64_t(1) << 30);  // the store's file over the user's
  EXPECT_EQ(o.remote_url, "redis://127.0.0.1:1");
  EXPECT_EQ(o.disk.durability, Durability::none);  // the environment over both
  EXPECT_EQ(o.engine, Engine::files);              // the command line over all
  EXPECT_EQ(o.memory_bytes, uint64_t(1) << 20);
  EXPECT_EQ(applied.origin["max_size"], "config file " + store);
  EXPECT_EQ(applied.origin["remote"], "config file " + user);
  EXPECT_EQ(applied.origin["durability"], "environment KCACHE_DURABILITY");
  EXPECT_EQ(applied.origin["engine"], "command line --engine");
  EXPECT_EQ(applied.origin.count("memory_size"), 0u);
  EXPECT_EQ(applied.files, (std::vector<std::string>{user, store}));

  // Options::from_env, which the C ABI and Python use, reads the same files.
  Options base;
  base.dir = tmp.path() + "/cache";
  EXPECT_EQ(Options::from_env(base).disk.max_bytes, uint64_t(1) << 30);

  // Unset: the user's value shows through; comments and other lines stay.
  spit(store, "# team settings\n" + slurp(store));
  ASSERT_TRUE(write_config_setting(store, "max_size", std::nullopt, true).is_ok());
  EXPECT_EQ(slurp(store), "# team settings\ndurability = full\n");
  Options again;
  again.dir = tmp.path() + "/cache";
  (void)apply_settings(again);
  EXPECT_EQ(again.disk.max_bytes, uint64_t(3) << 30);
}

TEST(ConfigTest, BadLinesAndUntrustedFilesAreProblems) {
  test::TempDir tmp;
  ScopedEnv xdg("XDG_CONFIG_HOME", (tmp.path() + "/xdg").c_str());
  ScopedEnv kdir("KCACHE_DIR", nullptr);
  const std::string store = tmp.path() + "/cache/config";
  ASSERT_TRUE(util::make_dirs(tmp.path() + "/cache").is_ok());
  spit(store, "max_size = 2G\nmax_size = plenty\nmaxsize = 1G\ndir = /x\njunk\n");
  Options o;
  o.dir = tmp.path() + "/cache";
  auto applied = apply_settings(o);
  ASSERT_EQ(applied.problems.size(), 4u);
  for (const auto& p : applied.problems) EXPECT_EQ(p.code(), Errc::invalid_argument) << p.message();
  EXPECT_NE(applied.problems[0].message().find(store + ":2: 'plenty' is not a size"), std::string::npos)
      << applied.problems[0].message();
  EXPECT_NE(applied.problems[1].message().find("did you mean max_size?"), std::string::npos);
  EXPECT_EQ(o.disk.max_bytes, uint64_t(2) << 30);
  EXPECT_TRUE(o.dir == tmp.path() + "/cache");

  // A file others may write is not read.
  spit(store, "max_size = 1G\n");
  ASSERT_EQ(::chmod(store.c_str(), 0666), 0);
  Options p;
  p.dir = tmp.path() + "/cache";
  applied = apply_settings(p);
  ASSERT_EQ(applied.problems.size(), 1u);
  EXPECT_EQ(applied.problems[0].code(), Errc::unavailable);
  EXPECT_NE(applied.problems[0].message().find("writable by every user"), std::string::npos);
  EXPECT_EQ(p.disk.max_bytes, Options().disk.max_bytes);
}

// A config file is what its descriptor shows: a link to a file (even one
// this user owns) is not followed, and a value with a line break is
// refused rather than written as a second setting.
TEST(ConfigTest, ALinkedConfigIsNotReadAndValuesAreOneLine) {
  test::TempDir tmp;
  ScopedEnv xdg("XDG_CONFIG_HOME", (tmp.path() + "/xdg").c_str());
  ScopedEnv kdir("KCACHE_DIR", nullptr);
  const std::string store = tmp.path() + "/cache/config";
  ASSERT_TRUE(util::make_dirs(tmp.path() + "/cache").is_ok());
  spit(tmp.path() + "/elsewhere", "max_size = 1G\n");
  ASSERT_EQ(::symlink((tmp.path() + "/elsewhere").c_str(), store.c_str()), 0);
  Options o;
  o.dir = tmp.path() + "/cache";
  auto applied = apply_settings(o);
  ASSERT_EQ(applied.problems.size(), 1u);
  EXPECT_EQ(applied.problems[0].code(), Errc::unavailable);
  EXPECT_NE(applied.problems[0].message().find("symbolic link"), std::string::npos) << applied.problems[0].message();
  EXPECT_EQ(o.disk.max_bytes, Options().disk.max_bytes);

  const std::string user = tmp.path() + "/xdg/kcache/config";
  EXPECT_EQ(write_config_setting(user, "remote", "redis://127.0.0.1:1\ndir = /x", false).code(),
            Errc::invalid_argument);
  EXPECT_EQ(write_config_setting(user, "remote", "redis://127.0.0.1:1\r", false).code(), Errc::invalid_argument);
  struct stat st;
  EXPECT_NE(::stat(user.c_str(), &st), 0);  // nothing written
}

// Names and words in any case; a misspelt variable names the nearest one,
// and from_env says each problem once per process.
TEST(ConfigTest, AnyCaseAndTheNearestNameOnce) {
  Options o;
  EXPECT_TRUE(o.set("Durability", "FULL").is_ok());
  EXPECT_EQ(o.disk.durability, Durability::full);
  EXPECT_TRUE(o.set("MAX-SIZE", "2g").is_ok());
  EXPECT_EQ(o.disk.max_bytes, uint64_t(2) << 30);
  EXPECT_TRUE(o.set("compression", "Auto").is_ok());
  EXPECT_TRUE(o.set("log", "DEBUG").is_ok());
  EXPECT_EQ(o.log_level, LogLevel::debug);
  if (engine_built(Engine::lmdb)) {
    EXPECT_TRUE(o.set("engine", "LMDB").is_ok());
  }
  EXPECT_EQ(nearest_option("KCACHE_READ_ONLY", true), "KCACHE_READONLY");
  EXPECT_EQ(nearest_option("KCACHE_MAXSIZE", true), "KCACHE_MAX_SIZE");
  EXPECT_EQ(nearest_option("KCACHE_COMPLETELY_UNRELATED", true), "");

  test::TempDir tmp;
  ScopedEnv typo("KCACHE_READ_ONLY", "1");
  ScopedEnv kdir("KCACHE_DIR", nullptr);
  const std::string log = tmp.path() + "/log";
  util::set_log(LogLevel::warn, log);
  (void)Options::from_env();
  (void)Options::from_env();
  util::set_log(LogLevel::warn, "");
  auto lines = test::log_lines(log, "KCACHE_READ_ONLY");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("did you mean KCACHE_READONLY?"), std::string::npos) << lines[0];
}

// KCACHE_LOG=debug says what became of each request, with the key's label:
// the miss, the compile, the store, then the hit; in a file each line
// carries the time and the process id.
TEST(LogTest, DebugLogsEachLookupCompileAndStoreWithTheLabel) {
  test::TempDir tmp;
  const std::string log = tmp.path() + "/kcache.log";
  Options o;
  o.dir = tmp.path() + "/cache";
  ASSERT_TRUE(o.set("log", "debug:" + log).is_ok());
  auto key = KeyBuilder("logtest/1").add_string("ir", "k").label("matmul_f16").finish();
  ASSERT_TRUE(key);
  int runs = 0;
  {
    auto cache = Cache::open(o);
    ASSERT_TRUE(cache->get_or_compile(*key, compile_to("x", &runs)));
    ASSERT_TRUE(cache->get_or_compile(*key, compile_to("x", &runs)));
  }
  util::set_log(LogLevel::warn, "");
  const std::string named = key->key.hex() + " \"matmul_f16\"";
  EXPECT_EQ(test::log_lines(log, "miss " + named).size(), 1u);
  EXPECT_EQ(test::log_lines(log, "compiled " + named).size(), 1u);
  EXPECT_EQ(test::log_lines(log, "stored " + named).size(), 1u);
  EXPECT_EQ(test::log_lines(log, "hit " + named + " (memory)").size(), 1u);
  const std::string pid = " [" + std::to_string(::getpid()) + "] kcache: debug: ";
  for (const auto& line : test::log_lines(log)) {
    // 2026-11-23T07:40:12.345Z [4242] kcache: debug: ...
    ASSERT_GT(line.size(), 25u) << line;
    EXPECT_EQ(line[4], '-') << line;
    EXPECT_EQ(line[10], 'T') << line;
    EXPECT_EQ(line[23], 'Z') << line;
    EXPECT_EQ(line.find(pid), 24u) << line;
  }
}

// KCACHE_RECOMPILE reaches every path that looks up: Cache::get (and so
// stage links and the integrations' object caches), get_or_compile,
// begin, batches. It was once honoured by get_or_compile only.
TEST(PolicyTest, RecompileSkipsEveryLookupAndOverwrites) {
  test::TempDir d;
  KeyInfo k = *KeyBuilder("policy/1").add_string("src", "x").finish();
  int runs = 0;
  {
    auto c = Cache::open(test::disk_options(d.path()));
    ASSERT_TRUE(c->get_or_compile(k, compile_to("old", &runs)).has_value());
  }
  Options o = test::disk_options(d.path());
  o.recompile = true;
  {
    auto c = Cache::open(o);
    EXPECT_FALSE(c->get(k.key).has_value());
    EXPECT_FALSE(c->get(k).has_value());
    Flight f = c->begin(k);
    EXPECT_TRUE(f.owner());
    f.abandon();
    std::vector<BatchItem> items{{k, compile_to("new", &runs)}};
    auto r = c->get_or_compile_batch(items);
    ASSERT_TRUE(r[0].has_value());
    EXPECT_EQ(obj(*r[0]), "new");
    EXPECT_EQ(runs, 2);
    EXPECT_EQ(c->stats().misses, 0u) << "a skipped lookup is not a miss";
  }
  auto c = Cache::open(test::disk_options(d.path()));
  auto e = c->get(k.key);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(obj(*e), "new") << "recompile overwrote the stored entry";
}

TEST(PolicyTest, RecompileRunsTheFrontEndOfAStagedCompile) {
  test::TempDir d;
  KeyInfo front = *KeyBuilder("policy-front/1").add_string("src", "x").finish();
  int frontends = 0, backends = 0;
  auto run = [&](Cache& c) {
    return get_or_compile_staged(
        c, front,
        [&]() -> Expected<StageOutput> {
          ++frontends;
          StageOutput out;
          out.ir = hash_bytes("ir");
          out.backend = *KeyBuilder("policy-back/1").add_digest("ir", out.ir).finish();
          return out;
        },
        compile_to("obj", &backends));
  };
  {
    auto c = Cache::open(test::disk_options(d.path()));
    ASSERT_TRUE(run(*c).has_value());
  }
  Options o = test::disk_options(d.path());
  o.recompile = true;
  auto c = Cache::open(o);
  auto r = run(*c);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->frontend_ran);
  EXPECT_TRUE(r->backend_ran);
  EXPECT_EQ(frontends, 2);
  EXPECT_EQ(backends, 2);
}

TEST(PolicyTest, ReadOnlyAndDisabledMeanTheSameOnEveryPath) {
  test::TempDir d;
  KeyInfo k = *KeyBuilder("policy/1").add_string("src", "y").finish();
  int runs = 0;
  Options ro = test::disk_options(d.path());
  ro.read_only = true;
  {
    auto c = Cache::open(ro);
    EXPECT_FALSE(c->put(k, {{"obj", std::string("a")}}).has_value()) << "no tier takes a read-only put";
    EXPECT_FALSE(c->get(k.key).has_value());
    ASSERT_TRUE(c->get_or_compile(k, compile_to("b", &runs)).has_value());
    Flight f = c->begin(k);
    ASSERT_TRUE(f.owner());
    ASSERT_TRUE(f.commit({{"obj", std::string("c")}}).has_value());
    (void)c->flush();
  }
  {
    auto c = Cache::open(test::disk_options(d.path(), /*memory=*/false));
    EXPECT_FALSE(c->get(k.key).has_value()) << "nothing read-only did reached the store";
    ASSERT_TRUE(c->get_or_compile(k, compile_to("stored", &runs)).has_value());
  }
  Options off = test::disk_options(d.path());
  off.disabled = true;
  auto c = Cache::open(off);
  EXPECT_FALSE(c->get(k.key).has_value());
  EXPECT_FALSE(c->put(k, {{"obj", std::string("z")}}).has_value());
  auto r = c->get_or_compile(k, compile_to("fresh", &runs));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(obj(*r), "fresh");
}

// The group this process runs as, by name: a shared store of that group
// is one this process may use.
std::string own_group() {
  struct group* g = ::getgrgid(::getegid());
  return g ? g->gr_name : std::to_string(::getegid());
}

// Bundles were made by reopening the store without its shared group, so
// every KCACHE_SHARED store refused them ("writable by group").
TEST(DiskStoreSpecTest, BundlesOfASharedStore) {
  test::TempDir d;
  Options o = test::disk_options(d.path(), /*memory=*/false);
  o.shared_group = own_group();
  auto c = Cache::open(o);
  ASSERT_EQ(c->tiers().size(), 1u) << "the shared store opened";
  int runs = 0;
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(c->get_or_compile(*KeyBuilder("b/1").add_u64("i", i).finish(), compile_to("x", &runs)).has_value());
  (void)c->flush();
  auto bytes = save_bundle(*c, BundleSelection{});
  ASSERT_TRUE(bytes.has_value()) << bytes.error().to_string();
  auto b = open_bundle_bytes(*bytes);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)->stats().entries, 3u);
  auto info = write_bundle(*c, BundleSelection{}, d.path() + "/out.kcb");
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_EQ(info->entries, 3u);
}

TEST(DiskStoreSpecTest, FromOptionsNamesEverything) {
  Options o;
  o.dir = "/some/where";
  o.engine = Engine::files;
  o.shared_group = "staff";
  o.create_dir = false;
  o.disk.max_bytes = 99;
  DiskStoreSpec s = DiskStoreSpec::from(o);
  EXPECT_EQ(s.dir, "/some/where");
  EXPECT_EQ(s.engine, Engine::files);
  EXPECT_EQ(s.shared_group, "staff");
  EXPECT_FALSE(s.create);
  EXPECT_EQ(s.tier.max_bytes, 99u);
  EXPECT_TRUE(s.leases);
  EXPECT_EQ(s.path(), "/some/where/files");
  o.read_only = true;
  EXPECT_FALSE(DiskStoreSpec::from(o).leases) << "a read-only cache takes no leases";
  for (const auto& e : engines()) {
    EXPECT_EQ(engine_info(e.engine).name, engine_name(e.engine));
    EXPECT_FALSE(e.owned_paths("/x").empty());
  }
}

// Options::env reaches the whole cache: the disk store (files engine) and
// its lease files see the same full disk, and the compile still succeeds.
TEST(OptionsTest, TheEnvOfTheOptionsReachesTheStoreAndItsLeases) {
  test::TempDir d;
  auto env = std::make_shared<test::FaultEnv>();
  env->manual_clock = false;  // the committer and the heartbeat run on real time here
  Options o = test::disk_options(d.path(), /*memory=*/false);
  o.engine = Engine::files;
  o.env = env;
  KeyInfo k = *KeyBuilder("env/1").add_string("src", "x").finish();
  int runs = 0;
  {
    auto c = Cache::open(o);
    ASSERT_EQ(c->tiers().size(), 1u);
    env->no_space = true;
    auto r = c->get_or_compile(k, compile_to("obj", &runs));
    ASSERT_TRUE(r.has_value()) << "a full disk never fails a compile";
    (void)c->flush();
    EXPECT_GT(env->faults.load(), 0u) << "the store and its leases asked the injected Env";
    EXPECT_EQ(c->stats().tiers.at(0).stats.puts, 0u);
    env->no_space = false;
  }
  auto c = Cache::open(o);
  EXPECT_FALSE(c->get(k.key).has_value()) << "nothing was stored on the full disk";
  ASSERT_TRUE(c->get_or_compile(k, compile_to("obj", &runs)).has_value());
  (void)c->flush();
  EXPECT_TRUE(Cache::open(o)->get(k.key).has_value());
  EXPECT_EQ(runs, 2);
}

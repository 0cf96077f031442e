// kcache tool — run: any command as a cached compile, through the Cache the
// library assembles (disk store with its leases, remote of KCACHE_REMOTE).
// A hit writes the stored artifacts to their paths and runs nothing; a miss
// runs COMMAND once across processes (the others wait for its entry), then
// stores the files it left at those paths in every tier.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

// Runs argv with the tool's stdin/stdout/stderr; returns its exit status
// (128 + signal when killed), or -1 with errno set when it could not start.
int run_child(const std::vector<std::string>& argv) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::execvp(av[0], av.data());
    std::fprintf(stderr, "kcache: run: cannot execute '%s': %s\n", av[0], std::strerror(errno));
    ::_exit(127);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

int cmd_run(Ctx& c) {
  auto key = key_flag(c);
  if (!key) return kExitUsage;
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& [flag, v] : c.args.all_flags) {
    if (flag != "--artifact") continue;
    size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
      return usage_error("run", "--artifact '" + v + "' is not NAME=PATH");
    files.emplace_back(v.substr(0, eq), v.substr(eq + 1));
  }
  if (files.empty()) return usage_error("run", "name at least one --artifact NAME=PATH");
  if (!c.args.saw_dashes || c.args.after_dashes.empty()) return usage_error("run", "give the command after '--'");
  if (int rc = open_tiers(c, {.create = true, .remote = true, .honour_disable = true, .needs_disk = false})) return rc;
  Cache& cache = *c.store.cache;

  int command_status = -2;  // -2: COMMAND did not run here
  auto compile = [&]() -> Expected<std::vector<Artifact>> {
    command_status = run_child(c.args.after_dashes);
    if (command_status == -1) return util::errno_status(errno, "run " + c.args.after_dashes[0]);
    if (command_status != 0)
      return Status(Errc::compile_failed, "command exited with status " + std::to_string(command_status));
    std::vector<Artifact> arts;
    for (const auto& [name, path] : files) {
      auto data = util::read_file(path);
      if (!data) return Status(Errc::not_found, "artifact '" + name + "': " + data.error().message());
      arts.push_back({name, std::move(data).value()});
    }
    return arts;
  };
  Source src = Source::compiled;
  auto e = cache.get_or_compile(*key, compile, &src);
  if (command_status != -2) {  // COMMAND ran here: its status is ours
    if (command_status == -1) return c.fail(kExitError, e.error().message());
    if (command_status == 0 && !e) std::fprintf(stderr, "kcache: run: not stored: %s\n", e.error().message().c_str());
    return command_status;
  }
  if (!e) return c.fail(e.error());
  // A hit, or another process's result: write the artifacts out. An entry
  // lacking one of them cannot stand for this command: run it.
  for (const auto& [name, path] : files)
    if (!e->artifact(name)) {
      auto arts = compile();  // runs COMMAND once and reads its outputs
      if (command_status == -1) return c.fail(kExitError, arts.error().message());
      if (arts) cache.put(KeyInfo{*key, {}}, std::move(arts).value());
      return command_status;
    }
  for (const auto& [name, path] : files) {
    Status st = write_output(path, *e->artifact(name));
    if (!st.is_ok()) return c.fail(kExitError, "artifact '" + name + "': " + st.message());
  }
  return kExitOk;
}

}  // namespace kcache::cli

// Real redis-server processes for tests and benchmarks: a standalone server
// or a 3-node Redis Cluster on loopback ports, started here and killed when
// the object goes. No gtest dependency (the benchmark uses it too).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace kcache::test {

// Where redis-server is, or "" when it is not installed.
inline std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return std::string();
}

inline bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A port whose cluster bus port (port + 10000) is free too.
inline int pick_port() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  for (int i = 0; i < 1000; ++i) {
    int p = 20000 + static_cast<int>(rng() % 30000);
    if (port_free(p) && port_free(p + 10000)) return p;
  }
  return 0;
}

struct ReplyDel {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDel>;

// A direct client for the test's own checks and sabotage.
class RedisClient {
 public:
  RedisClient(const std::string& host, int port) {
    timeval tv{2, 0};
    c_ = redisConnectWithTimeout(host.c_str(), port, tv);
    if (c_ && !c_->err) redisSetTimeout(c_, tv);
  }
  ~RedisClient() {
    if (c_) redisFree(c_);
  }
  bool ok() const { return c_ && !c_->err; }
  ReplyPtr cmd(const std::vector<std::string>& args) {
    if (!ok()) return nullptr;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return ReplyPtr(
        static_cast<redisReply*>(redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data())));
  }
  // The reply as text: strings and statuses, integers in decimal, "(nil)",
  // "ERR..." for errors, "" on a dead connection.
  std::string str(const std::vector<std::string>& args) {
    auto r = cmd(args);
    if (!r) return std::string();
    switch (r->type) {
      case REDIS_REPLY_STRING:
      case REDIS_REPLY_STATUS:
      case REDIS_REPLY_ERROR:
        return std::string(r->str, r->len);
      case REDIS_REPLY_INTEGER:
        return std::to_string(r->integer);
      case REDIS_REPLY_NIL:
        return "(nil)";
      default:
        return "(array)";
    }
  }

 private:
  redisContext* c_ = nullptr;
};

class RedisServer {
 public:
  // Starts redis-server on a free port with its files in `dir`. Check ok().
  explicit RedisServer(const std::string& dir, std::vector<std::string> extra = {}) : dir_(dir) {
    std::string bin = find_program("redis-server");
    if (bin.empty()) {
      error_ = "redis-server is not installed (scripts/install-deps.sh installs it)";
      return;
    }
    for (int attempt = 0; attempt < 5 && !ok(); ++attempt) {
      port_ = pick_port();
      if (!port_) continue;
      std::vector<std::string> args = {
          bin,     "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
          "--dir", dir_,     "--daemonize",         "no"};
      args.insert(args.end(), extra.begin(), extra.end());
      start(args);
      if (wait_ping(10000)) return;
      stop();
    }
    if (error_.empty()) error_ = "redis-server did not answer PING (see " + dir_ + "/redis.log)";
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool ok() const { return pid_ > 0 && up_; }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  // SIGSTOP / SIGCONT: the server hangs (connections are still accepted by
  // the kernel, nothing is answered) and comes back.
  void freeze() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void thaw() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  // SIGKILL and reap: the server vanishes mid-conversation.
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    pid_ = -1;
    up_ = false;
  }

  bool wait_ping(int ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (pid_ > 0 && ::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;  // exited (port taken?)
      }
      RedisClient c("127.0.0.1", port_);
      if (c.ok() && c.str({"PING"}) == "PONG") return up_ = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  void start(const std::vector<std::string>& args) {
    std::string log = dir_ + "/redis.log";
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
  }

  std::string dir_;
  std::string error_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool up_ = false;
};

// Three masters, no replicas, slots spread by redis-cli --cluster create.
class RedisCluster {
 public:
  explicit RedisCluster(const std::string& dir) {
    std::string cli = find_program("redis-cli");
    if (cli.empty() || find_program("redis-server").empty()) {
      error_ = "redis-server or redis-cli is not installed (scripts/install-deps.sh installs them)";
      return;
    }
    for (int i = 0; i < 3; ++i) {
      std::string d = dir + "/node" + std::to_string(i);
      ::mkdir(d.c_str(), 0700);
      nodes_.push_back(std::make_unique<RedisServer>(
          d, std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-config-file", d + "/nodes.conf",
                                      "--cluster-node-timeout", "5000"}));
      if (!nodes_.back()->ok()) {
        error_ = "cluster node: " + nodes_.back()->error();
        return;
      }
    }
    std::string cmd = "'" + cli + "' --cluster create";
    for (auto& n : nodes_) cmd += " " + n->addr();
    cmd += " --cluster-replicas 0 --cluster-yes > '" + dir + "/create.log' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      error_ = "redis-cli --cluster create failed (see " + dir + "/create.log)";
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      for (auto& n : nodes_) {
        RedisClient c("127.0.0.1", n->port());
        std::string info = c.str({"CLUSTER", "INFO"});
        if (info.find("cluster_state:ok") == std::string::npos) all = false;
      }
      if (all) {
        ok_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    error_ = "cluster did not reach cluster_state:ok";
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  RedisServer& node(int i) { return *nodes_[i]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  std::string url() const { return "redis+cluster://" + nodes_[0]->addr(); }
  std::string node_id(int i) {
    RedisClient c("127.0.0.1", nodes_[i]->port());
    return c.str({"CLUSTER", "MYID"});
  }
  // Index of the node serving `slot` (from node 0's view).
  int owner(int slot) {
    RedisClient c("127.0.0.1", nodes_[0]->port());
    auto r = c.cmd({"CLUSTER", "SLOTS"});
    if (!r || r->type != REDIS_REPLY_ARRAY) return -1;
    for (size_t k = 0; k < r->elements; ++k) {
      auto* range = r->element[k];
      if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
        int port = static_cast<int>(range->element[2]->element[1]->integer);
        for (int i = 0; i < size(); ++i)
          if (nodes_[i]->port() == port) return i;
      }
    }
    return -1;
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::string error_;
  bool ok_ = false;
};

}  // namespace kcache::test

// In a gtest test: starts a server in `dir` (a TempDir; further arguments go
// to RedisServer) as `var`, or skips the test, loudly, when redis-server is
// missing (fails it when redis-server is there but would not start).
#define START_REDIS(var, dir, ...)                                    \
  RedisServer var((dir).path(), ##__VA_ARGS__);                       \
  if (!var.ok()) {                                                    \
    if (find_program("redis-server").empty()) {                       \
      std::fprintf(stderr, "*** SKIPPED: %s\n", var.error().c_str()); \
      GTEST_SKIP() << var.error();                                    \
    }                                                                 \
    FAIL() << var.error();                                            \
  }

// The servers the remote suites run against: a real redis-server started by
// the test, and the in-process fault transport. Each can hang, die, hold a
// foreign value and hold a key of the wrong type, so one suite drives both.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

#include "kcache/redis.h"
#include "kcache/remote.h"
#include "redis_server.h"
#include "remote_fault_transport.h"
#include "test_util.h"
#include "util/util.h"

namespace kcache::test {

class RemoteServer {
 public:
  virtual ~RemoteServer() = default;
  virtual bool ok() const = 0;
  virtual std::string error() const = 0;
  // A new client of this server: its value store and lease backend.
  virtual RemoteTransports transport() = 0;
  virtual void hang() = 0;  // stops answering; calls run into their timeout
  virtual void unhang() = 0;
  virtual void kill() = 0;  // gone: connections reset, connects refused
  virtual void put_raw(const Key& key, const std::string& bytes) = 0;
  virtual std::string get_raw(const Key& key) = 0;
  virtual void set_wrong_type(const Key& key) = 0;
};

class RedisRemote final : public RemoteServer {
 public:
  RedisRemote() : srv_(dir_.path()) {}
  ~RedisRemote() override { srv_.thaw(); }
  bool ok() const override { return srv_.ok(); }
  std::string error() const override { return srv_.error(); }
  RemoteTransports transport() override {
    auto t = make_redis_transport(srv_.url());
    EXPECT_TRUE(t.has_value()) << t.status().to_string();
    return t ? *t : RemoteTransports{};
  }
  void hang() override { srv_.freeze(); }
  void unhang() override { srv_.thaw(); }
  void kill() override { srv_.stop(); }
  void put_raw(const Key& key, const std::string& bytes) override {
    RedisClient c("127.0.0.1", srv_.port());
    c.str({"SET", rkey(key), bytes});
  }
  std::string get_raw(const Key& key) override {
    RedisClient c("127.0.0.1", srv_.port());
    std::string v = c.str({"GET", rkey(key)});
    return v == "(nil)" ? std::string() : v;
  }
  void set_wrong_type(const Key& key) override {
    RedisClient c("127.0.0.1", srv_.port());
    c.str({"DEL", rkey(key)});
    c.str({"LPUSH", rkey(key), "not-a-value"});
  }
  RedisServer& server() { return srv_; }

 private:
  static std::string rkey(const Key& k) { return "kcache:{" + k.hex() + "}"; }
  TempDir dir_;
  RedisServer srv_;
};

class MemoryRemote final : public RemoteServer {
 public:
  bool ok() const override { return true; }
  std::string error() const override { return std::string(); }
  // Every client shares the one map (the "server").
  RemoteTransports transport() override { return {t_, t_}; }
  void hang() override { t_->inject(FaultTransport::Fault::timeout); }
  void unhang() override { t_->inject(FaultTransport::Fault::none); }
  void kill() override { t_->inject(FaultTransport::Fault::refused); }
  void put_raw(const Key& key, const std::string& bytes) override { t_->put_raw(key, bytes); }
  std::string get_raw(const Key& key) override { return t_->get_raw(key); }
  void set_wrong_type(const Key& key) override { t_->set_wrong_type(key); }
  FaultTransport& fault() { return *t_; }

 private:
  std::shared_ptr<FaultTransport> t_ = std::make_shared<FaultTransport>();
};

inline std::unique_ptr<RemoteServer> start_remote(const std::string& backend) {
  if (backend == "redis") return std::make_unique<RedisRemote>();
  return std::make_unique<MemoryRemote>();
}

inline uint64_t mono_ms() { return util::now_mono_us() / 1000; }

// The library's log, written to a file for the lifetime of this object.
class LogCapture {
 public:
  explicit LogCapture(LogLevel level = LogLevel::info) : path_(dir_.path() + "/kcache.log") {
    util::set_log(level, path_);
  }
  ~LogCapture() { util::set_log(LogLevel::warn, ""); }
  std::string text() const {
    std::ifstream f(path_);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  size_t warnings() const { return count("kcache: warning: "); }
  size_t count(const std::string& needle) const {
    std::string s = text();
    size_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  TempDir dir_;
  std::string path_;
};

}  // namespace kcache::test

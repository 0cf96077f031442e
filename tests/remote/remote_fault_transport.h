// An in-process remote for tests, both value store (RemoteTransport) and
// lease backend (RemoteLeaseBackend): a map in memory that injects
// faults on demand — timeouts (the call blocks for the configured command
// timeout, then fails), connection resets, refused connects, garbled
// streams, error replies, replies of the wrong type, slow replies.
//
// It lives with the tests, not in the library: it exists to prove that the
// remote policy works over any transport and to inject faults a real server
// cannot produce on cue; no program has a use for a remote that is a map in
// its own memory.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "kcache/remote.h"

namespace kcache::test {

class FaultTransport final : public RemoteTransport, public RemoteLeaseBackend {
 public:
  enum class Fault {
    none,
    timeout,      // blocks for the command timeout, then Errc::timeout
    reset,        // Errc::unavailable: connection reset by peer
    refused,      // Errc::unavailable at once: connection refused
    garbage,      // Errc::unavailable: the reply stream cannot be parsed
    error_reply,  // Errc::io_error: the server answers with an error
    wrong_type,   // Errc::corrupt: a reply of the wrong type
    slow,         // every call waits slow_ms first (a timeout if that is longer)
  };

  std::string_view name() const noexcept override { return "memory-remote"; }
  void set_timeouts(uint64_t connect_ms, uint64_t command_ms) override {
    connect_ms_ = connect_ms;
    command_ms_ = command_ms;
  }

  // Every later call meets `f` (Fault::none clears it).
  void inject(Fault f, uint64_t slow_ms = 0) {
    slow_ms_ = slow_ms;
    fault_ = f;
  }
  // Stores raw bytes as the value of `key`, as another writer could.
  void put_raw(const Key& key, std::string bytes) {
    std::lock_guard g(mu_);
    values_[key] = {std::move(bytes), 0};
  }
  std::string get_raw(const Key& key) {
    std::lock_guard g(mu_);
    auto it = values_.find(key);
    return it == values_.end() ? std::string() : it->second.bytes;
  }
  // A key that holds something other than a value: reads of it answer a
  // reply of the wrong type (per key; the rest of the server is fine).
  void set_wrong_type(const Key& key) {
    std::lock_guard g(mu_);
    values_.erase(key);
    wrong_type_keys_[key] = true;
  }
  uint64_t calls() const { return calls_.load(); }

  Expected<RemoteBytes> get(const Key& key) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    if (wrong_type_keys_.count(key)) return Status(Errc::corrupt, "WRONGTYPE: key holds another type");
    auto it = values_.find(key);
    if (it == values_.end() || expired(it->second.expiry_ms)) return RemoteBytes();
    return make_heap_buffer(it->second.bytes);
  }
  Status get_many(const std::vector<Key>& keys, std::vector<Expected<RemoteBytes>>* out) override {
    KCACHE_RETURN_IF_ERROR(enter());
    out->clear();
    std::lock_guard g(mu_);
    for (const Key& k : keys) {
      if (wrong_type_keys_.count(k)) {
        out->emplace_back(Status(Errc::corrupt, "WRONGTYPE: key holds another type"));
        continue;
      }
      auto it = values_.find(k);
      if (it == values_.end() || expired(it->second.expiry_ms))
        out->emplace_back(RemoteBytes());
      else
        out->emplace_back(make_heap_buffer(it->second.bytes));
    }
    return Status();
  }
  Status set(const Key& key, std::string_view value, uint64_t ttl_ms) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    wrong_type_keys_.erase(key);
    values_[key] = {std::string(value), ttl_ms ? now_ms() + ttl_ms : 0};
    return Status();
  }
  Status remove(const Key& key) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    values_.erase(key);
    wrong_type_keys_.erase(key);
    return Status();
  }
  Expected<bool> lease_acquire(const Key& key, std::string_view token, uint64_t ttl_ms) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    auto it = leases_.find(key);
    if (it != leases_.end() && !expired(it->second.expiry_ms) && it->second.bytes != token) return false;
    leases_[key] = {std::string(token), now_ms() + ttl_ms};
    return true;
  }
  Expected<bool> lease_renew(const Key& key, std::string_view token, uint64_t ttl_ms) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    auto it = leases_.find(key);
    if (it == leases_.end() || expired(it->second.expiry_ms) || it->second.bytes != token) return false;
    it->second.expiry_ms = now_ms() + ttl_ms;
    return true;
  }
  Expected<bool> lease_release(const Key& key, std::string_view token) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    auto it = leases_.find(key);
    if (it == leases_.end() || expired(it->second.expiry_ms) || it->second.bytes != token) return false;
    leases_.erase(it);
    return true;
  }
  Expected<bool> lease_held(const Key& key) override {
    KCACHE_RETURN_IF_ERROR(enter());
    std::lock_guard g(mu_);
    auto it = leases_.find(key);
    return it != leases_.end() && !expired(it->second.expiry_ms);
  }

 private:
  struct Record {
    std::string bytes;       // the value, or the lease holder's token
    uint64_t expiry_ms = 0;  // 0: none
  };
  static uint64_t now_ms() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  static bool expired(uint64_t expiry_ms) { return expiry_ms != 0 && now_ms() >= expiry_ms; }

  // The injected fault of one call, before it touches the map.
  Status enter() {
    calls_++;
    switch (fault_.load()) {
      case Fault::none:
        return Status();
      case Fault::timeout:
        std::this_thread::sleep_for(std::chrono::milliseconds(command_ms_.load()));
        return Status(Errc::timeout, "memory-remote: Resource temporarily unavailable");
      case Fault::reset:
        return Status(Errc::unavailable, "memory-remote: Connection reset by peer");
      case Fault::refused:
        return Status(Errc::unavailable, "memory-remote: Connection refused");
      case Fault::garbage:
        return Status(Errc::unavailable, "memory-remote: Protocol error, got \"\\x17\" as reply type byte");
      case Fault::error_reply:
        return Status(Errc::io_error, "memory-remote: ERR out of memory");
      case Fault::wrong_type:
        return Status(Errc::corrupt, "memory-remote: reply of the wrong type");
      case Fault::slow: {
        uint64_t slow = slow_ms_.load(), limit = command_ms_.load();
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(slow, limit)));
        if (slow >= limit) return Status(Errc::timeout, "memory-remote: Resource temporarily unavailable");
        return Status();
      }
    }
    return Status();
  }

  std::atomic<Fault> fault_{Fault::none};
  std::atomic<uint64_t> slow_ms_{0}, connect_ms_{250}, command_ms_{500}, calls_{0};
  std::mutex mu_;
  std::map<Key, Record> values_;         // GUARDED_BY(mu_)
  std::map<Key, Record> leases_;         // GUARDED_BY(mu_)
  std::map<Key, bool> wrong_type_keys_;  // GUARDED_BY(mu_)
};

}  // namespace kcache::test

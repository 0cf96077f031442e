// Private: who holds a lease, and whether that holder is still alive.
//
// Record (48 bytes, little-endian):
//   u64 token | u32 pid | u32 reserved | u64 start_ticks | u64 expiry_unix_ms
//   | host[16]
// host is a digest of the boot id and host name: PIDs are only compared
// for holders on this host and boot.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <atomic>

#include "kcache/key.h"
#include "util/util.h"

namespace kcache::lease {

struct Holder {
  uint64_t token = 0;
  uint32_t pid = 0;
  uint64_t start_ticks = 0;
  uint64_t expiry_ms = 0;
  Digest host;
};

inline constexpr size_t kHolderSize = 48;

std::string encode(const Holder& h);
bool decode(std::string_view s, Holder* out);

// This process, with the given token, expiring ttl_ms from now (or from
// now_ms, a wall-clock time of the caller's Env).
Holder self(uint64_t token, uint64_t ttl_ms);
Holder self(uint64_t token, uint64_t ttl_ms, uint64_t now_ms);
uint64_t new_token();

// A Leases object's holder token. A child of fork() gets a fresh one: it is
// another process and must not count as the holder of its parent's leases.
// No lock: a mutex inherited locked by a child of fork() (another parent
// thread was in get()) would hang the child. The token is a function of a
// random seed of this object, the process and its fork generation, so
// threads that compute it at once agree.
class Token {
 public:
  uint64_t get() {
    const uint64_t g = util::fork_generation();
    if (gen_.load(std::memory_order_acquire) == g) return token_.load(std::memory_order_relaxed);
    uint64_t t = derive(g);
    token_.store(t, std::memory_order_relaxed);
    gen_.store(g, std::memory_order_release);
    return t;
  }

 private:
  uint64_t derive(uint64_t g) const;
  const uint64_t seed_ = new_token();
  std::atomic<uint64_t> token_{0};
  std::atomic<uint64_t> gen_{~uint64_t{0}};  // the generation token_ is for; none yet
};

// True when the lease must not be taken over: unexpired and, if the holder
// is on this host, its process still running.
bool alive(const Holder& h, uint64_t now_ms);

// The holder's identity in a record kept elsewhere (a remote server's
// lease): "<host name>:<pid>:<random>:<start ticks>:<host digest hex>",
// the random part from `random`.
std::string process_token(uint64_t random);
// True when `token` (process_token()) names a process of this host, boot
// and PID namespace that is gone: its PID not running, a zombie, or reused by a process
// started at another time. False for anything else (another host, another
// form of token, this process).
bool token_holder_dead(std::string_view token);

}  // namespace kcache::lease

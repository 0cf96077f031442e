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

#include <mutex>

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

// This process, with the given token, expiring ttl_ms from now.
Holder self(uint64_t token, uint64_t ttl_ms);
uint64_t new_token();

// A Leases object's holder token. A child of fork() gets a fresh one: it is
// another process and must not count as the holder of its parent's leases.
class Token {
 public:
  uint64_t get() {
    std::lock_guard lk(mu_);
    uint64_t g = util::fork_generation();
    if (token_ == 0 || g != gen_) {
      token_ = new_token();
      gen_ = g;
    }
    return token_;
  }

 private:
  std::mutex mu_;
  uint64_t token_ = 0;  // GUARDED_BY(mu_)
  uint64_t gen_ = 0;    // GUARDED_BY(mu_)
};

// True when the lease must not be taken over: unexpired and, if the holder
// is on this host, its process still running.
bool alive(const Holder& h, uint64_t now_ms);

}  // namespace kcache::lease

// The framing of a remote value (docs/format.md, "Redis value"): an 8-byte
// header, an HMAC-SHA256 when a secret is configured, then the entry's
// bytes. The remote policy (remote_tier.cc) encodes every value it sends
// and opens every value it gets through one ValueFrame; what a refused
// value costs (a counter, a log line) stays the policy's.
//
// Thread-safety: const methods are safe for concurrent use.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache::remote_value {

// Bytes a value adds to its entry at most: the header and a MAC.
inline constexpr size_t kMaxOverhead = 8 + 32;

class ValueFrame {
 public:
  // Empty secret: values carry no MAC and none is checked.
  explicit ValueFrame(std::string secret);
  ~ValueFrame();
  ValueFrame(const ValueFrame&) = delete;
  ValueFrame& operator=(const ValueFrame&) = delete;

  // False when a secret is configured but OpenSSL has no HMAC.
  bool ok() const noexcept { return secret_.empty() || mac_ != nullptr; }
  // The 16-bit id of the secret that values carry (0: no secret).
  uint16_t fingerprint() const noexcept { return fingerprint_; }

  Expected<std::string> encode(const Entry& e) const;

  // What a value holds, checked in docs/format.md's order before a byte of
  // the entry is parsed: where the entry starts, or why the value is
  // refused, or (foreign) the id of another secret it was stored with.
  struct Opened {
    size_t entry_offset = 0;
    const char* refused = nullptr;  // set: refused, for this reason
    uint16_t foreign = 0;           // set: stored with another secret
  };
  Opened open(const Key& key, std::string_view value, uint64_t max_entry_bytes) const;

 private:
  bool mac_of(const Key& key, std::string_view header, std::string_view body, unsigned char out[32]) const;

  std::string secret_;
  EVP_MAC* mac_ = nullptr;
  uint16_t fingerprint_ = 0;
};

}  // namespace kcache::remote_value

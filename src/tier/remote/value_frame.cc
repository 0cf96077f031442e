// The framing of a remote value (value_frame.h, docs/format.md).
#include "tier/remote/value_frame.h"

#include <openssl/crypto.h>
#include <openssl/params.h>

#include <cstring>

namespace kcache::remote_value {

namespace {

constexpr char kMagic[4] = {'K', 'C', 'R', 'V'};
constexpr uint8_t kValueVersion = 1;
constexpr uint8_t kMacNone = 0, kMacHmacSha256 = 1;
constexpr size_t kValueHeader = 8, kMacSize = 32;
constexpr std::string_view kMacContext = "kcache-redis-value/1";
constexpr std::string_view kFingerprintContext = "kcache-secret-fingerprint/1";
static_assert(kValueHeader + kMacSize == kMaxOverhead);

}  // namespace

ValueFrame::ValueFrame(std::string secret) : secret_(std::move(secret)) {
  if (secret_.empty()) return;
  mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  // 16 bits naming the secret (never 0, which stands for "not said"):
  // HMAC-SHA256(secret, kFingerprintContext), its first two bytes. Values
  // carry it in their header, so a reader with another secret knows the
  // value was stored with a different one rather than damaged.
  unsigned char m[kMacSize];
  Key none{};
  if (!mac_ || !mac_of(none, kFingerprintContext, {}, m)) {
    fingerprint_ = 1;
    return;
  }
  uint16_t f = static_cast<uint16_t>(m[0] | (m[1] << 8));
  fingerprint_ = f ? f : 1;
}

ValueFrame::~ValueFrame() {
  if (mac_) EVP_MAC_free(mac_);
}

bool ValueFrame::mac_of(const Key& key, std::string_view header, std::string_view body,
                        unsigned char out[kMacSize]) const {
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac_);
  if (!ctx) return false;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  size_t len = 0;
  bool ok = EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(secret_.data()), secret_.size(), params) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(kMacContext.data()), kMacContext.size()) == 1 &&
            EVP_MAC_update(ctx, key.bytes.data(), key.bytes.size()) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(header.data()), header.size()) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(body.data()), body.size()) == 1 &&
            EVP_MAC_final(ctx, out, &len, kMacSize) == 1 && len == kMacSize;
  EVP_MAC_CTX_free(ctx);
  return ok;
}

Expected<std::string> ValueFrame::encode(const Entry& e) const {
  std::string_view body = e.encoded();
  std::string v;
  bool mac = !secret_.empty();
  v.reserve(kValueHeader + (mac ? kMacSize : 0) + body.size());
  v.append(kMagic, 4);
  v.push_back(static_cast<char>(kValueVersion));
  v.push_back(static_cast<char>(mac ? kMacHmacSha256 : kMacNone));
  v.push_back(static_cast<char>(fingerprint_ & 0xff));  // 0 without a secret
  v.push_back(static_cast<char>(fingerprint_ >> 8));
  if (mac) {
    unsigned char m[kMacSize];
    if (!mac_of(e.key(), std::string_view(v.data(), kValueHeader), body, m))
      return Status(Errc::internal, "HMAC-SHA256 failed");
    v.append(reinterpret_cast<const char*>(m), kMacSize);
  }
  v.append(body);
  return v;
}

ValueFrame::Opened ValueFrame::open(const Key& key, std::string_view v, uint64_t max_entry_bytes) const {
  Opened o;
  auto refuse = [&](const char* why) {
    o.refused = why;
    return o;
  };
  if (v.size() > max_entry_bytes + kValueHeader + kMacSize) return refuse("larger than max_entry_bytes");
  if (v.size() < kValueHeader || std::memcmp(v.data(), kMagic, 4) != 0 || static_cast<uint8_t>(v[4]) != kValueVersion)
    return refuse("not a kcache value");
  uint8_t alg = static_cast<uint8_t>(v[5]);
  size_t off = kValueHeader;
  if (alg == kMacHmacSha256) {
    if (v.size() < kValueHeader + kMacSize) return refuse("truncated MAC");
    off += kMacSize;
  } else if (alg != kMacNone) {
    return refuse("unknown MAC algorithm");
  }
  uint16_t stored_fp = static_cast<uint16_t>(static_cast<uint8_t>(v[6]) | (static_cast<uint8_t>(v[7]) << 8));
  if (fingerprint_ != 0 && alg == kMacHmacSha256 && stored_fp != 0 && stored_fp != fingerprint_) {
    // Stored with another secret: not damaged, not ours. (A value of a
    // build that wrote no fingerprint, 0, gets the MAC check.)
    o.foreign = stored_fp;
    return o;
  }
  if (!secret_.empty()) {
    if (alg != kMacHmacSha256) return refuse("no MAC, and a secret is configured");
    unsigned char m[kMacSize];
    if (!mac_of(key, v.substr(0, kValueHeader), v.substr(off), m)) return refuse("HMAC-SHA256 failed");
    if (CRYPTO_memcmp(m, v.data() + kValueHeader, kMacSize) != 0) return refuse("MAC mismatch");
  }
  o.entry_offset = off;
  return o;
}

}  // namespace kcache::remote_value

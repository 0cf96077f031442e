// Bundle checksums, SHA-256 and Ed25519 keys and signatures (OpenSSL EVP).
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "kcache/bundle.h"
#include "tier/bundle/bundle_format.h"
#include "util/fast_xxhash.h"
#include "util/fd.h"
#include "util/util.h"

namespace kcache::bundle {

namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct CtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using MdCtx = std::unique_ptr<EVP_MD_CTX, CtxFree>;

Expected<Pkey> read_pem(const std::string& path, bool private_key) {
  auto text = util::read_file(path, 1 << 16);
  if (!text) return Status(text.error().code(), "key file: " + text.error().message());
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(text->data(), static_cast<int>(text->size())),
                                                &BIO_free);
  if (!bio) return Status(Errc::internal, "out of memory reading " + path);
  EVP_PKEY* k = private_key ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr)
                            : PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr);
  if (!k)
    return Status(Errc::invalid_argument, path + " is not a PEM " + (private_key ? "private" : "public") + " key");
  Pkey key(k);
  if (EVP_PKEY_id(k) != EVP_PKEY_ED25519) return Status(Errc::invalid_argument, path + " is not an Ed25519 key");
  return key;
}

}  // namespace

std::array<unsigned char, 16> xxh128(std::string_view bytes) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
  std::array<unsigned char, 16> out;
  std::memcpy(out.data(), c.digest, 16);
  return out;
}

Sha256 sha256(std::string_view bytes) {
  Sha256 out{};
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), out.data(), &n, EVP_sha256(), nullptr);
  return out;
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

std::string fingerprint(const PublicKey& pub) {
  Sha256 h = sha256(std::string_view(reinterpret_cast<const char*>(pub.data()), pub.size()));
  return hex(h.data(), h.size());
}

Expected<std::array<unsigned char, 64>> sign(const std::string& key_file, std::string_view msg, PublicKey* pub) {
  KCACHE_TRY(Pkey key, read_pem(key_file, true));
  size_t n = pub->size();
  if (EVP_PKEY_get_raw_public_key(key.get(), pub->data(), &n) != 1 || n != 32)
    return Status(Errc::invalid_argument, key_file + ": no Ed25519 public key");
  MdCtx ctx(EVP_MD_CTX_new());
  std::array<unsigned char, 64> sig{};
  size_t len = sig.size();
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), sig.data(), &len, reinterpret_cast<const unsigned char*>(msg.data()), msg.size()) !=
          1 ||
      len != 64)
    return Status(Errc::internal, "Ed25519 signing failed");
  return sig;
}

bool verify_signature(const PublicKey& pub, std::string_view msg, const unsigned char sig[64]) {
  Pkey key(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, pub.data(), pub.size()));
  if (!key) return false;
  MdCtx ctx(EVP_MD_CTX_new());
  return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), sig, 64, reinterpret_cast<const unsigned char*>(msg.data()), msg.size()) == 1;
}

// An Ed25519 SubjectPublicKeyInfo is these 12 DER bytes, then the 32-byte
// key (RFC 8410). Decoded here directly: OpenSSL's generic PEM decoder costs
// more than the rest of opening a bundle.
constexpr unsigned char kEd25519Spki[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};

Expected<PublicKey> read_public_key(const std::string& path) {
  auto text = util::read_file(path, 1 << 16);
  if (!text) return Status(text.error().code(), "key file: " + text.error().message());
  const std::string begin = "-----BEGIN PUBLIC KEY-----", end = "-----END PUBLIC KEY-----";
  size_t b = text->find(begin), e = text->find(end);
  if (b == std::string::npos || e == std::string::npos || e < b)
    return Status(Errc::invalid_argument, path + " is not a PEM public key");
  std::string b64;
  for (size_t i = b + begin.size(); i < e; ++i)
    if ((*text)[i] != '\n' && (*text)[i] != '\r') b64.push_back((*text)[i]);
  unsigned char der[64];
  if (b64.size() != 60) return Status(Errc::invalid_argument, path + " is not an Ed25519 public key");
  int n = EVP_DecodeBlock(der, reinterpret_cast<const unsigned char*>(b64.data()), static_cast<int>(b64.size()));
  // 60 base64 characters are 45 bytes, the last one padding.
  if (n != 45 || std::memcmp(der, kEd25519Spki, sizeof kEd25519Spki) != 0)
    return Status(Errc::invalid_argument, path + " is not an Ed25519 public key");
  PublicKey pub{};
  std::memcpy(pub.data(), der + sizeof kEd25519Spki, 32);
  return pub;
}

}  // namespace kcache::bundle

namespace kcache {

Status bundle_keygen(const std::string& key_file) {
  if (key_file.empty()) return Status(Errc::invalid_argument, "no key file named");
  std::string pub_file = key_file + ".pub";
  struct stat st;
  if (::stat(key_file.c_str(), &st) == 0 || ::stat(pub_file.c_str(), &st) == 0)
    return Status(Errc::invalid_argument, key_file + " or " + pub_file + " exists already; not overwritten");
  bundle::Pkey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (!key) return Status(Errc::internal, "Ed25519 key generation failed");
  auto pem = [&](bool priv) -> Expected<std::string> {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
    if (!bio) return Status(Errc::internal, "out of memory");
    int ok = priv ? PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr)
                  : PEM_write_bio_PUBKEY(bio.get(), key.get());
    if (ok != 1) return Status(Errc::internal, "PEM encoding failed");
    char* p = nullptr;
    long n = BIO_get_mem_data(bio.get(), &p);
    return std::string(p, static_cast<size_t>(n));
  };
  KCACHE_TRY(std::string priv, pem(true));
  KCACHE_TRY(std::string pub, pem(false));
  // O_EXCL: never replaces a key that appeared meanwhile.
  Env& env = *Env::posix();
  util::Fd fd(env.open(key_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600), env);
  if (!fd) return util::errno_status(errno, "create " + key_file);
  int err = env.fchmod(fd.get(), 0600) != 0 ? errno : util::pwrite_all(env, fd.get(), priv);
  if (err == 0 && env.fdatasync(fd.get()) != 0) err = errno;
  if (fd.close() != 0 && err == 0) err = errno;
  if (err != 0) {
    env.unlink(key_file);
    return util::errno_status(err, "write " + key_file);
  }
  Status s = util::write_file_atomic_via(key_file + ".tmp", pub_file, pub, true, 0644, env);
  if (!s.is_ok()) env.unlink(key_file);
  return s;
}

}  // namespace kcache

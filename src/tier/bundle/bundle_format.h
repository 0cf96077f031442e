// Private: the bundle byte layout (docs/format.md, "Bundle") and the
// primitives shared by the bundle reader and writer: checksums, SHA-256,
// Ed25519 keys and signatures.
//
//   bundle  := header(128) index blocks signature? padding entries
//   header  := magic "KCBUNDL\x1a" | u32 version | u32 flags | u32 entry_version
//              | u32 block_records | u64 count | u64 index_offset | u64 blocks_offset
//              | u64 sig_offset | u64 data_offset | u64 file_size | u64 created_ms
//              | index_checksum[16] | reserved[16] | header_checksum[16]
//   index   := count * (key[16] | u64 offset | u64 length | sha256[32]), keys ascending
//   blocks  := ceil(count / block_records) * sha256[32] of each run of index records
//   signature := "KCBSIGN\x1a" | u32 alg (1 = Ed25519) | u32 0 | public_key[32]
//                | signature[64] | reserved[16]
//   signed message := "kcache-bundle/1\0" | header | blocks
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache::bundle {

inline constexpr char kMagic[8] = {'K', 'C', 'B', 'U', 'N', 'D', 'L', '\x1a'};
inline constexpr char kSigMagic[8] = {'K', 'C', 'B', 'S', 'I', 'G', 'N', '\x1a'};
inline constexpr std::string_view kSignContext{"kcache-bundle/1\0", 16};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kFlagSigned = 1;
inline constexpr uint32_t kAlgEd25519 = 1;
inline constexpr size_t kHeaderSize = 128;
inline constexpr size_t kRecordSize = 64;
inline constexpr size_t kSigSize = 128;
inline constexpr uint32_t kBlockRecords = 1024;
inline constexpr size_t kAlign = 64;

// Header field offsets.
enum : size_t {
  h_version = 8,
  h_flags = 12,
  h_entry_version = 16,
  h_block_records = 20,
  h_count = 24,
  h_index_offset = 32,
  h_blocks_offset = 40,
  h_sig_offset = 48,
  h_data_offset = 56,
  h_file_size = 64,
  h_created = 72,
  h_index_checksum = 80,
  h_reserved = 96,
  h_header_checksum = 112,
};
// Index record field offsets.
enum : size_t { r_key = 0, r_offset = 16, r_length = 24, r_sha = 32 };

using Sha256 = std::array<unsigned char, 32>;

// XXH3-128 in canonical (big-endian) byte order, as entries use.
std::array<unsigned char, 16> xxh128(std::string_view bytes);
Sha256 sha256(std::string_view bytes);

// Ed25519 through OpenSSL.
using PublicKey = std::array<unsigned char, 32>;
// A private key file (PEM) -> its raw public key and a signature over msg.
Expected<std::array<unsigned char, 64>> sign(const std::string& key_file, std::string_view msg, PublicKey* pub);
bool verify_signature(const PublicKey& pub, std::string_view msg, const unsigned char sig[64]);
// A public key file (PEM, as bundle_keygen writes KEYFILE.pub).
Expected<PublicKey> read_public_key(const std::string& path);
std::string hex(const unsigned char* p, size_t n);
// Hex SHA-256 of a raw public key: how a signer is named.
std::string fingerprint(const PublicKey& pub);

}  // namespace kcache::bundle

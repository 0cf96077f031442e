// Redis tier: standalone or Cluster, through hiredis (blocking contexts).
//
// Structure:
//  * Node: one server address and a pool of idle connections to it. A
//    connection is borrowed for one command (or one pipeline) and returned
//    only if it is still in a clean state; after any I/O error or timeout it
//    is freed, because an unread reply would answer the next command.
//  * Routing: standalone sends everything to node 0. Cluster keeps a slot
//    table (slot -> node index) loaded with CLUSTER SLOTS; MOVED updates the
//    slot and reloads the table, ASK sends ASKING + the command once to the
//    named node. Every Redis key of one cache key shares the hash tag {hex},
//    so an entry and its lease live in one slot.
//  * Breaker: `failures_` counts consecutive failed calls; reaching the
//    threshold sets `open_until_ms_`. While now < open_until_ms_ calls are
//    skipped; afterwards one caller wins a CAS on open_until_ms_ and probes,
//    the others keep skipping until its call succeeds (closing the breaker)
//    or fails (reopening it).
//  * Writes: put() queues the entry; one background thread sends queued
//    writes and lease releases in order, so a lease is released only after
//    this process's write of the entry was sent.
//  * Values: "KCRV" header, optional HMAC-SHA256, then the entry bytes
//    (docs/format.md, "Redis value"). The MAC is checked before
//    Entry::decode sees a byte.
#include <hiredis/hiredis.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "kcache/redis.h"
#include "util/util.h"

namespace kcache {

uint16_t redis_key_slot(std::string_view key) noexcept {
  if (auto open = key.find('{'); open != std::string_view::npos) {
    auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1) key = key.substr(open + 1, close - open - 1);
  }
  uint16_t crc = 0;  // CRC16-CCITT (XMODEM): poly 0x1021, init 0, no reflection
  for (char ch : key) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(ch) << 8);
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return crc & 16383;
}

namespace {

constexpr char kMagic[4] = {'K', 'C', 'R', 'V'};
constexpr uint8_t kValueVersion = 1;
constexpr uint8_t kMacNone = 0, kMacHmacSha256 = 1;
constexpr size_t kValueHeader = 8, kMacSize = 32;
constexpr std::string_view kMacContext = "kcache-redis-value/1";
constexpr size_t kPipelineBatch = 128;
constexpr int kMaxRedirects = 5;

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { if (r) freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;
struct ContextFree {
  void operator()(redisContext* c) const noexcept { if (c) redisFree(c); }
};
using Conn = std::unique_ptr<redisContext, ContextFree>;

timeval to_timeval(uint64_t ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

uint64_t mono_ms() { return util::now_mono_us() / 1000; }

std::string_view reply_str(const redisReply* r) { return {r->str, r->len}; }

// Entry bytes that live inside a hiredis reply: a hit is not copied again.
class ReplyBuffer final : public Buffer {
 public:
  ReplyBuffer(Reply r, size_t offset) : r_(std::move(r)), off_(offset) {}
  std::string_view bytes() const noexcept override { return {r_->str + off_, r_->len - off_}; }

 private:
  Reply r_;
  size_t off_;
};

struct Endpoint {
  std::string host;
  int port = 6379;
};

struct ParsedUrl {
  bool cluster = false;
  std::vector<Endpoint> seeds;
  std::string user, password;
  int db = 0;
  RedisTierOptions opt;
};

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

Status bad_url(const std::string& url, const std::string& why) {
  // The URL may hold a password: name only the problem.
  (void)url;
  return Status(Errc::invalid_argument, "redis URL: " + why);
}

Status apply_query(std::string_view q, RedisTierOptions* o, const std::string& url) {
  while (!q.empty()) {
    auto amp = q.find('&');
    std::string_view kv = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) return bad_url(url, "option without a value: " + std::string(kv));
    std::string_view k = kv.substr(0, eq), v = kv.substr(eq + 1);
    uint64_t n = 0;
    if (k == "key_prefix") {
      o->key_prefix = std::string(v);
      continue;
    }
    if (k == "read_only") {
      if (v == "1" || v == "true" || v == "yes") o->read_only = true;
      else if (v == "0" || v == "false" || v == "no") o->read_only = false;
      else return bad_url(url, "read_only wants 0 or 1");
      continue;
    }
    if (!parse_u64(v, &n)) return bad_url(url, "option " + std::string(k) + " wants a number");
    if (k == "connect_timeout_ms") o->connect_timeout_ms = n;
    else if (k == "command_timeout_ms") o->command_timeout_ms = n;
    else if (k == "ttl_ms") o->ttl_ms = n;
    else if (k == "max_entry_bytes") o->max_entry_bytes = n;
    else if (k == "breaker_threshold") o->breaker_threshold = static_cast<unsigned>(n);
    else if (k == "breaker_cooldown_ms") o->breaker_cooldown_ms = n;
    else if (k == "write_queue_depth") o->write_queue_depth = static_cast<unsigned>(n);
    else return bad_url(url, "unknown option " + std::string(k));
  }
  return Status();
}

Expected<ParsedUrl> parse_url(const std::string& url, const RedisTierOptions& base) {
  ParsedUrl p;
  p.opt = base;
  std::string_view s = url;
  if (s.starts_with("redis+cluster://")) {
    p.cluster = true;
    s.remove_prefix(16);
  } else if (s.starts_with("redis://")) {
    s.remove_prefix(8);
  } else {
    return bad_url(url, "scheme must be redis:// or redis+cluster://");
  }
  if (auto q = s.find('?'); q != std::string_view::npos) {
    KCACHE_RETURN_IF_ERROR(apply_query(s.substr(q + 1), &p.opt, url));
    s = s.substr(0, q);
  }
  if (auto at = s.rfind('@'); at != std::string_view::npos) {
    std::string_view info = s.substr(0, at);
    s = s.substr(at + 1);
    if (auto c = info.find(':'); c != std::string_view::npos) {
      p.user = std::string(info.substr(0, c));
      p.password = std::string(info.substr(c + 1));
    } else {
      p.password = std::string(info);
    }
  }
  if (auto slash = s.find('/'); slash != std::string_view::npos) {
    std::string_view db = s.substr(slash + 1);
    s = s.substr(0, slash);
    uint64_t n = 0;
    if (!db.empty()) {
      if (!parse_u64(db, &n) || n > 1000000) return bad_url(url, "database must be a number");
      if (p.cluster && n != 0) return bad_url(url, "Redis Cluster has only database 0");
      p.db = static_cast<int>(n);
    }
  }
  while (!s.empty()) {
    auto comma = s.find(',');
    std::string_view hp = s.substr(0, comma);
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
    Endpoint e;
    std::string_view host = hp, port;
    if (hp.starts_with("[")) {  // [v6]:port
      auto close = hp.find(']');
      if (close == std::string_view::npos) return bad_url(url, "unclosed [ in host");
      host = hp.substr(1, close - 1);
      if (close + 1 < hp.size()) {
        if (hp[close + 1] != ':') return bad_url(url, "junk after ]");
        port = hp.substr(close + 2);
      }
    } else if (auto c = hp.rfind(':'); c != std::string_view::npos) {
      host = hp.substr(0, c);
      port = hp.substr(c + 1);
    }
    if (host.empty()) return bad_url(url, "empty host");
    e.host = std::string(host);
    if (!port.empty()) {
      uint64_t n = 0;
      if (!parse_u64(port, &n) || n == 0 || n > 65535) return bad_url(url, "bad port");
      e.port = static_cast<int>(n);
    }
    p.seeds.push_back(std::move(e));
  }
  if (p.seeds.empty()) return bad_url(url, "no host");
  if (!p.cluster && p.seeds.size() > 1) return bad_url(url, "several hosts need redis+cluster://");
  RedisTierOptions& o = p.opt;
  if (!o.connect_timeout_ms) o.connect_timeout_ms = 250;
  if (!o.command_timeout_ms) o.command_timeout_ms = 500;
  if (!o.max_entry_bytes) o.max_entry_bytes = uint64_t(64) << 20;
  if (!o.breaker_threshold) o.breaker_threshold = 3;
  if (!o.breaker_cooldown_ms) o.breaker_cooldown_ms = 10000;
  if (!o.write_queue_depth) o.write_queue_depth = 64;
  return p;
}

struct Node {
  Endpoint ep;
  std::mutex mu;
  std::vector<Conn> idle;  // GUARDED_BY(mu)
};

// Lua: the lease operations must compare the holder token and act in one step.
constexpr const char* kAcquireLua =
    "local v = redis.call('GET', KEYS[1]) "
    "if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end "
    "if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end "
    "return 0";
constexpr const char* kRenewLua =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end "
    "return 0";
constexpr const char* kReleaseLua =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
    "return 0";

class RedisTierImpl final : public RedisTier {
 public:
  explicit RedisTierImpl(ParsedUrl p) : p_(std::move(p)), o_(p_.opt) {
    name_ = o_.read_only ? "redis(ro)" : "redis";
    for (const auto& e : p_.seeds) node_index(e);
    slots_.fill(-1);
    std::random_device rd;
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    token_ = std::string(host) + ":" + std::to_string(::getpid()) + ":" +
             std::to_string((uint64_t(rd()) << 32) | rd());
    if (!o_.secret.empty()) mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (p_.cluster) {
      Status st = refresh_slots();
      if (!st.is_ok()) KCACHE_LOG(LogLevel::warn, "redis cluster: no slot map yet: %s", st.to_string().c_str());
    }
    writer_ = std::thread([this] { write_loop(); });
  }

  ~RedisTierImpl() override {
    (void)flush();
    {
      std::lock_guard lk(q_mu_);
      stop_ = true;
    }
    q_cv_.notify_all();
    writer_.join();
    if (mac_) EVP_MAC_free(mac_);
  }

  bool ok() const { return o_.secret.empty() || mac_ != nullptr; }
  std::string_view name() const noexcept override { return name_; }
  TierKind kind() const noexcept override { return TierKind::remote; }
  bool writable() const noexcept override { return !o_.read_only; }

  // ---- RedisTier ----------------------------------------------------------

  std::vector<std::optional<Entry>> get_many(const std::vector<Key>& keys) override {
    std::vector<std::optional<Entry>> out(keys.size());
    if (keys.empty()) return out;
    if (!allow()) {
      skipped_ += keys.size();
      return out;
    }
    std::vector<std::string> rkeys(keys.size());
    // Group by node (all on node 0 when standalone).
    std::unordered_map<int, std::vector<size_t>> groups;
    for (size_t i = 0; i < keys.size(); ++i) {
      rkeys[i] = entry_key(keys[i]);
      groups[p_.cluster ? node_for_slot(redis_key_slot(rkeys[i])) : 0].push_back(i);
    }
    std::vector<size_t> retry;  // redirected keys, asked one by one
    for (auto& [ni, idx] : groups) {
      Node& n = node(ni);
      for (size_t b = 0; b < idx.size(); b += kPipelineBatch) {
        size_t e = std::min(idx.size(), b + kPipelineBatch);
        auto conn = borrow(n);
        if (!conn) {
          fail(conn.error());
          return out;
        }
        redisContext* c = conn->get();
        for (size_t j = b; j < e; ++j) {
          const char* argv[2] = {"GET", rkeys[idx[j]].data()};
          size_t lens[2] = {3, rkeys[idx[j]].size()};
          redisAppendCommandArgv(c, 2, argv, lens);
        }
        for (size_t j = b; j < e; ++j) {
          void* raw = nullptr;
          if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
            fail(conn_error(n, c));
            return out;  // the connection is dropped with its unread replies
          }
          Reply r(static_cast<redisReply*>(raw));
          size_t i = idx[j];
          if (r->type == REDIS_REPLY_ERROR) {
            if (p_.cluster && (reply_str(r.get()).starts_with("MOVED ") || reply_str(r.get()).starts_with("ASK ")))
              retry.push_back(i);
            else
              errors_++;
            continue;
          }
          out[i] = accept(keys[i], std::move(r));
          if (out[i]) hits_++;
          else misses_++;
        }
        give_back(n, std::move(*conn));
      }
    }
    succeed();
    for (size_t i : retry) {
      auto r = do_get(keys[i], MissCount::counted);
      if (r && r->has_value()) out[i] = std::move(**r);
    }
    return out;
  }

  Expected<bool> acquire_lease(const Key& key, uint64_t ttl_ms) override {
    bool releasing;
    {
      std::lock_guard g(q_mu_);
      releasing = pending_releases_.count(key) != 0;
    }
    // A queued release of this key must not remove the lease taken now.
    if (releasing) (void)flush();
    if (!allow()) {
      skipped_++;
      return Status(Errc::unavailable, "redis: circuit breaker open");
    }
    std::string lk = lease_key(key), ttl = std::to_string(ttl_ms ? ttl_ms : 1);
    KCACHE_TRY(Reply r, run(lk, {"EVAL", kAcquireLua, "1", lk, token_, ttl}));
    if (r->type != REDIS_REPLY_INTEGER) return Status(Errc::io_error, "redis: unexpected lease reply");
    if (r->integer == 1) {
      std::lock_guard g(c_mu_);
      ++c_.leases_taken;
      return true;
    }
    std::lock_guard g(c_mu_);
    ++c_.leases_busy;
    return false;
  }

  bool renew_lease(const Key& key, uint64_t ttl_ms) override {
    if (!allow()) {
      skipped_++;
      return false;
    }
    std::string lk = lease_key(key), ttl = std::to_string(ttl_ms ? ttl_ms : 1);
    auto r = run(lk, {"EVAL", kRenewLua, "1", lk, token_, ttl});
    return r && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1;
  }

  void release_lease(const Key& key) override {
    // Never dropped, even with a full queue: a lost release makes every
    // waiter sit out the lease's TTL.
    Task t;
    t.kind = Task::release;
    t.key = key;
    {
      std::lock_guard lk(q_mu_);
      ++pending_releases_[key];
      q_.push_back(std::move(t));
    }
    q_cv_.notify_one();
  }

  std::optional<Entry> wait_for(const Key& key, uint64_t bound_ms) override {
    uint64_t deadline = mono_ms() + bound_ms, sleep_ms = 2;
    std::string lk = lease_key(key);
    for (;;) {
      if (!allow()) {
        skipped_++;
        return std::nullopt;
      }
      auto r = fetch(key);
      if (!r) return std::nullopt;  // the server cannot be asked: stop waiting
      if (r->has_value()) {
        hits_++;
        std::lock_guard g(c_mu_);
        ++c_.lease_waits;
        return std::move(*r);
      }
      auto ex = run(lk, {"EXISTS", lk});
      if (!ex) return std::nullopt;
      if ((*ex)->type == REDIS_REPLY_INTEGER && (*ex)->integer == 0) {
        // The holder is gone; it may have stored the entry just before.
        auto again = fetch(key);
        if (again && again->has_value()) {
          hits_++;
          return std::move(*again);
        }
        return std::nullopt;
      }
      uint64_t now = mono_ms();
      if (now >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(sleep_ms, deadline - now)));
      sleep_ms = std::min<uint64_t>(sleep_ms * 2, 50);
    }
  }

  Status flush() override {
    // Bounded by progress: each write either completes or fails within the
    // timeouts, so a stall longer than that means something is wrong.
    const uint64_t stall_ms = 2 * (o_.connect_timeout_ms + o_.command_timeout_ms) + 100;
    std::unique_lock lk(q_mu_);
    uint64_t seen = done_;
    while (!q_.empty() || busy_) {
      if (!idle_cv_.wait_for(lk, std::chrono::milliseconds(stall_ms), [&] { return (q_.empty() && !busy_) || done_ != seen; })) {
        return Status(Errc::timeout, "redis: queued writes made no progress for " + std::to_string(stall_ms) + " ms");
      }
      seen = done_;
    }
    return Status();
  }

  RedisCounters counters() const override {
    std::lock_guard g(c_mu_);
    RedisCounters c = c_;
    c.breaker_opens = breaker_opens_.load();
    return c;
  }

 protected:
  Expected<std::optional<Entry>> do_get(const Key& key, MissCount count) override {
    if (!allow()) {
      skipped_++;
      return std::optional<Entry>();
    }
    auto r = fetch(key);
    if (!r) return std::move(r).error();
    if (r->has_value()) hits_++;
    else if (count == MissCount::counted) misses_++;
    return r;
  }

  Status do_put(const Entry& entry) override {
    if (o_.read_only) {
      rejected_++;
      return Status(Errc::read_only, "redis tier is read-only");
    }
    if (entry.encoded().size() > o_.max_entry_bytes) {
      rejected_++;
      return Status(Errc::too_large, "entry of " + std::to_string(entry.encoded().size()) +
                                         " bytes is larger than the redis tier's max_entry_bytes");
    }
    if (breaker_open()) {
      skipped_++;
      return Status();
    }
    Task t;
    t.kind = Task::put;
    t.key = entry.key();
    t.entry = entry.pinned() ? entry.detach() : entry;
    {
      std::lock_guard lk(q_mu_);
      if (q_.size() >= o_.write_queue_depth) {
        if (dropped_.fetch_add(1) == 0)
          KCACHE_LOG(LogLevel::info, "redis: write queue full (%u); dropping writes", o_.write_queue_depth);
        return Status();
      }
      q_.push_back(std::move(t));
    }
    q_cv_.notify_one();
    return Status();
  }

  Status do_remove(const Key& key) override {
    if (o_.read_only) {
      rejected_++;
      return Status(Errc::read_only, "redis tier is read-only");
    }
    if (!allow()) {
      skipped_++;
      return Status(Errc::unavailable, "redis: circuit breaker open");
    }
    std::string k = entry_key(key);
    KCACHE_TRY(Reply r, run(k, {"DEL", k}));
    (void)r;
    return Status();
  }

  TierStats do_stats() override {
    TierStats s;
    s.hits = hits_.load();
    s.misses = misses_.load();
    s.puts = puts_.load();
    s.corrupt = corrupt_.load();
    s.errors = errors_.load();
    s.rejected = rejected_.load();
    s.skipped = skipped_.load();
    s.dropped = dropped_.load();
    return s;
  }

 private:
  struct Task {
    enum Kind { put, release } kind = put;
    Key key;
    Entry entry;
  };

  std::string entry_key(const Key& k) const { return o_.key_prefix + "{" + k.hex() + "}"; }
  std::string lease_key(const Key& k) const { return o_.key_prefix + "{" + k.hex() + "}:lease"; }

  // ---- values ---------------------------------------------------------------

  bool compute_mac(const Key& key, std::string_view header, std::string_view body, unsigned char out[kMacSize]) const {
    EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac_);
    if (!ctx) return false;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
    size_t len = 0;
    bool ok = EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(o_.secret.data()), o_.secret.size(), params) == 1 &&
              EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(kMacContext.data()), kMacContext.size()) == 1 &&
              EVP_MAC_update(ctx, key.bytes.data(), key.bytes.size()) == 1 &&
              EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(header.data()), header.size()) == 1 &&
              EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(body.data()), body.size()) == 1 &&
              EVP_MAC_final(ctx, out, &len, kMacSize) == 1 && len == kMacSize;
    EVP_MAC_CTX_free(ctx);
    return ok;
  }

  Expected<std::string> encode_value(const Entry& e) const {
    std::string_view body = e.encoded();
    std::string v;
    bool mac = !o_.secret.empty();
    v.reserve(kValueHeader + (mac ? kMacSize : 0) + body.size());
    v.append(kMagic, 4);
    v.push_back(static_cast<char>(kValueVersion));
    v.push_back(static_cast<char>(mac ? kMacHmacSha256 : kMacNone));
    v.append(2, '\0');
    if (mac) {
      unsigned char m[kMacSize];
      if (!compute_mac(e.key(), std::string_view(v.data(), kValueHeader), body, m))
        return Status(Errc::internal, "HMAC-SHA256 failed");
      v.append(reinterpret_cast<const char*>(m), kMacSize);
    }
    v.append(body);
    return v;
  }

  // A GET reply to an entry, or a miss with a counter. Nothing past the
  // value header is parsed before the MAC (when configured) is checked.
  std::optional<Entry> accept(const Key& key, Reply r) {
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    if (r->type != REDIS_REPLY_STRING) {
      errors_++;
      return std::nullopt;
    }
    std::string_view v = reply_str(r.get());
    auto reject = [&](const char* why) -> std::optional<Entry> {
      rejected_++;
      KCACHE_LOG(LogLevel::warn, "redis: rejected value for %s: %s", key.hex().c_str(), why);
      return std::nullopt;
    };
    if (v.size() > o_.max_entry_bytes + kValueHeader + kMacSize) return reject("larger than max_entry_bytes");
    if (v.size() < kValueHeader || std::memcmp(v.data(), kMagic, 4) != 0 || static_cast<uint8_t>(v[4]) != kValueVersion)
      return reject("not a kcache value");
    uint8_t alg = static_cast<uint8_t>(v[5]);
    size_t off = kValueHeader;
    if (alg == kMacHmacSha256) {
      if (v.size() < kValueHeader + kMacSize) return reject("truncated MAC");
      off += kMacSize;
    } else if (alg != kMacNone) {
      return reject("unknown MAC algorithm");
    }
    if (!o_.secret.empty()) {
      if (alg != kMacHmacSha256) return reject("no MAC, and a secret is configured");
      unsigned char m[kMacSize];
      if (!compute_mac(key, v.substr(0, kValueHeader), v.substr(off), m)) return reject("HMAC-SHA256 failed");
      if (CRYPTO_memcmp(m, v.data() + kValueHeader, kMacSize) != 0) return reject("MAC mismatch");
    }
    auto e = Entry::decode(std::make_shared<ReplyBuffer>(std::move(r), off), &key);
    if (!e) {
      corrupt_++;
      KCACHE_LOG(LogLevel::warn, "redis: corrupt entry %s: %s", key.hex().c_str(), e.error().to_string().c_str());
      return std::nullopt;
    }
    return std::move(e).value();
  }

  // GET and accept; an error only when the server could not be asked.
  Expected<std::optional<Entry>> fetch(const Key& key) {
    std::string k = entry_key(key);
    KCACHE_TRY(Reply r, run(k, {"GET", k}));
    return accept(key, std::move(r));
  }

  // ---- breaker --------------------------------------------------------------

  bool breaker_open() const {
    uint64_t until = open_until_ms_.load(std::memory_order_relaxed);
    return until != 0 && mono_ms() < until;
  }

  // False: skip the server (the caller counts it as skipped).
  bool allow() {
    uint64_t until = open_until_ms_.load(std::memory_order_relaxed);
    if (until == 0) return true;
    uint64_t now = mono_ms();
    if (now < until) return false;
    // Cool-down over: one caller probes, the rest skip until it answers.
    return open_until_ms_.compare_exchange_strong(until, now + o_.breaker_cooldown_ms);
  }

  void succeed() {
    if (failures_.load(std::memory_order_relaxed)) failures_.store(0, std::memory_order_relaxed);
    if (open_until_ms_.load(std::memory_order_relaxed)) {
      open_until_ms_.store(0);
      KCACHE_LOG(LogLevel::info, "redis: server answers again; circuit breaker closed");
    }
  }

  void fail(const Status& st) {
    errors_++;
    if (failures_.fetch_add(1) + 1 < o_.breaker_threshold) return;
    uint64_t now = mono_ms(), until = open_until_ms_.load();
    if (until == 0) {
      if (open_until_ms_.compare_exchange_strong(until, now + o_.breaker_cooldown_ms)) {
        breaker_opens_++;
        KCACHE_LOG(LogLevel::warn, "redis: %s; skipping the server for %llu ms", st.to_string().c_str(),
                   static_cast<unsigned long long>(o_.breaker_cooldown_ms));
      }
    } else {
      open_until_ms_.store(now + o_.breaker_cooldown_ms);  // a failed probe
    }
  }

  // ---- connections and routing ----------------------------------------------

  int node_index(const Endpoint& e) {
    std::string id = e.host + ":" + std::to_string(e.port);
    std::unique_lock lk(map_mu_);
    auto it = node_ids_.find(id);
    if (it != node_ids_.end()) return it->second;
    auto n = std::make_unique<Node>();
    n->ep = e;
    nodes_.push_back(std::move(n));
    int i = static_cast<int>(nodes_.size() - 1);
    node_ids_.emplace(id, i);
    return i;
  }

  Node& node(int i) {
    std::shared_lock lk(map_mu_);
    return *nodes_[i];  // nodes_ never shrinks and its Nodes never move
  }

  int node_for_slot(uint16_t slot) {
    std::shared_lock lk(map_mu_);
    int i = slots_[slot];
    return i < 0 ? 0 : i;
  }

  Status conn_error(Node& n, redisContext* c) {
    Errc code = (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) ? Errc::timeout : Errc::unavailable;
    return Status(code, "redis " + n.ep.host + ":" + std::to_string(n.ep.port) + ": " +
                            (c->errstr[0] ? c->errstr : "connection lost"));
  }

  Expected<Conn> borrow(Node& n) {
    {
      std::lock_guard lk(n.mu);
      if (!n.idle.empty()) {
        Conn c = std::move(n.idle.back());
        n.idle.pop_back();
        return c;
      }
    }
    Conn c(redisConnectWithTimeout(n.ep.host.c_str(), n.ep.port, to_timeval(o_.connect_timeout_ms)));
    if (!c) return Status(Errc::internal, "redis: out of memory");
    if (c->err) return conn_error(n, c.get());
    redisSetTimeout(c.get(), to_timeval(o_.command_timeout_ms));
    auto simple = [&](std::vector<std::string> args) -> Status {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (auto& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      Reply r(static_cast<redisReply*>(redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
      if (!r) return conn_error(n, c.get());
      if (r->type == REDIS_REPLY_ERROR) return Status(Errc::unavailable, "redis: " + std::string(reply_str(r.get())));
      return Status();
    };
    if (!p_.password.empty()) {
      KCACHE_RETURN_IF_ERROR(p_.user.empty() ? simple({"AUTH", p_.password}) : simple({"AUTH", p_.user, p_.password}));
    }
    if (p_.db != 0) KCACHE_RETURN_IF_ERROR(simple({"SELECT", std::to_string(p_.db)}));
    return c;
  }

  void give_back(Node& n, Conn c) {
    std::lock_guard lk(n.mu);
    if (n.idle.size() < 16) n.idle.push_back(std::move(c));
  }

  // One command on one node (with ASKING first when asked to). No breaker
  // bookkeeping: run() does it.
  Expected<Reply> exec_on(Node& n, const std::vector<std::string_view>& args, bool asking) {
    KCACHE_TRY(Conn c, borrow(n));
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (auto a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (asking) redisAppendCommand(c.get(), "ASKING");
    redisAppendCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data());
    void* raw = nullptr;
    if (asking) {
      if (redisGetReply(c.get(), &raw) != REDIS_OK) return conn_error(n, c.get());
      freeReplyObject(raw);
      raw = nullptr;
    }
    if (redisGetReply(c.get(), &raw) != REDIS_OK || !raw) return conn_error(n, c.get());
    give_back(n, std::move(c));
    return Reply(static_cast<redisReply*>(raw));
  }

  static bool parse_redirect(std::string_view msg, uint16_t* slot, Endpoint* to) {
    // "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"
    auto sp1 = msg.find(' ');
    if (sp1 == std::string_view::npos) return false;
    auto sp2 = msg.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) return false;
    uint64_t s = 0, port = 0;
    if (!parse_u64(msg.substr(sp1 + 1, sp2 - sp1 - 1), &s) || s > 16383) return false;
    std::string_view addr = msg.substr(sp2 + 1);
    auto colon = addr.rfind(':');
    if (colon == std::string_view::npos || !parse_u64(addr.substr(colon + 1), &port) || port == 0 || port > 65535) return false;
    *slot = static_cast<uint16_t>(s);
    to->host = std::string(addr.substr(0, colon));
    to->port = static_cast<int>(port);
    return true;
  }

  // Runs one command on the node owning `rkey`, following redirections.
  // Counts failures for the breaker. REQUIRES: allow() was consulted.
  Expected<Reply> run(std::string_view rkey, const std::vector<std::string_view>& args) {
    int ni = p_.cluster ? node_for_slot(redis_key_slot(rkey)) : 0;
    bool asking = false;
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
      auto r = exec_on(node(ni), args, asking);
      if (!r) {
        fail(r.error());
        return std::move(r).error();
      }
      asking = false;
      if ((*r)->type != REDIS_REPLY_ERROR) {
        succeed();
        return r;
      }
      std::string_view msg = reply_str(r->get());
      uint16_t slot = 0;
      Endpoint to;
      if (p_.cluster && msg.starts_with("MOVED ") && parse_redirect(msg, &slot, &to)) {
        ni = node_index(to);
        {
          std::unique_lock lk(map_mu_);
          slots_[slot] = ni;
        }
        {
          std::lock_guard g(c_mu_);
          ++c_.moved;
        }
        (void)refresh_slots();  // one slot moved: others probably did too
        continue;
      }
      if (p_.cluster && msg.starts_with("ASK ") && parse_redirect(msg, &slot, &to)) {
        ni = node_index(to);
        asking = true;
        std::lock_guard g(c_mu_);
        ++c_.ask;
        continue;
      }
      Status st(Errc::io_error, "redis: " + std::string(msg));
      fail(st);
      return st;
    }
    Status st(Errc::io_error, "redis: too many cluster redirections");
    fail(st);
    return st;
  }

  // Loads the slot table from the first node that answers CLUSTER SLOTS.
  Status refresh_slots() {
    size_t count;
    {
      std::shared_lock lk(map_mu_);
      count = nodes_.size();
    }
    Status last(Errc::unavailable, "redis cluster: no node answered CLUSTER SLOTS");
    for (size_t i = 0; i < count; ++i) {
      Node& n = node(static_cast<int>(i));
      auto r = exec_on(n, {"CLUSTER", "SLOTS"}, false);
      if (!r) {
        last = r.error();
        continue;
      }
      const redisReply* top = r->get();
      if (top->type != REDIS_REPLY_ARRAY) {
        last = Status(Errc::io_error, "redis cluster: unexpected CLUSTER SLOTS reply");
        continue;
      }
      std::array<int, 16384> table;
      table.fill(-1);
      for (size_t k = 0; k < top->elements; ++k) {
        const redisReply* range = top->element[k];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
        const redisReply* lo = range->element[0];
        const redisReply* hi = range->element[1];
        const redisReply* master = range->element[2];
        if (lo->type != REDIS_REPLY_INTEGER || hi->type != REDIS_REPLY_INTEGER || master->type != REDIS_REPLY_ARRAY ||
            master->elements < 2 || master->element[1]->type != REDIS_REPLY_INTEGER)
          continue;
        Endpoint e;
        if (master->element[0]->type == REDIS_REPLY_STRING) e.host = std::string(reply_str(master->element[0]));
        // An empty or "?" host means "the node you asked".
        if (e.host.empty() || e.host == "?") e.host = n.ep.host;
        e.port = static_cast<int>(master->element[1]->integer);
        int idx = node_index(e);
        for (long long s = std::max(0LL, lo->integer); s <= std::min(16383LL, hi->integer); ++s) table[s] = idx;
      }
      {
        std::unique_lock lk(map_mu_);
        slots_ = table;
      }
      std::lock_guard g(c_mu_);
      ++c_.slot_refreshes;
      return Status();
    }
    return last;
  }

  // ---- background writes ---------------------------------------------------------

  void write_loop() {
    std::unique_lock lk(q_mu_);
    for (;;) {
      q_cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop_ and nothing left
      Task t = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lk.unlock();
      send(t);
      lk.lock();
      if (t.kind == Task::release) {
        auto it = pending_releases_.find(t.key);
        if (it != pending_releases_.end() && --it->second == 0) pending_releases_.erase(it);
      }
      busy_ = false;
      ++done_;
      idle_cv_.notify_all();
    }
  }

  void send(const Task& t) {
    if (!allow()) {
      skipped_++;
      return;
    }
    if (t.kind == Task::release) {
      std::string lk = lease_key(t.key);
      (void)run(lk, {"EVAL", kReleaseLua, "1", lk, token_});
      return;
    }
    auto v = encode_value(t.entry);
    if (!v) {
      errors_++;
      return;
    }
    std::string k = entry_key(t.key);
    std::string ttl = std::to_string(o_.ttl_ms);
    auto r = o_.ttl_ms ? run(k, {"SET", k, *v, "PX", ttl}) : run(k, {"SET", k, *v});
    if (r) puts_++;
  }

  ParsedUrl p_;
  const RedisTierOptions& o_;
  std::string name_;
  std::string token_;  // this object's lease holder identity
  EVP_MAC* mac_ = nullptr;

  std::shared_mutex map_mu_;
  std::vector<std::unique_ptr<Node>> nodes_;          // GUARDED_BY(map_mu_)
  std::unordered_map<std::string, int> node_ids_;     // GUARDED_BY(map_mu_)
  std::array<int, 16384> slots_;                      // GUARDED_BY(map_mu_)

  std::atomic<uint64_t> failures_{0}, open_until_ms_{0}, breaker_opens_{0};
  std::atomic<uint64_t> hits_{0}, misses_{0}, puts_{0}, corrupt_{0}, errors_{0}, rejected_{0}, skipped_{0}, dropped_{0};
  mutable std::mutex c_mu_;
  RedisCounters c_;  // GUARDED_BY(c_mu_), except breaker_opens

  std::mutex q_mu_;
  std::condition_variable q_cv_, idle_cv_;
  std::deque<Task> q_;     // GUARDED_BY(q_mu_)
  bool busy_ = false;      // GUARDED_BY(q_mu_): the writer is sending a task
  bool stop_ = false;      // GUARDED_BY(q_mu_)
  uint64_t done_ = 0;      // GUARDED_BY(q_mu_): tasks finished
  std::unordered_map<Key, int> pending_releases_;  // GUARDED_BY(q_mu_): queued releases per key
  std::thread writer_;
};

class RedisLeases final : public Leases {
 public:
  RedisLeases(std::shared_ptr<RedisTier> redis, std::shared_ptr<Leases> local)
      : redis_(std::move(redis)), local_(std::move(local)) {}
  std::string_view name() const noexcept override { return "redis"; }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    LeaseResult l = local_ ? local_->acquire(key, ttl_ms) : LeaseResult::acquired;
    if (l == LeaseResult::busy) return l;  // a process of this machine has it
    auto r = redis_->acquire_lease(key, ttl_ms);
    if (!r) return local_ ? l : LeaseResult::error;
    if (*r) return LeaseResult::acquired;
    if (local_ && l == LeaseResult::acquired) local_->release(key);
    return LeaseResult::busy;  // another machine has it
  }
  bool renew(const Key& key, uint64_t ttl_ms) override {
    bool remote = redis_->renew_lease(key, ttl_ms);
    return local_ ? local_->renew(key, ttl_ms) : remote;
  }
  void release(const Key& key) override {
    redis_->release_lease(key);
    if (local_) local_->release(key);
  }
  uint64_t takeovers() const noexcept override { return local_ ? local_->takeovers() : 0; }

 private:
  std::shared_ptr<RedisTier> redis_;
  std::shared_ptr<Leases> local_;
};

}  // namespace

std::shared_ptr<Leases> make_redis_leases(std::shared_ptr<Tier> redis, std::shared_ptr<Leases> local) {
  auto r = std::dynamic_pointer_cast<RedisTier>(std::move(redis));
  if (!r) return local;
  return std::make_shared<RedisLeases>(std::move(r), std::move(local));
}

Expected<std::shared_ptr<Tier>> make_redis_tier(const std::string& url, const RedisTierOptions& options) {
  KCACHE_TRY(ParsedUrl p, parse_url(url, options));
  auto t = std::make_shared<RedisTierImpl>(std::move(p));
  if (!t->ok()) return Status(Errc::internal, "OpenSSL has no HMAC");
  return std::shared_ptr<Tier>(std::move(t));
}

}  // namespace kcache

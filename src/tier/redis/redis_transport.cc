// The Redis transport (kcache/redis.h): standalone or Cluster, through
// hiredis (blocking contexts). One object is both the value store and the
// lease backend of kcache/remote.h. Transport only: the policy (breaker,
// write queue, value framing, leases for the Cache) is src/tier/remote/.
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
//  * Errors (kcache/remote.h): a socket timeout (errno EAGAIN, or a connect
//    that timed out) is Errc::timeout; any other connection fault is
//    Errc::unavailable; an error reply is Errc::io_error; a reply of the
//    wrong type, or WRONGTYPE (a key holding another type), is Errc::corrupt;
//    a value over the policy's bound (set_max_value_bytes) is Errc::too_large,
//    answered by the server as its length instead of the value (a small
//    script in place of GET, the same one round trip; EVALSHA, and EVAL of
//    its text only after NOSCRIPT). A server that will not run the script
//    (an ACL user without +@scripting, a server or proxy without Lua) is
//    asked GETRANGE key 0 bound instead, for the life of the transport: at
//    most bound + 1 bytes of an oversized value travel, and the refusal is
//    one log line, never an error of the call.
//  * Statistics: one hash (PREFIX stats) of counters that every client
//    adds to (HINCRBY, pipelined) and reads (HGETALL); the values stored
//    are counted by SCAN over value names only and STRLEN of each.
//  * URL: parsed in redis_url.cc (redis_url.h), the one table of options
//    with it.
//
// One concept, the Redis transport: the node pools, the slot routing and
// the bounded reads all serve the one object behind the value store and
// lease backend interfaces; nothing here is policy, and nothing is used
// without the rest.
#include <hiredis/hiredis.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>

#include "kcache/redis.h"
#include "tier/redis/redis_url.h"
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
    for (int b = 0; b < 8; ++b)
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return crc & 16383;
}

namespace {

using redis_url::Endpoint;
using redis_url::parse_u64;
using redis_url::parse_url;
using redis_url::ParsedUrl;

constexpr size_t kPipelineBatch = 128;
constexpr int kMaxRedirects = 5;

struct ReplyFree {
  void operator()(redisReply* r) const noexcept {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;
struct ContextFree {
  void operator()(redisContext* c) const noexcept {
    if (c) redisFree(c);
  }
};
using Conn = std::unique_ptr<redisContext, ContextFree>;

timeval to_timeval(uint64_t ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

std::string_view reply_str(const redisReply* r) { return {r->str, r->len}; }

// Value bytes that live inside a hiredis reply: a hit is not copied again.
class ReplyBuffer final : public Buffer {
 public:
  ReplyBuffer(Reply r, size_t offset) : r_(std::move(r)), off_(offset) {}
  std::string_view bytes() const noexcept override { return {r_->str + off_, r_->len - off_}; }

 private:
  Reply r_;
  size_t off_;
};

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

// GET bounded by size, in one round trip: the server answers the value's
// length (an integer) instead of a value longer than ARGV[1], so an
// oversized value is never sent. A missing key: STRLEN 0, GET nil.
constexpr const char* kBoundedGetLua =
    "local n = redis.call('STRLEN', KEYS[1]) "
    "if n > tonumber(ARGV[1]) then return n end "
    "return redis.call('GET', KEYS[1])";
// Its SHA-1, for EVALSHA: the text goes to a server only when that server
// answers NOSCRIPT (then EVAL runs and caches it).
constexpr std::string_view kBoundedGetSha = "215b79c7e8ab23f5f835776b43fd0033c789bece";

bool is_noscript(const Status& st) {
  return st.code() == Errc::io_error && st.message().starts_with("redis: NOSCRIPT");
}

// Whether an error reply (as run() words it) says the server will not run
// the lookup script at all, as opposed to a fault of the server or of one
// key: an ACL user without +@scripting (NOPERM), a server or proxy without
// EVAL (unknown command), a script cache EVAL cannot fill (NOSCRIPT), or
// scripting switched off.
bool refuses_scripts(const Status& st) {
  if (st.code() != Errc::io_error) return false;
  std::string_view msg = st.message();
  if (msg.starts_with("redis: ")) msg.remove_prefix(7);
  if (msg.starts_with("NOPERM") || msg.starts_with("NOSCRIPT")) return true;
  if (!msg.starts_with("ERR")) return false;
  std::string low(msg);
  for (char& ch : low) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (low.starts_with("err unknown command")) return true;
  bool about_scripts = low.find("script") != std::string::npos || low.find("lua") != std::string::npos ||
                       low.find("eval") != std::string::npos;
  bool switched_off = low.find("disabled") != std::string::npos || low.find("not enabled") != std::string::npos ||
                      low.find("not supported") != std::string::npos || low.find("unsupported") != std::string::npos;
  return about_scripts && switched_off;
}

// A GETRANGE key 0 bound reply to value bytes, where the server would not
// run the lookup script: more than `bound` bytes is a value over the bound
// (only bound + 1 of its bytes were sent); "" is a missing key (an empty
// value is never a kcache value: it has at least its header).
Expected<RemoteBytes> range_value_of(Reply r, uint64_t bound) {
  if (r->type == REDIS_REPLY_NIL) return RemoteBytes();
  if (r->type != REDIS_REPLY_STRING)
    return Status(Errc::corrupt, "redis: GETRANGE answered a reply of type " + std::to_string(r->type));
  if (r->len > bound)
    return Status(Errc::too_large, "redis: a value of more than " + std::to_string(bound) + " bytes, over the bound");
  if (r->len == 0) return RemoteBytes();
  return RemoteBytes(std::make_shared<ReplyBuffer>(std::move(r), 0));
}

// A (bounded) GET reply to value bytes (null: nothing stored; too_large:
// the server answered the length of a value over the bound).
Expected<RemoteBytes> value_of(Reply r) {
  if (r->type == REDIS_REPLY_NIL) return RemoteBytes();
  if (r->type == REDIS_REPLY_INTEGER)
    return Status(Errc::too_large, "redis: a value of " + std::to_string(r->integer) + " bytes, over the bound");
  if (r->type != REDIS_REPLY_STRING)
    return Status(Errc::corrupt, "redis: GET answered a reply of type " + std::to_string(r->type));
  return RemoteBytes(std::make_shared<ReplyBuffer>(std::move(r), 0));
}

// An integer reply to a yes/no answer.
Expected<bool> flag_of(const Reply& r, const char* what) {
  if (r->type != REDIS_REPLY_INTEGER)
    return Status(Errc::corrupt,
                  std::string("redis: unexpected ") + what + " reply of type " + std::to_string(r->type));
  return r->integer == 1;
}

class RedisTransport final : public RemoteTransport, public RemoteLeaseBackend {
 public:
  explicit RedisTransport(ParsedUrl p)
      : p_(std::move(p)), connect_ms_(p_.opt.connect_timeout_ms), command_ms_(p_.opt.command_timeout_ms) {
    for (const auto& e : p_.seeds) node_index(e);
    slots_.fill(-1);
    // Without a slot map every key goes to the first node until a MOVED
    // teaches better.
    if (p_.cluster) (void)refresh_slots();
  }

  std::string_view name() const noexcept override { return "redis"; }

  void set_timeouts(uint64_t connect_ms, uint64_t command_ms) override {
    connect_ms_ = connect_ms;
    command_ms_ = command_ms;
    // Idle connections carry the old socket timeouts: let them go.
    std::shared_lock lk(map_mu_);
    for (auto& n : nodes_) {
      std::lock_guard g(n->mu);
      n->idle.clear();
    }
  }

  void set_max_value_bytes(uint64_t max_bytes) override { max_value_ = max_bytes; }

  Expected<RemoteBytes> get(const Key& key) override {
    std::string k = entry_key(key);
    uint64_t bound = max_value_.load();
    if (bound == 0) {
      KCACHE_TRY(Reply r, run(k, {"GET", k}));
      return value_of(std::move(r));
    }
    std::string b = std::to_string(bound);
    if (!no_scripts_.load()) {
      std::vector<std::string_view> load = {"EVAL", kBoundedGetLua, "1", k, b};
      auto r = run(k, {"EVALSHA", kBoundedGetSha, "1", k, b}, &load);
      if (r) return value_of(std::move(*r));
      if (!refuses_scripts(r.error())) return std::move(r).error();
      scripts_refused(r.error());
    }
    // GETRANGE's end is inclusive: at most bound + 1 bytes.
    KCACHE_TRY(Reply r, run(k, {"GETRANGE", k, "0", b}));
    return range_value_of(std::move(r), bound);
  }

  Status get_many(const std::vector<Key>& keys, std::vector<Expected<RemoteBytes>>* out) override {
    out->clear();
    out->reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out->emplace_back(RemoteBytes());
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
        // Asked by EVALSHA, then with the script's text (EVAL) where the
        // server had not cached it, then without it where the server
        // refused it (pipeline() turns it off).
        std::vector<size_t> again(idx.begin() + static_cast<std::ptrdiff_t>(b),
                                  idx.begin() + static_cast<std::ptrdiff_t>(e));
        for (int pass = 0; pass < 3 && !again.empty(); ++pass)
          KCACHE_RETURN_IF_ERROR(pipeline(n, pass > 0, rkeys, out, &retry, &again));
        for (size_t i : again) (*out)[i] = Status(Errc::io_error, "redis: the lookup script was not run");
      }
    }
    for (size_t i : retry) {
      auto r = get(keys[i]);
      if (!r && r.error().code() != Errc::corrupt && r.error().code() != Errc::io_error) return std::move(r).error();
      (*out)[i] = std::move(r);
    }
    return Status();
  }

  Status set(const Key& key, std::string_view value, uint64_t ttl_ms) override {
    std::string k = entry_key(key);
    std::string ttl = std::to_string(ttl_ms);
    KCACHE_TRY(Reply r, ttl_ms ? run(k, {"SET", k, value, "PX", ttl}) : run(k, {"SET", k, value}));
    (void)r;
    return Status();
  }

  Status remove(const Key& key) override {
    std::string k = entry_key(key);
    KCACHE_TRY(Reply r, run(k, {"DEL", k}));
    (void)r;
    return Status();
  }

  Expected<bool> lease_acquire(const Key& key, std::string_view token, uint64_t ttl_ms) override {
    std::string lk = lease_key(key), ttl = std::to_string(ttl_ms);
    KCACHE_TRY(Reply r, run(lk, {"EVAL", kAcquireLua, "1", lk, token, ttl}));
    return flag_of(r, "lease");
  }

  Expected<bool> lease_renew(const Key& key, std::string_view token, uint64_t ttl_ms) override {
    std::string lk = lease_key(key), ttl = std::to_string(ttl_ms);
    KCACHE_TRY(Reply r, run(lk, {"EVAL", kRenewLua, "1", lk, token, ttl}));
    return flag_of(r, "lease renewal");
  }

  Expected<bool> lease_release(const Key& key, std::string_view token) override {
    std::string lk = lease_key(key);
    KCACHE_TRY(Reply r, run(lk, {"EVAL", kReleaseLua, "1", lk, token}));
    return flag_of(r, "lease release");
  }

  Expected<bool> lease_held(const Key& key) override {
    std::string lk = lease_key(key);
    KCACHE_TRY(Reply r, run(lk, {"EXISTS", lk}));
    if (r->type != REDIS_REPLY_INTEGER) return Status(Errc::corrupt, "redis: unexpected EXISTS reply");
    return r->integer != 0;
  }

  Expected<std::optional<std::string>> lease_holder(const Key& key) override {
    std::string lk = lease_key(key);
    KCACHE_TRY(Reply r, run(lk, {"GET", lk}));
    if (r->type == REDIS_REPLY_NIL) return std::optional<std::string>();
    if (r->type != REDIS_REPLY_STRING) return Status(Errc::corrupt, "redis: unexpected GET reply for a lease");
    return std::optional<std::string>(std::string(r->str, r->len));
  }

  // ---- statistics: one hash of counters, and a count of the values --------

  bool keeps_stats() const noexcept override { return true; }

  Status add_stats(const std::vector<std::pair<std::string, uint64_t>>& deltas, uint64_t now_unix_ms) override {
    const std::string k = stats_key(), now = std::to_string(now_unix_ms);
    std::vector<std::vector<std::string>> cmds;
    for (const auto& [name, n] : deltas) cmds.push_back({"HINCRBY", k, name, std::to_string(n)});
    cmds.push_back({"HSETNX", k, "since_ms", now});
    return on_key(k, cmds);
  }

  Expected<std::vector<std::pair<std::string, uint64_t>>> read_stats() override {
    const std::string k = stats_key();
    KCACHE_TRY(Reply r, run(k, {"HGETALL", k}));
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0)
      return Status(Errc::corrupt, "redis: unexpected HGETALL reply for " + k);
    std::vector<std::pair<std::string, uint64_t>> out;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
      const redisReply* name = r->element[i];
      const redisReply* value = r->element[i + 1];
      uint64_t v = 0;
      if (name->type != REDIS_REPLY_STRING || value->type != REDIS_REPLY_STRING || !parse_u64(reply_str(value), &v))
        continue;  // not one of ours: left out
      out.emplace_back(std::string(reply_str(name)), v);
    }
    return out;
  }

  Status zero_stats(uint64_t now_unix_ms) override {
    const std::string k = stats_key();
    return on_key(k, {{"DEL", k}, {"HSET", k, "since_ms", std::to_string(now_unix_ms)}});
  }

  // SCAN over each node that owns slots, for the names of values only
  // (P{32 hex digits}: leases and the statistics hash do not match), and
  // STRLEN of each key found, pipelined per batch.
  Expected<RemoteStored> count_stored(uint64_t budget_ms) override {
    std::vector<int> owners{0};
    if (p_.cluster) {
      KCACHE_RETURN_IF_ERROR(refresh_slots());
      std::shared_lock lk(map_mu_);
      owners.clear();
      for (int i : slots_)
        if (i >= 0 && std::find(owners.begin(), owners.end(), i) == owners.end()) owners.push_back(i);
    }
    std::string pattern;
    for (char ch : p_.opt.key_prefix) {
      if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\') pattern += '\\';
      pattern += ch;
    }
    pattern += "{" + std::string(32, '?') + "}";
    const uint64_t deadline = util::now_mono_us() / 1000 + budget_ms;
    RemoteStored out;
    for (int ni : owners) {
      Node& n = node(ni);
      std::string cursor = "0";
      do {
        if (util::now_mono_us() / 1000 >= deadline) {
          out.complete = false;
          return out;
        }
        KCACHE_TRY(Reply r, exec_on(n, {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, false));
        if (r->type == REDIS_REPLY_ERROR) return Status(Errc::io_error, "redis: " + std::string(reply_str(r.get())));
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY)
          return Status(Errc::corrupt, "redis: unexpected SCAN reply");
        cursor = std::string(reply_str(r->element[0]));
        std::vector<std::vector<std::string>> lens;
        for (size_t i = 0; i < r->element[1]->elements; ++i)
          if (r->element[1]->element[i]->type == REDIS_REPLY_STRING)
            lens.push_back({"STRLEN", std::string(reply_str(r->element[1]->element[i]))});
        KCACHE_TRY(std::vector<Reply> got, pipelined(n, lens));
        for (const Reply& g : got) {
          // 0: gone since the scan; an error: a key of another type.
          if (g->type != REDIS_REPLY_INTEGER || g->integer <= 0) continue;
          ++out.entries;
          out.bytes += static_cast<uint64_t>(g->integer);
        }
      } while (cursor != "0");
    }
    return out;
  }

  // One pipeline of lookups on one node, for the keys in *again: the
  // replies land in (*out)[i]; a redirected key is added to `retry`, and
  // *again becomes the keys to ask again: those the server answered
  // NOSCRIPT (not cached: `load` sends the script's text) or whose script
  // it refused (then the transport stops sending the script, so asking
  // those again goes without it).
  Status pipeline(Node& n, bool load, const std::vector<std::string>& rkeys, std::vector<Expected<RemoteBytes>>* out,
                  std::vector<size_t>* retry, std::vector<size_t>* again) {
    std::vector<size_t> ask;
    ask.swap(*again);
    KCACHE_TRY(Conn conn, borrow(n));
    redisContext* c = conn.get();
    uint64_t bound = max_value_.load();
    bool scripted = bound != 0 && !no_scripts_.load();
    std::string bs = std::to_string(bound);
    for (size_t i : ask) {
      const std::string& k = rkeys[i];
      if (bound == 0) {
        const char* argv[2] = {"GET", k.data()};
        size_t lens[2] = {3, k.size()};
        redisAppendCommandArgv(c, 2, argv, lens);
      } else if (scripted) {
        std::string_view cmd = load ? "EVAL" : "EVALSHA";
        std::string_view script = load ? std::string_view(kBoundedGetLua) : kBoundedGetSha;
        const char* argv[5] = {cmd.data(), script.data(), "1", k.data(), bs.data()};
        size_t lens[5] = {cmd.size(), script.size(), 1, k.size(), bs.size()};
        redisAppendCommandArgv(c, 5, argv, lens);
      } else {
        const char* argv[4] = {"GETRANGE", k.data(), "0", bs.data()};
        size_t lens[4] = {8, k.size(), 1, bs.size()};
        redisAppendCommandArgv(c, 4, argv, lens);
      }
    }
    for (size_t i : ask) {
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK || !raw)
        return conn_error(n, c, errno);  // the connection is dropped with its unread replies
      Reply r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) {
        std::string_view msg = reply_str(r.get());
        Status st(msg.find("WRONGTYPE") != std::string_view::npos ? Errc::corrupt : Errc::io_error,
                  "redis: " + std::string(msg));
        if (p_.cluster && (msg.starts_with("MOVED ") || msg.starts_with("ASK "))) {
          retry->push_back(i);
        } else if (scripted && !load && is_noscript(st)) {
          again->push_back(i);
        } else if (scripted && refuses_scripts(st)) {
          scripts_refused(st);
          again->push_back(i);
        } else {
          (*out)[i] = std::move(st);
        }
        continue;
      }
      (*out)[i] = scripted || bound == 0 ? value_of(std::move(r)) : range_value_of(std::move(r), bound);
    }
    give_back(n, std::move(conn));
    return Status();
  }

  // The server will not run the lookup script: bounded lookups go without
  // it from now on, and the log says so once.
  void scripts_refused(const Status& why) {
    if (no_scripts_.exchange(true)) return;
    std::string_view msg = why.message();
    if (msg.starts_with("redis: ")) msg.remove_prefix(7);
    KCACHE_LOG(LogLevel::warn,
               "redis: the server refuses the lookup script (%.*s); lookups bounded by size use GETRANGE instead",
               static_cast<int>(msg.size()), msg.data());
  }

  TransportCounters counters() const override {
    TransportCounters c;
    c.moved = moved_.load();
    c.ask = ask_.load();
    c.slot_refreshes = slot_refreshes_.load();
    return c;
  }

 private:
  std::string entry_key(const Key& k) const { return p_.opt.key_prefix + "{" + k.hex() + "}"; }
  std::string lease_key(const Key& k) const { return p_.opt.key_prefix + "{" + k.hex() + "}:lease"; }
  std::string stats_key() const { return p_.opt.key_prefix + "stats"; }

  // Commands sent on one connection to `n` in one round trip; the replies
  // in order (error replies among them).
  Expected<std::vector<Reply>> pipelined(Node& n, const std::vector<std::vector<std::string>>& cmds) {
    std::vector<Reply> out;
    if (cmds.empty()) return out;
    KCACHE_TRY(Conn conn, borrow(n));
    for (const auto& cmd : cmds) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const auto& a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      redisAppendCommandArgv(conn.get(), static_cast<int>(argv.size()), argv.data(), lens.data());
    }
    for (size_t i = 0; i < cmds.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(conn.get(), &raw) != REDIS_OK || !raw) return conn_error(n, conn.get(), errno);
      out.emplace_back(static_cast<redisReply*>(raw));
    }
    give_back(n, std::move(conn));
    return out;
  }

  // Commands on the one key `rkey`, pipelined to the node that owns it; a
  // command answered with a Cluster redirection is sent again alone through
  // run(). The first other error reply is the result.
  Status on_key(const std::string& rkey, const std::vector<std::vector<std::string>>& cmds) {
    KCACHE_TRY(std::vector<Reply> got, pipelined(node(p_.cluster ? node_for_slot(redis_key_slot(rkey)) : 0), cmds));
    Status first;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i]->type != REDIS_REPLY_ERROR) continue;
      std::string_view msg = reply_str(got[i].get());
      if (p_.cluster && (msg.starts_with("MOVED ") || msg.starts_with("ASK "))) {
        std::vector<std::string_view> args(cmds[i].begin(), cmds[i].end());
        auto r = run(rkey, args);
        if (!r && first.is_ok()) first = std::move(r).error();
        continue;
      }
      if (first.is_ok())
        first = Status(msg.find("WRONGTYPE") != std::string_view::npos ? Errc::corrupt : Errc::io_error,
                       "redis: " + std::string(msg));
    }
    return first;
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

  // `err` is errno right after the failed hiredis call. A read or write
  // that ran out of its socket timeout fails with EAGAIN, a connect that ran
  // out of its timeout with ETIMEDOUT; hiredis keeps the text of either.
  static Status conn_error(Node& n, redisContext* c, int err) {
    bool timed_out = false;
    if (c->err == REDIS_ERR_IO) {
      timed_out = err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT || err == EINPROGRESS;
      std::string_view msg = c->errstr;
      for (int e : {EAGAIN, ETIMEDOUT, EINPROGRESS})
        if (msg == std::strerror(e)) timed_out = true;
    }
    return Status(
        timed_out ? Errc::timeout : Errc::unavailable,
        "redis " + n.ep.host + ":" + std::to_string(n.ep.port) + ": " + (c->errstr[0] ? c->errstr : "connection lost"));
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
    errno = 0;
    Conn c(redisConnectWithTimeout(n.ep.host.c_str(), n.ep.port, to_timeval(connect_ms_.load())));
    int err = errno;
    if (!c) return Status(Errc::internal, "redis: out of memory");
    if (c->err) return conn_error(n, c.get(), err);
    redisSetTimeout(c.get(), to_timeval(command_ms_.load()));
    auto simple = [&](std::vector<std::string> args) -> Status {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (auto& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      Reply r(
          static_cast<redisReply*>(redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
      if (!r) return conn_error(n, c.get(), errno);
      if (r->type == REDIS_REPLY_ERROR) return Status(Errc::io_error, "redis: " + std::string(reply_str(r.get())));
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

  // One command on one node (with ASKING first when asked to).
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
      if (redisGetReply(c.get(), &raw) != REDIS_OK) return conn_error(n, c.get(), errno);
      freeReplyObject(raw);
      raw = nullptr;
    }
    if (redisGetReply(c.get(), &raw) != REDIS_OK || !raw) return conn_error(n, c.get(), errno);
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
    if (colon == std::string_view::npos || !parse_u64(addr.substr(colon + 1), &port) || port == 0 || port > 65535)
      return false;
    *slot = static_cast<uint16_t>(s);
    to->host = std::string(addr.substr(0, colon));
    to->port = static_cast<int>(port);
    return true;
  }

  // Runs one command on the node owning `rkey`, following redirections. An
  // error reply other than a redirection is Errc::io_error. A node that
  // answers NOSCRIPT to EVALSHA is sent `on_noscript` (the EVAL of the same
  // script) at once, asked the same way.
  Expected<Reply> run(std::string_view rkey, const std::vector<std::string_view>& args,
                      const std::vector<std::string_view>* on_noscript = nullptr) {
    int ni = p_.cluster ? node_for_slot(redis_key_slot(rkey)) : 0;
    bool asking = false;
    const std::vector<std::string_view>* cmd = &args;
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
      auto r = exec_on(node(ni), *cmd, asking);
      if (!r) return std::move(r).error();
      if (on_noscript && (*r)->type == REDIS_REPLY_ERROR && reply_str(r->get()).starts_with("NOSCRIPT")) {
        cmd = on_noscript;
        on_noscript = nullptr;
        r = exec_on(node(ni), *cmd, asking);
        if (!r) return std::move(r).error();
      }
      asking = false;
      if ((*r)->type != REDIS_REPLY_ERROR) return r;
      std::string_view msg = reply_str(r->get());
      uint16_t slot = 0;
      Endpoint to;
      if (p_.cluster && msg.starts_with("MOVED ") && parse_redirect(msg, &slot, &to)) {
        ni = node_index(to);
        {
          std::unique_lock lk(map_mu_);
          slots_[slot] = ni;
        }
        moved_++;
        (void)refresh_slots();  // one slot moved: others probably did too
        continue;
      }
      if (p_.cluster && msg.starts_with("ASK ") && parse_redirect(msg, &slot, &to)) {
        ni = node_index(to);
        asking = true;
        ask_++;
        continue;
      }
      // A key of another type: that key is unusable, the server is fine.
      if (msg.find("WRONGTYPE") != std::string_view::npos) return Status(Errc::corrupt, "redis: " + std::string(msg));
      return Status(Errc::io_error, "redis: " + std::string(msg));
    }
    return Status(Errc::io_error, "redis: too many cluster redirections");
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
      slot_refreshes_++;
      return Status();
    }
    return last;
  }

  ParsedUrl p_;
  std::atomic<uint64_t> connect_ms_, command_ms_;
  std::atomic<uint64_t> max_value_{0};   // 0: GET without a bound
  std::atomic<bool> no_scripts_{false};  // the server refused the lookup script
  std::atomic<uint64_t> moved_{0}, ask_{0}, slot_refreshes_{0};

  std::shared_mutex map_mu_;
  std::vector<std::unique_ptr<Node>> nodes_;       // GUARDED_BY(map_mu_)
  std::unordered_map<std::string, int> node_ids_;  // GUARDED_BY(map_mu_)
  std::array<int, 16384> slots_;                   // GUARDED_BY(map_mu_)
};

}  // namespace

Expected<RemoteTransports> make_redis_transport(const std::string& url, const RedisTierOptions& options) {
  KCACHE_TRY(ParsedUrl p, parse_url(url, options));
  auto t = std::make_shared<RedisTransport>(std::move(p));
  return RemoteTransports{t, t};
}

Expected<Remote> make_redis_remote(const std::string& url, const RedisTierOptions& options) {
  KCACHE_TRY(ParsedUrl p, parse_url(url, options));
  RemoteTierOptions policy = p.opt;  // the URL's query applied
  auto t = std::make_shared<RedisTransport>(std::move(p));
  return make_remote(t, t, policy);
}

Expected<std::shared_ptr<RemoteTier>> make_redis_tier(const std::string& url, const RedisTierOptions& options) {
  KCACHE_TRY(ParsedUrl p, parse_url(url, options));
  RemoteTierOptions policy = p.opt;  // the URL's query applied
  return make_remote_tier(std::make_shared<RedisTransport>(std::move(p)), policy);
}

}  // namespace kcache

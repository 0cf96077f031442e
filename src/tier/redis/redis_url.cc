// The Redis URL and its options (redis_url.h, kcache/redis.h).
#include "tier/redis/redis_url.h"

#include <charconv>
#include <climits>
#include <optional>

#include "util/util.h"

namespace kcache {

using redis_url::parse_u64;

namespace {

// ---- remote options: one table ------------------------------------------------

// A number's 0 means what it means in RemoteTierOptions (kcache/options.h,
// "Zero and defaults"): the default, or for ttl_ms no expiry.
enum class OptionForm {
  millis,     // whole milliseconds
  expiry_ms,  // whole milliseconds, 0: no expiry
  bytes,      // whole bytes
  count,      // a whole number up to UINT_MAX
  flag,       // 1/0, true/false, yes/no, on/off
  text,       // anything
};

struct OptionValue {
  uint64_t n = 0;
  bool flag = false;
  std::string_view text;
};

struct RemoteOption {
  std::string_view name;
  OptionForm form;
  void (*set)(RedisTierOptions* o, const OptionValue& v);
};

constexpr RemoteOption kRemoteOptions[] = {
    {"connect_timeout_ms", OptionForm::millis,
     [](RedisTierOptions* o, const OptionValue& v) { o->connect_timeout_ms = v.n; }},
    {"command_timeout_ms", OptionForm::millis,
     [](RedisTierOptions* o, const OptionValue& v) { o->command_timeout_ms = v.n; }},
    {"ttl_ms", OptionForm::expiry_ms, [](RedisTierOptions* o, const OptionValue& v) { o->ttl_ms = v.n; }},
    {"read_only", OptionForm::flag, [](RedisTierOptions* o, const OptionValue& v) { o->read_only = v.flag; }},
    {"max_entry_bytes", OptionForm::bytes, [](RedisTierOptions* o, const OptionValue& v) { o->max_entry_bytes = v.n; }},
    {"breaker_threshold", OptionForm::count,
     [](RedisTierOptions* o, const OptionValue& v) { o->breaker_threshold = static_cast<unsigned>(v.n); }},
    {"breaker_timeouts", OptionForm::count,
     [](RedisTierOptions* o, const OptionValue& v) { o->breaker_timeouts = static_cast<unsigned>(v.n); }},
    {"breaker_cooldown_ms", OptionForm::millis,
     [](RedisTierOptions* o, const OptionValue& v) { o->breaker_cooldown_ms = v.n; }},
    {"write_queue_depth", OptionForm::count,
     [](RedisTierOptions* o, const OptionValue& v) { o->write_queue_depth = static_cast<unsigned>(v.n); }},
    {"shared_stats", OptionForm::flag, [](RedisTierOptions* o, const OptionValue& v) { o->shared_stats = v.flag; }},
    {"key_prefix", OptionForm::text,
     [](RedisTierOptions* o, const OptionValue& v) { o->key_prefix = std::string(v.text); }},
};

// What a value of `form` looks like, for error messages.
std::string_view form_text(OptionForm form) {
  switch (form) {
    case OptionForm::millis:
      return "a whole number of milliseconds, e.g. 250 (0: the default)";
    case OptionForm::expiry_ms:
      return "a whole number of milliseconds (0: no expiry)";
    case OptionForm::bytes:
      return "a whole number of bytes, e.g. 67108864 (0: the default)";
    case OptionForm::count:
      return "a whole number up to 4294967295 (0: the default)";
    case OptionForm::flag:
      return "1/0, true/false, yes/no or on/off";
    case OptionForm::text:
      return "text";
  }
  return "";
}

// The value of `text` in `form`, or nullopt when it has another form.
std::optional<OptionValue> parse_option(OptionForm form, std::string_view text) {
  OptionValue v;
  v.text = text;
  switch (form) {
    case OptionForm::text:
      return v;
    case OptionForm::flag: {
      auto b = util::parse_bool(text);
      if (!b) return std::nullopt;
      v.flag = *b;
      return v;
    }
    case OptionForm::millis:
    case OptionForm::expiry_ms:
    case OptionForm::bytes:
      if (!parse_u64(text, &v.n)) return std::nullopt;
      return v;
    case OptionForm::count:
      if (!parse_u64(text, &v.n) || v.n > UINT_MAX) return std::nullopt;
      return v;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string_view> remote_option_names() {
  std::vector<std::string_view> names;
  for (const auto& opt : kRemoteOptions) names.push_back(opt.name);
  return names;
}

Status set_remote_option(RedisTierOptions* o, std::string_view name, std::string_view value) {
  for (const auto& opt : kRemoteOptions) {
    if (opt.name != name) continue;
    auto v = parse_option(opt.form, value);
    if (!v)
      return Status(Errc::invalid_argument,
                    "remote option " + std::string(name) + " wants " + std::string(form_text(opt.form)));
    opt.set(o, *v);
    return Status();
  }
  std::string known;
  for (const auto& opt : kRemoteOptions) known += (known.empty() ? "" : ", ") + std::string(opt.name);
  return Status(Errc::invalid_argument, "unknown remote option '" + std::string(name) + "' (known: " + known + ")");
}

namespace redis_url {

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

namespace {

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
    if (eq == std::string_view::npos)
      return bad_url(url, "option " + std::string(kv) + " has no value (write " + std::string(kv) + "=value)");
    Status st = set_remote_option(o, kv.substr(0, eq), kv.substr(eq + 1));
    if (!st.is_ok()) return bad_url(url, st.message());
  }
  return Status();
}

}  // namespace

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
    // A '?' inside a password would put the rest of the password in the
    // query, and the messages about options would show it: refuse it
    // without naming any part of the URL.
    if (s.find('@', q) != std::string_view::npos)
      return bad_url(url, "an '@' after the '?' (a password may not hold '?' nor an option '@')");
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
  return p;
}

}  // namespace redis_url
}  // namespace kcache

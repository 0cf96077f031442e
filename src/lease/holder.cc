#include "lease/holder.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "util/util.h"

namespace kcache::lease {

namespace {

// Field 22 of /proc/PID/stat: start time in clock ticks since boot. Zero if
// unreadable. Together with the PID it identifies one process instance.
// *state gets field 3 ('Z' for a zombie: dead, though kill(pid, 0) works).
uint64_t start_ticks_of(uint32_t pid, char* state = nullptr) {
  auto s = util::read_file("/proc/" + std::to_string(pid) + "/stat", 1 << 16);
  if (!s) return 0;
  // The command name (field 2) may contain spaces and ')': skip past the last ')'.
  size_t p = s->rfind(')');
  if (p == std::string::npos) return 0;
  if (state && p + 2 < s->size()) *state = (*s)[p + 2];
  int field = 2;
  size_t i = p + 1;
  while (i < s->size() && field < 22) {
    while (i < s->size() && (*s)[i] == ' ') ++i;
    ++field;
    if (field == 22) return std::strtoull(s->c_str() + i, nullptr, 10);
    while (i < s->size() && (*s)[i] != ' ') ++i;
  }
  return 0;
}

// This process's PID and start time, read once per process: a child of
// fork() finds its parent's PID cached, and reads its own (once) instead of
// reading /proc for every lease it takes. One word holds both (start time
// << 22 | PID; Linux PIDs are below 2^22), so no thread or child ever sees
// a PID with another process's start time. Threads that read at once store
// the same value. A failed read is not kept: the next call reads again. No
// lock: a child may inherit one held by a parent thread it does not have.
struct Self {
  uint32_t pid;
  uint64_t ticks;
};
constexpr unsigned kPidBits = 22;
std::atomic<uint64_t> g_self{0};
Self this_process() {
  const uint32_t pid = static_cast<uint32_t>(::getpid());
  const uint64_t cached = g_self.load(std::memory_order_relaxed);
  if (cached != 0 && (cached & ((uint64_t{1} << kPidBits) - 1)) == pid) return Self{pid, cached >> kPidBits};
  const uint64_t ticks = start_ticks_of(pid);
  if (ticks != 0 && pid < (uint32_t{1} << kPidBits) && ticks < (uint64_t{1} << (64 - kPidBits)))
    g_self.store(ticks << kPidBits | pid, std::memory_order_relaxed);
  return Self{pid, ticks};
}

// The boot, the host name and the PID namespace: containers sharing the
// host's network (and name) but not its PIDs are other hosts, whose PIDs
// this process cannot check. `pid_ns_known` is false when the namespace
// could not be read; then no holder is judged dead by its PID.
struct HostId {
  Digest id;
  bool pid_ns_known = false;
  pid_t pid = 0;                 // the process that read it (a child reads again)
  const HostId* prev = nullptr;  // the parent's, kept (never freed)
};
std::atomic<const HostId*> g_host{nullptr};
const HostId& host() {
  const pid_t pid = ::getpid();
  const HostId* cur = g_host.load(std::memory_order_acquire);
  if (cur && cur->pid == pid) return *cur;
  auto* h = new HostId;
  std::string boot;
  if (auto b = util::read_file("/proc/sys/kernel/random/boot_id", 4096)) boot = *b;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  struct stat st;
  std::string ns = "?";
  if (::stat("/proc/self/ns/pid", &st) == 0) {
    ns = std::to_string(static_cast<uint64_t>(st.st_dev)) + ":" + std::to_string(static_cast<uint64_t>(st.st_ino));
    h->pid_ns_known = true;
  }
  h->id = hash_bytes(boot + "|" + name + "|" + ns);
  h->pid = pid;
  h->prev = cur;
  // Threads that read at once each publish an equal value.
  while (!g_host.compare_exchange_weak(cur, h, std::memory_order_acq_rel)) h->prev = cur;
  return *h;
}
const Digest& host_id() { return host().id; }

}  // namespace

std::string encode(const Holder& h) {
  std::string s;
  util::put_u64(s, h.token);
  util::put_u32(s, h.pid);
  util::put_u32(s, 0);
  util::put_u64(s, h.start_ticks);
  util::put_u64(s, h.expiry_ms);
  s.append(reinterpret_cast<const char*>(h.host.bytes.data()), 16);
  return s;
}

bool decode(std::string_view s, Holder* h) {
  if (s.size() != kHolderSize) return false;
  h->token = util::get_u64(s.data());
  h->pid = util::get_u32(s.data() + 8);
  h->start_ticks = util::get_u64(s.data() + 16);
  h->expiry_ms = util::get_u64(s.data() + 24);
  std::memcpy(h->host.bytes.data(), s.data() + 32, 16);
  return true;
}

uint64_t Token::derive(uint64_t g) const {
  std::string b;
  util::put_u64(b, seed_);
  util::put_u64(b, static_cast<uint64_t>(::getpid()));
  util::put_u64(b, g);
  Digest d = hash_bytes(b);
  uint64_t t = util::get_u64(reinterpret_cast<const char*>(d.bytes.data()));
  return t ? t : 1;
}

uint64_t new_token() {
  uint64_t t;
  do t = util::random_u64();
  while (t == 0);
  return t;
}

Holder self(uint64_t token, uint64_t ttl_ms) { return self(token, ttl_ms, util::now_unix_ms()); }

Holder self(uint64_t token, uint64_t ttl_ms, uint64_t now_ms) {
  const Self me = this_process();
  Holder h;
  h.token = token;
  h.pid = me.pid;
  h.start_ticks = me.ticks;
  h.expiry_ms = now_ms + ttl_ms;
  h.host = host_id();
  return h;
}

bool alive(const Holder& h, uint64_t now_ms) {
  if (h.expiry_ms <= now_ms) return false;
  if (h.host != host_id()) return true;  // another machine: only the TTL tells
  // This very process (another Cache of it, or this one's own lease): alive,
  // and no /proc read to say so.
  const Self me = this_process();
  if (h.pid == me.pid && me.ticks != 0 && h.start_ticks == me.ticks) return true;
  if (!host().pid_ns_known) return true;
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return false;
  char state = '?';
  uint64_t ticks = start_ticks_of(h.pid, &state);
  if (state == 'Z' || state == 'X') return false;
  if (ticks != 0 && h.start_ticks != 0 && ticks != h.start_ticks) return false;  // PID reused
  return true;
}

std::string process_token(uint64_t random) {
  const Self me = this_process();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(me.pid) + ":" + std::to_string(random) + ":" +
         std::to_string(me.ticks) + ":" + host_id().hex();
}

bool token_holder_dead(std::string_view token) {
  // From the end: the host name may hold ':'.
  size_t a = token.rfind(':');
  if (a == std::string_view::npos || token.substr(a + 1) != host_id().hex()) return false;
  size_t b = token.rfind(':', a - 1);
  if (b == std::string_view::npos || b == 0) return false;
  size_t c = token.rfind(':', b - 1);  // before the random part
  if (c == std::string_view::npos || c == 0) return false;
  size_t d = token.rfind(':', c - 1);  // before the pid
  if (d == std::string_view::npos) return false;
  // At most 19 digits: no value wraps.
  auto number = [](std::string_view s, uint64_t* out) {
    if (s.empty() || s.size() > 19) return false;
    uint64_t v = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') return false;
      v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    *out = v;
    return true;
  };
  uint64_t pid = 0, ticks = 0;
  if (!number(token.substr(d + 1, c - d - 1), &pid) || !number(token.substr(b + 1, a - b - 1), &ticks)) return false;
  if (pid == 0 || pid >= (uint64_t{1} << kPidBits) || !host().pid_ns_known) return false;
  Holder h;
  h.pid = static_cast<uint32_t>(pid);
  h.start_ticks = ticks;
  h.expiry_ms = ~uint64_t{0};
  h.host = host_id();
  return !alive(h, 0);
}

}  // namespace kcache::lease

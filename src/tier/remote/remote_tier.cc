// The remote policy over any RemoteTransport and RemoteLeaseBackend
// (kcache/remote.h): the tier, and the leases made with it.
//
// Structure:
//  * Breaker: `failures_` counts failed calls since the server last
//    answered, `timeouts_` the timeouts among them; reaching
//    breaker_threshold or breaker_timeouts sets `open_until_ms_`. While
//    now < open_until_ms_ calls are skipped; afterwards one caller wins a CAS
//    on open_until_ms_ and probes, the others keep skipping until its call
//    succeeds (closing the breaker) or fails (reopening it). A timeout opens
//    it at once by default, so one request (lookup, lease, wait) pays at most
//    one timeout.
//  * Logging: `outage_` is set by the first failure after the server last
//    answered; that failure is the one warn line of the outage, the rest of
//    the outage is logged at info. A rejected or corrupt value is logged once
//    per key (`said_`, bounded), not on every read of it.
//  * Writes: put() queues the entry; one background thread sends queued
//    writes and lease releases in order, so a lease is released only after
//    the tier's write of the entry was sent.
//  * Leases: RemoteLeasesImpl holds the RemoteTierImpl it was made with
//    (make_remote makes both; nothing is cast) and goes through its breaker,
//    counters and write queue; its releases are tasks of that queue. Each
//    leases object has its own holder token.
//  * Shared statistics: hits, misses, puts, corrupt and rejected values
//    (in all, and per namespace) are counted twice, for this process
//    (`counts_`) and unsent to the server (`unsent_`, shared_stats.h); the
//    writer thread adds the unsent ones to the server's counters about
//    once a second and when the tier closes. A failed send keeps them for
//    the next; a server that answers with an error is said once and sent
//    nothing more.
//  * Values: "KCRV" header, optional HMAC-SHA256, then the entry bytes
//    (docs/format.md, "Redis value"; value_frame.h). The MAC is checked
//    before Entry::decode sees a byte.
//
// One concept, the remote policy: the tier and its leases are one object
// graph (the leases go through the tier's breaker, counters and write
// queue), and each part above is a rule of that policy, not a layer of its
// own; the byte framing of values (value_frame.h) and the shared counts
// (shared_stats.h) are kept apart as data, the transport it drives is
// src/tier/redis/.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kcache/remote.h"
#include "lease/holder.h"
#include "tier/core/atomic_stats.h"
#include "tier/remote/shared_stats.h"
#include "tier/remote/value_frame.h"
#include "util/util.h"

namespace kcache {

namespace {

constexpr size_t kSaidKeys = 4096;
constexpr uint64_t kStatsEveryMs = 1000;

uint64_t mono_ms() { return util::now_mono_us() / 1000; }

// Entry bytes inside a value the transport handed over: a hit is not copied.
class SliceBuffer final : public Buffer {
 public:
  SliceBuffer(RemoteBytes inner, size_t offset) : inner_(std::move(inner)), off_(offset) {}
  std::string_view bytes() const noexcept override { return inner_->bytes().substr(off_); }

 private:
  RemoteBytes inner_;
  size_t off_;
};

// `o` with each 0 that means unset replaced by the field's default
// (kcache/options.h, "Zero and defaults"); ttl_ms 0 is no expiry.
RemoteTierOptions with_defaults(RemoteTierOptions o) {
  const RemoteTierOptions d;
  o.connect_timeout_ms = util::or_default(o.connect_timeout_ms, d.connect_timeout_ms);
  o.command_timeout_ms = util::or_default(o.command_timeout_ms, d.command_timeout_ms);
  o.max_entry_bytes = util::or_default(o.max_entry_bytes, d.max_entry_bytes);
  o.breaker_threshold = util::or_default(o.breaker_threshold, d.breaker_threshold);
  o.breaker_timeouts = util::or_default(o.breaker_timeouts, d.breaker_timeouts);
  o.breaker_cooldown_ms = util::or_default(o.breaker_cooldown_ms, d.breaker_cooldown_ms);
  o.write_queue_depth = util::or_default(o.write_queue_depth, d.write_queue_depth);
  return o;
}

// A lease holder's identity: host, process (PID and start time), a random
// part per object, and the host and boot's digest, so a waiter on the same
// host can tell a holder that died (lease/holder.h).
std::string new_token() {
  std::random_device rd;
  return lease::process_token((uint64_t(rd()) << 32) | rd());
}

class RemoteTierImpl final : public RemoteTier {
 public:
  RemoteTierImpl(std::shared_ptr<RemoteTransport> t, const RemoteTierOptions& o)
      : t_(std::move(t)),
        o_(o),
        frame_(o_.secret),
        sends_stats_(o_.shared_stats && !o_.read_only && t_->keeps_stats()) {
    name_ = std::string(t_->name()) + (o_.read_only ? "(ro)" : "");
    t_->set_timeouts(o_.connect_timeout_ms, o_.command_timeout_ms);
    t_->set_max_value_bytes(o_.max_entry_bytes + remote_value::kMaxOverhead);
    writer_ = std::thread([this] { write_loop(); });
  }

  ~RemoteTierImpl() override {
    (void)flush();
    {
      std::lock_guard lk(q_mu_);
      stop_ = true;
    }
    q_cv_.notify_all();
    writer_.join();
  }

  bool ok() const { return frame_.ok(); }
  std::string_view name() const noexcept override { return name_; }
  TierKind kind() const noexcept override { return TierKind::remote; }
  bool writable() const noexcept override { return !o_.read_only; }

  // ---- RemoteTier -----------------------------------------------------------

  std::vector<std::optional<Entry>> get_many(const std::vector<Key>& keys) override {
    std::vector<std::optional<Entry>> out(keys.size());
    if (keys.empty()) return out;
    if (!allow()) {
      count(&TierStats::skipped, keys.size());
      return out;
    }
    std::vector<Expected<RemoteBytes>> vals;
    Status st = t_->get_many(keys, &vals);
    if (!st.is_ok() || vals.size() != keys.size()) {
      fail(st.is_ok() ? Status(Errc::internal, "transport answered a batch with the wrong count") : st);
      return out;
    }
    succeed();
    for (size_t i = 0; i < keys.size(); ++i) {
      out[i] = accept(keys[i], std::move(vals[i]));
      if (out[i])
        count_hit(*out[i]);
      else
        count(&TierStats::misses);
    }
    return out;
  }

  Status flush() override {
    // Bounded by progress: each write either completes or fails within the
    // timeouts, so a stall longer than that means something is wrong.
    const uint64_t stall_ms = 2 * (o_.connect_timeout_ms + o_.command_timeout_ms) + 100;
    std::unique_lock lk(q_mu_);
    uint64_t seen = done_;
    while (!q_.empty() || busy_) {
      if (!idle_cv_.wait_for(lk, std::chrono::milliseconds(stall_ms),
                             [&] { return (q_.empty() && !busy_) || done_ != seen; })) {
        return Status(Errc::timeout,
                      name_ + ": queued writes made no progress for " + std::to_string(stall_ms) + " ms");
      }
      seen = done_;
    }
    return Status();
  }

  RemoteCounters counters() const override {
    RemoteCounters c;
    {
      std::lock_guard g(c_mu_);
      c = c_;
    }
    TransportCounters tc = t_->counters();
    c.moved = tc.moved;
    c.ask = tc.ask;
    c.slot_refreshes = tc.slot_refreshes;
    c.breaker_opens = breaker_opens_.load();
    c.timeouts = timeouts_total_.load();
    c.unreachable = unreachable_.load();
    c.server_errors = server_errors_.load();
    c.bad_replies = bad_replies_.load();
    return c;
  }

  bool breaker_open() const override {
    uint64_t until = open_until_ms_.load(std::memory_order_relaxed);
    return until != 0 && mono_ms() < until;
  }

  // ---- for RemoteLeasesImpl: the breaker, counters and write queue --------

  // False: skip the server (counted as skipped).
  bool allow_or_skip() {
    if (allow()) return true;
    count(&TierStats::skipped);
    return false;
  }
  void count_lease(bool held) {
    std::lock_guard g(c_mu_);
    ++(held ? c_.leases_taken : c_.leases_busy);
  }
  void count_hit(const Entry& e, bool lease_wait = false) {
    count(&TierStats::hits);
    note_namespace(e, false);
    if (!lease_wait) return;
    std::lock_guard g(c_mu_);
    ++c_.lease_waits;
  }
  // Whether a release of `key` is still queued.
  bool releasing(const Key& key) {
    std::lock_guard g(q_mu_);
    return pending_releases_.count(key) != 0;
  }
  // Queues a release behind the pending writes. Never dropped, even with a
  // full queue: a lost release makes every waiter sit out the lease's TTL.
  void queue_release(const Key& key, std::shared_ptr<RemoteLeaseBackend> backend, const std::string& token) {
    Task t;
    t.kind = Task::release;
    t.key = key;
    t.lease = std::move(backend);
    t.token = token;
    {
      std::lock_guard lk(q_mu_);
      ++pending_releases_[key];
      q_.push_back(std::move(t));
    }
    q_cv_.notify_one();
  }

  // GET and accept; an error only when the server could not be asked.
  Expected<std::optional<Entry>> fetch(const Key& key) {
    auto r = t_->get(key);
    if (!r && r.error().code() != Errc::corrupt && r.error().code() != Errc::too_large) {
      fail(r.error());
      return std::move(r).error();
    }
    succeed();
    return accept(key, std::move(r));
  }

  // Breaker bookkeeping around one transport call. A reply of the wrong
  // type still means the server answered.
  template <class T>
  Expected<T> call(Expected<T> r) {
    if (r) {
      succeed();
    } else if (r.error().code() == Errc::corrupt) {
      succeed();
      count(&TierStats::errors);
      bad_replies_++;
    } else {
      fail(r.error());
    }
    return r;
  }

  // A lease call's result. A server that answered with an error (a user
  // without scripting, out of memory, a read-only replica) is not an
  // outage: lookups and writes still work, so the breaker is left out of
  // it, and the condition is one line until a lease call succeeds again.
  // Timeouts and an unreachable server are call()'s: they count toward
  // the breaker like any other request.
  template <class T>
  Expected<T> lease_call(Expected<T> r) {
    if (!r && r.error().code() == Errc::io_error) {
      succeed();
      count(&TierStats::errors);
      server_errors_++;
      if (!leases_refused_.exchange(true))
        KCACHE_LOG(LogLevel::warn,
                   "%s: the server refuses leases (%s); compiles go on without single-flight across machines until "
                   "it grants one",
                   name_.c_str(), r.error().to_string().c_str());
      return r;
    }
    if (r && leases_refused_.load(std::memory_order_relaxed) && leases_refused_.exchange(false))
      KCACHE_LOG(LogLevel::info, "%s: the server grants leases again", name_.c_str());
    return call(std::move(r));
  }

 protected:
  Expected<std::optional<Entry>> do_get(const Key& key, Access access) override {
    if (!allow()) {
      if (access != Access::peek) count(&TierStats::skipped);
      return std::optional<Entry>();
    }
    auto r = fetch(key);
    if (!r) return std::move(r).error();
    if (access == Access::peek) return r;
    if (r->has_value())
      count_hit(**r);
    else if (access == Access::counted)
      count(&TierStats::misses);
    return r;
  }

  Status do_put(const Entry& entry) override {
    if (o_.read_only) {
      count(&TierStats::rejected);
      return Status(Errc::read_only, name_ + " tier is read-only");
    }
    if (entry.encoded().size() > o_.max_entry_bytes) {
      count(&TierStats::rejected);
      return Status(Errc::too_large, "entry of " + std::to_string(entry.encoded().size()) +
                                         " bytes is larger than the " + name_ + " tier's max_entry_bytes");
    }
    if (foreign(entry.key())) {
      count(&TierStats::rejected);
      return Status();
    }
    forget_said(entry.key());
    if (breaker_open()) {
      count(&TierStats::skipped);
      return Status();
    }
    Task t;
    t.kind = Task::put;
    t.key = entry.key();
    if (entry.pinned()) {
      KCACHE_TRY(t.entry, entry.detach());
    } else {
      t.entry = entry;
    }
    {
      std::lock_guard lk(q_mu_);
      if (q_.size() >= o_.write_queue_depth) {
        if (count(&TierStats::dropped) == 0)
          KCACHE_LOG(LogLevel::info, "%s: write queue full (%u); dropping writes", name_.c_str(), o_.write_queue_depth);
        return Status();
      }
      q_.push_back(std::move(t));
    }
    q_cv_.notify_one();
    return Status();
  }

  Status do_remove(const Key& key) override {
    if (o_.read_only) {
      count(&TierStats::rejected);
      return Status(Errc::read_only, name_ + " tier is read-only");
    }
    if (!allow()) {
      count(&TierStats::skipped);
      return Status(Errc::unavailable, name_ + ": circuit breaker open");
    }
    KCACHE_RETURN_IF_ERROR(call_status(t_->remove(key)));
    return Status();
  }

  TierStats do_stats() override { return counts_.snapshot(); }

 private:
  struct Task {
    enum Kind { put, release } kind = put;
    Key key;
    Entry entry;                                // put
    std::shared_ptr<RemoteLeaseBackend> lease;  // release: where, and as whom
    std::string token;
  };

  // ---- counting -------------------------------------------------------------

  // Adds n to this process's `field`, and to what the server is sent when
  // the field is one of the shared ones. Returns this process's count
  // before.
  uint64_t count(uint64_t TierStats::*field, uint64_t n = 1) {
    if (sends_stats_) unsent_.add(field, n);
    return counts_.add(field, n);
  }
  // A hit or a put of `e`, for the server's counts per namespace.
  void note_namespace(const Entry& e, bool put, uint64_t value_bytes = 0) {
    if (sends_stats_) unsent_.note(e, put, value_bytes);
  }

  // Adds the unsent shared counts to the server's counters. Kept for the
  // next try when the server cannot be asked; dropped, and no more sent,
  // when it answers with an error (said once).
  void push_stats() {
    if (!sends_stats_ || stats_refused_.load(std::memory_order_relaxed)) return;
    std::lock_guard g(stats_send_mu_);
    stats_sent_ms_.store(mono_ms(), std::memory_order_relaxed);
    remote_stats::Batch batch = unsent_.take();
    const auto deltas = batch.named();
    if (deltas.empty()) return;
    if (!allow()) {
      unsent_.give_back(batch);  // for the next send
      return;
    }
    Status st = t_->add_stats(deltas, util::now_unix_ms());
    if (st.is_ok()) {
      succeed();
      return;
    }
    if (st.code() == Errc::io_error || st.code() == Errc::corrupt) {
      // The server answered, refusing (an ACL without hash commands, the
      // statistics key holding another type): lookups and writes still
      // work, so the breaker is left out of it.
      succeed();
      count(&TierStats::errors);
      server_errors_++;
      stats_refused_.store(true);
      KCACHE_LOG(LogLevel::warn, "%s: the server refuses statistics (%s); this process's counts are not kept there",
                 name_.c_str(), st.to_string().c_str());
      return;
    }
    fail(st);
    unsent_.give_back(batch);
  }

 public:
  Expected<RemoteServerStats> server_stats(uint64_t scan_budget_ms) override {
    if (!t_->keeps_stats()) return Status(Errc::unavailable, name_ + " keeps no statistics");
    push_stats();
    if (!allow()) return Status(Errc::unavailable, name_ + ": circuit breaker open");
    KCACHE_TRY(auto named, call(t_->read_stats()));
    KCACHE_TRY(RemoteStored stored, call(t_->count_stored(scan_budget_ms)));
    return remote_stats::report(named, stored);
  }

  Status zero_server_stats() override {
    if (!t_->keeps_stats()) return Status(Errc::unavailable, name_ + " keeps no statistics");
    if (o_.read_only) return Status(Errc::read_only, name_ + " tier is read-only");
    push_stats();
    if (!allow()) return Status(Errc::unavailable, name_ + ": circuit breaker open");
    return call_status(t_->zero_stats(util::now_unix_ms()));
  }

 private:
  // ---- values ---------------------------------------------------------------

  // True the first time `key` is named in a log line (until it is stored
  // again, or the bounded set is full and starts over).
  bool first_word(const Key& key) {
    std::lock_guard g(said_mu_);
    if (said_.size() >= kSaidKeys) said_.clear();
    return said_.insert(key).second;
  }
  // A value under `key` was stored with another secret (fingerprint fp):
  // remembered (bounded) so that this tier does not overwrite it; said once
  // per tier.
  void note_foreign(const Key& key, uint16_t fp) {
    {
      std::lock_guard g(said_mu_);
      if (foreign_.size() >= kSaidKeys) foreign_.clear();
      foreign_.insert(key);
    }
    if (!foreign_said_.exchange(true))
      KCACHE_LOG(LogLevel::warn,
                 "%s: values on the server were stored with another secret (fingerprint %04x; this one's is %04x): "
                 "they are misses here and are not overwritten; check the secret file",
                 name_.c_str(), fp, frame_.fingerprint());
  }
  bool foreign(const Key& key) {
    std::lock_guard g(said_mu_);
    return foreign_.count(key) != 0;
  }
  void forget_said(const Key& key) {
    std::lock_guard g(said_mu_);
    said_.erase(key);
  }

  // A value from the transport to an entry, or a miss with a counter.
  // Nothing past the value header is parsed before the MAC (when
  // configured) is checked.
  std::optional<Entry> accept(const Key& key, Expected<RemoteBytes> got) {
    if (!got && got.error().code() == Errc::too_large) {  // refused unread: a miss, not a fault
      count(&TierStats::rejected);
      if (first_word(key))
        KCACHE_LOG(LogLevel::warn, "%s: rejected value for %s: larger than max_entry_bytes (%s)", name_.c_str(),
                   key.hex().c_str(), got.error().message().c_str());
      return std::nullopt;
    }
    if (!got) {  // a reply of the wrong type for this key
      count(&TierStats::errors);
      bad_replies_++;
      if (first_word(key))
        KCACHE_LOG(LogLevel::warn, "%s: bad reply for %s: %s", name_.c_str(), key.hex().c_str(),
                   got.error().to_string().c_str());
      return std::nullopt;
    }
    RemoteBytes bytes = std::move(got).value();
    if (!bytes) return std::nullopt;
    std::string_view v = bytes->bytes();
    auto reject = [&](const char* why) -> std::optional<Entry> {
      count(&TierStats::rejected);
      if (first_word(key))
        KCACHE_LOG(LogLevel::warn, "%s: rejected value for %s: %s", name_.c_str(), key.hex().c_str(), why);
      return std::nullopt;
    };
    const remote_value::ValueFrame::Opened opened = frame_.open(key, v, o_.max_entry_bytes);
    if (opened.foreign) {
      // Stored with another secret: not damaged, not ours. A miss, and the
      // value is left alone (a put of the key is not sent from here), so a
      // node with the wrong secret cannot empty the others' cache.
      count(&TierStats::rejected);
      note_foreign(key, opened.foreign);
      return std::nullopt;
    }
    if (opened.refused) return reject(opened.refused);
    auto e = Entry::decode(std::make_shared<SliceBuffer>(std::move(bytes), opened.entry_offset), &key);
    if (!e) {
      count(&TierStats::corrupt);
      if (first_word(key))
        KCACHE_LOG(LogLevel::warn, "%s: corrupt entry %s: %s", name_.c_str(), key.hex().c_str(),
                   e.error().to_string().c_str());
      return std::nullopt;
    }
    return std::move(e).value();
  }

  Status call_status(Status st) {
    if (st.is_ok())
      succeed();
    else
      fail(st);
    return st;
  }

  // ---- breaker --------------------------------------------------------------

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
    if (timeouts_.load(std::memory_order_relaxed)) timeouts_.store(0, std::memory_order_relaxed);
    if (open_until_ms_.load(std::memory_order_relaxed)) open_until_ms_.store(0);
    if (outage_.load(std::memory_order_relaxed) && outage_.exchange(false))
      KCACHE_LOG(LogLevel::info, "%s: server answers again%s", name_.c_str(),
                 breaker_opens_.load() ? "; circuit breaker closed" : "");
  }

  void fail(const Status& st) {
    count(&TierStats::errors);
    bool timeout = st.code() == Errc::timeout;
    switch (st.code()) {
      case Errc::timeout:
        timeouts_total_++;
        break;
      case Errc::unavailable:
        unreachable_++;
        break;
      default:
        server_errors_++;
        break;
    }
    uint64_t f = failures_.fetch_add(1) + 1;
    uint64_t t = timeout ? timeouts_.fetch_add(1) + 1 : timeouts_.load();
    bool opened = false;
    if (f >= o_.breaker_threshold || t >= o_.breaker_timeouts) {
      uint64_t now = mono_ms(), until = open_until_ms_.load();
      if (until == 0) {
        if (open_until_ms_.compare_exchange_strong(until, now + o_.breaker_cooldown_ms)) {
          breaker_opens_++;
          opened = true;
        }
      } else {
        open_until_ms_.store(now + o_.breaker_cooldown_ms);  // a failed probe, or a call begun before it opened
      }
    }
    // One warn line per outage: its first failure. The rest at info.
    bool first = !outage_.exchange(true);
    if (first) {
      if (opened)
        KCACHE_LOG(LogLevel::warn, "%s: %s; skipping the server for %llu ms", name_.c_str(), st.to_string().c_str(),
                   static_cast<unsigned long long>(o_.breaker_cooldown_ms));
      else
        KCACHE_LOG(LogLevel::warn, "%s: %s (a miss; the server is skipped after %u failures)", name_.c_str(),
                   st.to_string().c_str(), o_.breaker_threshold);
    } else if (opened) {
      KCACHE_LOG(LogLevel::info, "%s: %s; skipping the server for %llu ms", name_.c_str(), st.to_string().c_str(),
                 static_cast<unsigned long long>(o_.breaker_cooldown_ms));
    } else {
      KCACHE_LOG(LogLevel::info, "%s: %s", name_.c_str(), st.to_string().c_str());
    }
  }

  // ---- background writes ------------------------------------------------------

  void write_loop() {
    std::unique_lock lk(q_mu_);
    for (;;) {
      auto ready = [&] { return stop_ || !q_.empty(); };
      if (sends_stats_)
        q_cv_.wait_for(lk, std::chrono::milliseconds(kStatsEveryMs), ready);
      else
        q_cv_.wait(lk, ready);
      if (sends_stats_ && q_.empty() && (stop_ || mono_ms() - stats_sent_ms_.load() >= kStatsEveryMs)) {
        // Idle and due, or closing (the last counts of a process): never
        // before a queued write.
        lk.unlock();
        push_stats();
        lk.lock();
      }
      if (q_.empty()) {
        if (stop_) return;  // nothing left
        continue;
      }
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
      count(&TierStats::skipped);
      return;
    }
    if (t.kind == Task::release) {
      (void)lease_call(t.lease->lease_release(t.key, t.token));
      return;
    }
    auto v = frame_.encode(t.entry);
    if (!v) {
      count(&TierStats::errors);
      return;
    }
    Status st = t_->set(t.key, *v, o_.ttl_ms);
    if (st.is_ok()) {
      succeed();
      count(&TierStats::puts);
      note_namespace(t.entry, true, v->size());
      if (writes_refused_.load(std::memory_order_relaxed) && writes_refused_.exchange(false))
        KCACHE_LOG(LogLevel::info, "%s: the server takes writes again", name_.c_str());
      return;
    }
    if (st.code() == Errc::io_error) {
      // The server answered, refusing the write (out of memory, a
      // read-only replica): reads still work, so the breaker is left out
      // of it, and the condition is one line until a write is taken.
      succeed();
      count(&TierStats::errors);
      server_errors_++;
      if (!writes_refused_.exchange(true))
        KCACHE_LOG(LogLevel::warn,
                   "%s: the server refuses writes (%s); entries are not stored there until it takes one", name_.c_str(),
                   st.to_string().c_str());
      return;
    }
    fail(st);
  }

  std::shared_ptr<RemoteTransport> t_;
  const RemoteTierOptions o_;
  std::string name_;
  const remote_value::ValueFrame frame_;  // values' header and MAC

  std::atomic<uint64_t> failures_{0}, timeouts_{0}, open_until_ms_{0}, breaker_opens_{0};
  std::atomic<bool> outage_{false};
  std::atomic<bool> leases_refused_{false};  // lease calls are answered with an error (said once)
  std::atomic<bool> writes_refused_{false};  // the last write got an error reply
  AtomicTierStats counts_;                   // this process's counts
  const bool sends_stats_;                   // shared statistics are sent to the server
  remote_stats::Unsent unsent_;              // shared counts not yet sent
  std::mutex stats_send_mu_;                 // one send of the shared counts at a time
  std::atomic<uint64_t> stats_sent_ms_{0};
  std::atomic<bool> stats_refused_{false};  // the server answered a send with an error
  std::atomic<uint64_t> timeouts_total_{0}, unreachable_{0}, server_errors_{0}, bad_replies_{0};
  mutable std::mutex c_mu_;
  RemoteCounters c_;  // GUARDED_BY(c_mu_): the lease counters

  std::mutex said_mu_;
  std::unordered_set<Key> said_;     // GUARDED_BY(said_mu_): keys named in a log line
  std::unordered_set<Key> foreign_;  // GUARDED_BY(said_mu_): keys holding another secret's value
  std::atomic<bool> foreign_said_{false};

  std::mutex q_mu_;
  std::condition_variable q_cv_, idle_cv_;
  std::deque<Task> q_;                             // GUARDED_BY(q_mu_)
  bool busy_ = false;                              // GUARDED_BY(q_mu_): the writer is sending a task
  bool stop_ = false;                              // GUARDED_BY(q_mu_)
  uint64_t done_ = 0;                              // GUARDED_BY(q_mu_): tasks finished
  std::unordered_map<Key, int> pending_releases_;  // GUARDED_BY(q_mu_): queued releases per key
  std::thread writer_;
};

class RemoteLeasesImpl final : public RemoteLeases {
 public:
  RemoteLeasesImpl(std::shared_ptr<RemoteTierImpl> tier, std::shared_ptr<RemoteLeaseBackend> backend)
      : tier_(std::move(tier)), b_(std::move(backend)), name_(tier_->name()), token_(new_token()) {}

  // ---- Leases -----------------------------------------------------------------

  std::string_view name() const noexcept override { return name_; }
  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    auto r = acquire_lease(key, ttl_ms);
    if (!r) return LeaseResult::error;
    return *r ? LeaseResult::acquired : LeaseResult::busy;
  }
  bool renew(const Key& key, uint64_t ttl_ms) override { return renew_lease(key, ttl_ms); }
  void release(const Key& key) override { release_lease(key); }
  uint64_t takeovers() const noexcept override { return takeovers_.load(std::memory_order_relaxed); }

  // ---- RemoteLeases -------------------------------------------------------------

  Expected<bool> acquire_lease(const Key& key, uint64_t ttl_ms) override {
    // A queued release of this key must not remove the lease taken now.
    if (tier_->releasing(key)) (void)tier_->flush();
    if (!tier_->allow_or_skip()) return Status(Errc::unavailable, name_ + ": circuit breaker open");
    KCACHE_TRY(bool held, tier_->lease_call(b_->lease_acquire(key, token_, ttl_ms ? ttl_ms : 1)));
    tier_->count_lease(held);
    return held;
  }

  bool renew_lease(const Key& key, uint64_t ttl_ms) override {
    if (!tier_->allow_or_skip()) return false;
    auto r = tier_->lease_call(b_->lease_renew(key, token_, ttl_ms ? ttl_ms : 1));
    return r && *r;
  }

  void release_lease(const Key& key) override { tier_->queue_release(key, b_, token_); }

  bool take_over_dead(const Key& key) override {
    if (!tier_->allow_or_skip()) return false;
    auto holder = tier_->lease_call(b_->lease_holder(key));
    if (!holder || !*holder || **holder == token_ || !lease::token_holder_dead(**holder)) return false;
    // Removed only if that dead holder still has it (compare and delete).
    auto gone = tier_->lease_call(b_->lease_release(key, **holder));
    if (!gone || !*gone) return false;
    takeovers_.fetch_add(1, std::memory_order_relaxed);
    KCACHE_LOG(LogLevel::info, "%s: lease on %s held by a dead process of this host (%s); taken over", name_.c_str(),
               key.hex().c_str(), holder->value().c_str());
    return true;
  }

  std::optional<Entry> wait_for(const Key& key, uint64_t bound_ms) override {
    uint64_t deadline = mono_ms() + bound_ms, sleep_ms = 2;
    for (;;) {
      if (!tier_->allow_or_skip()) return std::nullopt;
      auto r = tier_->fetch(key);
      if (!r) return std::nullopt;  // the server cannot be asked: stop waiting
      if (r->has_value()) {
        tier_->count_hit(**r, true);
        return std::move(*r);
      }
      auto held = tier_->lease_call(b_->lease_held(key));
      if (!held) return std::nullopt;
      if (!*held) {
        // The holder is gone; it may have stored the entry just before.
        auto again = tier_->fetch(key);
        if (again && again->has_value()) {
          tier_->count_hit(**again);
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

  RemoteCounters counters() const override { return tier_->counters(); }

 private:
  std::shared_ptr<RemoteTierImpl> tier_;
  std::shared_ptr<RemoteLeaseBackend> b_;
  std::string name_;
  std::string token_;  // this object's lease holder identity
  std::atomic<uint64_t> takeovers_{0};
};

// A machine's own leases (may be null) and the remote's, both held.
class CombinedLeases final : public Leases {
 public:
  CombinedLeases(std::shared_ptr<RemoteLeases> remote, std::shared_ptr<Leases> local)
      : remote_(std::move(remote)), local_(std::move(local)), name_(remote_->name()) {}
  std::string_view name() const noexcept override { return name_; }

  LeaseResult acquire(const Key& key, uint64_t ttl_ms) override {
    LeaseResult l = local_ ? local_->acquire(key, ttl_ms) : LeaseResult::acquired;
    if (l == LeaseResult::busy) return l;  // a process of this machine has it
    auto r = remote_->acquire_lease(key, ttl_ms);
    if (!r) return local_ ? l : LeaseResult::error;
    if (!*r && remote_->take_over_dead(key)) {
      // Its holder was a process of this host that died: no wait for its
      // lease to expire.
      r = remote_->acquire_lease(key, ttl_ms);
      if (!r) return local_ ? l : LeaseResult::error;
    }
    if (*r) return LeaseResult::acquired;
    if (local_ && l == LeaseResult::acquired) local_->release(key);
    return LeaseResult::busy;  // another machine has it
  }
  bool renew(const Key& key, uint64_t ttl_ms) override {
    bool remote = remote_->renew_lease(key, ttl_ms);
    return local_ ? local_->renew(key, ttl_ms) : remote;
  }
  void release(const Key& key) override {
    remote_->release_lease(key);
    if (local_) local_->release(key);
  }
  uint64_t takeovers() const noexcept override { return (local_ ? local_->takeovers() : 0) + remote_->takeovers(); }

 private:
  std::shared_ptr<RemoteLeases> remote_;
  std::shared_ptr<Leases> local_;
  std::string name_;
};

}  // namespace

Expected<Remote> make_remote(std::shared_ptr<RemoteTransport> values, std::shared_ptr<RemoteLeaseBackend> leases,
                             const RemoteTierOptions& options) {
  if (!values) return Status(Errc::invalid_argument, "make_remote: no transport");
  auto t = std::make_shared<RemoteTierImpl>(std::move(values), with_defaults(options));
  if (!t->ok()) return Status(Errc::internal, "OpenSSL has no HMAC");
  Remote r;
  if (leases) r.leases = std::make_shared<RemoteLeasesImpl>(t, std::move(leases));
  r.tier = std::move(t);
  return r;
}

Expected<Remote> make_remote(const RemoteTransports& transports, const RemoteTierOptions& options) {
  return make_remote(transports.values, transports.leases, options);
}

Expected<std::shared_ptr<RemoteTier>> make_remote_tier(std::shared_ptr<RemoteTransport> values,
                                                       const RemoteTierOptions& options) {
  KCACHE_TRY(Remote r, make_remote(std::move(values), nullptr, options));
  return std::move(r.tier);
}

std::shared_ptr<Leases> make_remote_leases(std::shared_ptr<RemoteLeases> remote, std::shared_ptr<Leases> local) {
  if (!remote) return local;
  return std::make_shared<CombinedLeases>(std::move(remote), std::move(local));
}

}  // namespace kcache

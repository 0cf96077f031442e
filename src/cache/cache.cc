// The Cache facade: opening, get/put, and the request path of
// get_or_compile and begin, in the four named steps of impl.h. The tier
// chain (tier_chain.cc), in-process single-flight (flight.cc) and waiting
// for other processes (lease_wait.cc) each live in a file of their own.
#include "kcache/cache.h"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cache/assembly.h"
#include "cache/impl.h"
#include "util/util.h"

namespace kcache {

namespace {

// State shared by every Cache of the process. Never destroyed, so the exit
// handler can use it whatever the order of static destruction. Safe across
// fork(): a parent thread may hold the mutex at the fork, so the first use
// in a child abandons (leaks) what it inherited and starts empty; as with
// util::Worker, a child begins using it from one thread.
template <class T>
class ProcessWide {
 public:
  template <class F>
  auto with(F&& fn) {
    renew();
    std::lock_guard lk(*mu_);
    return fn(*val_);
  }

 private:
  void renew() {
    uint64_t now = util::fork_generation(), was = gen_.load();
    if (was == now || !gen_.compare_exchange_strong(was, now)) return;
    util::abandon(mu_);
    util::abandon(val_);
    mu_ = new std::mutex;
    val_ = new T;
  }
  std::atomic<uint64_t> gen_{util::fork_generation()};
  std::mutex* mu_ = new std::mutex;
  T* val_ = new T;
};

// How a re-entrant request's status begins (is_reentry).
constexpr std::string_view kReentryPrefix = "re-entrant request: ";

// Every open Cache of the process, flushed by the exit handler: a program
// that returns from main or calls exit() without closing its caches still
// has every entry it stored on disk. Caches inherited across fork() are
// dropped in the child (they have nothing of their own to write).
ProcessWide<std::unordered_set<Cache*>>& live_caches() {
  static auto* l = new ProcessWide<std::unordered_set<Cache*>>;
  return *l;
}

// Registered once per process image (a child of fork() inherits it), by
// the first Cache: after the statics the opening made, so those are
// destroyed after it runs.
// Each waits at most 10 s: a store another process keeps locked must not
// keep this one from ending.
void flush_live_caches() {
  live_caches().with([](std::unordered_set<Cache*>& caches) {
    for (Cache* c : caches)
      if (!c->flush(std::chrono::seconds(10)))
        KCACHE_LOG(LogLevel::warn, "at exit: entries still not written after 10 s; the process ends without them");
  });
}

void register_live(Cache* c) {
  static std::atomic<bool> handler{false};
  if (!handler.exchange(true)) std::atexit(flush_live_caches);
  live_caches().with([c](std::unordered_set<Cache*>& caches) { caches.insert(c); });
}

// The cross-process leases each thread of this process holds, through any
// Cache: key -> holding threads.
using HeldLeases = std::unordered_multimap<Key, std::thread::id>;
ProcessWide<HeldLeases>& held_leases() {
  static auto* h = new ProcessWide<HeldLeases>;
  return *h;
}

}  // namespace

void Cache::Impl::Leadership::hold_lease() {
  leased = true;
  lease_thread = std::this_thread::get_id();
  held_leases().with([&](HeldLeases& h) { h.emplace(lead.key(), lease_thread); });
}

// May run on another thread than hold_lease (a Flight committed there).
void Cache::Impl::Leadership::hand_over_lease() {
  held_leases().with([&](HeldLeases& h) {
    auto [b, e] = h.equal_range(lead.key());
    for (auto it = b; it != e; ++it)
      if (it->second == lease_thread) {
        h.erase(it);
        return;
      }
  });
}

bool Cache::Impl::held_here(const Key& key) {
  return held_leases().with([&](HeldLeases& h) {
    auto [b, e] = h.equal_range(key);
    for (auto it = b; it != e; ++it)
      if (it->second == std::this_thread::get_id()) return true;
    return false;
  });
}

std::string_view source_name(Source s) noexcept {
  switch (s) {
    case Source::compiled:
      return "compiled";
    case Source::memory:
      return "memory";
    case Source::disk:
      return "disk";
    case Source::remote:
      return "remote";
    case Source::other:
      return "other";
    case Source::waited:
      return "waited";
    case Source::bundle:
      return "bundle";
  }
  return "?";
}

// ---- opening ---------------------------------------------------------------

Cache::Cache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { register_live(this); }

Cache::~Cache() {
  // Off the exit handler's list first (waiting for it if it is flushing
  // this Cache now).
  live_caches().with([this](std::unordered_set<Cache*>& caches) { caches.erase(this); });
  impl_->committer.stop();  // releases the leases that went with its entries
  impl_->lease.stop();
  (void)impl_->chain.flush();  // a failure is in the log
  if (impl_->opt.print_stats) std::fprintf(stderr, "%s", stats().to_string().c_str());
}

std::unique_ptr<Cache> Cache::with_tiers(std::vector<std::shared_ptr<Tier>> tiers, const Options& options) {
  std::unique_ptr<Cache> c(new Cache(std::make_unique<Impl>(options)));
  for (auto& t : tiers) c->add_tier(std::move(t));
  return c;
}

std::unique_ptr<Cache> Cache::open(const Options& options) {
  util::set_log(options.log_level, options.log_file);
  return open(assemble(options), options);
}

std::unique_ptr<Cache> Cache::open(Assembly assembly, const Options& options) {
  auto c = with_tiers(std::move(assembly.tiers), options);
  c->set_leases(std::move(assembly.leases));
  // Why did it miss (cache/journal.h): the store's miss journal, KCACHE_EXPLAIN.
  if (assembly.disk && !options.read_only && (options.miss_journal > 0 || options.explain)) {
    std::unique_ptr<MissJournal> journal;
    if (options.miss_journal > 0)
      journal = std::make_unique<MissJournal>(assembly.disk->path, options.miss_journal, !options.shared_group.empty(),
                                              options.env);
    c->impl_->explainer = std::make_unique<MissExplainer>(assembly.disk->tier, std::move(journal), options.explain);
  }
  return c;
}

void Cache::set_leases(std::shared_ptr<Leases> leases) { impl_->lease.set_leases(std::move(leases)); }

// Read-only covers the shared stores; the process's own memory tier still
// takes promotions, or every hit would be a disk read and a copy.
void Cache::add_tier(std::shared_ptr<Tier> tier) {
  bool wrap = impl_->opt.read_only && tier->writable() && tier->kind() != TierKind::memory;
  impl_->chain.add(wrap ? make_read_only(std::move(tier)) : std::move(tier));
}

const std::vector<std::shared_ptr<Tier>>& Cache::tiers() const noexcept { return impl_->chain.tiers(); }
const Options& Cache::options() const noexcept { return impl_->opt; }
bool is_reentry(const Status& st) noexcept {
  return st.code() == Errc::invalid_argument && st.message().starts_with(kReentryPrefix);
}

Status Cache::flush() {
  impl_->committer.flush();
  Status chain = impl_->chain.flush();
  if (impl_->explainer) impl_->explainer->flush();
  Status lost = impl_->committer.take_failures();
  return lost.is_ok() ? chain : lost;
}

bool Cache::flush(std::chrono::milliseconds bound) {
  if (!impl_->committer.flush_for(bound)) return false;
  (void)impl_->chain.flush();
  if (impl_->explainer) impl_->explainer->flush();
  return true;
}

Status Cache::Impl::store(const Entry& e) {
  if (!policy.store) return Status(Errc::read_only, "this cache stores nothing (read-only or disabled)");
  bool any = chain.store(e, TierChain::Tiers::memory);
  if (!chain.has_slow_writable())
    return any ? Status() : Status(Errc::unavailable, "no tier took the entry (see the log)");
  uint64_t seq = committer.submit(e, nullptr);
  // With sync_commit the entry is also written before this store returns,
  // and a write that failed is this put's result.
  if (!opt.sync_commit) return Status();
  committer.flush();
  return committer.outcome(seq);
}

bool Cache::Impl::store_compiled(const Entry& e) {
  if (!policy.store) return false;
  // One transaction of its own in the disk tier, in this thread: committed
  // (other processes see it, a killed process keeps it) when this returns.
  // Its sync (the durability option's, against a machine crash) is the
  // committer's, once for every compile of its lingering window, unless
  // sync_commit asks for it here. A remote tier queues the entry for its
  // own writer. The caller releases the key's lease after this returns, so
  // another process that waited on it finds the entry.
  bool any = chain.store(e, TierChain::Tiers::all, /*synced=*/opt.sync_commit);
  if (any && !opt.sync_commit && chain.has_slow_writable()) committer.request_sync();
  return any;
}

// ---- get and put -------------------------------------------------------------

namespace {
// The key as a debug line names it: hex, and its label when it has one.
std::string debug_name(const KeyInfo& key) {
  return key.key.hex() + (key.label.empty() ? std::string() : " \"" + key.label + "\"");
}
}  // namespace

std::optional<Entry> Cache::get(const Key& key, Source* source) { return impl_->look_up(key, source, Access::counted); }

std::optional<Entry> Cache::get(const KeyInfo& key, Source* source) {
  Source found = Source::compiled;
  auto e = get(key.key, &found);
  if (source) *source = found;
  if (e)
    KCACHE_LOG(LogLevel::debug, "hit %s (%s)", debug_name(key).c_str(), std::string(source_name(found)).c_str());
  else
    KCACHE_LOG(LogLevel::debug, "miss %s", debug_name(key).c_str());
  if (!e) impl_->explain_miss(key);
  return e;
}

Status Cache::put(const Entry& entry) { return impl_->store(entry); }

std::optional<Entry> Cache::put(const KeyInfo& key, std::vector<Artifact> artifacts, uint64_t compile_cost_us) {
  auto e = impl_->build(key, std::move(artifacts), compile_cost_us);
  if (!e) {
    KCACHE_LOG(LogLevel::warn, "put: %s", e.error().to_string().c_str());
    return std::nullopt;
  }
  if (!put(*e)) return std::nullopt;
  return std::move(e).value();
}

Expected<Entry> Cache::Impl::build(const KeyInfo& key, std::vector<Artifact> arts, uint64_t cost_us) {
  EntryBuilder b(key.key);
  for (auto& a : arts) b.add(std::move(a));
  EntryMeta m;
  m.created_unix_ms = util::now_unix_ms();
  m.compile_cost_us = cost_us;
  m.producer = opt.producer;
  m.label = key.label;
  b.meta(std::move(m)).manifest(key.manifest).compression(opt.compression);
  return b.build();
}

// ---- the request path ----------------------------------------------------------

Expected<Entry> Cache::get_or_compile(const Key& key, const CompileFn& compile, Source* source) {
  KeyInfo info;
  info.key = key;
  return get_or_compile(info, compile, source);
}

Expected<Entry> Cache::get_or_compile(const KeyInfo& key, const CompileFn& compile, Source* source) {
  Impl::Outcome o;
  return impl_->resolve(key, compile, source, true, &o);
}

Expected<Entry> Cache::Impl::resolve(const KeyInfo& key, const CompileFn& compile, Source* source, bool wait_for_others,
                                     Outcome* outcome, Access count) {
  *outcome = Outcome::done;
  if (source) *source = Source::compiled;
  if (!policy.single_flight) return compile_entry(key, compile);
  Source found = Source::compiled;
  if (auto hit = look_up(key.key, &found, count)) {
    if (source) *source = found;
    KCACHE_LOG(LogLevel::debug, "hit %s (%s)", debug_name(key).c_str(), std::string(source_name(found)).c_str());
    return std::move(*hit);
  }
  KCACHE_LOG(LogLevel::debug, "miss %s", debug_name(key).c_str());

  Turn turn = take_turn(key.key, source, wait_for_others, key.label);
  if (turn.busy) *outcome = Outcome::busy;
  // Journaled once the turn says who compiles: a caller that waited and got
  // the entry compiled nothing, and N processes that start cold on one key
  // journal one miss, not N.
  if (count == Access::counted && !(turn.answer && *turn.answer)) explain_miss(key);
  if (turn.answer) return std::move(*turn.answer);

  // Leading: an exception from the compile function or a tier drops the
  // Leadership unfinished, which releases the lease and tells the waiters.
  if (turn.leader) turn.leader->lead.compiling();
  Expected<Entry> r = compile_entry(key, compile);
  if (r) {
    if (source) *source = Source::compiled;
    bool stored = store_compiled(*r);
    KCACHE_LOG(LogLevel::debug, "%s %s (%zu bytes)", stored ? "stored" : "not stored (no writable tier)",
               debug_name(key).c_str(), r->encoded().size());
  } else {
    KCACHE_LOG(LogLevel::debug, "compile of %s failed: %s", debug_name(key).c_str(), r.error().to_string().c_str());
  }
  if (turn.leader) turn.leader->finish(r);
  return r;
}

Cache::Impl::Turn Cache::Impl::take_turn(const Key& key, Source* source, bool wait, std::string_view label) {
  using End = FlightTable::End;
  Turn t;
  for (;;) {
    std::shared_ptr<FlightTable::Shared> join;
    bool reentry = false;
    std::optional<FlightTable::Lead> lead = flights.lead_or_join(key, &join, &reentry);
    if (reentry) {
      KCACHE_LOG(LogLevel::warn,
                 "key %s asked for again by the thread compiling it (a compile function that asks the cache for "
                 "its own key, or a second begin() before commit or abandon): refused",
                 key.hex().c_str());
      t.reentry = true;
      t.answer = Status(Errc::invalid_argument,
                        std::string(kReentryPrefix) + "this thread is already compiling key " + key.hex() +
                            " (a compile function asked the cache for its own key, or begin() was called again "
                            "before commit or abandon)");
      return t;
    }
    if (!lead) {
      // Another thread leads: its result is ours, unless it gave the key
      // up (another process holds the lease, or a Flight was abandoned).
      waits.fetch_add(1, std::memory_order_relaxed);
      if (source) *source = Source::waited;
      auto [r, end] = flights.wait(join, opt.wait_bound_ms);
      if (end == End::gave_up) {
        KCACHE_LOG(LogLevel::warn,
                   "waited %llu ms for another thread of this process compiling %s%s%.*s%s; compiling here without "
                   "its flight",
                   static_cast<unsigned long long>(opt.wait_bound_ms), key.hex().c_str(), label.empty() ? "" : " \"",
                   static_cast<int>(label.size()), label.data(), label.empty() ? "" : "\"");
        t.solo = true;
        return t;
      }
      if (end == End::done || (end == End::busy && !wait)) {
        t.busy = end == End::busy;
        t.answer = std::move(r);
        return t;
      }
      continue;
    }
    Leadership leader(this, std::move(*lead));
    auto found = [&](Entry e) {
      leader.finish(e);
      t.answer = std::move(e);
      return std::move(t);
    };
    // Another thread may have stored it between our lookup and our flight.
    if (auto hit = look_up(key, source, Access::uncounted)) return found(std::move(*hit));
    // A thread that holds the key's lease through another Cache of this
    // process (one on the same store) would wait for itself: it compiles
    // without the lease instead.
    if (lease.active() && !opt.read_only && held_here(key)) {
      KCACHE_LOG(LogLevel::info, "key %s asked for again by the thread holding its lease: compiling without it",
                 key.hex().c_str());
    } else if (lease.active() && !opt.read_only) {
      bool waited = false;
      switch (lease.claim(key, wait, &waited)) {
        case LeaseWait::Claim::held:
          leader.hold_lease();
          if (auto hit = look_up(key, source, Access::uncounted)) {
            if (waited && source && *source != Source::memory) *source = Source::waited;
            return found(std::move(*hit));
          }
          break;
        case LeaseWait::Claim::busy: {
          Status st(Errc::unavailable, "another process is compiling this key");
          leader.finish(st, End::busy);
          t.busy = true;
          t.answer = st;
          return t;
        }
        case LeaseWait::Claim::timed_out:
        case LeaseWait::Claim::uncoordinated:
          break;  // compile without coordination
      }
    }
    t.leader.emplace(std::move(leader));
    return t;
  }
}

Expected<Entry> Cache::Impl::compile_entry(const KeyInfo& key, const CompileFn& compile) {
  uint64_t t0 = util::now_mono_us();
  compiles.fetch_add(1, std::memory_order_relaxed);
  auto arts = compile();
  uint64_t dt = util::now_mono_us() - t0;
  compile_us.fetch_add(dt, std::memory_order_relaxed);
  KCACHE_LOG(LogLevel::debug, "compiled %s in %.3f ms", debug_name(key).c_str(), static_cast<double>(dt) / 1000.0);
  if (!arts) {
    compile_failures.fetch_add(1, std::memory_order_relaxed);
    return std::move(arts).error();
  }
  auto e = build(key, std::move(arts).value(), dt);
  if (!e) compile_failures.fetch_add(1, std::memory_order_relaxed);
  return e;
}

// ---- flights: the caller compiles ------------------------------------------------

struct Flight::State {
  Cache::Impl* impl = nullptr;
  KeyInfo key;
  Source source = Source::compiled;
  std::optional<Entry> entry;
  std::optional<Cache::Impl::Leadership> leader;
  bool owner = false;  // until committed or abandoned
  bool busy = false;   // try_begin: another process holds the lease
  Status error;        // why begin() refused (re-entry)
};

Flight::Flight(std::unique_ptr<State> s) : s_(std::move(s)) {}
Flight::Flight(Flight&& o) noexcept = default;
Flight& Flight::operator=(Flight&& o) noexcept {
  if (this != &o) {
    abandon();
    s_ = std::move(o.s_);
  }
  return *this;
}
Flight::~Flight() { abandon(); }

bool Flight::hit() const noexcept { return s_ && !s_->owner && s_->entry && s_->source != Source::compiled; }
bool Flight::owner() const noexcept { return s_ && s_->owner; }
bool Flight::busy() const noexcept { return s_ && s_->busy; }
Source Flight::source() const noexcept { return s_ ? s_->source : Source::compiled; }
bool Flight::has_entry() const noexcept { return s_ && s_->entry.has_value(); }
const Entry& Flight::entry() const { return *s_->entry; }
const Status& Flight::error() const noexcept {
  static const Status ok;
  return s_ ? s_->error : ok;
}

Expected<Entry> Flight::commit(std::vector<Artifact> artifacts, uint64_t compile_cost_us) {
  if (!owner()) return Status(Errc::invalid_argument, "commit on a flight that does not own its key");
  Cache::Impl& impl = *s_->impl;
  impl.compiles.fetch_add(1, std::memory_order_relaxed);
  impl.compile_us.fetch_add(compile_cost_us, std::memory_order_relaxed);
  auto e = impl.build(s_->key, std::move(artifacts), compile_cost_us);
  if (!e) {
    impl.compile_failures.fetch_add(1, std::memory_order_relaxed);
    abandon();
    return e;
  }
  impl.store_compiled(*e);
  if (s_->leader) s_->leader->finish(*e);
  s_->leader.reset();
  s_->owner = false;
  s_->source = Source::compiled;
  s_->entry = *e;
  return e;
}

void Flight::abandon() noexcept {
  if (!s_ || !s_->owner) return;
  s_->owner = false;
  if (s_->leader)
    s_->leader->finish(Status(Errc::compile_failed, "the key's flight was abandoned"), FlightTable::End::abandoned);
  s_->leader.reset();
}

Flight Cache::begin(const KeyInfo& key) { return begin(key, /*wait=*/true); }
Flight Cache::try_begin(const KeyInfo& key) { return begin(key, /*wait=*/false); }

Flight Cache::begin(const KeyInfo& key, bool wait) {
  auto s = std::make_unique<Flight::State>();
  s->impl = impl_.get();
  s->key = key;
  if (!impl_->policy.single_flight) {
    s->owner = true;
    return Flight(std::move(s));
  }
  if (auto hit = impl_->look_up(key.key, &s->source, Access::counted)) {
    s->entry = std::move(*hit);
    return Flight(std::move(s));
  }
  for (;;) {
    Impl::Turn turn = impl_->take_turn(key.key, &s->source, wait, key.label);
    if (turn.busy) {
      s->busy = true;
      s->source = Source::compiled;
      return Flight(std::move(s));
    }
    if (turn.reentry) {
      s->error = turn.answer->error();
      s->source = Source::compiled;
      impl_->explain_miss(key);
      return Flight(std::move(s));
    }
    if (turn.leader || turn.solo) {
      // Journaled only by the caller that compiles (see resolve).
      impl_->explain_miss(key);
      if (turn.leader) {
        s->leader.emplace(std::move(*turn.leader));
        s->leader->lead.compiling();  // the caller compiles from here
      }
      s->owner = true;
      s->source = Source::compiled;
      return Flight(std::move(s));
    }
    // Another caller's compile failed: this caller compiles it itself.
    if (!*turn.answer) continue;
    s->entry = std::move(*turn.answer).value();
    return Flight(std::move(s));
  }
}

// ---- statistics --------------------------------------------------------------

CacheStats Cache::stats() const {
  CacheStats s;
  for (auto& t : impl_->chain.tiers()) s.tiers.push_back({std::string(t->name()), t->stats()});
  s.hits = impl_->chain.hits();
  s.misses = impl_->chain.misses();
  s.faults = impl_->chain.faults();
  s.compiles = impl_->compiles.load();
  s.compile_failures = impl_->compile_failures.load();
  s.waits = impl_->waits.load();
  s.compile_us = impl_->compile_us.load();
  s.lease_waits = impl_->lease.waits();
  s.lease_timeouts = impl_->lease.timeouts();
  s.lease_takeovers = impl_->lease.takeovers();
  return s;
}

}  // namespace kcache

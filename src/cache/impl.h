// Private: the Cache's state and the steps of a request, shared by cache.cc
// (single keys and flights) and batch.cc (batches).
//
// A request goes: look_up (every tier, counted) -> take_turn (lead the key's
// in-process flight or wait for its leader; the leader re-checks and claims
// the cross-process lease, or waits for the process holding it) -> compile
// -> store -> finish (hand the result to the waiting threads, release the
// lease).
#pragma once

#include <atomic>
#include <optional>
#include <thread>

#include "cache/committer.h"
#include "cache/flight.h"
#include "cache/journal.h"
#include "cache/lease_wait.h"
#include "cache/tier_chain.h"
#include "kcache/cache.h"

namespace kcache {

// The one policy gate: what the options allow, asked by every path that
// looks up or stores (Cache::get and put, the request path, flights,
// batches, and through Cache::get the stage links and the integrations'
// object caches), so KCACHE_DISABLE, KCACHE_READONLY and KCACHE_RECOMPILE
// mean the same everywhere.
struct Policy {
  explicit Policy(const Options& o)
      : look_up(!o.disabled && !o.recompile), store(!o.disabled && !o.read_only), single_flight(!o.disabled) {}
  // Tiers are asked (and a miss is a miss: counted, journaled).
  bool look_up;
  // Entries go into the writable tiers.
  bool store;
  // Compiles of one key are single-flighted; off only when the cache is
  // disabled (under recompile, one thread still compiles for all).
  bool single_flight;
};

struct Cache::Impl {
  // A lease TTL of 0 would expire as it is taken: the default instead.
  explicit Impl(const Options& o)
      : opt(o),
        policy(o),
        lease(o.lease_ttl_ms ? o.lease_ttl_ms : Options().lease_ttl_ms, o.wait_bound_ms, o.env),
        committer(chain, o.env) {}

  Options opt;
  Policy policy;
  TierChain chain;
  FlightTable flights;
  LeaseWait lease;
  Committer committer;
  std::atomic<uint64_t> compiles{0}, compile_failures{0}, waits{0}, compile_us{0};

  // Why did it miss: the miss journal and KCACHE_EXPLAIN (cache/journal.h);
  // null when neither applies. Called once per counted miss (not for the
  // lookups that recompile skips).
  std::unique_ptr<MissExplainer> explainer;
  void explain_miss(const KeyInfo& key) {
    if (explainer && policy.look_up) explainer->miss(key);
  }

  // What the leader of a key's flight holds until it finishes: the
  // in-process flight and, when it was claimed, the cross-process lease.
  // Dropped unfinished (an exception from the compile function or a tier),
  // it gives the lease up and the waiting threads get an error.
  struct Leadership {
    Impl* impl;
    FlightTable::Lead lead;
    bool leased = false;
    std::thread::id lease_thread;  // the thread that claimed the lease

    Leadership(Impl* i, FlightTable::Lead l) : impl(i), lead(std::move(l)) {}
    Leadership(Leadership&& o) noexcept
        : impl(o.impl), lead(std::move(o.lead)), leased(o.leased), lease_thread(o.lease_thread) {
      o.leased = false;
    }
    ~Leadership() { release_lease(); }
    // Holding the claimed lease: noted as this thread's (see held_here).
    void hold_lease();
    // The note of hold_lease goes: the lease is released.
    void hand_over_lease();
    // The lease goes after the entry is stored (store_compiled: written to
    // the disk tier), so that other processes find it; then the waiting
    // threads get the result.
    void finish(const Expected<Entry>& r, FlightTable::End end = FlightTable::End::done) {
      release_lease();
      lead.finish(r, end);
    }
    void release_lease() {
      if (!leased) return;
      hand_over_lease();
      leased = false;
      impl->lease.release(lead.key());
    }
  };
  // Whether the calling thread holds `key`'s lease through any Cache of
  // this process: claiming it again (a compile function asking another
  // Cache on the same store for its own key) would wait for itself.
  static bool held_here(const Key& key);

  // After a miss: either an answer (another thread's result, an entry a
  // re-check found, or "busy" when the caller would not wait for another
  // process), or the lead, and the caller compiles.
  struct Turn {
    std::optional<Expected<Entry>> answer;
    std::optional<Leadership> leader;
    bool busy = false;
    // The calling thread leads the key's flight already (re-entry): the
    // answer is invalid_argument, at once.
    bool reentry = false;
    // Another thread of this process led the key's flight past wait_bound_ms:
    // the caller compiles without a flight (no answer, no leader).
    bool solo = false;
  };

  // Step 1: every tier, in order (skipped under recompile); an entry still
  // on its way to disk is served from the committer's queue.
  std::optional<Entry> look_up(const Key& key, Source* source, Access count) {
    if (!policy.look_up) return std::nullopt;
    if (auto e = in_flight(key, source)) return e;
    return chain.lookup(key, source, count);
  }
  // An entry handed to the committer and not yet written (one atomic load
  // when its queue is empty).
  std::optional<Entry> in_flight(const Key& key, Source* source) {
    if (committer.idle()) return std::nullopt;
    auto e = committer.find(key);
    if (e) {
      chain.note_hit();
      if (source) *source = Source::memory;
    }
    return e;
  }
  // Step 2. wait=false: a key another process is compiling is answered busy
  // (with an unavailable status) instead of waiting, so a batch can do other
  // work first.
  Turn take_turn(const Key& key, Source* source, bool wait, std::string_view label = {});
  // Step 3: the compile function, timed and counted, and the entry built
  // from its artifacts.
  Expected<Entry> compile_entry(const KeyInfo& key, const CompileFn& compile);
  // Step 4, for what a compile produced (get_or_compile, batches, a
  // flight's commit): every writable tier (none when read-only), the disk
  // tier's write committed in the calling thread before it returns, so the
  // entry is visible to other processes and survives this one being killed
  // by any signal; a remote tier queues it for its own writer.
  bool store_compiled(const Entry& e);
  // A plain put (Cache::put, stage links): the memory tier at once, the
  // slower ones through the committer (group commit); with sync_commit,
  // written before it returns, and a failed disk write is the result.
  Status store(const Entry& e);

  enum class Outcome { done, busy };
  // The four steps. count: whether this request's first lookup counts a
  // miss (a batch has counted it in its lookup pass).
  Expected<Entry> resolve(const KeyInfo& key, const CompileFn& compile, Source* source, bool wait_for_others,
                          Outcome* outcome, Access count = Access::counted);

  Expected<Entry> build(const KeyInfo& key, std::vector<Artifact> arts, uint64_t cost_us);
};

}  // namespace kcache

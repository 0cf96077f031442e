// Private: in-process single-flight. One thread leads a key's flight (looks
// it up again, claims the cross-process lease, compiles, stores); the other
// threads that miss the key meanwhile wait for the leader's result instead
// of compiling it again.
//
// Re-entry: a flight remembers the thread that leads it. That thread asking
// for the same key again (a compile function that asks the cache for its own
// key, or a second begin() of a key it has not committed) would wait for
// itself for ever; lead_or_join refuses it instead (Join::reentry), at once.
//
// Fork: a child of fork() has only the forking thread, so the flights its
// parent's other threads led can never end there, and one of them may have
// held the table's lock at the fork. The child's first use of the table
// abandons (leaks) what it inherited and starts empty, as ProcessWide and
// util::Worker do: a flight held by a parent thread never makes a child wait.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "kcache/entry.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache {

class FlightTable {
 public:
  // How a flight ended, for the threads that waited on it.
  enum class End : uint8_t {
    done,       // the result is the answer (an entry or the compile's error)
    busy,       // another process holds the key's lease: the leader gave up
    abandoned,  // the leader gave up without a result: try again
    gave_up,    // the waiter's bound passed first: it compiles without the flight
  };
  // A flight as the threads that join it see it. The leader hands over its
  // result only when a thread joined: a flight no one waited on (the common
  // case) costs no copy of the entry and no wake-up.
  struct Shared {
    std::shared_ptr<const Expected<Entry>> result;  // GUARDED_BY(the table's mu_)
    End end = End::done;                            // GUARDED_BY(the table's mu_)
    bool ended = false;                             // GUARDED_BY(the table's mu_)
    unsigned waiters = 0;                           // GUARDED_BY(the table's mu_)
    std::condition_variable cv;                     // `ended` became true
    std::thread::id leader;                         // the thread that took the lead; set once
    // When the leader began to compile (steady clock, ns; 0: not yet, it is
    // still looking up or waiting for another process's lease, a wait with
    // its own bound). A waiter's bound counts from here.
    std::atomic<int64_t> compiling_since{0};
  };

  // The leader's hold on a flight. Whatever happens (a result, an error, an
  // exception), the flight ends once: finish() or the destructor hands a
  // result to every waiting thread and unregisters the flight.
  class Lead {
   public:
    Lead(FlightTable* table, Key key) : table_(table), key_(std::move(key)) {}
    Lead(Lead&& o) noexcept;
    Lead& operator=(Lead&&) = delete;
    ~Lead();
    void finish(const Expected<Entry>& r, End end = End::done);
    // The leader begins to compile: the waiters' bound starts.
    void compiling() noexcept;
    bool finished() const noexcept { return done_; }
    const Key& key() const noexcept { return key_; }

   private:
    friend class FlightTable;
    FlightTable* table_;
    Key key_;
    std::shared_ptr<Shared> shared_;
    bool done_ = false;
  };

  // Leads the key's flight (returns the Lead), or joins the one another
  // thread leads (returns nullopt and sets *join; the caller must then
  // wait() on it). When the calling thread leads the key's flight itself,
  // returns nullopt, leaves *join null and sets *reentry: joining would
  // wait for ever.
  std::optional<Lead> lead_or_join(const Key& key, std::shared_ptr<Shared>* join, bool* reentry);
  // Waits until the joined flight ends: its result, and how it ended; or,
  // once the leader has been compiling for `bound_ms` (0: no bound), a
  // timeout and End::gave_up (a compile function that hands its own key to
  // another thread and joins it would otherwise hang).
  std::pair<Expected<Entry>, End> wait(const std::shared_ptr<Shared>& join, uint64_t bound_ms);

  FlightTable();
  FlightTable(const FlightTable&) = delete;
  FlightTable& operator=(const FlightTable&) = delete;
  ~FlightTable();

 private:
  // The table of one fork generation. Replaced as a whole (one atomic
  // pointer), so threads of a child that renew it at once all end up on the
  // same one.
  struct State {
    explicit State(uint64_t g) : gen(g) {}
    const uint64_t gen;
    std::mutex mu;
    std::unordered_map<Key, std::shared_ptr<Shared>> flights;  // GUARDED_BY(mu)
  };
  // This generation's table (made afresh in a child of fork()).
  State& state();

  std::atomic<State*> state_;
};

}  // namespace kcache

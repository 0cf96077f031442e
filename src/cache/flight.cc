// In-process single-flight: the table of flights and the leader's hold on
// one. See flight.h.
#include "cache/flight.h"

#include "util/util.h"

namespace kcache {

FlightTable::FlightTable() : state_(new State(util::fork_generation())) {}

FlightTable::~FlightTable() { delete state_.load(); }

FlightTable::State& FlightTable::state() {
  State* s = state_.load(std::memory_order_acquire);
  const uint64_t now = util::fork_generation();
  if (s->gen == now) return *s;
  // A child of fork(): the parent's flights were led by threads the child
  // does not have, and a parent thread may have held the lock. Whichever
  // thread swaps first, every thread then uses its table.
  auto* fresh = new State(now);
  if (state_.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) {
    util::abandon(s);
    return *fresh;
  }
  delete fresh;
  return *s;
}

std::optional<FlightTable::Lead> FlightTable::lead_or_join(const Key& key, std::shared_ptr<Shared>* join,
                                                           bool* reentry) {
  std::optional<Lead> lead;
  *reentry = false;
  join->reset();
  const std::thread::id me = std::this_thread::get_id();
  State& st = state();
  std::lock_guard lk(st.mu);
  if (auto it = st.flights.find(key); it != st.flights.end()) {
    if (it->second->leader == me) {
      *reentry = true;
      return lead;
    }
    ++it->second->waiters;  // before the lock drops: the leader then keeps its result for us
    *join = it->second;
    return lead;
  }
  lead.emplace(this, key);
  lead->shared_ = std::make_shared<Shared>();
  lead->shared_->leader = me;
  st.flights.emplace(key, lead->shared_);
  return lead;
}

std::pair<Expected<Entry>, FlightTable::End> FlightTable::wait(const std::shared_ptr<Shared>& join, uint64_t bound_ms) {
  using Clock = std::chrono::steady_clock;
  std::shared_ptr<const Expected<Entry>> result;
  End end;
  {
    State& st = state();
    std::unique_lock lk(st.mu);
    for (;;) {
      if (join->ended) break;
      const int64_t since = join->compiling_since.load(std::memory_order_relaxed);
      if (bound_ms == 0 || since == 0) {
        // No bound, or the leader is not compiling yet (its own wait for
        // another process is bounded): look again in a while.
        join->cv.wait_for(lk, std::chrono::milliseconds(bound_ms == 0 ? 60000 : 100));
        continue;
      }
      const auto deadline = Clock::time_point(Clock::duration(since)) + std::chrono::milliseconds(bound_ms);
      if (Clock::now() >= deadline) {
        --join->waiters;
        return {Status(Errc::timeout, "waited past the bound for another thread's compile"), End::gave_up};
      }
      join->cv.wait_until(lk, deadline);
    }
    result = join->result;
    end = join->end;
    --join->waiters;
  }
  return {*result, end};  // the copy outside the table's lock
}

void FlightTable::Lead::compiling() noexcept {
  if (!shared_) return;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  shared_->compiling_since.store(now > 0 ? now : 1, std::memory_order_relaxed);
}

FlightTable::Lead::Lead(Lead&& o) noexcept
    : table_(o.table_), key_(std::move(o.key_)), shared_(std::move(o.shared_)), done_(o.done_) {
  o.done_ = true;
}

void FlightTable::Lead::finish(const Expected<Entry>& r, End end) {
  if (done_) return;
  done_ = true;
  if (!shared_) return;  // never registered (its state could not be made)
  bool wake = false;
  {
    State& st = table_->state();
    std::lock_guard lk(st.mu);
    auto it = st.flights.find(key_);
    if (it != st.flights.end() && it->second == shared_) st.flights.erase(it);
    if (shared_->waiters > 0) {
      shared_->result = std::make_shared<const Expected<Entry>>(r);
      shared_->end = end;
      wake = true;
    }
    shared_->ended = true;
  }
  if (wake) shared_->cv.notify_all();
}

FlightTable::Lead::~Lead() {
  // Unwound by an exception from the compile function (or an interrupt a
  // binding carries through as one): the compile did not end, so the
  // waiters are not handed its failure; one of them compiles instead.
  if (!done_) finish(Status(Errc::compile_failed, "compile function threw an exception"), End::abandoned);
}

}  // namespace kcache

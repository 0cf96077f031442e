// In-process single-flight: the table of flights and the leader's hold on
// one. See flight.h.
#include "cache/flight.h"

#include "util/util.h"

namespace kcache {

FlightTable::FlightTable() : gen_(util::fork_generation()) {}

FlightTable::~FlightTable() {
  delete flights_;
  delete mu_;
}

std::mutex& FlightTable::lock() {
  uint64_t now = util::fork_generation(), was = gen_.load(std::memory_order_relaxed);
  if (was != now && gen_.compare_exchange_strong(was, now)) {
    util::abandon(mu_);
    util::abandon(flights_);
    mu_ = new std::mutex;
    flights_ = new Map;
  }
  return *mu_;
}

std::optional<FlightTable::Lead> FlightTable::lead_or_join(const Key& key, std::shared_ptr<Shared>* join,
                                                           bool* reentry) {
  std::optional<Lead> lead;
  *reentry = false;
  join->reset();
  const std::thread::id me = std::this_thread::get_id();
  std::lock_guard lk(lock());
  if (auto it = flights_->find(key); it != flights_->end()) {
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
  flights_->emplace(key, lead->shared_);
  return lead;
}

std::pair<Expected<Entry>, FlightTable::End> FlightTable::wait(const std::shared_ptr<Shared>& join, uint64_t bound_ms) {
  std::shared_ptr<const Expected<Entry>> result;
  End end;
  {
    std::unique_lock lk(lock());
    if (!join->cv.wait_for(lk, std::chrono::milliseconds(bound_ms), [&] { return join->ended; })) {
      --join->waiters;
      return {Status(Errc::timeout, "waited past the bound for another thread's compile"), End::gave_up};
    }
    result = join->result;
    end = join->end;
    --join->waiters;
  }
  return {*result, end};  // the copy outside the table's lock
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
    std::lock_guard lk(table_->lock());
    auto it = table_->flights_->find(key_);
    if (it != table_->flights_->end() && it->second == shared_) table_->flights_->erase(it);
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

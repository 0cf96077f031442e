// In-process single-flight: the table of flights and the leader's hold on
// one. See flight.h.
#include "cache/flight.h"

namespace kcache {

std::optional<FlightTable::Lead> FlightTable::lead_or_join(const Key& key, std::shared_ptr<Shared>* join,
                                                           bool* reentry) {
  std::optional<Lead> lead;
  *reentry = false;
  join->reset();
  const std::thread::id me = std::this_thread::get_id();
  std::lock_guard lk(mu_);
  if (auto it = flights_.find(key); it != flights_.end()) {
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
  flights_.emplace(key, lead->shared_);
  return lead;
}

std::pair<Expected<Entry>, FlightTable::End> FlightTable::wait(const std::shared_ptr<Shared>& join) {
  std::shared_ptr<const Expected<Entry>> result;
  End end;
  {
    std::unique_lock lk(mu_);
    join->cv.wait(lk, [&] { return join->ended; });
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
    std::lock_guard lk(table_->mu_);
    auto it = table_->flights_.find(key_);
    if (it != table_->flights_.end() && it->second == shared_) table_->flights_.erase(it);
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

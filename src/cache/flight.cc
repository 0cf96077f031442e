// In-process single-flight: the table of flights and the leader's hold on
// one. See flight.h.
#include "cache/flight.h"

namespace kcache {

std::optional<FlightTable::Lead> FlightTable::lead_or_join(const Key& key, std::shared_ptr<Shared>* join) {
  std::optional<Lead> lead;
  std::lock_guard lk(mu_);
  if (auto it = flights_.find(key); it != flights_.end()) {
    *join = it->second;
    return lead;
  }
  lead.emplace(this, key);
  auto shared = std::make_shared<Shared>();
  shared->result = lead->promise_.get_future().share();
  flights_.emplace(key, std::move(shared));
  return lead;
}

FlightTable::Lead::Lead(Lead&& o) noexcept
    : table_(o.table_), key_(std::move(o.key_)), promise_(std::move(o.promise_)), done_(o.done_) {
  o.done_ = true;
}

void FlightTable::Lead::finish(const Expected<Entry>& r, End end) {
  if (done_) return;
  done_ = true;
  std::lock_guard lk(table_->mu_);
  auto it = table_->flights_.find(key_);
  if (it != table_->flights_.end()) it->second->end.store(end);
  promise_.set_value(r);
  if (it != table_->flights_.end()) table_->flights_.erase(it);
}

FlightTable::Lead::~Lead() {
  if (!done_) finish(Status(Errc::compile_failed, "compile function threw an exception"));
}

}  // namespace kcache

// The group committer: the Cache's writes to its slower tiers, off the
// compile path. See committer.h.
#include "cache/committer.h"

namespace kcache {

namespace {
// Bounds of the queue and of one group.
constexpr size_t kMaxQueued = 1024;
constexpr uint64_t kMaxQueuedBytes = uint64_t(256) << 20;
constexpr size_t kMaxGroup = 256;
// How long the committer lets a group gather before it writes it. Puts of
// one thread (stage links, a host's own stores) come one compile apart;
// without the wait each is a group of its own, a transaction and a sync.
// flush() and close cut the wait short.
constexpr uint64_t kLingerUs = 100'000;
}  // namespace

// A child of fork() writes none of its parent's queue (the parent does).
void Committer::renew_after_fork() {
  if (!worker_.renewed()) return;
  inherited_ = true;
  // The inherited containers may be mid-update by a parent thread: leak
  // them rather than destroy them.
  util::abandon(new std::deque<Item>(std::move(queue_)));
  util::abandon(new std::unordered_map<Key, std::pair<uint64_t, Entry>>(std::move(inflight_)));
  queue_ = {};
  inflight_ = {};
  submitted_ = written_ = queued_bytes_ = 0;
  sync_requested_ = synced_ = 0;
  util::abandon(new std::deque<std::pair<uint64_t, Status>>(std::move(failed_)));
  failed_ = {};
  failures_ = reported_ = 0;
  first_unreported_ = Status();
  flushing_ = 0;
  stop_ = false;
  waiting_.store(0);
  util::abandon(done_cv_.release());
  done_cv_ = std::make_unique<std::condition_variable>();
}

uint64_t Committer::submit(Entry e, std::function<void()> then) {
  renew_after_fork();
  if (inherited_) {
    // A child of fork() using its parent's Cache (whose disk handles refuse
    // it) writes in the caller's thread instead of starting one.
    std::vector<Item> one{{e, nullptr, 0}};
    std::vector<Status> r = chain_.store_group({std::move(e)});
    if (then) then();
    std::lock_guard lk(worker_.mu());
    one[0].seq = ++submitted_;
    ++written_;
    record(one, r);
    return one[0].seq;
  }
  std::unique_lock lk(worker_.mu());
  done_cv_->wait(lk, [&] { return queue_.size() < kMaxQueued && queued_bytes_ < kMaxQueuedBytes; });
  uint64_t seq = ++submitted_;
  queued_bytes_ += e.encoded().size();
  inflight_[e.key()] = {seq, e};
  queue_.push_back({std::move(e), std::move(then), seq});
  waiting_.fetch_add(1, std::memory_order_release);
  stop_ = false;
  worker_.start([this] { run(); });
  // The first entry starts a group; later ones join it without a wake-up
  // (a system call on the compiling thread) until the group is full.
  if (queue_.size() == 1 || group_full()) worker_.cv().notify_one();
  return seq;
}

void Committer::record(const std::vector<Item>& group, const std::vector<Status>& r) {
  for (size_t k = 0; k < group.size() && k < r.size(); ++k) {
    if (r[k].is_ok()) continue;
    if (failures_++ == reported_) first_unreported_ = r[k];
    failed_.emplace_back(group[k].seq, r[k]);
    if (failed_.size() > kMaxFailures) failed_.pop_front();
  }
}

Status Committer::take_failures() {
  renew_after_fork();
  std::lock_guard lk(worker_.mu());
  if (failures_ == reported_) return Status();
  const uint64_t n = failures_ - reported_;
  reported_ = failures_;
  Status first = std::move(first_unreported_);
  first_unreported_ = Status();
  if (n == 1) return first;
  return Status(first.code(), std::to_string(n) + " entries were not written; the first: " + first.message());
}

Status Committer::outcome(uint64_t seq) {
  renew_after_fork();
  std::lock_guard lk(worker_.mu());
  for (auto it = failed_.rbegin(); it != failed_.rend() && it->first >= seq; ++it)
    if (it->first == seq) return it->second;
  return Status();
}

void Committer::request_sync() {
  renew_after_fork();
  if (inherited_) {
    chain_.sync();
    return;
  }
  std::unique_lock lk(worker_.mu());
  const bool first = sync_requested_ == synced_ && queue_.empty();
  ++sync_requested_;
  stop_ = false;
  worker_.start([this] { run(); });
  if (first) worker_.cv().notify_one();
}

bool Committer::group_full() const { return queue_.size() >= kMaxGroup || queued_bytes_ >= kMaxQueuedBytes / 4; }

std::optional<Entry> Committer::find(const Key& key) {
  renew_after_fork();
  std::lock_guard lk(worker_.mu());
  auto it = inflight_.find(key);
  if (it == inflight_.end()) return std::nullopt;
  return it->second.second;
}

void Committer::flush() {
  renew_after_fork();
  std::unique_lock lk(worker_.mu());
  uint64_t target = submitted_, sync_target = sync_requested_;
  if (written_ >= target && synced_ >= sync_target) return;
  ++flushing_;
  worker_.cv().notify_all();  // no lingering: someone waits
  done_cv_->wait(lk, [&] { return written_ >= target && synced_ >= sync_target; });
  --flushing_;
}

bool Committer::flush_for(std::chrono::milliseconds bound) {
  renew_after_fork();
  std::unique_lock lk(worker_.mu());
  uint64_t target = submitted_, sync_target = sync_requested_;
  if (written_ >= target && synced_ >= sync_target) return true;
  ++flushing_;
  worker_.cv().notify_all();
  const bool done = done_cv_->wait_for(lk, bound, [&] { return written_ >= target && synced_ >= sync_target; });
  --flushing_;
  return done;
}

void Committer::stop() {
  renew_after_fork();
  flush();
  {
    std::lock_guard lk(worker_.mu());
    stop_ = true;
  }
  worker_.cv().notify_all();
  worker_.join();
}

void Committer::run() {
  std::unique_lock lk(worker_.mu());
  for (;;) {
    worker_.cv().wait(lk, [&] { return stop_ || !queue_.empty() || sync_requested_ > synced_; });
    if (queue_.empty() && sync_requested_ <= synced_) return;  // stop_ and nothing left
    const uint64_t deadline = env_->now_mono_us() + kLingerUs;
    for (uint64_t now = env_->now_mono_us(); !(stop_ || flushing_ > 0 || group_full()) && now < deadline;
         now = env_->now_mono_us())
      env_->wait_us(worker_.cv(), lk, deadline - now);
    std::vector<Item> group;
    while (!queue_.empty() && group.size() < kMaxGroup) {
      queued_bytes_ -= queue_.front().entry.encoded().size();
      group.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    const uint64_t sync_upto = sync_requested_;
    const bool sync = sync_upto > synced_;
    done_cv_->notify_all();  // room in the queue
    lk.unlock();
    std::vector<Entry> entries;
    entries.reserve(group.size());
    for (auto& it : group) entries.push_back(it.entry);
    std::vector<Status> results;
    if (!entries.empty()) {
      results = chain_.store_group(entries);
      groups_.fetch_add(1, std::memory_order_relaxed);
    }
    // After the group: its own synced commit has made the unsynced commits
    // before it durable already, and the tier's sync then has nothing to do.
    if (sync) chain_.sync();
    for (auto& it : group)
      if (it.then) it.then();
    lk.lock();
    for (auto& it : group) {
      auto f = inflight_.find(it.entry.key());
      if (f != inflight_.end() && f->second.first == it.seq) inflight_.erase(f);
    }
    record(group, results);
    written_ += group.size();
    if (sync) synced_ = sync_upto;
    waiting_.fetch_sub(group.size(), std::memory_order_release);
    done_cv_->notify_all();
  }
}

}  // namespace kcache

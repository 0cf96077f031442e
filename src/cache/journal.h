// Private: why a lookup missed. The miss journal (the last misses of a
// store, shared by its processes; read_miss_journal, kcache/miss_journal.h,
// reads it), the search for the stored entry nearest to a lookup, and the
// explainer the Cache calls on each counted miss. What is said of a miss is
// a MissReport (kcache/explain.h).
//
// The journal is a file beside the disk store, `<dir>/<engine>.misses`
// (docs/format.md, "Miss journal"), plus the previous generation
// `<dir>/<engine>.misses.1`. Records are appended under flock(2); the
// header says where the committed records end, so a record torn by a crash
// is never read and is overwritten by the next one. When the current file
// holds `keep` records it becomes the previous generation, so the journal
// keeps between `keep` and 2 x `keep` records and never grows further.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kcache/env.h"
#include "kcache/explain.h"
#include "kcache/key.h"
#include "kcache/manifest.h"
#include "kcache/miss_journal.h"
#include "kcache/status.h"
#include "kcache/tier.h"
#include "util/worker.h"

namespace kcache {

class MissJournal {
 public:
  // `store_path` is the disk store's folder (DiskStore::path); the journal
  // is that path + ".misses". keep: records kept (at least 1). shared: the
  // files are made group-writable (a store shared with a group).
  // Its file operations, lock waits and clock go through `env` (null: the
  // real one), the Cache's Options::env.
  MissJournal(const std::string& store_path, size_t keep, bool shared = false, std::shared_ptr<Env> env = nullptr);
  ~MissJournal();
  MissJournal(const MissJournal&) = delete;
  MissJournal& operator=(const MissJournal&) = delete;

  static std::string path_for(const std::string& store_path) { return miss_journal_path(store_path); }
  const std::string& path() const noexcept { return path_; }

  // Appends one record (under the journal's lock), now. Thread-safe. Waits
  // at most kLockBound for the lock (a holder that long is stopped or
  // stuck): then Errc::timeout, and for kSkipAfterTimeout after that every
  // append of this object fails at once with Errc::timeout, waiting for
  // nothing.
  Status append(const MissRecord& r);
  // Hands one record to the journal's writer thread, which appends it
  // (letting records gather for up to kLinger first): a miss on the compile
  // path costs no file system call. Records past kMaxPosted waiting are
  // dropped (the journal is a diagnostic), and so is the rest of a batch
  // once an append failed (a lock held past kLockBound, a failed write or
  // rotation): a batch is appended under one hold of the lock. flush() and
  // the destructor wait for the records posted before them: at most about
  // kLockBound.
  void post(MissRecord r);
  void flush();
  static constexpr size_t kMaxPosted = 4096;
  static constexpr std::chrono::milliseconds kLinger{100};
  static constexpr std::chrono::milliseconds kLockBound{1000};
  static constexpr std::chrono::seconds kSkipAfterTimeout{10};

 private:
  Status open_locked();  // opens (again) and locks the current file; REQUIRES mu_
  // Appends n encoded records, as many at a time as the current file has
  // room for, under one hold of the lock each. Stops at the first error;
  // *appended (when given) says how many were committed before it.
  Status append_encoded(const std::string* recs, size_t n, size_t* appended);
  void write_posted();  // the writer thread
  void renew_after_fork();
  std::string path_;
  size_t keep_;
  unsigned mode_;
  const std::shared_ptr<Env> env_;  // never null
  // On the heap: a child of fork() replaces it (a parent thread may have
  // held it at the fork), as util::Worker does its own.
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  int fd_ = -1;                             // GUARDED_BY(mu_)
  int fd_pid_ = 0;                          // the process that opened fd_ (flock is per open file)
  std::atomic<uint64_t> skip_until_us_{0};  // appends fail at once until then (util::now_mono_us)

  util::Worker writer_;
  std::vector<MissRecord> posted_;      // GUARDED_BY(writer_.mu())
  uint64_t n_posted_ = 0, n_done_ = 0;  // GUARDED_BY(writer_.mu())
  unsigned flushing_ = 0;               // GUARDED_BY(writer_.mu()): flush() callers waiting
  bool stop_ = false;                   // GUARDED_BY(writer_.mu())
  bool inherited_ = false;              // inherited across fork(): appends in the caller's thread
};

// The manifests of a tier's entries, each entry decoded once.
class StoredManifests {
 public:
  // Lists the tier (through its admin(): unavailable without one) and
  // decodes the entries not seen before, read with Access::peek so that the
  // search leaves every counter and recency record as it was; forgets keys
  // no longer listed. Entries stored without a manifest are left out.
  // `unreadable` counts entries that could not be read.
  Status load(Tier& tier, uint64_t* unreadable = nullptr);
  size_t size() const noexcept { return by_key_.size(); }

  // The candidate nearest to `want`: an entry of the same namespace, not
  // `self`, created no later than `before_ms` (0: any time). Among them the
  // entries with the same label (when `label` is set and any has it), then
  // the fewest differing components, then the most recently created, then
  // the most recently used.
  NearestSearch nearest(const Manifest& want, const std::string& label, const Key& self, uint64_t before_ms = 0) const;
  // The report of `miss` against the entries nearest() finds for it.
  MissReport explain(const MissRecord& miss, uint64_t before_ms = 0) const {
    return make_miss_report(miss, nearest(miss.manifest, miss.label, miss.key, before_ms));
  }

 private:
  std::unordered_map<Key, StoredManifest> by_key_;
};

// What the Cache calls on each counted miss of a key with a manifest:
// appends it to the journal (when there is one) and, with explain on,
// compares it with the disk store's entries and logs one line (warn): the
// report's TextForm::line, when something of its namespace is stored.
class MissExplainer {
 public:
  MissExplainer(std::shared_ptr<Tier> disk, std::unique_ptr<MissJournal> journal, bool explain);
  // Journals the miss (on the journal's writer thread) and, with explain
  // on, logs the nearest stored entry.
  void miss(const KeyInfo& key);
  // Waits until the misses so far are in the journal.
  void flush() {
    if (journal_) journal_->flush();
  }

 private:
  std::shared_ptr<Tier> disk_;
  std::unique_ptr<MissJournal> journal_;
  bool explain_;
  std::mutex mu_;
  StoredManifests stored_;  // GUARDED_BY(mu_)
};

}  // namespace kcache

// LMDB disk engine.
//
// One environment (data.mdb + lock.mdb) per folder, opened once per process
// (LMDB forbids opening an environment twice in one process, so handles are
// shared through a registry keyed by device and inode).
//
// Named databases:
//   entries : key[16] -> encoded entry (docs/format.md)
//   meta    : key[16] -> u64 last_use_ms | u64 size
//   lru     : u64be last_use_ms | key[16] -> "" (recency index, oldest first)
//   stats   : counter name -> u64 (hits, misses, puts, evictions, corrupt,
//             errors, entries, bytes)
//
// Invariants, true after every committed write transaction:
//   * a key is in `entries` iff it is in `meta`, and then `lru` holds exactly
//     one record (meta.last_use_ms, key);
//   * stats.entries / stats.bytes equal the count and summed sizes of
//     `entries` (verify --fix recomputes them if they ever drift).
// An entry, its metadata and its counters change in one transaction, so a
// SIGKILL at any instant leaves either the old or the new state.
//
// Reads are zero-copy: a hit returns an Entry whose bytes point into the map
// and which pins its read transaction until the last copy is dropped.
// Hits are recorded in memory; a background thread writes recency and
// counters in batches, so the hit path never takes the write lock.
#include <lmdb.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kcache/tier.h"
#include "entry/buffer.h"
#include "tier/lmdb/lmdb_env.h"
#include "util/util.h"

namespace kcache {

namespace {

Status mdb_status(int rc, std::string_view what) {
  Errc c = Errc::io_error;
  if (rc == MDB_MAP_FULL) c = Errc::no_space;
  else if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    c = Errc::corrupt;
  else if (rc == EACCES || rc == EROFS) c = Errc::read_only;
  else if (rc == ENOSPC || rc == EDQUOT) c = Errc::no_space;
  return Status(c, std::string("lmdb ") + std::string(what) + ": " + mdb_strerror(rc));
}

MDB_val val(const void* p, size_t n) { return MDB_val{n, const_cast<void*>(p)}; }
MDB_val val(const Key& k) { return val(k.bytes.data(), 16); }

void lru_key(char out[24], uint64_t ms, const Key& k) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(ms >> (8 * (7 - i)));
  std::memcpy(out + 8, k.bytes.data(), 16);
}

// Records walked by eviction and repair, for tests of put cost.
std::atomic<uint64_t> g_records_visited{0};

const char* const kCounterNames[] = {"hits", "misses", "puts", "evictions", "corrupt", "errors", "entries", "bytes"};
enum Counter { c_hits, c_misses, c_puts, c_evictions, c_corrupt, c_errors, c_entries, c_bytes, c_count };

// ---- structural check of the data file ----------------------------------
//
// LMDB keeps no page checksums and trusts every page number and offset it
// reads: a flipped bit in a B-tree page can send mdb_get outside the map
// (SIGSEGV/SIGBUS). Before any transaction walks the tree, a process checks
// once, after opening, that the file is shaped as LMDB wrote it: both meta
// pages sane, and for the free list, the main database and every named
// database, each reachable page in bounds, numbered as its offset, of the
// right type and depth, reached once, with node offsets and sizes inside the
// page, overflow runs inside the file, and free-listed pages not in use.
// Entry bytes are not read here (their checksums are verified on every get);
// the cost is one pass over the B-tree pages, a small part of the file.
//
// The layout constants below are LMDB 0.9's on-disk format (lmdb.h/mdb.c:
// MDB_page, MDB_node, MDB_meta, MDB_db), which is stable across 0.9.x.
constexpr uint32_t kMdbMagic = 0xBEEFC0DE;
constexpr uint32_t kMdbVersion = 1;
constexpr size_t kPageHdr = 16;   // pgno u64 | pad u16 | flags u16 | lower u16 | upper u16 (or pages u32)
constexpr size_t kNodeHdr = 8;    // lo u16 | hi u16 | flags u16 | ksize u16
constexpr size_t kDbRecord = 48;  // pad u32 | flags u16 | depth u16 | 4 x u64 | root u64
constexpr uint16_t kPBranch = 0x01, kPLeaf = 0x02, kPOverflow = 0x04;
constexpr uint16_t kFBigData = 0x01, kFSubData = 0x02;
constexpr uint64_t kNoRoot = ~uint64_t(0);

uint16_t rd16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t rd32(const unsigned char* p) { return rd16(p) | (static_cast<uint32_t>(rd16(p + 2)) << 16); }
uint64_t rd64(const unsigned char* p) { return rd32(p) | (static_cast<uint64_t>(rd32(p + 4)) << 32); }

struct MetaInfo {
  uint32_t psize = 0;
  uint64_t last_pg = 0, txnid = 0;
  uint64_t free_root = kNoRoot, main_root = kNoRoot;
  uint16_t free_depth = 0, main_depth = 0;
};

// Parses the meta record that starts kPageHdr bytes into a meta page.
bool parse_meta(const unsigned char* m, MetaInfo* out) {
  if (rd32(m) != kMdbMagic || rd32(m + 4) != kMdbVersion) return false;
  const unsigned char* free_db = m + 24;
  const unsigned char* main_db = free_db + kDbRecord;
  out->psize = rd32(free_db);
  out->free_depth = rd16(free_db + 6);
  out->free_root = rd64(free_db + 40);
  out->main_depth = rd16(main_db + 6);
  out->main_root = rd64(main_db + 40);
  out->last_pg = rd64(main_db + kDbRecord);
  out->txnid = rd64(main_db + kDbRecord + 8);
  return true;
}

// Before LMDB maps the file: both metas readable and sane, and the pages the
// newer one claims are present (LMDB would otherwise map past the end of
// the file, or size its map from a corrupt field).
Status check_metas_before_open(const std::string& data_path) {
  int fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status();  // a new store
  struct stat st;
  Status res;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    unsigned char b0[kPageHdr + 160], b1[kPageHdr + 160];
    MetaInfo m0, m1;
    bool ok = ::pread(fd, b0, sizeof b0, 0) == static_cast<ssize_t>(sizeof b0) && parse_meta(b0 + kPageHdr, &m0);
    uint32_t ps = ok ? m0.psize : 0;
    ok = ok && ps >= 512 && ps <= 65536 && (ps & (ps - 1)) == 0 &&
         ::pread(fd, b1, sizeof b1, ps) == static_cast<ssize_t>(sizeof b1) && parse_meta(b1 + kPageHdr, &m1) &&
         m1.psize == ps && rd16(b0 + 10) == 0x08 && rd16(b1 + 10) == 0x08;
    if (!ok) {
      res = Status(Errc::corrupt, "lmdb meta pages of " + data_path + " are damaged");
    } else {
      const MetaInfo& m = m0.txnid >= m1.txnid ? m0 : m1;
      if (m.last_pg < 1 || m.last_pg > (uint64_t(1) << 40) ||
          (m.last_pg + 1) * ps > static_cast<uint64_t>(st.st_size))
        res = Status(Errc::corrupt, "lmdb data file " + data_path + " is truncated or its meta page is damaged");
    }
  }
  ::close(fd);
  return res;
}

class TreeChecker {
 public:
  TreeChecker(const unsigned char* map, uint32_t psize, uint64_t npages)
      : map_(map), psize_(psize), npages_(npages), used_(npages, 0) {}

  // Checks the database rooted at `root` (`depth` levels deep, from its
  // record). Named-database records are collected when allow_subdb; free-list
  // records are read when free_list.
  bool tree(uint64_t root, uint16_t depth, bool allow_subdb, bool free_list) {
    if (root == kNoRoot) return true;
    if (depth == 0 || depth > 32) return fail("bad tree depth");
    std::vector<std::pair<uint64_t, uint16_t>> todo{{root, 1}};
    while (!todo.empty()) {
      auto [pg, level] = todo.back();
      todo.pop_back();
      const unsigned char* p = page(pg);
      if (!p) return false;
      uint16_t flags = rd16(p + 10), lower = rd16(p + 12), upper = rd16(p + 14);
      bool leaf = flags == kPLeaf;
      if (!leaf && flags != kPBranch) return fail("page of unexpected type");
      if (leaf != (level == depth)) return fail("tree depth mismatch");
      if (lower < kPageHdr + 2 || (lower - kPageHdr) % 2 != 0 || lower > upper || upper > psize_)
        return fail("page bounds damaged");
      unsigned n = (lower - kPageHdr) / 2;
      for (unsigned i = 0; i < n; ++i) {
        uint16_t off = rd16(p + kPageHdr + 2 * i);
        if (off < upper || off % 2 != 0 || off + kNodeHdr > psize_) return fail("node offset damaged");
        const unsigned char* node = p + off;
        uint16_t nflags = rd16(node + 4), ksize = rd16(node + 6);
        if (off + kNodeHdr + ksize > psize_) return fail("key size damaged");
        if (!leaf) {
          uint64_t child = rd16(node) | (uint64_t(rd16(node + 2)) << 16) | (uint64_t(nflags) << 32);
          todo.emplace_back(child, static_cast<uint16_t>(level + 1));
          continue;
        }
        uint64_t dsize = rd16(node) | (uint64_t(rd16(node + 2)) << 16);
        const unsigned char* data = node + kNodeHdr + ksize;
        if (nflags & ~(kFBigData | kFSubData)) return fail("node flags damaged");
        if (nflags & kFBigData) {
          if (nflags & kFSubData) return fail("node flags damaged");
          if (off + kNodeHdr + ksize + 8 > psize_) return fail("overflow reference damaged");
          uint64_t ov = rd64(data);
          if (!overflow(ov, dsize)) return false;
          if (free_list && !free_ids(map_ + ov * psize_ + kPageHdr, dsize)) return false;
          continue;
        }
        if (off + kNodeHdr + ksize + dsize > psize_) return fail("data size damaged");
        if (nflags & kFSubData) {
          if (!allow_subdb || dsize != kDbRecord) return fail("named database record damaged");
          subdbs_.emplace_back(rd64(data + 40), rd16(data + 6));
        } else if (free_list && !free_ids(data, dsize)) {
          return false;
        }
      }
      if (n == 0) return fail("empty page in a tree");
    }
    return true;
  }

  // Named databases found while checking the main database.
  const std::vector<std::pair<uint64_t, uint16_t>>& subdbs() const { return subdbs_; }

  // Free-listed pages must not be part of any tree.
  bool free_pages_unused() {
    for (uint64_t pg : free_)
      if (used_[pg]) return fail("a page is both free and in use");
    return true;
  }

  const std::string& why() const { return why_; }

 private:
  bool fail(const char* why) {
    why_ = why;
    return false;
  }

  const unsigned char* page(uint64_t pg) {
    if (pg < 2 || pg >= npages_) return fail("page number out of range"), nullptr;
    if (used_[pg]) return fail("page reached twice"), nullptr;
    used_[pg] = 1;
    const unsigned char* p = map_ + pg * psize_;
    if (rd64(p) != pg) return fail("page number mismatch"), nullptr;
    return p;
  }

  // An overflow run is checked from the leaf's side only: its first page
  // number and the length LMDB derives from the node's data size must lie
  // inside the file and not overlap another page in use. The run's own pages
  // are not read: reads take the size from the leaf, and the entry's bytes
  // are checksummed on every get, so reading one page per entry here (most
  // of the open cost of a large store) would buy no safety for lookups.
  bool overflow(uint64_t pg, uint64_t dsize) {
    uint64_t pages = (dsize + kPageHdr + psize_ - 1) / psize_;
    if (pg < 2 || pages == 0 || pg >= npages_ || pages > npages_ - pg) return fail("overflow run damaged");
    for (uint64_t i = 0; i < pages; ++i) {
      if (used_[pg + i]) return fail("overflow page reached twice");
      used_[pg + i] = 1;
    }
    return true;
  }

  // A free-list record: u64 count, then that many page numbers.
  bool free_ids(const unsigned char* d, uint64_t dsize) {
    if (dsize < 8 || dsize % 8 != 0 || rd64(d) != dsize / 8 - 1) return fail("free list record damaged");
    for (uint64_t i = 1; i < dsize / 8; ++i) {
      uint64_t pg = rd64(d + 8 * i);
      if (pg < 2 || pg >= npages_) return fail("free page out of range");
      free_.push_back(pg);
    }
    return true;
  }

  const unsigned char* map_;
  uint32_t psize_;
  uint64_t npages_;
  std::vector<uint8_t> used_;
  std::vector<uint64_t> free_;
  std::vector<std::pair<uint64_t, uint16_t>> subdbs_;
  std::string why_;
};

// After mdb_env_open, before the first transaction that reads the tree.
// Reads through a private read-only map of the file (LMDB does not expose
// its own), bounded by the file's size, while a read transaction keeps the
// checked snapshot's pages from being reused by writers.
Status check_tree(MDB_env* env, const std::string& data_path) {
  MDB_txn* txn;
  int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  if (rc) return mdb_status(rc, "begin check");
  uint64_t txnid = mdb_txn_id(txn);
  MDB_stat mst;
  mdb_env_stat(env, &mst);
  uint32_t ps = mst.ms_psize;
  Status res;
  int fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat fst;
  if (fd < 0 || ::fstat(fd, &fst) != 0) {
    res = util::errno_status(errno, "open " + data_path);
    if (fd >= 0) ::close(fd);
    mdb_txn_abort(txn);
    return res;
  }
  uint64_t fsize = static_cast<uint64_t>(fst.st_size);
  void* mp = fsize >= 2ull * ps ? ::mmap(nullptr, fsize, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  MetaInfo m0, m1;
  if (mp == MAP_FAILED) {
    res = fsize >= 2ull * ps ? util::errno_status(errno, "map " + data_path)
                             : Status(Errc::corrupt, "lmdb data file " + data_path + " is truncated");
  } else if (const auto* map = static_cast<const unsigned char*>(mp);
             !parse_meta(map + kPageHdr, &m0) || !parse_meta(map + ps + kPageHdr, &m1)) {
    res = Status(Errc::corrupt, "lmdb meta pages of " + data_path + " are damaged");
  } else {
    const MetaInfo* m = m0.txnid == txnid ? &m0 : m1.txnid == txnid ? &m1 : nullptr;
    uint64_t npages = m ? m->last_pg + 1 : 0;
    if (!m || npages * ps > fsize) {
      res = Status(Errc::corrupt, "lmdb meta page of " + data_path + " is damaged");
    } else {
      TreeChecker c(map, ps, npages);
      bool ok = c.tree(m->free_root, m->free_depth, false, true) && c.tree(m->main_root, m->main_depth, true, false);
      for (size_t i = 0; ok && i < c.subdbs().size(); ++i) {
        auto [root, depth] = c.subdbs()[i];
        ok = c.tree(root, depth, false, false);
      }
      ok = ok && c.free_pages_unused();
      if (!ok) res = Status(Errc::corrupt, "lmdb store " + data_path + " is damaged: " + c.why());
    }
  }
  if (mp != MAP_FAILED) ::munmap(mp, fsize);
  mdb_txn_abort(txn);
  return res;
}

}  // namespace

// ---- the shared environment --------------------------------------------

uint64_t lmdb_records_visited() noexcept { return g_records_visited.load(std::memory_order_relaxed); }

uint64_t lmdb_map_size(uint64_t max_bytes) noexcept {
  constexpr uint64_t kFloor = uint64_t(64) << 30, kSlack = uint64_t(64) << 20;
  constexpr uint64_t kCeiling = uint64_t(1) << 46;  // 64 TiB: within any 64-bit address space
  uint64_t want = max_bytes > (kCeiling - kSlack) / 2 ? kCeiling : 2 * max_bytes + kSlack;
  want = std::max(want, kFloor);
  long ps = ::sysconf(_SC_PAGESIZE);
  uint64_t page = ps > 0 ? static_cast<uint64_t>(ps) : 4096;
  return (want + page - 1) / page * page;
}

namespace {

// LMDB 0.9.24 opens data.mdb without close-on-exec (its lock file and the
// second data-file handle have it): a program the process execs would keep
// the store open. Sets FD_CLOEXEC on every descriptor of this process that
// refers to the store's files. Another thread exec'ing between
// mdb_env_open and this scan can still pass one on: LMDB offers no hook to
// open with O_CLOEXEC.
void set_cloexec_on_store_fds(MDB_env* env, const std::string& dir) {
  auto mark = [](int fd) {
    int fl = ::fcntl(fd, F_GETFD);
    if (fl >= 0 && !(fl & FD_CLOEXEC)) (void)::fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
  };
  mdb_filehandle_t fd;
  if (mdb_env_get_fd(env, &fd) == 0 && fd >= 0) mark(fd);
  struct stat data_st, lock_st;
  bool have_data = ::stat((dir + "/data.mdb").c_str(), &data_st) == 0;
  bool have_lock = ::stat((dir + "/lock.mdb").c_str(), &lock_st) == 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return;
  int self = ::dirfd(d);
  while (struct dirent* de = ::readdir(d)) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
    int n = std::atoi(de->d_name);
    struct stat st;
    if (n == self || ::fstat(n, &st) != 0) continue;
    bool ours = (have_data && st.st_dev == data_st.st_dev && st.st_ino == data_st.st_ino) ||
                (have_lock && st.st_dev == lock_st.st_dev && st.st_ino == lock_st.st_ino);
    if (ours) mark(n);
  }
  ::closedir(d);
}

}  // namespace

LmdbEnv::~LmdbEnv() {
  if (inherited()) {
    // A child of fork(): aborting a pooled transaction would free the
    // parent's reader slot, and closing the environment would close the
    // lock file and with it this process's fcntl lock on it, held for a
    // fresh environment the child may have opened on the same store
    // (LMDB's "first opener resets the lock file" check relies on it).
    // Leave it all; exit or exec releases the memory and descriptors.
    return;
  }
  for (MDB_txn* t : idle_) mdb_txn_abort(t);
  if (env_) mdb_env_close(env_);
}

bool LmdbEnv::inherited() const noexcept { return fork_gen_ != util::fork_generation(); }

Status LmdbEnv::inherited_error() {
  uint64_t gen = util::fork_generation();
  if (fork_logged_gen_.exchange(gen, std::memory_order_relaxed) != gen)
    KCACHE_LOG(LogLevel::warn, "lmdb store %s was opened before fork(); open a new Cache in the child to use it",
               dir_.c_str());
  return Status(Errc::unavailable, "lmdb store " + dir_ + " opened before fork(); open a new Cache in the child");
}

Status LmdbEnv::resized_error() {
  // Re-mapping (mdb_env_set_mapsize) would move the map under the hits this
  // process still holds; the handle keeps its map, and the store is a miss
  // here until the process opens it again.
  if (!resized_logged_.exchange(true, std::memory_order_relaxed))
    KCACHE_LOG(LogLevel::warn,
               "lmdb store %s: the store's map was grown by a process with a larger size limit; reopen to use it",
               dir_.c_str());
  return Status(Errc::unavailable, "lmdb store " + dir_ +
                                       ": the store's map was grown by a process with a larger size limit; reopen "
                                       "to use it");
}

Expected<std::shared_ptr<LmdbEnv>> LmdbEnv::open(const std::string& dir, uint64_t map_size, bool sync_data,
                                                 bool sync_meta, bool check_structure) {
  KCACHE_RETURN_IF_ERROR(util::make_dirs(dir));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return util::errno_status(errno, "stat " + dir);

  static std::mutex reg_mu;
  static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<LmdbEnv>> registry;
  std::lock_guard lk(reg_mu);
  auto id = std::make_pair(st.st_dev, st.st_ino);
  if (auto it = registry.find(id); it != registry.end()) {
    // A handle inherited through fork() is never shared: this process
    // opens its own.
    if (auto sp = it->second.lock(); sp && !sp->inherited()) {
      if (sp->map_size_ < map_size)
        KCACHE_LOG(LogLevel::info, "lmdb store %s is already open in this process with a %s map; %s asked for",
                   dir.c_str(), util::format_size(sp->map_size_).c_str(), util::format_size(map_size).c_str());
      return sp;
    }
  }

  auto env = std::shared_ptr<LmdbEnv>(new LmdbEnv());
  env->fork_gen_ = util::fork_generation();
  env->map_size_ = map_size;
  env->dir_ = dir;
  int rc = mdb_env_create(&env->env_);
  if (rc) return mdb_status(rc, "env_create");
  mdb_env_set_maxdbs(env->env_, 8);
  mdb_env_set_maxreaders(env->env_, 1022);
  mdb_env_set_mapsize(env->env_, map_size);
  std::string data = dir + "/data.mdb";
  KCACHE_RETURN_IF_ERROR(check_metas_before_open(data));
  unsigned flags = MDB_NOTLS | MDB_NORDAHEAD;
  if (!sync_data) flags |= MDB_NOSYNC;
  else if (!sync_meta) flags |= MDB_NOMETASYNC;
  rc = mdb_env_open(env->env_, dir.c_str(), flags, 0600);
  if (rc) return mdb_status(rc, "open " + dir);
  set_cloexec_on_store_fds(env->env_, dir);
  int dead = 0;
  mdb_reader_check(env->env_, &dead);

  // A data file shorter than the pages LMDB believes in would fault on
  // access (SIGBUS through the map): treat it as a corrupt store.
  MDB_envinfo info;
  MDB_stat mst;
  mdb_env_info(env->env_, &info);
  mdb_env_stat(env->env_, &mst);
  struct stat fst;
  if (::stat(data.c_str(), &fst) == 0 &&
      static_cast<uint64_t>(fst.st_size) < (info.me_last_pgno + 1) * static_cast<uint64_t>(mst.ms_psize))
    return Status(Errc::corrupt, "lmdb data file " + data + " is truncated");
  if (check_structure) KCACHE_RETURN_IF_ERROR(check_tree(env->env_, data));

  MDB_txn* txn;
  rc = mdb_txn_begin(env->env_, nullptr, 0, &txn);
  if (rc) return mdb_status(rc, "begin");
  const char* names[] = {"entries", "meta", "lru", "stats", "leases"};
  MDB_dbi* dbis[] = {&env->entries, &env->meta, &env->lru, &env->stats, &env->leases};
  for (int i = 0; i < 5; ++i) {
    rc = mdb_dbi_open(txn, names[i], MDB_CREATE, dbis[i]);
    if (rc) {
      mdb_txn_abort(txn);
      return mdb_status(rc, std::string("open db ") + names[i]);
    }
  }
  rc = mdb_txn_commit(txn);
  if (rc) return mdb_status(rc, "commit");
  registry[id] = env;
  return env;
}

Expected<MDB_txn*> LmdbEnv::begin_read() {
  if (inherited()) return inherited_error();
  MDB_txn* t = nullptr;
  {
    std::lock_guard lk(mu_);
    if (!idle_.empty()) {
      t = idle_.back();
      idle_.pop_back();
    }
  }
  int rc;
  if (t) {
    rc = mdb_txn_renew(t);
    if (rc == 0) return t;
    mdb_txn_abort(t);
    if (rc == MDB_MAP_RESIZED) return resized_error();
  }
  rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &t);
  if (rc == MDB_READERS_FULL) {
    int dead = 0;
    mdb_reader_check(env_, &dead);
    rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &t);
  }
  if (rc == MDB_MAP_RESIZED) return resized_error();
  if (rc) return mdb_status(rc, "begin read");
  return t;
}

void LmdbEnv::end_read(MDB_txn* t) {
  // In a child of fork() the transaction's reader slot is the parent's:
  // resetting it would unpin the parent's snapshot. Leak the handle.
  if (inherited()) return;
  mdb_txn_reset(t);
  std::lock_guard lk(mu_);
  if (idle_.size() < 16) {
    idle_.push_back(t);
    return;
  }
  mdb_txn_abort(t);
}

Expected<MDB_txn*> LmdbEnv::begin_write() {
  if (inherited()) return inherited_error();
  MDB_txn* t = nullptr;
  int rc = mdb_txn_begin(env_, nullptr, 0, &t);
  if (rc == MDB_MAP_RESIZED) return resized_error();
  if (rc) return mdb_status(rc, "begin write");
  return t;
}

namespace {

// Bytes of a hit: they live in the map, pinned by the read transaction.
class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(std::shared_ptr<LmdbEnv> env, MDB_txn* txn, std::string_view bytes)
      : env_(std::move(env)), txn_(txn), bytes_(bytes) {
    env_->pinned.fetch_add(1, std::memory_order_relaxed);
  }
  ~PinnedBuffer() override {
    env_->pinned.fetch_sub(1, std::memory_order_relaxed);
    env_->end_read(txn_);
  }
  std::string_view bytes() const noexcept override { return bytes_; }
  bool pinned() const noexcept override { return true; }

 private:
  std::shared_ptr<LmdbEnv> env_;
  MDB_txn* txn_;
  std::string_view bytes_;
};

class LmdbTier final : public Tier {
 public:
  LmdbTier(std::shared_ptr<LmdbEnv> env, const DiskTierOptions& o) : env_(std::move(env)), opt_(o) {
    max_bytes_ = effective_max_bytes(o);
    max_entries_ = effective_max_entries(o);
    low_water_ = o.low_water > 0 && o.low_water < 1 ? o.low_water : 0.8;
    max_entry_ = o.max_entry_bytes ? o.max_entry_bytes : std::max<uint64_t>(max_bytes_ / 8, 1);
    batch_ = o.recency_batch ? o.recency_batch : 256;
    flusher_ = std::thread([this] { flusher_loop(); });
  }
  ~LmdbTier() override {
    if (env_->inherited()) {
      // A child of fork(): the flusher thread does not exist here, so its
      // handle must not be joined (that would wait forever), and the
      // condition variable it was waiting on must not be destroyed (glibc
      // waits for that waiter too). Both are leaked, and nothing is
      // flushed: the store belongs to the parent.
      new std::thread(std::move(flusher_));  // never joined, never freed
      (void)pend_cv_.release();
      return;
    }
    {
      std::lock_guard lk(pend_mu_);
      stop_ = true;
    }
    pend_cv_->notify_all();
    flusher_.join();
    (void)flush();
  }

  std::string_view name() const noexcept override { return "lmdb"; }
  TierKind kind() const noexcept override { return TierKind::disk; }

  // Off (the read-only wrapper): the tier makes no write of its own to the
  // store: a corrupt entry is reported and counted in this process only,
  // never removed, and recency and counters are never flushed.
  void set_repair(bool on) noexcept override { repair_.store(on, std::memory_order_relaxed); }

  // Counts a damaged store found (and moved aside) when opening.
  void note_corrupt() { count(c_corrupt); }

  Status flush() override {
    // Nothing to write in a child of fork() (it counts nothing there), nor
    // when repair is off (nothing is ever written then).
    if (env_->inherited() || !repair_.load(std::memory_order_relaxed)) return Status();
    std::unordered_map<Key, uint64_t> touched;
    uint64_t counts[c_count] = {};
    {
      std::lock_guard lk(pend_mu_);
      touched.swap(touched_);
      for (int i = 0; i < c_count; ++i) {
        counts[i] = pending_[i];
        pending_[i] = 0;
      }
    }
    if (touched.empty() && std::all_of(counts, counts + c_count, [](uint64_t v) { return v == 0; }))
      return Status();
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    int rc = 0;
    for (const auto& [k, ms] : touched) {
      rc = touch_locked(txn, k, ms);
      if (rc) break;
    }
    if (!rc) rc = add_counters(txn, counts);
    if (rc) {
      mdb_txn_abort(txn);
      return mdb_status(rc, "flush");
    }
    rc = mdb_txn_commit(txn);
    return rc ? mdb_status(rc, "commit flush") : Status();
  }

  // Recency records (meta/lru) hold wall-clock ms of a put or a hit.
  Expected<uint64_t> mark() override {
    if (env_->inherited()) return env_->inherited_error();
    return recency_mark();
  }

  Status list(const std::function<bool(const ListItem&)>& fn) override {
    if (env_->inherited()) return env_->inherited_error();
    KCACHE_TRY(MDB_txn * txn, env_->begin_read());
    MDB_cursor* cur;
    int rc = mdb_cursor_open(txn, env_->meta, &cur);
    if (rc) {
      env_->end_read(txn);
      return mdb_status(rc, "cursor");
    }
    MDB_val k, v;
    std::vector<ListItem> items;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      if (k.mv_size != 16 || v.mv_size != 16) continue;
      ListItem it;
      std::memcpy(it.key.bytes.data(), k.mv_data, 16);
      it.last_use_ms = util::get_u64(static_cast<const char*>(v.mv_data));
      it.size = util::get_u64(static_cast<const char*>(v.mv_data) + 8);
      items.push_back(it);
    }
    mdb_cursor_close(cur);
    env_->end_read(txn);
    if (rc != MDB_NOTFOUND) return mdb_status(rc, "list");
    for (const auto& it : items)
      if (!fn(it)) break;
    return Status();
  }

  Expected<VerifyReport> verify(bool fix) override {
    if (env_->inherited()) return env_->inherited_error();
    (void)flush();
    VerifyReport rep;
    uint64_t entries = 0, bytes = 0, other_format = 0;
    {
      KCACHE_TRY(MDB_txn * txn, env_->begin_read());
      MDB_cursor* cur;
      int rc = mdb_cursor_open(txn, env_->entries, &cur);
      if (rc) {
        env_->end_read(txn);
        return mdb_status(rc, "cursor");
      }
      MDB_val k, v;
      for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        ++rep.checked;
        Key key{};
        if (k.mv_size == 16) std::memcpy(key.bytes.data(), k.mv_data, 16);
        std::string_view enc(static_cast<const char*>(v.mv_data), v.mv_size);
        Status st = k.mv_size == 16 ? Entry::check(enc, &key) : Status(Errc::corrupt, "bad key length");
        if (st.is_ok()) {
          auto d = Entry::decode(make_heap_buffer(std::string(enc)), &key);
          if (!d) st = d.error();
        }
        if (st.code() == Errc::stale_format) {
          // Written by a build with another entry format, which may still
          // share the store (a rolling upgrade): unusable here, not damaged.
          ++other_format;
        } else if (!st.is_ok()) {
          rep.bad.emplace_back(key, st.message());
        } else {
          ++entries;
          bytes += v.mv_size;
        }
      }
      mdb_cursor_close(cur);
      env_->end_read(txn);
      if (rc != MDB_NOTFOUND) return mdb_status(rc, "verify walk");
    }
    if (other_format)
      KCACHE_LOG(LogLevel::info, "lmdb verify %s: %llu entries of another format version left in place",
                 env_->dir().c_str(), static_cast<unsigned long long>(other_format));
    if (fix) {
      for (const auto& [k, why] : rep.bad)
        if (remove_entry(k, /*count_corrupt=*/true).is_ok()) ++rep.removed;
      KCACHE_RETURN_IF_ERROR(repair_totals());
    }
    return rep;
  }

  Expected<uint64_t> trim(uint64_t max_bytes) override {
    if (env_->inherited()) return env_->inherited_error();
    (void)flush();
    return evict(max_bytes, max_entries_);
  }

  Status clear() override {
    if (env_->inherited()) return env_->inherited_error();
    {
      std::lock_guard lk(pend_mu_);
      touched_.clear();
    }
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    int rc = 0;
    for (MDB_dbi d : {env_->entries, env_->meta, env_->lru})
      if (!rc) rc = mdb_drop(txn, d, 0);
    if (!rc) {
      uint64_t zero = 0;
      for (int c : {c_entries, c_bytes})
        if (!rc) rc = put_counter(txn, c, zero);
    }
    if (rc) {
      mdb_txn_abort(txn);
      return mdb_status(rc, "clear");
    }
    rc = mdb_txn_commit(txn);
    return rc ? mdb_status(rc, "commit clear") : Status();
  }

 protected:
  Expected<std::optional<Entry>> do_get(const Key& key, MissCount miss) override {
    // In a child of fork() this returns before any lock or counter is
    // touched: a thread of the parent may have held them at the fork.
    if (env_->inherited()) return env_->inherited_error();
    KCACHE_TRY(MDB_txn * txn, env_->begin_read());
    MDB_val k = val(key), v;
    int rc = mdb_get(txn, env_->entries, &k, &v);
    if (rc == MDB_NOTFOUND) {
      env_->end_read(txn);
      if (miss == MissCount::counted) count(c_misses);
      return std::optional<Entry>();
    }
    if (rc) {
      env_->end_read(txn);
      count(c_errors);
      return mdb_status(rc, "get");
    }
    std::string_view bytes(static_cast<const char*>(v.mv_data), v.mv_size);
    std::shared_ptr<const Buffer> buf;
    if (env_->pinned.load(std::memory_order_relaxed) < kMaxPinned) {
      buf = std::make_shared<PinnedBuffer>(env_, txn, bytes);
    } else {
      // Each pinned hit holds a reader slot; a caller that keeps many
      // entries alive gets copies instead of exhausting the reader table.
      auto copy = std::make_shared<AlignedBuffer>(bytes.size());
      std::memcpy(copy->data(), bytes.data(), bytes.size());
      env_->end_read(txn);
      buf = std::move(copy);
    }
    auto e = Entry::decode(std::move(buf), &key);
    if (!e && e.error().code() == Errc::stale_format) {
      // Another build's entry: a miss, left for the build that reads it.
      if (miss == MissCount::counted) count(c_misses);
      return std::optional<Entry>();
    }
    if (!e) {
      // Counted in this process; stored (with the removal) only when
      // repair is on. A read-only store is never written.
      count(c_corrupt);
      if (repair_.load(std::memory_order_relaxed)) (void)remove_entry(key, false);
      return Status(Errc::corrupt, "lmdb entry " + key.hex() + ": " + e.error().message());
    }
    note_hit(key);
    return std::optional<Entry>(std::move(e).value());
  }

  Status do_put(const Entry& entry) override {
    if (env_->inherited()) return env_->inherited_error();
    std::string_view enc = entry.encoded();
    if (enc.size() > max_entry_) {
      count(c_errors);
      return Status(Errc::too_large, "entry of " + util::format_size(enc.size()) + " exceeds the largest entry stored (" +
                                         util::format_size(max_entry_) + ")");
    }
    Status st = put_once(entry.key(), enc);
    if (st.code() == Errc::no_space) {
      // The map is full: make room and try once more.
      (void)evict(static_cast<uint64_t>(max_bytes_ * low_water_ * 0.5), max_entries_);
      st = put_once(entry.key(), enc);
    }
    if (st.code() == Errc::io_error && disk_nearly_full(enc.size())) {
      // LMDB reports a short write of a page (a full file system) as EIO;
      // say what it is, so the caller turns writes off instead of retrying.
      st = Status(Errc::no_space, st.message() + " (the file system is full)");
    }
    if (!st.is_ok()) {
      count(c_errors);
      return st;
    }
    maybe_evict();
    return Status();
  }

  Status do_remove(const Key& key) override {
    if (env_->inherited()) return env_->inherited_error();
    return remove_entry(key, false);
  }

  TierStats do_stats() override {
    TierStats s;
    if (env_->inherited()) return s;  // the store's counters are the parent's
    uint64_t v[c_count] = {};
    auto txn = env_->begin_read();
    if (txn) {
      for (int i = 0; i < c_count; ++i) v[i] = get_counter(*txn, i);
      env_->end_read(*txn);
    }
    {
      std::lock_guard lk(pend_mu_);
      for (int i = 0; i < c_count; ++i) v[i] += pending_[i];
    }
    s.hits = v[c_hits];
    s.misses = v[c_misses];
    s.puts = v[c_puts];
    s.evictions = v[c_evictions];
    s.corrupt = v[c_corrupt];
    s.errors = v[c_errors];
    s.entries = v[c_entries];
    s.bytes = v[c_bytes];
    return s;
  }

 private:
  // Free space (for unprivileged users) below what one commit of `need`
  // bytes may write, with room for the B-tree pages that change with it.
  bool disk_nearly_full(uint64_t need) {
    struct statvfs v;
    if (::statvfs(env_->dir().c_str(), &v) != 0) return false;
    uint64_t free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    return free_bytes < need + (uint64_t(1) << 20) || v.f_favail == 0;
  }

  void count(int c, uint64_t n = 1) {
    std::lock_guard lk(pend_mu_);
    pending_[c] += n;
  }

  void note_hit(const Key& key) {
    bool wake;
    bool writes = repair_.load(std::memory_order_relaxed);
    {
      std::lock_guard lk(pend_mu_);
      if (writes) touched_[key] = util::now_unix_ms();
      ++pending_[c_hits];
      wake = writes && (touched_.size() >= batch_ || pending_[c_hits] + pending_[c_misses] >= 16 * batch_);
    }
    if (wake) pend_cv_->notify_one();
  }

  void flusher_loop() {
    std::unique_lock lk(pend_mu_);
    while (!stop_) {
      pend_cv_->wait_for(lk, std::chrono::seconds(5));
      if (stop_) break;
      bool due = touched_.size() >= batch_ || pending_[c_hits] + pending_[c_misses] >= 16 * batch_;
      if (!due) continue;
      lk.unlock();
      Status st = flush();
      if (!st.is_ok()) KCACHE_LOG(LogLevel::debug, "lmdb recency flush: %s", st.to_string().c_str());
      lk.lock();
    }
  }

  static uint64_t get_counter(MDB_txn* txn, MDB_dbi dbi, int c) {
    MDB_val k = val(kCounterNames[c], std::strlen(kCounterNames[c])), v;
    if (mdb_get(txn, dbi, &k, &v) != 0 || v.mv_size != 8) return 0;
    return util::get_u64(static_cast<const char*>(v.mv_data));
  }
  uint64_t get_counter(MDB_txn* txn, int c) { return get_counter(txn, env_->stats, c); }
  int put_counter(MDB_txn* txn, int c, uint64_t value) {
    std::string b;
    util::put_u64(b, value);
    MDB_val k = val(kCounterNames[c], std::strlen(kCounterNames[c])), v = val(b.data(), 8);
    return mdb_put(txn, env_->stats, &k, &v, 0);
  }
  int add_counter(MDB_txn* txn, int c, int64_t delta) {
    if (delta == 0) return 0;
    uint64_t cur = get_counter(txn, c);
    uint64_t next = delta < 0 && static_cast<uint64_t>(-delta) > cur ? 0 : cur + delta;
    return put_counter(txn, c, next);
  }
  int add_counters(MDB_txn* txn, const uint64_t* counts) {
    for (int i = 0; i < c_count; ++i) {
      int rc = add_counter(txn, i, static_cast<int64_t>(counts[i]));
      if (rc) return rc;
    }
    return 0;
  }

  // Moves k's recency record to `ms`. REQUIRES: write txn.
  int touch_locked(MDB_txn* txn, const Key& key, uint64_t ms) {
    MDB_val k = val(key), v;
    int rc = mdb_get(txn, env_->meta, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;  // evicted meanwhile
    if (rc) return rc;
    if (v.mv_size != 16) return 0;
    uint64_t old_ms = util::get_u64(static_cast<const char*>(v.mv_data));
    uint64_t size = util::get_u64(static_cast<const char*>(v.mv_data) + 8);
    if (old_ms >= ms) return 0;
    char lk[24];
    lru_key(lk, old_ms, key);
    MDB_val lkv = val(lk, 24);
    rc = mdb_del(txn, env_->lru, &lkv, nullptr);
    if (rc && rc != MDB_NOTFOUND) return rc;
    return set_meta(txn, key, ms, size);
  }

  int set_meta(MDB_txn* txn, const Key& key, uint64_t ms, uint64_t size) {
    std::string m;
    util::put_u64(m, ms);
    util::put_u64(m, size);
    MDB_val k = val(key), mv = val(m.data(), 16);
    int rc = mdb_put(txn, env_->meta, &k, &mv, 0);
    if (rc) return rc;
    char lk[24];
    lru_key(lk, ms, key);
    MDB_val lkv = val(lk, 24), empty = val("", 0);
    return mdb_put(txn, env_->lru, &lkv, &empty, 0);
  }

  // Deletes key's entry, meta and lru records and updates totals.
  // REQUIRES: write txn. Sets *size to the removed size (0 if absent).
  int delete_locked(MDB_txn* txn, const Key& key, uint64_t* removed_size) {
    *removed_size = 0;
    MDB_val k = val(key), v;
    int rc = mdb_get(txn, env_->meta, &k, &v);
    if (rc == 0 && v.mv_size == 16) {
      uint64_t ms = util::get_u64(static_cast<const char*>(v.mv_data));
      char lk[24];
      lru_key(lk, ms, key);
      MDB_val lkv = val(lk, 24);
      rc = mdb_del(txn, env_->lru, &lkv, nullptr);
      if (rc && rc != MDB_NOTFOUND) return rc;
    }
    rc = mdb_del(txn, env_->meta, &k, nullptr);
    if (rc && rc != MDB_NOTFOUND) return rc;
    rc = mdb_get(txn, env_->entries, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    *removed_size = v.mv_size;
    rc = mdb_del(txn, env_->entries, &k, nullptr);
    if (rc) return rc;
    rc = add_counter(txn, c_entries, -1);
    if (!rc) rc = add_counter(txn, c_bytes, -static_cast<int64_t>(*removed_size));
    return rc;
  }

  Status remove_entry(const Key& key, bool count_corrupt) {
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    uint64_t size;
    int rc = delete_locked(txn, key, &size);
    if (!rc && count_corrupt) rc = add_counter(txn, c_corrupt, 1);
    if (rc) {
      mdb_txn_abort(txn);
      return mdb_status(rc, "remove");
    }
    rc = mdb_txn_commit(txn);
    return rc ? mdb_status(rc, "commit remove") : Status();
  }

  Status put_once(const Key& key, std::string_view enc) {
    // Pending recency and counters ride along with the put's transaction.
    std::unordered_map<Key, uint64_t> touched;
    uint64_t counts[c_count] = {};
    {
      std::lock_guard lk(pend_mu_);
      touched.swap(touched_);
      for (int i = 0; i < c_count; ++i) {
        counts[i] = pending_[i];
        pending_[i] = 0;
      }
    }
    auto restore = [&] {
      std::lock_guard lk(pend_mu_);
      for (auto& [k, ms] : touched) touched_.emplace(k, ms);
      for (int i = 0; i < c_count; ++i) pending_[i] += counts[i];
    };
    auto txn_or = env_->begin_write();
    if (!txn_or) {
      restore();
      return txn_or.error();
    }
    MDB_txn* txn = *txn_or;
    uint64_t old_size = 0;
    int rc = delete_locked(txn, key, &old_size);
    MDB_val k = val(key), v;
    v.mv_size = enc.size();
    v.mv_data = nullptr;
    if (!rc) rc = mdb_put(txn, env_->entries, &k, &v, MDB_RESERVE);
    if (!rc) {
      std::memcpy(v.mv_data, enc.data(), enc.size());
      rc = set_meta(txn, key, util::now_unix_ms(), enc.size());
    }
    if (!rc) rc = add_counter(txn, c_entries, 1);
    if (!rc) rc = add_counter(txn, c_bytes, static_cast<int64_t>(enc.size()));
    if (!rc) rc = add_counter(txn, c_puts, 1);
    for (const auto& [tk, ms] : touched)
      if (!rc) rc = touch_locked(txn, tk, ms);
    if (!rc) rc = add_counters(txn, counts);
    if (rc) {
      mdb_txn_abort(txn);
      restore();
      return mdb_status(rc, "put");
    }
    rc = mdb_txn_commit(txn);
    if (rc) {
      restore();
      return mdb_status(rc, "commit put");
    }
    return Status();
  }

  void maybe_evict() {
    auto s = do_stats();
    if (s.bytes <= max_bytes_ && s.entries <= max_entries_) return;
    auto r = evict(static_cast<uint64_t>(max_bytes_ * low_water_), static_cast<uint64_t>(max_entries_ * low_water_));
    if (!r) KCACHE_LOG(LogLevel::warn, "lmdb eviction failed: %s", r.error().to_string().c_str());
  }

  // Removes oldest entries until bytes <= target_bytes and entries <=
  // target_entries, in transactions of at most 512 deletions so that other
  // writers are never blocked for long. The write lock makes each batch
  // exclusive, and each batch re-reads the totals, so concurrent evictors
  // never remove more than needed.
  Expected<uint64_t> evict(uint64_t target_bytes, uint64_t target_entries) {
    uint64_t total = 0;
    for (;;) {
      KCACHE_TRY(MDB_txn * txn, env_->begin_write());
      uint64_t bytes = get_counter(txn, c_bytes), entries = get_counter(txn, c_entries);
      if (bytes <= target_bytes && entries <= target_entries) {
        mdb_txn_abort(txn);
        return total;
      }
      MDB_cursor* cur;
      int rc = mdb_cursor_open(txn, env_->lru, &cur);
      std::vector<Key> victims;
      MDB_val k, v;
      uint64_t b = bytes, e = entries;
      for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && victims.size() < 512 &&
                                                                  (b > target_bytes || e > target_entries);
           rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        g_records_visited.fetch_add(1, std::memory_order_relaxed);
        if (k.mv_size != 24) continue;
        Key key;
        std::memcpy(key.bytes.data(), static_cast<const char*>(k.mv_data) + 8, 16);
        victims.push_back(key);
        MDB_val mk = val(key), mv;
        if (mdb_get(txn, env_->meta, &mk, &mv) == 0 && mv.mv_size == 16)
          b -= std::min(b, util::get_u64(static_cast<const char*>(mv.mv_data) + 8));
        if (e) --e;
      }
      mdb_cursor_close(cur);
      if (victims.empty()) {
        // Totals say over the limit but nothing is indexed: repair them.
        mdb_txn_abort(txn);
        KCACHE_RETURN_IF_ERROR(repair_totals());
        return total;
      }
      rc = 0;
      for (const auto& key : victims) {
        uint64_t sz;
        rc = delete_locked(txn, key, &sz);
        if (rc) break;
      }
      if (!rc) rc = add_counter(txn, c_evictions, static_cast<int64_t>(victims.size()));
      if (rc) {
        mdb_txn_abort(txn);
        return mdb_status(rc, "evict");
      }
      rc = mdb_txn_commit(txn);
      if (rc) return mdb_status(rc, "commit evict");
      total += victims.size();
    }
  }

  // Recomputes entries/bytes from the entries database, and rebuilds the
  // meta/lru records of entries that lack them.
  Status repair_totals() {
    KCACHE_TRY(MDB_txn * txn, env_->begin_write());
    MDB_cursor* cur;
    int rc = mdb_cursor_open(txn, env_->entries, &cur);
    uint64_t n = 0, bytes = 0;
    std::vector<std::pair<Key, uint64_t>> missing;
    MDB_val k, v;
    for (rc = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      g_records_visited.fetch_add(1, std::memory_order_relaxed);
      ++n;
      bytes += v.mv_size;
      if (k.mv_size != 16) continue;
      MDB_val mv;
      if (mdb_get(txn, env_->meta, &k, &mv) != 0) {
        Key key;
        std::memcpy(key.bytes.data(), k.mv_data, 16);
        missing.emplace_back(key, v.mv_size);
      }
    }
    mdb_cursor_close(cur);
    rc = rc == MDB_NOTFOUND ? 0 : rc;
    uint64_t now = util::now_unix_ms();
    for (const auto& [key, size] : missing)
      if (!rc) rc = set_meta(txn, key, now, size);
    if (!rc) rc = put_counter(txn, c_entries, n);
    if (!rc) rc = put_counter(txn, c_bytes, bytes);
    if (rc) {
      mdb_txn_abort(txn);
      return mdb_status(rc, "repair");
    }
    rc = mdb_txn_commit(txn);
    return rc ? mdb_status(rc, "commit repair") : Status();
  }

  std::shared_ptr<LmdbEnv> env_;
  DiskTierOptions opt_;
  uint64_t max_bytes_, max_entries_, max_entry_;
  double low_water_;
  unsigned batch_;

  std::atomic<bool> repair_{true};

  std::mutex pend_mu_;
  // On the heap so that a child of fork() can leak it (see ~LmdbTier).
  std::unique_ptr<std::condition_variable> pend_cv_ = std::make_unique<std::condition_variable>();
  std::unordered_map<Key, uint64_t> touched_;  // GUARDED_BY(pend_mu_): key -> last hit ms
  uint64_t pending_[c_count] = {};              // GUARDED_BY(pend_mu_): counter deltas not yet stored
  bool stop_ = false;                           // GUARDED_BY(pend_mu_)
  std::thread flusher_;
};

}  // namespace

Expected<std::shared_ptr<Tier>> open_lmdb_tier(const std::string& dir, const DiskTierOptions& options) {
  // The map holds the entries plus B-tree overhead and pages kept for old
  // readers, and is the same in every process with the same or a smaller
  // limit, so none of them ever needs to re-map (lmdb_env.h).
  uint64_t map_size = lmdb_map_size(effective_max_bytes(options));
  bool sync_data = options.durability != Durability::none;
  bool sync_meta = options.durability == Durability::full;
  auto env = LmdbEnv::open(dir, map_size, sync_data, sync_meta, options.check_on_open);
  bool quarantined = false;
  if (!env && env.error().code() == Errc::corrupt) {
    // A store LMDB cannot use safely is moved aside, never deleted, and a
    // fresh one takes its place: the cache keeps working. Processes that
    // find it damaged at once take turns under a lock beside the folder, and
    // each looks again first, so a fresh store another one just made is
    // used, not moved aside in its turn.
    std::string lock_path = dir + ".quarantine-lock";
    int lfd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd >= 0) {
      while (::flock(lfd, LOCK_EX) != 0 && errno == EINTR) {
      }
      env = LmdbEnv::open(dir, map_size, sync_data, sync_meta, options.check_on_open);
    }
    if (!env && env.error().code() == Errc::corrupt) {
      std::string aside = dir + ".corrupt-" + std::to_string(util::now_unix_ms()) + "-" + std::to_string(::getpid());
      KCACHE_LOG(LogLevel::warn, "%s; moved aside to %s", env.error().to_string().c_str(), aside.c_str());
      if (::rename(dir.c_str(), aside.c_str()) == 0) {
        env = LmdbEnv::open(dir, map_size, sync_data, sync_meta, options.check_on_open);
        quarantined = env.has_value();
      }
    }
    if (lfd >= 0) ::close(lfd);
  }
  if (!env) return env.error();
  auto tier = std::make_shared<LmdbTier>(std::move(env).value(), options);
  if (quarantined) tier->note_corrupt();  // the store's own counters show it
  return std::shared_ptr<Tier>(std::move(tier));
}

}  // namespace kcache

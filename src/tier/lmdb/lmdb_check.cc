// Structural check of an LMDB data file, run once per process when a store
// is opened, before any transaction walks its B-trees.
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
#include "tier/lmdb/lmdb_check.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tier/lmdb/lmdb_env.h"
#include "util/util.h"

namespace kcache {

namespace {

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

class TreeChecker {
 public:
  // `npages`: the pages the meta page counts; `present`: those the file
  // holds (at most npages). LMDB does not write the pages a transaction
  // allocated and freed again before it committed (its loose pages), so
  // the file may end before the last pages the meta counts: those can only
  // be free. Every page a tree or a value uses must be in the file.
  TreeChecker(const unsigned char* map, uint32_t psize, uint64_t npages, uint64_t present)
      : map_(map), psize_(psize), npages_(npages), present_(present), used_(npages, 0) {}

  // Checks the database rooted at `root` (`depth` levels deep, from its
  // record). Named-database records are collected when allow_subdb; free-list
  // records are read when free_list. Values in overflow runs are allowed
  // when allow_big (the free list and `entries`: every other database holds
  // values of a few dozen bytes, and a run LMDB would free when one of them
  // is replaced must not be made up by a damaged node flag).
  bool tree(uint64_t root, uint16_t depth, bool allow_subdb, bool free_list, bool allow_big) {
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
          if (!allow_big) return fail("overflow value in a database of small values");
          if (!overflow(ov, dsize)) return false;
          // LMDB frees a free-list record's run (reading its own header)
          // when it uses up the record: the header must be as written.
          if (free_list && !run_header_ok(ov, dsize)) return fail("free list overflow page damaged");
          if (free_list && !free_ids(map_ + ov * psize_ + kPageHdr, dsize)) return false;
          continue;
        }
        if (off + kNodeHdr + ksize + dsize > psize_) return fail("data size damaged");
        if (nflags & kFSubData) {
          if (!allow_subdb || dsize != kDbRecord) return fail("named database record damaged");
          subdbs_.push_back(
              {rd64(data + 40), rd16(data + 6), std::string(reinterpret_cast<const char*>(node + kNodeHdr), ksize)});
        } else if (free_list && !free_ids(data, dsize)) {
          return false;
        }
      }
      if (n == 0) return fail("empty page in a tree");
    }
    return true;
  }

  // Named databases found while checking the main database.
  struct SubDb {
    uint64_t root;
    uint16_t depth;
    std::string name;
  };
  const std::vector<SubDb>& subdbs() const { return subdbs_; }

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
    if (pg < 2 || pg >= present_) return fail("page number out of range"), nullptr;
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
    if (pg < 2 || pages == 0 || pg >= present_ || pages > present_ - pg) return fail("overflow run damaged");
    for (uint64_t i = 0; i < pages; ++i) {
      if (used_[pg + i]) return fail("overflow page reached twice");
      used_[pg + i] = 1;
    }
    return true;
  }

  // The run's first page says what LMDB wrote: its own number, overflow
  // type, and the page count of `dsize` bytes. REQUIRES: overflow(pg, dsize).
  bool run_header_ok(uint64_t pg, uint64_t dsize) const {
    const unsigned char* p = map_ + pg * psize_;
    return rd64(p) == pg && rd16(p + 10) == kPOverflow && rd32(p + 12) == (dsize + kPageHdr + psize_ - 1) / psize_;
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
  uint64_t present_;
  std::vector<uint8_t> used_;
  std::vector<uint64_t> free_;
  std::vector<SubDb> subdbs_;
  std::string why_;
};
}  // namespace

// Before LMDB maps the file: both metas readable and sane, and the pages the
// newer one claims are present (LMDB would otherwise map past the end of
// the file, or size its map from a corrupt field).
Status check_metas_before_open(const std::string& data_path) {
  int fd = util::open_above_std(data_path.c_str(), O_RDONLY | O_CLOEXEC);
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
      // The file may end before the last pages the meta counts (pages LMDB
      // left unwritten: TreeChecker); whether every page in use is there is
      // check_tree's to say, and a lookup that meets a missing one faults
      // under a guard (LmdbEnv::get_guarded).
      const MetaInfo& m = m0.txnid >= m1.txnid ? m0 : m1;
      if (m.last_pg < 1 || m.last_pg > (uint64_t(1) << 40) || static_cast<uint64_t>(st.st_size) < 2ull * ps)
        res = Status(Errc::corrupt, "lmdb data file " + data_path + " is truncated or its meta page is damaged");
    }
  }
  ::close(fd);
  return res;
}

// After mdb_env_open, before the first transaction that reads the tree.
// Reads through LMDB's map or a private read-only map of the file, bounded
// by the file's size, while a read transaction keeps the checked snapshot's
// pages from being reused by writers.
Status check_tree(MDB_env* env, const std::string& data_path, const unsigned char* lmdb_map, uint64_t lmdb_map_len) {
  MDB_txn* txn;
  int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  if (rc) return mdb_status(rc, "begin check");
  uint64_t txnid = mdb_txn_id(txn);
  MDB_stat mst;
  mdb_env_stat(env, &mst);
  uint32_t ps = mst.ms_psize;
  Status res;
  int fd = util::open_above_std(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat fst;
  if (fd < 0 || ::fstat(fd, &fst) != 0) {
    res = util::errno_status(errno, "open " + data_path);
    if (fd >= 0) ::close(fd);
    mdb_txn_abort(txn);
    return res;
  }
  uint64_t fsize = static_cast<uint64_t>(fst.st_size);
  const bool own = !lmdb_map || fsize > lmdb_map_len;
  void* mp = fsize < 2ull * ps ? MAP_FAILED
             : own             ? ::mmap(nullptr, fsize, PROT_READ, MAP_SHARED, fd, 0)
                               : const_cast<unsigned char*>(lmdb_map);
  ::close(fd);
  // LMDB advises its map MADV_RANDOM (the store is opened MDB_NORDAHEAD):
  // on a cold page cache the walk would then fault in one page at a time.
  // The handle is not shared yet, so the map reads ahead for the check and
  // is advised as LMDB left it afterwards.
  if (!own && mp != MAP_FAILED) (void)::madvise(mp, lmdb_map_len, MADV_NORMAL);
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
    if (!m) {
      res = Status(Errc::corrupt, "lmdb meta page of " + data_path + " is damaged");
    } else {
      TreeChecker c(map, ps, npages, std::min<uint64_t>(npages, fsize / ps));
      bool ok = c.tree(m->free_root, m->free_depth, false, true, true) &&
                c.tree(m->main_root, m->main_depth, true, false, false);
      for (size_t i = 0; ok && i < c.subdbs().size(); ++i) {
        const auto& db = c.subdbs()[i];
        ok = c.tree(db.root, db.depth, false, false, db.name == "entries");
      }
      ok = ok && c.free_pages_unused();
      if (!ok) res = Status(Errc::corrupt, "lmdb store " + data_path + " is damaged: " + c.why());
    }
  }
  if (own && mp != MAP_FAILED) ::munmap(mp, fsize);
  if (!own && mp != MAP_FAILED) (void)::madvise(mp, lmdb_map_len, MADV_RANDOM);
  mdb_txn_abort(txn);
  return res;
}

}  // namespace kcache

// kcache/stage.h — stage keys: a two-stage pipeline (source -> IR -> object)
// cached with early cutoff.
//
// A JIT that lowers source to IR and IR to an object has two keys:
//
//   * the front-end key: everything the front end reads (the source text,
//     the front end's version and flags) AND everything the backend reads
//     besides the IR (target, optimisation level, backend version). It is
//     cheap: the client has these bytes at hand.
//   * the backend (final) key: the IR's digest and the backend's inputs.
//     It costs a front-end run (and hashing the IR) to know.
//
// The final artifact is stored under the backend key, as any entry. Beside
// it, a small *link* entry under a key derived from the front-end key
// records the IR digest and the backend key. Then:
//
//   * a lookup by front-end key (link -> final entry) finds the artifact
//     without running the front end or hashing the IR;
//   * a changed source whose front end produces the IR it produced before
//     (same IR digest, same backend key) runs the front end only: the
//     backend's entry is found (early cutoff);
//   * a changed IR runs both stages.
//
// A link is only a pointer: the final entry is found by its own key and
// verified as every entry is. A link that is corrupt, of another format,
// made for another front-end key, or that points to an entry no longer
// stored is a miss (both stages run and the link is replaced), never a
// wrong artifact. Because a front-end key maps straight to an artifact, it
// must cover the backend's inputs too; a front-end key that leaves out the
// target would hand one target's object to another.
//
// The front end is not single-flighted: two threads that miss one front-end
// key at once both run it; the backend runs once per backend key
// (Cache::get_or_compile).
//
// Links are stored as entries through Cache::put, so they reach the disk
// through the Cache's committer; until then Cache::get serves them from the
// committer's queue.
//
// Link entry format (artifact "stage-link", 52 bytes, little-endian):
//   "KCSL" | u32 version (1) | front-end key (16) | IR digest (16) | final key (16)
//
// Thread-safety: the functions may be called concurrently, as the Cache's.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kcache/cache.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache {

// What the front end produced, as far as the cache needs to know.
struct StageOutput {
  // Digest of the IR (e.g. hash_bytes of its bitcode).
  Digest ir;
  // The backend's key, built on `ir` (add_digest) and the backend's inputs.
  KeyInfo backend;
};

// A link read back: front-end key -> IR digest -> final key.
struct StageLink {
  Key front;
  Digest ir;
  Key backend;
};

// The key the link of `front` is stored under (namespace "kcache-stage-link/1").
Key stage_link_key(const Key& front);

// The link stored for `front`, or nullopt when there is none or it does not
// parse (wrong size, magic, version, or made for another key).
std::optional<StageLink> find_stage_link(Cache& cache, const Key& front);

// The final entry through the link of `front`, or nullopt (no link, a bad
// link, or its entry is no longer stored). `link`, when given, receives the
// link on a hit.
std::optional<Entry> get_staged(Cache& cache, const Key& front, Source* source = nullptr, StageLink* link = nullptr);

// Stores the link front -> (ir, backend). False when no tier took it (a
// fault, counted and logged by the Cache, or a disabled cache).
bool put_stage_link(Cache& cache, const Key& front, const Digest& ir, const Key& backend);

using FrontendFn = std::function<Expected<StageOutput>()>;

struct StagedResult {
  Entry entry;
  bool frontend_ran = false;
  bool backend_ran = false;
  // Where the final entry came from (Source::compiled when the backend ran here).
  Source source = Source::compiled;
  StageLink link;
};

// The final artifact for `front`: through its link; else runs `frontend`,
// then Cache::get_or_compile(backend key, backend) and stores the link.
// `backend` runs on the IR the front end just produced (the caller keeps it,
// e.g. in a variable both lambdas capture). Errors: the front end's or the
// backend's own; cache faults never.
Expected<StagedResult> get_or_compile_staged(Cache& cache, const KeyInfo& front, const FrontendFn& frontend,
                                             const CompileFn& backend);

}  // namespace kcache

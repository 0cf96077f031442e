// Stage keys: links from a front-end key to the IR digest and the final key,
// and the two-stage get_or_compile with early cutoff (see kcache/stage.h).
#include "kcache/stage.h"

#include <cstring>

#include "util/util.h"

namespace kcache {

namespace {

constexpr char kLinkArtifact[] = "stage-link";
constexpr char kLinkMagic[4] = {'K', 'C', 'S', 'L'};
constexpr uint32_t kLinkVersion = 1;
constexpr size_t kLinkSize = 4 + 4 + 16 * 3;

std::string encode_link(const Key& front, const Digest& ir, const Key& backend) {
  std::string out(kLinkMagic, sizeof kLinkMagic);
  util::put_u32(out, kLinkVersion);
  for (const Digest* d : {&front, &ir, &backend})
    out.append(reinterpret_cast<const char*>(d->bytes.data()), d->bytes.size());
  return out;
}

std::optional<StageLink> decode_link(const Entry& e, const Key& front) {
  auto a = e.artifact(kLinkArtifact);
  if (!a || a->size() != kLinkSize || std::memcmp(a->data(), kLinkMagic, 4) != 0 ||
      util::get_u32(a->data() + 4) != kLinkVersion)
    return std::nullopt;
  StageLink l;
  const char* p = a->data() + 8;
  for (Digest* d : {&l.front, &l.ir, &l.backend}) {
    std::memcpy(d->bytes.data(), p, 16);
    p += 16;
  }
  if (l.front != front) return std::nullopt;
  return l;
}

// A key of its own namespace: a link can never be mistaken for an artifact
// of the front-end key's namespace, nor the other way round.
KeyInfo link_key_info(const Key& front) {
  // Cannot fail: one component with a fixed, non-empty name.
  return *KeyBuilder("kcache-stage-link/1").add_digest("front", front).finish();
}

}  // namespace

Key stage_link_key(const Key& front) { return link_key_info(front).key; }

std::optional<StageLink> find_stage_link(Cache& cache, const Key& front) {
  auto e = cache.get(stage_link_key(front));
  if (!e) return std::nullopt;
  auto l = decode_link(*e, front);
  if (!l)
    KCACHE_LOG(LogLevel::warn, "stage: link entry %s for %s does not parse (ignored)", e->key().hex().c_str(),
               front.hex().c_str());
  return l;
}

std::optional<Entry> get_staged(Cache& cache, const Key& front, Source* source, StageLink* link) {
  auto l = find_stage_link(cache, front);
  if (!l) return std::nullopt;
  auto e = cache.get(l->backend, source);
  if (!e) {
    KCACHE_LOG(LogLevel::info, "stage: link %s points to %s, which is not stored", front.hex().c_str(),
               l->backend.hex().c_str());
    return std::nullopt;
  }
  if (link) *link = *l;
  return e;
}

bool put_stage_link(Cache& cache, const Key& front, const Digest& ir, const Key& backend) {
  KeyInfo k = link_key_info(front);
  auto e = EntryBuilder(k.key).add(kLinkArtifact, encode_link(front, ir, backend)).manifest(k.manifest).build();
  return e && cache.put(*e);
}

Expected<StagedResult> get_or_compile_staged(Cache& cache, const KeyInfo& front, const FrontendFn& frontend,
                                             const CompileFn& backend) {
  StagedResult r;
  if (auto e = get_staged(cache, front.key, &r.source, &r.link)) {
    r.entry = std::move(*e);
    return r;
  }
  r.frontend_ran = true;
  auto out = frontend();
  if (!out) return out.error();
  bool ran = false;
  CompileFn counted = [&]() {
    ran = true;
    return backend();
  };
  auto e = cache.get_or_compile(out->backend, counted, &r.source);
  if (!e) return e.error();
  r.backend_ran = ran;
  r.entry = std::move(*e);
  r.link = StageLink{front.key, out->ir, out->backend.key};
  put_stage_link(cache, front.key, out->ir, out->backend.key);
  return r;
}

}  // namespace kcache

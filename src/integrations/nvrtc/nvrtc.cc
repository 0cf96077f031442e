// Cached NVRTC compiles. A compile builds the program's inputs key (library
// identity, canonical options, headers, source, name expressions, outputs),
// checks the manifests stored under it (what earlier compiles saw NVRTC
// read, manifest.h) and looks up the entry key of the one that holds. With
// none, NVRTC runs once across threads and processes (a Flight on the
// inputs key and the stored list) with the recorder on (observe.h), and the
// entry and its manifest are stored, unless the compile's inputs moved
// while it ran. A batch (compile_all) looks every program up first, then
// compiles on a pool what no process holds and waits for the rest last. A
// hit is checked (PTX NUL-terminated, the lowered names decode and cover
// every requested expression) before it is handed out; an entry that fails
// the check is recompiled and overwritten.
//
// One concept, kcache::nvrtc::Compiler: the file is its Impl (the path from
// a program to its inputs key, the manifests under it, the entry and the
// flight) and the few helpers of its keys (options, outputs, lowered names)
// above it. What it uses but is not it lives apart: the recorder
// (observe.cc) and the manifests (manifest.cc and the files beside it).
#include "kcache/nvrtc.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <deque>
#include <list>
#include <mutex>
#include <set>
#include <unordered_map>

#include "cache/batch_pool.h"
#include "integrations/nvrtc/flight.h"
#include "integrations/nvrtc/manifest.h"
#include "integrations/nvrtc/observe.h"
#include "util/util.h"

namespace kcache::nvrtc {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The architecture named by the -arch option at options[*i] ("-arch=X",
// "-archX", or "-arch" "X" as two options, which advances *i), or empty.
std::string_view arch_value(const std::vector<std::string>& options, size_t* i) {
  std::string_view o = options[*i];
  for (std::string_view p : {"--gpu-architecture", "-arch"}) {
    if (o == p) return *i + 1 < options.size() ? std::string_view(options[++*i]) : std::string_view();
    if (starts_with(o, p)) {
      std::string_view v = o.substr(p.size());
      if (!v.empty() && v.front() == '=') v.remove_prefix(1);
      return v;
    }
  }
  return {};
}

std::string encode_lowered(const std::vector<std::pair<std::string, std::string>>& names) {
  std::string out;
  for (const auto& [expr, low] : names) {
    util::put_u32(out, static_cast<uint32_t>(expr.size()));
    out += expr;
    util::put_u32(out, static_cast<uint32_t>(low.size()));
    out += low;
  }
  return out;
}

std::optional<std::vector<std::pair<std::string, std::string>>> decode_lowered(std::string_view s) {
  std::vector<std::pair<std::string, std::string>> out;
  auto take = [&](std::string& dst) {
    if (s.size() < 4) return false;
    uint32_t n = util::get_u32(s.data());
    s.remove_prefix(4);
    if (s.size() < n) return false;
    dst.assign(s.substr(0, n));
    s.remove_prefix(n);
    return true;
  };
  while (!s.empty()) {
    std::pair<std::string, std::string> p;
    if (!take(p.first) || !take(p.second)) return std::nullopt;
    out.push_back(std::move(p));
  }
  return out;
}

// Digest of a file's bytes through a read-only map (no copy into the heap).
Expected<Digest> hash_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return util::errno_status(errno, path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return util::errno_status(e, path);
  }
  if (st.st_size == 0) {
    ::close(fd);
    return hash_bytes({});
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return util::errno_status(e, path);
  Digest d = hash_bytes(std::string_view(static_cast<const char*>(p), static_cast<size_t>(st.st_size)));
  ::munmap(p, static_cast<size_t>(st.st_size));
  return d;
}

std::string nvrtc_error(nvrtcResult r, std::string_view what) {
  return std::string(what) + ": " + nvrtcGetErrorString(r);
}

}  // namespace

Outputs outputs_for(const std::vector<std::string>& options) {
  Outputs o;
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string& opt = options[i];
    // NVRTC makes a CUBIN when any -arch names a real architecture, even
    // when a virtual one follows (-arch=sm_90 -arch=compute_90).
    if (starts_with(arch_value(options, &i), "sm_")) o.cubin = true;
    if (opt == "-dlto" || opt == "--dlink-time-opt") o.ltoir = true;
  }
  if (o.ltoir) {
    o.ptx = false;
    o.cubin = false;
  }
  return o;
}

CanonicalOptions canonical_options(const std::vector<std::string>& options) {
  detail::ParsedOptions p = detail::parse_options(options);
  CanonicalOptions c;
  c.options = std::move(p.other);
  for (auto& d : p.include_dirs) c.options.push_back("-I" + d);
  for (auto& h : p.pre_includes) c.options.push_back("--pre-include=" + h);
  c.macros = std::move(p.macros);
  return c;
}

std::optional<std::string_view> Result::lowered(std::string_view expression) const noexcept {
  for (const auto& [e, l] : lowered_names)
    if (e == expression) return std::string_view(l);
  return std::nullopt;
}

Expected<std::vector<Artifact>> compile_uncached(const Program& program) {
  std::vector<const char*> hdr_src, hdr_names;
  for (const auto& h : program.headers) {
    hdr_src.push_back(h.contents.c_str());
    hdr_names.push_back(h.name.c_str());
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult r =
      nvrtcCreateProgram(&prog, program.source.c_str(), program.name.empty() ? nullptr : program.name.c_str(),
                         static_cast<int>(hdr_src.size()), hdr_src.data(), hdr_names.data());
  if (r != NVRTC_SUCCESS) return Status(Errc::internal, nvrtc_error(r, "nvrtcCreateProgram"));
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};

  for (const auto& e : program.name_expressions) {
    r = nvrtcAddNameExpression(prog, e.c_str());
    if (r != NVRTC_SUCCESS) return Status(Errc::invalid_argument, nvrtc_error(r, "nvrtcAddNameExpression(" + e + ")"));
  }
  std::vector<const char*> opts;
  for (const auto& o : program.options) opts.push_back(o.c_str());
  nvrtcResult cr = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());

  std::string log;
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
    log.resize(n);
    if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) log.clear();
    while (!log.empty() && log.back() == '\0') log.pop_back();
  }
  if (cr != NVRTC_SUCCESS) {
    std::string msg = nvrtcGetErrorString(cr);
    if (!log.empty()) msg += "\n" + log;
    return Status(Errc::compile_failed, std::move(msg));
  }

  std::vector<Artifact> arts;
  auto fetch = [&](const char* name, nvrtcResult (*size_fn)(nvrtcProgram, size_t*),
                   nvrtcResult (*get_fn)(nvrtcProgram, char*), bool text) -> Status {
    size_t sz = 0;
    nvrtcResult rr = size_fn(prog, &sz);
    if (rr != NVRTC_SUCCESS) return Status(Errc::internal, nvrtc_error(rr, name));
    if (sz == 0) return Status();
    std::string data(sz, '\0');
    rr = get_fn(prog, data.data());
    if (rr != NVRTC_SUCCESS) return Status(Errc::internal, nvrtc_error(rr, name));
    if (text) {
      // Stored with exactly one terminating NUL (Result::ptx excludes it).
      while (!data.empty() && data.back() == '\0') data.pop_back();
      if (data.empty()) return Status();
      data.push_back('\0');
    }
    if (!data.empty()) arts.push_back({name, std::move(data)});
    return Status();
  };
  // Whatever NVRTC made, whatever the options look like: each output is
  // asked for and kept when it is not empty.
  KCACHE_RETURN_IF_ERROR(fetch("ptx", nvrtcGetPTXSize, nvrtcGetPTX, true));
  KCACHE_RETURN_IF_ERROR(fetch("cubin", nvrtcGetCUBINSize, nvrtcGetCUBIN, false));
  KCACHE_RETURN_IF_ERROR(fetch("ltoir", nvrtcGetLTOIRSize, nvrtcGetLTOIR, false));

  if (!program.name_expressions.empty()) {
    std::vector<std::pair<std::string, std::string>> lowered;
    for (const auto& e : program.name_expressions) {
      const char* low = nullptr;
      r = nvrtcGetLoweredName(prog, e.c_str(), &low);
      if (r != NVRTC_SUCCESS || !low)
        return Status(Errc::compile_failed, nvrtc_error(r, "nvrtcGetLoweredName(" + e + ")"));
      lowered.emplace_back(e, low);
    }
    arts.push_back({"lowered_names", encode_lowered(lowered)});
  }
  if (!log.empty()) arts.push_back({"log", std::move(log)});
  return arts;
}

struct Compiler::Impl {
  Cache& cache;
  CompilerOptions opt;

  std::once_flag identity_once;
  Identity ident;
  Status ident_error;

  Impl(Cache& c, CompilerOptions o) : cache(c), opt(o) {}

  // The library digest, memoised in the cache under the file's identity so
  // only the first process on a machine reads the 110 MB.
  Digest library_digest(const std::string& file) {
    KeyBuilder kb("kcache.nvrtc.libid/2");
    struct stat st;
    if (::stat(file.c_str(), &st) == 0) {
      kb.add_string("file", file + "|" + std::to_string(st.st_dev) + "|" + std::to_string(st.st_ino) + "|" +
                                std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
                                std::to_string(st.st_mtim.tv_nsec) + "|" + std::to_string(st.st_ctim.tv_sec) + "." +
                                std::to_string(st.st_ctim.tv_nsec));
    }
    auto memo = kb.finish();
    if (memo) {
      if (auto e = cache.get(memo->key)) {
        auto d = e->artifact("digest");
        if (d && d->size() == sizeof(Digest::bytes)) {
          Digest out;
          std::copy(d->begin(), d->end(), reinterpret_cast<char*>(out.bytes.data()));
          return out;
        }
      }
    }
    auto d = hash_file(file);
    if (!d) {
      KCACHE_LOG(LogLevel::warn, "nvrtc: cannot hash %s: %s", file.c_str(), d.error().to_string().c_str());
      return Digest{};
    }
    if (memo) {
      std::string bytes(reinterpret_cast<const char*>(d->bytes.data()), d->bytes.size());
      cache.put(*memo, {{"digest", std::move(bytes)}});
    }
    return *d;
  }

  void compute_identity() {
    if (nvrtcResult r = nvrtcVersion(&ident.major, &ident.minor); r != NVRTC_SUCCESS) {
      ident_error = Status(Errc::internal, nvrtc_error(r, "nvrtcVersion"));
      return;
    }
    if (!opt.hash_library) return;
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || !info.dli_fname) {
      KCACHE_LOG(LogLevel::warn, "nvrtc: dladdr cannot name the NVRTC library; keying on its version only");
      return;
    }
    char real[PATH_MAX];
    ident.library_path = ::realpath(info.dli_fname, real) ? real : info.dli_fname;
    ident.library_digest = library_digest(ident.library_path);
  }

  const Identity& identity() {
    std::call_once(identity_once, [this] { compute_identity(); });
    return ident;
  }

  // ---- keys ------------------------------------------------------------------

  static constexpr std::string_view kInputsNs = "kcache.nvrtc.inputs/1";
  static constexpr size_t kMaxManifests = 8;  // per program: one per include configuration seen

  static void put_field(std::string& out, std::string_view s) {
    util::put_u32(out, static_cast<uint32_t>(s.size()));
    out += s;
  }

  // Everything the program's inputs key depends on besides the library.
  static Digest program_digest(const Program& p) {
    std::string b;
    put_field(b, p.source);
    put_field(b, p.name);
    util::put_u32(b, static_cast<uint32_t>(p.options.size()));
    for (const auto& o : p.options) put_field(b, o);
    util::put_u32(b, static_cast<uint32_t>(p.headers.size()));
    for (const auto& h : p.headers) {
      put_field(b, h.name);
      put_field(b, h.contents);
    }
    util::put_u32(b, static_cast<uint32_t>(p.name_expressions.size()));
    for (const auto& e : p.name_expressions) put_field(b, e);
    util::put_u32(b, static_cast<uint32_t>(p.extra_key.size()));
    for (const auto& [k, v] : p.extra_key) {
      put_field(b, k);
      put_field(b, v);
    }
    return hash_bytes(b);
  }

  // Debug and line info name the folder of the source: the working folder
  // is then an input.
  static bool names_working_folder(const std::vector<std::string>& options) {
    for (const auto& o : options)
      if (o == "-G" || o == "--device-debug" || o == "-lineinfo" || o == "--generate-line-info" ||
          starts_with(o, "--device-debug=") || starts_with(o, "--generate-line-info="))
        return true;
    return false;
  }

  // The program's own inputs, in the order of the key.
  Status add_inputs(KeyBuilder& kb, const Program& p) {
    const Identity& id = identity();
    if (!ident_error.is_ok()) return ident_error;
    std::map<std::string, std::string> headers;
    for (const auto& h : p.headers) {
      if (h.name.empty()) return Status(Errc::invalid_argument, "nvrtc: a header has an empty name");
      if (!headers.emplace(h.name, h.contents).second)
        return Status(Errc::invalid_argument, "nvrtc: header named twice: " + h.name);
    }
    CanonicalOptions canon = canonical_options(p.options);
    Outputs out = outputs_for(p.options);
    std::vector<std::string> outs;
    if (out.ptx) outs.push_back("ptx");
    if (out.cubin) outs.push_back("cubin");
    if (out.ltoir) outs.push_back("ltoir");
    kb.add_string("nvrtc.version", std::to_string(id.major) + "." + std::to_string(id.minor))
        .add_digest("nvrtc.library", id.library_digest)
        .add_list("options", canon.options)
        .add_list("macros", canon.macros)
        .add_map("headers", headers)
        .add_bytes("source", p.source)
        .add_string("program_name", p.name.empty() ? "default_program" : p.name)
        .add_list("name_expressions", p.name_expressions)
        .add_list("outputs", outs);
    if (names_working_folder(p.options)) {
      char buf[PATH_MAX];
      kb.add_string("working_folder", ::getcwd(buf, sizeof buf) ? buf : "?");
    }
    for (const auto& [k, v] : p.extra_key) kb.add_string("extra." + k, v);
    kb.label(p.name.empty() ? "default_program" : p.name);  // not part of the key: compared first on a miss
    return Status();
  }

  Expected<KeyInfo> inputs_key(const Program& p) {
    KeyBuilder kb(kInputsNs);
    KCACHE_RETURN_IF_ERROR(add_inputs(kb, p));
    return std::move(kb).finish();
  }

  // The entry's key: the inputs and what the manifest says NVRTC read, one
  // component per file so that an explanation names it.
  Expected<KeyInfo> entry_key(const Program& p, const detail::DepManifest& m) {
    KeyBuilder kb(kNamespace);
    KCACHE_RETURN_IF_ERROR(add_inputs(kb, p));
    for (const auto& f : m.files) kb.add_digest("file:" + f.path, f.digest);
    for (const auto& pr : m.present) kb.add_u64("probe:" + pr.path, pr.mode);
    kb.add_list("probes.absent", m.absent);
    for (const auto& a : m.links) kb.add_string("readlink:" + a.path, a.found ? a.value : std::string("(none)"));
    for (const auto& a : m.resolved) kb.add_string("realpath:" + a.path, a.found ? a.value : std::string("(none)"));
    for (const auto& a : m.listings) kb.add_string("listing:" + a.path, a.found ? a.value : std::string("(none)"));
    for (const auto& a : m.env) kb.add_string("env:" + a.path, a.found ? a.value : std::string("(unset)"));
    for (const auto& l : m.libs) {
      kb.add_string("library:" + l.name, l.path.empty() ? std::string("(not loaded)") : l.path);
      if (!l.path.empty()) kb.add_digest("library.digest:" + l.name, l.digest);
    }
    if (!m.cwd.empty()) kb.add_string("output_names_working_folder", m.cwd);
    return std::move(kb).finish();
  }

  // ---- manifests -----------------------------------------------------------------

  struct Candidate {
    std::shared_ptr<const detail::DepManifest> manifest;
    std::shared_ptr<const KeyInfo> entry;  // its entry's key
    detail::WatchState watch;
  };
  struct Known {
    std::shared_ptr<const KeyInfo> inputs;
    std::vector<Candidate> candidates;                                                    // newest first
    std::vector<std::pair<std::shared_ptr<const detail::DepManifest>, Status>> failures;  // remembered, oldest first
    std::list<Digest>::iterator at;                                                       // its place in `lru`
    size_t bytes = 0;                                                                     // about what it holds
  };
  // The programs remembered, least recently used dropped first past a
  // budget of bytes (a CCCL manifest lists about 1,300 paths: ~200 KB with
  // its entry key).
  static constexpr size_t kMemoBudget = size_t(64) << 20;
  static constexpr size_t kMemoCap = 4096;
  std::mutex memo_mu;
  std::unordered_map<Digest, Known> memo;  // GUARDED_BY(memo_mu); by program_digest
  std::list<Digest> lru;                   // GUARDED_BY(memo_mu); most recently used first
  size_t memo_bytes = 0;                   // GUARDED_BY(memo_mu)
  std::set<std::string> logged;            // GUARDED_BY(memo_mu); lines said once each

  static size_t approx_bytes(const detail::DepManifest& m) {
    size_t n = sizeof m + m.cwd.size();
    for (const auto& f : m.files) n += sizeof f + f.path.size();
    for (const auto& p : m.present) n += sizeof p + p.path.size();
    for (const auto& a : m.absent) n += sizeof a + a.size();
    for (const auto& d : m.dirs) n += sizeof d + d.path.size();
    for (const auto* v : {&m.links, &m.resolved, &m.listings, &m.env})
      for (const auto& a : *v) n += sizeof a + a.path.size() + a.value.size();
    for (const auto& l : m.libs) n += sizeof l + l.name.size() + l.path.size();
    return n;
  }
  // The program's memo, made most recently used (made when new).
  // REQUIRES: memo_mu held.
  Known& touch(const Digest& pd) {
    auto [it, fresh] = memo.try_emplace(pd);
    if (fresh) {
      lru.push_front(pd);
      it->second.at = lru.begin();
    } else {
      lru.splice(lru.begin(), lru, it->second.at);
    }
    return it->second;
  }
  // Counts what `k` holds now and drops the least recently used others
  // while the memo is over budget. REQUIRES: memo_mu held.
  void account(Known& k) {
    size_t b = sizeof k;
    if (k.inputs) b += k.inputs->manifest.items.size() * 64;
    // A candidate's entry key names each path the manifest does.
    for (const auto& c : k.candidates) b += 2 * approx_bytes(*c.manifest) + c.watch.wds.size() * sizeof(int);
    for (const auto& [m, st] : k.failures) b += approx_bytes(*m) + st.message().size();
    memo_bytes = memo_bytes - k.bytes + b;
    k.bytes = b;
    while ((memo_bytes > kMemoBudget || memo.size() > kMemoCap) && lru.size() > 1) {
      auto it = memo.find(lru.back());
      if (&it->second == &k) break;
      memo_bytes -= it->second.bytes;
      memo.erase(it);
      lru.pop_back();
    }
  }

  void log_once(const std::string& line) {
    bool first = false;
    {
      std::lock_guard lk(memo_mu);
      first = logged.size() < 1000 && logged.insert(line).second;
    }
    if (first) KCACHE_LOG(LogLevel::warn, "%s", line.c_str());
  }

  static std::string encode_list(const std::vector<std::string>& manifests) {
    std::string out;
    util::put_u32(out, static_cast<uint32_t>(manifests.size()));
    for (const auto& m : manifests) put_field(out, m);
    return out;
  }
  static std::vector<std::string> decode_list(std::string_view s) {
    std::vector<std::string> out;
    if (s.size() < 4) return out;
    uint32_t n = util::get_u32(s.data());
    s.remove_prefix(4);
    for (uint32_t i = 0; i < n && i < kMaxManifests; ++i) {
      if (s.size() < 4) return {};
      uint32_t len = util::get_u32(s.data());
      s.remove_prefix(4);
      if (s.size() < len) return {};
      out.emplace_back(s.substr(0, len));
      s.remove_prefix(len);
    }
    return out;
  }

  // What a lookup found: the program's inputs key, the entry key of the
  // manifest that holds now (or none), and the stored list it looked at.
  struct Lookup {
    std::shared_ptr<const KeyInfo> inputs;
    std::shared_ptr<const KeyInfo> entry;
    std::vector<std::string> stored;  // the manifests stored under `inputs`, newest first
    Digest stored_digest;             // of the stored list's bytes (zero: none)
    std::optional<Status> failure;    // a remembered failure whose manifest holds
  };

  void remember(const Digest& pd, const std::shared_ptr<const KeyInfo>& inputs, Candidate c) {
    std::lock_guard lk(memo_mu);
    Known& k = touch(pd);
    k.inputs = inputs;
    for (const auto& old : k.candidates)
      if (old.entry->key == c.entry->key) return;
    k.candidates.insert(k.candidates.begin(), std::move(c));
    if (k.candidates.size() > kMaxManifests) k.candidates.pop_back();
    account(k);
  }

  Expected<Lookup> lookup(const Program& p) {
    const Digest pd = program_digest(p);
    Lookup out;
    {
      // Checked under the lock: the watch state is updated by the check.
      std::lock_guard lk(memo_mu);
      if (auto it = memo.find(pd); it != memo.end()) {
        lru.splice(lru.begin(), lru, it->second.at);
        out.inputs = it->second.inputs;
        for (auto& c : it->second.candidates) {
          if (detail::manifest_holds(*c.manifest, &c.watch)) {
            out.entry = c.entry;
            return out;
          }
        }
        for (auto& [m, st] : it->second.failures)
          if (detail::manifest_holds(*m)) out.failure = st;
      }
    }
    if (!out.inputs) {
      KCACHE_TRY(KeyInfo ki, inputs_key(p));
      out.inputs = std::make_shared<const KeyInfo>(std::move(ki));
      std::lock_guard lk(memo_mu);
      Known& k = touch(pd);
      k.inputs = out.inputs;
      account(k);
    }
    if (out.failure) return out;
    if (auto e = cache.get(out.inputs->key)) {
      if (auto bytes = e->artifact("manifests")) {
        out.stored = decode_list(*bytes);
        out.stored_digest = hash_bytes(*bytes);
      }
    }
    for (const auto& bytes : out.stored) {
      auto m = detail::decode_manifest(bytes);
      if (!m || !detail::manifest_holds(*m)) continue;
      KCACHE_TRY(KeyInfo ek, entry_key(p, *m));
      Candidate c{std::make_shared<const detail::DepManifest>(std::move(*m)),
                  std::make_shared<const KeyInfo>(std::move(ek)),
                  {}};
      out.entry = c.entry;
      remember(pd, out.inputs, std::move(c));
      return out;
    }
    return out;
  }

  Expected<KeyInfo> key(const Program& p) {
    KCACHE_TRY(Lookup lk, lookup(p));
    return lk.entry ? *lk.entry : *lk.inputs;
  }

  // ---- results -------------------------------------------------------------------

  // Views into the entry, or nullopt when the entry does not hold what the
  // program asks for (treated as a bad entry and recompiled).
  std::optional<Result> make_result(Entry e, const Program& p, const Key& key, Source src) {
    if (e.pinned()) {
      auto d = e.detach();
      if (!d) return std::nullopt;
      e = std::move(d).value();
    }
    Result r;
    r.entry = std::move(e);
    r.key = key;
    r.source = src;
    r.ptx = r.entry.artifact("ptx").value_or(std::string_view());
    if (!r.ptx.empty()) {
      if (r.ptx.back() != '\0') return std::nullopt;
      r.ptx.remove_suffix(1);
    }
    r.cubin = r.entry.artifact("cubin").value_or(std::string_view());
    r.ltoir = r.entry.artifact("ltoir").value_or(std::string_view());
    r.log = r.entry.artifact("log").value_or(std::string_view());
    if (r.ptx.empty() && r.ltoir.empty() && r.cubin.empty()) return std::nullopt;
    if (!p.name_expressions.empty()) {
      auto ln = r.entry.artifact("lowered_names");
      if (!ln) return std::nullopt;
      auto names = decode_lowered(*ln);
      if (!names) return std::nullopt;
      r.lowered_names = std::move(*names);
      for (const auto& ex : p.name_expressions)
        if (!r.lowered(ex)) return std::nullopt;
    }
    return r;
  }

  Expected<Result> unstored(const Program& p, Expected<std::vector<Artifact>> arts) {
    if (!arts) return std::move(arts).error();
    EntryBuilder b{Key{}};
    for (auto& a : *arts) b.add(std::move(a));
    auto e = b.build();
    if (!e) return std::move(e).error();
    if (auto r = make_result(std::move(e).value(), p, Key{}, Source::compiled)) return std::move(*r);
    return Status(Errc::internal, "nvrtc: compile produced neither PTX, CUBIN nor LTO-IR");
  }

  // Compiled without the cache: a program whose reads cannot be observed.
  Expected<Result> compile_without_cache(const Program& p, const Status& why) {
    log_once(std::string("nvrtc: compiling ") + (p.name.empty() ? "default_program" : p.name.c_str()) +
             " without the cache: " + why.to_string());
    return unstored(p, compile_uncached(p));
  }

  // One compile with the recorder on, and the manifest of what it read.
  struct Recorded {
    Expected<std::vector<Artifact>> artifacts;
    detail::Built built;
    uint64_t cost_us = 0;
  };
  Recorded compile_recorded(const Program& p) {
    detail::Recording rec;
    uint64_t t0 = util::now_mono_us();
    Recorded out{std::vector<Artifact>{}, {}, 0};
    {
      detail::ScopedRecording on(&rec);
      out.artifacts = compile_uncached(p);
    }
    out.cost_us = util::now_mono_us() - t0;
    std::vector<std::string_view> outputs, in_memory{p.source};
    if (out.artifacts)
      for (const auto& a : *out.artifacts) outputs.push_back(a.data);
    else
      outputs.push_back(out.artifacts.error().message());
    for (const auto& h : p.headers) in_memory.push_back(h.contents);
    out.built = detail::build_manifest(rec, outputs, in_memory);
    return out;
  }

  // What a lookup answers without compiling: a remembered failure, or the
  // stored entry of the manifest that holds; nullopt when NVRTC must run.
  std::optional<Expected<Result>> found(const Program& p, const Lookup& lk) {
    if (lk.failure) return Expected<Result>(*lk.failure);
    if (lk.entry) {
      Source src = Source::compiled;
      if (auto e = cache.get(*lk.entry, &src)) {
        if (auto r = make_result(std::move(*e), p, lk.entry->key, src)) return Expected<Result>(std::move(*r));
        KCACHE_LOG(LogLevel::warn, "nvrtc: entry %s lacks requested outputs; recompiling", lk.entry->key.hex().c_str());
      }
      // The entry is gone (evicted, or bad): compiled again, with the
      // recorder on, so nothing read since the check is missed.
    }
    return std::nullopt;
  }

  Expected<Result> compile(const Program& p) {
    if (const Status& st = detail::install_recorder(); !st.is_ok()) return compile_without_cache(p, st);
    KCACHE_TRY(Lookup lk, lookup(p));
    if (auto r = found(p, lk)) return std::move(*r);
    bool busy = false;
    return compile_missed(p, lk, /*wait=*/true, &busy);
  }

  // The batch: every program looked up in the caller's thread, then the
  // misses on a pool (cache/batch_pool.h), each first without waiting for
  // another process; those held elsewhere are waited for at the end.
  std::vector<Expected<Result>> compile_all(const std::vector<Program>& programs, unsigned threads) {
    const size_t n = programs.size();
    std::vector<std::optional<Expected<Result>>> out(n);
    std::vector<std::optional<Lookup>> looked(n);
    const Status& recorder = detail::install_recorder();
    std::deque<size_t> todo;
    for (size_t i = 0; i < n; ++i) {
      if (!recorder.is_ok()) {
        todo.push_back(i);
        continue;
      }
      auto lk = lookup(programs[i]);
      if (!lk) {
        out[i].emplace(std::move(lk).error());
        continue;
      }
      if (auto r = found(programs[i], *lk)) {
        out[i].emplace(std::move(*r));
        continue;
      }
      looked[i].emplace(std::move(lk).value());
      todo.push_back(i);
    }
    std::mutex mu;
    const unsigned pool = batch_threads(threads, todo.size());
    run_batch(std::move(todo), pool, [&](size_t i, bool wait) {
      const Program& p = programs[i];
      std::optional<Expected<Result>> r;
      if (!recorder.is_ok()) {
        r.emplace(compile_without_cache(p, recorder));
      } else if (wait) {
        r.emplace(compile(p));  // looked up again: the holder has stored it by now
      } else {
        bool busy = false;
        r.emplace(compile_missed(p, *looked[i], /*wait=*/false, &busy));
        if (busy) return false;
      }
      std::lock_guard lk(mu);
      out[i] = std::move(r);
      return true;
    });
    std::vector<Expected<Result>> results;
    results.reserve(n);
    for (auto& r : out) results.push_back(r ? std::move(*r) : Status(Errc::internal, "nvrtc: program not resolved"));
    return results;
  }

  // After a miss: NVRTC runs once per program and stored list, across
  // threads and processes (the others wait and take the owner's manifest).
  // wait=false: while another process holds the program's flight, sets
  // *busy and returns at once, compiling nothing.
  Expected<Result> compile_missed(const Program& p, const Lookup& lk, bool wait, bool* busy) {
    const Digest pd = program_digest(p);
    KCACHE_TRY(KeyInfo fk, detail::flight_key(lk.inputs->key, lk.stored_digest, lk.entry ? &lk.entry->key : nullptr));
    Flight f = wait ? cache.begin(fk) : cache.try_begin(fk);
    if (f.busy()) {
      *busy = true;
      return Status(Errc::unavailable, "nvrtc: another process is compiling this program");
    }
    if (f.hit()) {
      auto bytes = f.entry().artifact("manifest");
      auto m = bytes ? detail::decode_manifest(*bytes) : std::nullopt;
      if (m && detail::manifest_holds(*m)) {
        KCACHE_TRY(KeyInfo ek, entry_key(p, *m));
        Source src = Source::compiled;
        if (auto e = cache.get(ek, &src)) {
          Key k = ek.key;
          if (auto r = make_result(std::move(*e), p, k, src == Source::compiled ? Source::waited : src)) {
            remember(pd, lk.inputs,
                     Candidate{std::make_shared<const detail::DepManifest>(std::move(*m)),
                               std::make_shared<const KeyInfo>(std::move(ek)),
                               {}});
            return std::move(*r);
          }
        }
      }
      // The owner read other files than this caller would now: compiled
      // here, outside the flight.
    } else if (!f.owner()) {
      return compile_without_cache(p, f.error());
    }
    Recorded rc = compile_recorded(p);
    const std::string name = p.name.empty() ? "default_program" : p.name;
    if (!rc.artifacts) {
      if (f.owner()) f.abandon();
      if (opt.remember_failures && rc.artifacts.error().code() == Errc::compile_failed &&
          rc.built.uncacheable.empty()) {
        std::lock_guard lk2(memo_mu);
        Known& k = touch(pd);
        // Each is checked on every lookup of the program: a few, the
        // oldest dropped first.
        size_t cap = opt.max_remembered_failures ? opt.max_remembered_failures : 8;
        k.failures.emplace_back(std::make_shared<const detail::DepManifest>(std::move(rc.built.manifest)),
                                rc.artifacts.error());
        if (k.failures.size() > cap) k.failures.erase(k.failures.begin(), k.failures.end() - cap);
        account(k);
      }
      return std::move(rc.artifacts).error();
    }
    if (!rc.built.uncacheable.empty()) {
      if (f.owner()) f.abandon();
      log_once("nvrtc: " + name + " is not stored: " + rc.built.uncacheable);
      return unstored(p, std::move(rc.artifacts));
    }
    auto ek = entry_key(p, rc.built.manifest);
    if (!ek) {
      if (f.owner()) f.abandon();
      return std::move(ek).error();
    }
    std::string encoded = detail::encode_manifest(rc.built.manifest);
    auto stored = cache.put(*ek, std::move(rc.artifacts).value(), rc.cost_us);
    if (!stored) {
      if (f.owner()) f.abandon();
      return Status(Errc::internal, "nvrtc: could not build an entry for the compiled program");
    }
    // The program's list: this manifest first, then the others stored (read
    // again: another process may have added one meanwhile), at most
    // kMaxManifests.
    std::vector<std::string> list{encoded};
    std::vector<std::string> current = lk.stored;
    if (auto e = cache.get(lk.inputs->key))
      if (auto bytes = e->artifact("manifests")) current = decode_list(*bytes);
    for (auto& m : current)
      if (m != encoded && list.size() < kMaxManifests) list.push_back(std::move(m));
    cache.put(*lk.inputs, {{"manifests", encode_list(list)}});
    // The entry and the list are on disk before this returns and before the
    // processes waiting on the flight look for them (plain puts are group
    // committed; a compile's result is kept and seen at once).
    (void)cache.flush();  // a failed write is in the log: the next process compiles again
    if (f.owner()) (void)f.commit({{"manifest", encoded}});
    Key k = ek->key;
    remember(pd, lk.inputs,
             Candidate{std::make_shared<const detail::DepManifest>(std::move(rc.built.manifest)),
                       std::make_shared<const KeyInfo>(std::move(*ek)),
                       {}});
    if (auto r = make_result(std::move(*stored), p, k, Source::compiled)) return std::move(*r);
    return Status(Errc::internal, "nvrtc: compile produced neither PTX, CUBIN nor LTO-IR");
  }
};

Expected<KeyInfo> detail::flight_key(const Key& inputs, const Digest& stored, const Key* entry) {
  return KeyBuilder("kcache.nvrtc.flight/1")
      .add_digest("inputs", inputs)
      .add_digest("stored", stored)
      .add_string("entry", entry ? entry->hex() : std::string())
      .finish();
}

Compiler::Compiler(Cache& cache, CompilerOptions options) : impl_(std::make_unique<Impl>(cache, options)) {}
Compiler::~Compiler() = default;
Expected<Result> Compiler::compile(const Program& program) { return impl_->compile(program); }
std::vector<Expected<Result>> Compiler::compile_all(const std::vector<Program>& programs, unsigned threads) {
  return impl_->compile_all(programs, threads);
}
Expected<KeyInfo> Compiler::key(const Program& program) { return impl_->key(program); }
const Identity& Compiler::identity() { return impl_->identity(); }

}  // namespace kcache::nvrtc

// Cached NVRTC compiles. A compile builds the key (library identity,
// canonical options, headers, the files on disk its #includes can reach,
// source, name expressions, outputs), asks the Cache for it, and on a miss
// runs compile_uncached(), whose artifacts the Cache stores as one entry. A
// hit is checked (PTX NUL-terminated, the lowered names decode and cover
// every requested expression) before it is handed out; an entry that fails
// the check is recompiled and overwritten.
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
#include <mutex>
#include <set>
#include <unordered_map>

#include "integrations/nvrtc/includes.h"
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

  std::mutex failures_mu;
  std::unordered_map<Key, Status> failures;  // GUARDED_BY(failures_mu)
  std::deque<Key> failure_order;             // GUARDED_BY(failures_mu); oldest first

  Impl(Cache& c, CompilerOptions o) : cache(c), opt(o) {}

  // The library digest, memoised in the cache under the files' identity so
  // only the first process on a machine reads the 110 MB.
  Digest library_digest(const std::vector<std::string>& files) {
    KeyBuilder kb("kcache.nvrtc.libid/1");
    std::vector<std::string> ids;
    for (const auto& f : files) {
      struct stat st;
      if (::stat(f.c_str(), &st) != 0) continue;
      ids.push_back(f + "|" + std::to_string(st.st_dev) + "|" + std::to_string(st.st_ino) + "|" +
                    std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
                    std::to_string(st.st_mtim.tv_nsec) + "|" + std::to_string(st.st_ctim.tv_sec) + "." +
                    std::to_string(st.st_ctim.tv_nsec));
    }
    kb.add_list("files", ids);
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
    std::string all;
    for (const auto& f : files) {
      auto d = hash_file(f);
      if (!d) {
        KCACHE_LOG(LogLevel::warn, "nvrtc: cannot hash %s: %s", f.c_str(), d.error().to_string().c_str());
        continue;
      }
      all += f.substr(f.rfind('/') + 1) + "=" + d->hex() + ";";
    }
    Digest out = hash_bytes(all);
    if (memo) {
      std::string bytes(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size());
      cache.put(*memo, {{"digest", std::move(bytes)}});
    }
    return out;
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
    std::vector<std::string> files{ident.library_path};
    std::string dir = ident.library_path.substr(0, ident.library_path.rfind('/') + 1);
    std::string builtins =
        dir + "libnvrtc-builtins.so." + std::to_string(ident.major) + "." + std::to_string(ident.minor);
    if (::access(builtins.c_str(), R_OK) == 0) files.push_back(builtins);
    ident.library_digest = library_digest(files);
  }

  const Identity& identity() {
    std::call_once(identity_once, [this] { compute_identity(); });
    return ident;
  }

  // Warm keys. Per program (all its inputs): the closure last walked and
  // the key built from it (a closure with relative paths holds only in the
  // working folder it was walked in). A key whose closure is
  // still as recorded (closure_still_valid: a stat per file and folder) is
  // answered from here without reading a header; another process finds the
  // record in the cache (namespace kRecordNs) and checks it the same way.
  struct Memo {
    std::shared_ptr<const detail::Closure> closure;
    std::shared_ptr<const KeyInfo> info;
    detail::WatchState watch;
  };
  static constexpr std::string_view kRecordNs = "kcache.nvrtc.closure/1";
  static constexpr size_t kMemoCap = 4096;
  std::mutex memo_mu;
  std::unordered_map<Digest, Memo> memo;       // GUARDED_BY(memo_mu)
  std::set<std::string> without_cache_logged;  // GUARDED_BY(memo_mu); said once each

  static void put_field(std::string& out, std::string_view s) {
    util::put_u32(out, static_cast<uint32_t>(s.size()));
    out += s;
  }

  // Everything the program's key and closure depend on besides the files.
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

  static Expected<KeyInfo> record_key(const Digest& program) {
    return KeyBuilder(kRecordNs).add_digest("program", program).finish();
  }

  Expected<std::shared_ptr<const KeyInfo>> key_info(const Program& p) {
    const Digest pd = program_digest(p);
    bool known = false;
    {
      // Checked under the lock: the watch state is updated by the check
      // (a stat per file at most once a second, else no system call).
      std::lock_guard lk(memo_mu);
      if (auto it = memo.find(pd); it != memo.end()) {
        if (detail::closure_still_valid(*it->second.closure, &it->second.watch)) return it->second.info;
        known = true;
      }
    }
    detail::ParsedOptions parsed = detail::parse_options(p.options);
    std::shared_ptr<const detail::Closure> closure;
    auto rk = record_key(pd);
    if (!known && rk) {
      if (auto e = cache.get(rk->key)) {
        if (auto bytes = e->artifact("closure")) {
          auto c = detail::decode_closure(*bytes);
          if (c && detail::closure_still_valid(*c)) closure = std::make_shared<const detail::Closure>(std::move(*c));
        }
      }
    }
    bool walked = false;
    if (!closure) {
      KCACHE_TRY(detail::Closure c, detail::walk_closure(p, parsed));
      closure = std::make_shared<const detail::Closure>(std::move(c));
      walked = true;
    }
    KCACHE_TRY(KeyInfo ki, key(p, parsed, *closure));
    auto info = std::make_shared<const KeyInfo>(std::move(ki));
    if (closure->settled) {
      {
        std::lock_guard lk(memo_mu);
        if (memo.size() >= kMemoCap) memo.clear();
        memo[pd] = Memo{closure, info, {}};
      }
      if (walked && rk) cache.put(*rk, {{"closure", detail::encode_closure(*closure)}});
    }
    return info;
  }

  Expected<KeyInfo> key(const Program& p) {
    KCACHE_TRY(auto info, key_info(p));
    return *info;
  }

  Expected<KeyInfo> key(const Program& p, const detail::ParsedOptions& parsed, const detail::Closure& disk) {
    const Identity& id = identity();
    if (!ident_error.is_ok()) return ident_error;
    std::map<std::string, std::string> headers;
    for (const auto& h : p.headers) {
      if (h.name.empty()) return Status(Errc::invalid_argument, "nvrtc: a header has an empty name");
      if (!headers.emplace(h.name, h.contents).second)
        return Status(Errc::invalid_argument, "nvrtc: header named twice: " + h.name);
    }
    std::vector<std::string> options = parsed.other;
    for (const auto& d : parsed.include_dirs) options.push_back("-I" + d);
    for (const auto& h : parsed.pre_includes) options.push_back("--pre-include=" + h);
    Outputs out = outputs_for(p.options);
    std::vector<std::string> outs;
    if (out.ptx) outs.push_back("ptx");
    if (out.cubin) outs.push_back("cubin");
    if (out.ltoir) outs.push_back("ltoir");

    KeyBuilder kb(kNamespace);
    kb.add_string("nvrtc.version", std::to_string(id.major) + "." + std::to_string(id.minor))
        .add_digest("nvrtc.library", id.library_digest)
        .add_list("options", options)
        .add_list("macros", parsed.macros)
        .add_map("headers", headers)
        .add_bytes("source", p.source)
        .add_string("program_name", p.name.empty() ? "default_program" : p.name)
        .add_list("name_expressions", p.name_expressions)
        .add_list("outputs", outs);
    // The disk closure, one component per file and per probe found, so that
    // an explanation names the file: "file:/x/y.h: changed (...)".
    for (const auto& f : disk.files) kb.add_digest("file:" + f.path, f.digest);
    for (const auto& pr : disk.present) kb.add_bool("probe:" + pr, true);
    kb.add_list("probes.absent", disk.absent);
    if (!disk.fallback.empty()) kb.add_list("whole_folders", disk.fallback);
    for (const auto& [k, v] : p.extra_key) kb.add_string("extra." + k, v);
    kb.label(p.name.empty() ? "default_program" : p.name);  // not part of the key: compared first on a miss
    return std::move(kb).finish();
  }

  // Views into the entry, or nullopt when the entry does not hold what the
  // program asks for (treated as a bad entry and recompiled).
  std::optional<Result> make_result(Entry e, const Program& p, const Key& key, Source src) {
    if (e.pinned()) e = e.detach();
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

  std::optional<Status> remembered_failure(const Key& k) {
    if (!opt.remember_failures) return std::nullopt;
    std::lock_guard lk(failures_mu);
    auto it = failures.find(k);
    if (it == failures.end()) return std::nullopt;
    return it->second;
  }

  void remember_failure(const Key& k, const Status& st) {
    if (!opt.remember_failures || st.code() != Errc::compile_failed) return;
    size_t cap = opt.max_remembered_failures ? opt.max_remembered_failures : 1024;
    std::lock_guard lk(failures_mu);
    if (!failures.emplace(k, st).second) return;
    failure_order.push_back(k);
    while (failure_order.size() > cap) {
      failures.erase(failure_order.front());
      failure_order.pop_front();
    }
  }

  // A program whose include search holds too many files for a key: compiled
  // without the cache, never with a partial key.
  Expected<Result> compile_without_cache(const Program& p, const Status& why) {
    std::string line = std::string("nvrtc: compiling ") + (p.name.empty() ? "default_program" : p.name.c_str()) +
                       " without the cache: " + why.to_string();
    bool first = false;
    {
      std::lock_guard lk(memo_mu);
      first = without_cache_logged.size() < 1000 && without_cache_logged.insert(line).second;
    }
    if (first) KCACHE_LOG(LogLevel::warn, "%s", line.c_str());
    auto arts = compile_uncached(p);
    if (!arts) return std::move(arts).error();
    EntryBuilder b{Key{}};
    for (auto& a : *arts) b.add(std::move(a));
    auto e = b.build();
    if (!e) return std::move(e).error();
    if (auto r = make_result(std::move(e).value(), p, Key{}, Source::compiled)) return std::move(*r);
    return Status(Errc::internal, "nvrtc: compile produced neither PTX, CUBIN nor LTO-IR");
  }

  Expected<Result> compile(const Program& p) {
    auto info = key_info(p);
    if (!info) {
      if (info.error().code() == Errc::too_large) return compile_without_cache(p, info.error());
      return std::move(info).error();
    }
    const KeyInfo& ki = **info;
    if (auto f = remembered_failure(ki.key)) return *f;
    Source src = Source::compiled;
    auto e = cache.get_or_compile(
        ki, [&] { return compile_uncached(p); }, &src);
    if (!e) {
      remember_failure(ki.key, e.error());
      return std::move(e).error();
    }
    if (auto r = make_result(std::move(e).value(), p, ki.key, src)) return std::move(*r);
    // A stored entry that does not answer this program: compile, replace.
    KCACHE_LOG(LogLevel::warn, "nvrtc: entry %s lacks requested outputs; recompiling", ki.key.hex().c_str());
    uint64_t t0 = util::now_mono_us();
    auto arts = compile_uncached(p);
    if (!arts) return std::move(arts).error();
    auto stored = cache.put(ki, std::move(arts).value(), util::now_mono_us() - t0);
    if (!stored) return Status(Errc::internal, "nvrtc: could not build an entry for the compiled program");
    if (auto r = make_result(std::move(*stored), p, ki.key, Source::compiled)) return std::move(*r);
    return Status(Errc::internal, "nvrtc: compile produced neither PTX, CUBIN nor LTO-IR");
  }
};

Compiler::Compiler(Cache& cache, CompilerOptions options) : impl_(std::make_unique<Impl>(cache, options)) {}
Compiler::~Compiler() = default;
Expected<Result> Compiler::compile(const Program& program) { return impl_->compile(program); }
Expected<KeyInfo> Compiler::key(const Program& program) { return impl_->key(program); }
const Identity& Compiler::identity() { return impl_->identity(); }

}  // namespace kcache::nvrtc

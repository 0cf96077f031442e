// Cached OpenCL program builds. build(): key from the device description and
// the program; the Cache's get_or_compile either hands back a stored binary
// (loaded with clCreateProgramWithBinary + clBuildProgram) or runs the
// source build in this thread, whose program is returned directly (so a
// miss never builds twice) and whose binary is stored.
#include "kcache/opencl.h"

#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

#include "util/object_id.h"
#include "util/util.h"

namespace kcache::opencl {
namespace {

const char* cl_error_name(cl_int e) {
  switch (e) {
    case CL_SUCCESS:
      return "CL_SUCCESS";
    case CL_DEVICE_NOT_FOUND:
      return "CL_DEVICE_NOT_FOUND";
    case CL_OUT_OF_RESOURCES:
      return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY:
      return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE:
      return "CL_BUILD_PROGRAM_FAILURE";
    case CL_COMPILE_PROGRAM_FAILURE:
      return "CL_COMPILE_PROGRAM_FAILURE";
    case CL_LINK_PROGRAM_FAILURE:
      return "CL_LINK_PROGRAM_FAILURE";
    case CL_INVALID_VALUE:
      return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE:
      return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT:
      return "CL_INVALID_CONTEXT";
    case CL_INVALID_BINARY:
      return "CL_INVALID_BINARY";
    case CL_INVALID_BUILD_OPTIONS:
      return "CL_INVALID_BUILD_OPTIONS";
    case CL_INVALID_COMPILER_OPTIONS:
      return "CL_INVALID_COMPILER_OPTIONS";
    case CL_INVALID_LINKER_OPTIONS:
      return "CL_INVALID_LINKER_OPTIONS";
    case CL_INVALID_PROGRAM:
      return "CL_INVALID_PROGRAM";
    case CL_INVALID_OPERATION:
      return "CL_INVALID_OPERATION";
    case CL_COMPILER_NOT_AVAILABLE:
      return "CL_COMPILER_NOT_AVAILABLE";
    case CL_LINKER_NOT_AVAILABLE:
      return "CL_LINKER_NOT_AVAILABLE";
    default:
      return "CL_ERROR";
  }
}

std::string cl_error(cl_int e, std::string_view what) {
  return std::string(what) + ": " + cl_error_name(e) + " (" + std::to_string(e) + ")";
}

Expected<std::string> info_string(cl_int (*fn)(void*, cl_uint, size_t, void*, size_t*), void* obj, cl_uint param,
                                  const char* what) {
  size_t n = 0;
  cl_int e = fn(obj, param, 0, nullptr, &n);
  if (e != CL_SUCCESS) return Status(Errc::io_error, cl_error(e, what));
  std::string s(n, '\0');
  e = fn(obj, param, n, s.data(), nullptr);
  if (e != CL_SUCCESS) return Status(Errc::io_error, cl_error(e, what));
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

cl_int platform_info(void* o, cl_uint p, size_t n, void* v, size_t* r) {
  return clGetPlatformInfo(static_cast<cl_platform_id>(o), p, n, v, r);
}
cl_int device_info(void* o, cl_uint p, size_t n, void* v, size_t* r) {
  return clGetDeviceInfo(static_cast<cl_device_id>(o), p, n, v, r);
}

// The identity of the library that serves `platform` (see
// DeviceDescription::driver_library), found once per platform.
std::string driver_library(cl_platform_id platform) {
  static std::mutex mu;
  static std::map<cl_platform_id, std::string> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(platform);
  if (it != known.end()) return it->second;
  // ICD objects begin with their dispatch table's address; only where that
  // table lies is used, never what it holds.
  if (platform == nullptr) return {};
  const void* table = nullptr;
  std::memcpy(&table, static_cast<const void*>(platform), sizeof table);
  std::string id = util::build_id_at(table);
  if (id.empty()) {
    std::string path = util::object_path_at(table);
    auto bytes = path.empty() ? Expected<std::string>(Status(Errc::not_found, "")) : util::read_file(path);
    if (bytes) id = "file:" + hash_bytes(*bytes).hex();
  }
  return known.emplace(platform, id).first->second;
}

std::string build_log(cl_program prog, cl_device_id dev) {
  size_t n = 0;
  if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, s.data(), nullptr) != CL_SUCCESS) return {};
  while (!s.empty() && (s.back() == '\0' || s.back() == '\n')) s.pop_back();
  return s;
}

// The device binary of a program built for exactly one device.
Expected<std::string> program_binary(cl_program prog) {
  cl_uint ndev = 0;
  cl_int e = clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, nullptr);
  if (e != CL_SUCCESS) return Status(Errc::io_error, cl_error(e, "clGetProgramInfo(NUM_DEVICES)"));
  if (ndev != 1) return Status(Errc::internal, "program has " + std::to_string(ndev) + " devices, expected 1");
  size_t size = 0;
  e = clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr);
  if (e != CL_SUCCESS) return Status(Errc::io_error, cl_error(e, "clGetProgramInfo(BINARY_SIZES)"));
  std::string bin(size, '\0');
  if (size == 0) return bin;
  unsigned char* ptrs[1] = {reinterpret_cast<unsigned char*>(bin.data())};
  e = clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof ptrs, ptrs, nullptr);
  if (e != CL_SUCCESS) return Status(Errc::io_error, cl_error(e, "clGetProgramInfo(BINARIES)"));
  return bin;
}

// A program from a stored binary, built (finalised) for the device; the
// driver's refusal is an error, which the caller turns into a source build.
Expected<cl_program> load_binary(cl_context ctx, cl_device_id dev, std::string_view bin, const std::string& options) {
  const unsigned char* data = reinterpret_cast<const unsigned char*>(bin.data());
  size_t len = bin.size();
  cl_int status = CL_SUCCESS, err = CL_SUCCESS;
  cl_program p = clCreateProgramWithBinary(ctx, 1, &dev, &len, &data, &status, &err);
  if (err != CL_SUCCESS || status != CL_SUCCESS || !p) {
    if (p) clReleaseProgram(p);
    return Status(Errc::corrupt, cl_error(err != CL_SUCCESS ? err : status, "clCreateProgramWithBinary"));
  }
  err = clBuildProgram(p, 1, &dev, options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    std::string log = build_log(p, dev);
    clReleaseProgram(p);
    return Status(Errc::corrupt, cl_error(err, "clBuildProgram(binary)") + (log.empty() ? "" : ": " + log));
  }
  return p;
}

}  // namespace

Expected<DeviceDescription> describe(cl_device_id device) {
  cl_platform_id platform = nullptr;
  cl_int e = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, nullptr);
  if (e != CL_SUCCESS) return Status(Errc::invalid_argument, cl_error(e, "clGetDeviceInfo(PLATFORM)"));
  DeviceDescription d;
  KCACHE_TRY(d.platform_name, info_string(platform_info, platform, CL_PLATFORM_NAME, "CL_PLATFORM_NAME"));
  KCACHE_TRY(d.platform_version, info_string(platform_info, platform, CL_PLATFORM_VERSION, "CL_PLATFORM_VERSION"));
  KCACHE_TRY(d.device_name, info_string(device_info, device, CL_DEVICE_NAME, "CL_DEVICE_NAME"));
  KCACHE_TRY(d.device_version, info_string(device_info, device, CL_DEVICE_VERSION, "CL_DEVICE_VERSION"));
  KCACHE_TRY(d.driver_version, info_string(device_info, device, CL_DRIVER_VERSION, "CL_DRIVER_VERSION"));
  d.driver_library = driver_library(platform);
  return d;
}

std::vector<std::string> split_options(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false, quoted = false;
  for (char c : s) {
    if (c == '"') {
      quoted = !quoted;
      in_word = true;
      cur += c;
    } else if (!quoted && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
      if (in_word) out.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(std::move(cur));
  return out;
}

namespace {

std::string unquoted(std::string_view w) {
  std::string out;
  for (char c : w)
    if (c != '"') out += c;
  return out;
}

// Where the options send the compiler for headers: the folders of -I,
// -isystem, -iquote, -idirafter and --include-directory, and the files of
// -include, -imacros and --include.
struct IncludeOptions {
  std::vector<std::string> dirs, forced;
};

// Each option by its exact name: its value in the next word, or joined
// where the name cannot begin another option (-Idir, --include-directory=
// dir, --include=file). Errors: unavailable for any other option that can
// change where headers are found or what is read (-iprefix, -isysroot,
// -include-pch, --include-directory-after, -I=dir, -I-, -Xclang,
// -Xpreprocessor, -Wp,..., @file), rather than a guess at what it does.
Expected<IncludeOptions> include_options(const std::vector<std::string>& words) {
  static constexpr std::string_view kDirs[] = {"-I", "-isystem", "-iquote", "-idirafter", "--include-directory"};
  static constexpr std::string_view kFiles[] = {"-include", "-imacros", "--include"};
  IncludeOptions io;
  for (size_t i = 0; i < words.size(); ++i) {
    // A word is matched without its quotes: "-I/a b" is -I with "/a b".
    const std::string word = unquoted(words[i]);
    std::string_view w = word;
    auto next = [&](std::vector<std::string>& into) {
      if (i + 1 >= words.size()) return false;
      into.push_back(unquoted(words[++i]));
      return true;
    };
    auto refuse = [&] {
      return Status(Errc::unavailable, "the option " + word + " can change where headers are found");
    };
    bool taken = false;
    for (std::string_view f : kDirs)
      if (!taken && w == f) {
        if (!next(io.dirs)) return refuse();
        taken = true;
      }
    for (std::string_view f : kFiles)
      if (!taken && w == f) {
        if (!next(io.forced)) return refuse();
        taken = true;
      }
    if (taken) continue;
    if (w.substr(0, 2) == "-I") {
      std::string_view dir = w.substr(2);
      if (dir == "-" || dir.substr(0, 1) == "=" || dir.substr(0, 1) == "$") return refuse();
      io.dirs.emplace_back(dir);
    } else if (w.substr(0, 20) == "--include-directory=") {
      io.dirs.emplace_back(w.substr(20));
    } else if (w.substr(0, 10) == "--include=") {
      io.forced.emplace_back(w.substr(10));
    } else if (w.substr(0, 2) == "-i" || w.substr(0, 9) == "--include" || w.substr(0, 2) == "-X" ||
               w.substr(0, 4) == "-Wp," || w.substr(0, 1) == "@" || w == "-nostdinc" || w.substr(0, 9) == "--sysroot") {
      return refuse();
    }
  }
  // Where clang also looks when the driver passes them on.
  for (const char* var : {"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"}) {
    const char* v = std::getenv(var);
    for (std::string_view rest = v ? v : ""; !rest.empty();) {
      size_t colon = rest.find(':');
      std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) io.dirs.emplace_back(dir);
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
  }
  return io;
}

struct Directive {
  std::string name;
  bool quoted = false;
};

// The files `text` can make the preprocessor read or look for: every
// #include, #include_next, #import and #embed (after a `#` or `%:`, a
// digraph, anywhere on a line) and every __has_include, __has_include_next
// and __has_embed, whether or not a conditional, a comment or a string
// leaves it out (more names than the compiler reads, never fewer). Lines
// are spliced first; comments between the parts are skipped. False when a
// name cannot be read without running the preprocessor: a file named
// through a macro, a comment that runs past the line inside a directive,
// or a trigraph that could make one (??= or ??/).
bool include_directives(std::string_view raw, std::vector<Directive>* out) {
  // ??= is # and ??/ is \ where trigraphs are on (-trigraphs).
  if (raw.find("?"
               "?=") != std::string_view::npos ||
      raw.find("?"
               "?/") != std::string_view::npos)
    return false;
  std::string text;
  text.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '\\' && k + 1 < raw.size() && raw[k + 1] == '\n') {
      ++k;
    } else if (raw[k] == '\\' && k + 2 < raw.size() && raw[k + 1] == '\r' && raw[k + 2] == '\n') {
      k += 2;
    } else {
      text += raw[k];
    }
  }
  std::string_view t = text;
  constexpr size_t kEnd = std::string_view::npos;  // the line ends
  constexpr size_t kOpen = kEnd - 1;               // a comment runs past the line
  // Past blanks and /* */ comments on the line.
  auto skip = [&](size_t i) {
    while (i < t.size() && t[i] != '\n') {
      if (t[i] == ' ' || t[i] == '\t' || t[i] == '\r' || t[i] == '\f' || t[i] == '\v') {
        ++i;
      } else if (t.substr(i, 2) == "/*") {
        size_t close = t.find("*/", i + 2);
        size_t eol = t.find('\n', i);
        if (close == kEnd || (eol != kEnd && close > eol)) return kOpen;
        i = close + 2;
      } else {
        return i;
      }
    }
    return kEnd;
  };
  auto ident_char = [&](size_t i) {
    return i < t.size() && (std::isalnum(static_cast<unsigned char>(t[i])) || t[i] == '_');
  };
  // The <name> or "name" at i (false when there is none on the line).
  auto name_at = [&](size_t i, size_t* end) {
    if (i >= t.size() || (t[i] != '<' && t[i] != '"')) return false;
    char close = t[i] == '<' ? '>' : '"';
    *end = t.find(close, i + 1);
    size_t eol = t.find('\n', i);
    if (*end == kEnd || (eol != kEnd && *end > eol)) return false;
    out->push_back({std::string(t.substr(i + 1, *end - i - 1)), close == '"'});
    return true;
  };
  for (size_t at = 0; at < t.size(); ++at) {
    size_t i, end = 0;
    if (t[at] == '_' && !(at > 0 && ident_char(at - 1)) &&
        (t.substr(at, 13) == "__has_include" || t.substr(at, 11) == "__has_embed")) {
      i = at;
      while (ident_char(i)) ++i;
      std::string_view name = t.substr(at, i - at);
      if (name != "__has_include" && name != "__has_include_next" && name != "__has_embed") continue;
      i = skip(i);
      if (i >= kOpen || t[i] != '(') return false;
      i = skip(i + 1);
      if (i >= kOpen || !name_at(i, &end)) return false;
      at = end;
      continue;
    }
    if (t[at] == '#') {
      i = at + 1;
    } else if (t.substr(at, 2) == "%:") {
      i = at + 2;
    } else {
      continue;
    }
    i = skip(i);
    if (i == kOpen) return false;
    if (i == kEnd) continue;
    size_t word = i;
    while (ident_char(i)) ++i;
    std::string_view name = t.substr(word, i - word);
    if (name != "include" && name != "include_next" && name != "import" && name != "embed") continue;
    i = skip(i);
    if (i >= kOpen || !name_at(i, &end)) return false;
    at = end;
  }
  return true;
}

}  // namespace

// The options a driver adds to every build from its environment (PoCL's
// POCL_EXTRA_BUILD_FLAGS; AMD's AMD_OCL_BUILD_OPTIONS and
// AMD_OCL_BUILD_OPTIONS_APPEND), those set.
std::map<std::string, std::string> driver_flags() {
  std::map<std::string, std::string> out;
  for (const char* var : {"POCL_EXTRA_BUILD_FLAGS", "AMD_OCL_BUILD_OPTIONS", "AMD_OCL_BUILD_OPTIONS_APPEND"})
    if (const char* v = std::getenv(var); v && *v) out.emplace(var, v);
  return out;
}

namespace {

std::string folder_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

}  // namespace

Expected<std::map<std::string, std::string>> disk_headers(const ProgramSource& p) {
  constexpr size_t kMaxFiles = 20000;
  std::map<std::string, std::string> found;
  std::vector<std::string> words = split_options(p.options);
  for (const auto& [var, value] : driver_flags())
    for (auto& w : split_options(value)) words.push_back(std::move(w));
  KCACHE_TRY(IncludeOptions io, include_options(words));
  // Texts still to read for directives: the text, and its folder on disk
  // ("" for the source and the named headers, which are in memory).
  std::deque<std::pair<std::string, std::string>> todo;
  todo.emplace_back(p.source, "");
  for (const auto& h : p.headers) todo.emplace_back(h.contents, "");
  std::vector<std::pair<std::string, bool>> names;  // forced includes first
  for (const auto& f : io.forced) names.emplace_back(f, true);
  bool first = true;
  while (!todo.empty()) {
    auto [text, folder] = std::move(todo.front());
    todo.pop_front();
    std::vector<Directive> ds;
    if (!include_directives(text, &ds))
      return Status(Errc::unavailable, "an #include that names its file through a macro, or a trigraph" +
                                           (folder.empty() ? std::string() : " (in " + folder + ")"));
    if (!first) names.clear();
    first = false;
    for (auto& d : ds) names.emplace_back(std::move(d.name), d.quoted);
    for (const auto& [name, quoted] : names) {
      std::vector<std::string> candidates;
      if (!name.empty() && name[0] == '/') {
        candidates.push_back(name);
      } else {
        if (quoted) candidates.push_back(folder.empty() ? name : folder + "/" + name);
        for (const auto& d : io.dirs) candidates.push_back(d + "/" + name);
      }
      for (auto& c : candidates) {
        if (found.count(c)) continue;
        if (found.size() >= kMaxFiles)
          return Status(Errc::unavailable, "more than " + std::to_string(kMaxFiles) + " header paths to look at");
        struct stat st;
        if (::stat(c.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
          found.emplace(c, "absent");
          continue;
        }
        auto body = util::read_file(c);
        if (!body) return Status(Errc::unavailable, "cannot read " + c + ": " + body.error().message());
        found.emplace(c, hash_bytes(*body).hex());
        todo.emplace_back(std::move(*body), folder_of(c));
      }
    }
  }
  // A source that can read nothing from disk keys as it always has.
  if (io.dirs.empty() && io.forced.empty()) {
    bool any = false;
    for (const auto& [path, digest] : found) any = any || digest != "absent";
    if (!any) found.clear();
  }
  return found;
}

Expected<KeyInfo> program_key(const DeviceDescription& d, const ProgramSource& p) {
  std::map<std::string, std::string> headers;
  for (const auto& h : p.headers) {
    if (h.name.empty()) return Status(Errc::invalid_argument, "opencl: a header has an empty name");
    if (!headers.emplace(h.name, h.contents).second)
      return Status(Errc::invalid_argument, "opencl: header named twice: " + h.name);
  }
  KeyBuilder kb(kNamespace);
  kb.add_string("platform.name", d.platform_name)
      .add_string("platform.version", d.platform_version)
      .add_string("device.name", d.device_name)
      .add_string("device.version", d.device_version)
      .add_string("device.driver_version", d.driver_version)
      .add_string("device.driver_library", d.driver_library)
      .add_list("options", split_options(p.options))
      .add_bytes("source", p.source)
      .add_map("headers", headers);
  KCACHE_TRY(auto on_disk, disk_headers(p));
  if (!on_disk.empty()) kb.add_map("disk_headers", on_disk);
  for (const auto& [var, value] : driver_flags()) kb.add_string("driver_env." + var, value);
  for (const auto& [k, v] : d.extra) kb.add_string("device.extra." + k, v);
  for (const auto& [k, v] : p.extra_key) kb.add_string("extra." + k, v);
  return kb.finish();
}

Status build_from_source(cl_context ctx, cl_device_id dev, const ProgramSource& p, cl_program* out, std::string* log) {
  *out = nullptr;
  const char* src = p.source.c_str();
  size_t len = p.source.size();
  cl_int err = CL_SUCCESS;
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, &len, &err);
  if (err != CL_SUCCESS || !prog) return Status(Errc::internal, cl_error(err, "clCreateProgramWithSource"));

  if (p.headers.empty()) {
    err = clBuildProgram(prog, 1, &dev, p.options.c_str(), nullptr, nullptr);
    std::string l = build_log(prog, dev);
    if (err != CL_SUCCESS) {
      clReleaseProgram(prog);
      return Status(Errc::compile_failed, cl_error(err, "clBuildProgram") + (l.empty() ? "" : "\n" + l));
    }
    if (log) *log = std::move(l);
    *out = prog;
    return Status();
  }

  // Headers come from memory: compile with embedded header programs, link.
  std::vector<cl_program> hdrs;
  std::vector<const char*> names;
  auto release_all = [&] {
    for (cl_program h : hdrs) clReleaseProgram(h);
    clReleaseProgram(prog);
  };
  for (const auto& h : p.headers) {
    const char* hs = h.contents.c_str();
    size_t hl = h.contents.size();
    cl_program hp = clCreateProgramWithSource(ctx, 1, &hs, &hl, &err);
    if (err != CL_SUCCESS || !hp) {
      release_all();
      return Status(Errc::internal, cl_error(err, "clCreateProgramWithSource(header " + h.name + ")"));
    }
    hdrs.push_back(hp);
    names.push_back(h.name.c_str());
  }
  err = clCompileProgram(prog, 1, &dev, p.options.c_str(), static_cast<cl_uint>(hdrs.size()), hdrs.data(), names.data(),
                         nullptr, nullptr);
  std::string l = build_log(prog, dev);
  if (err != CL_SUCCESS) {
    release_all();
    return Status(Errc::compile_failed, cl_error(err, "clCompileProgram") + (l.empty() ? "" : "\n" + l));
  }
  cl_program linked = clLinkProgram(ctx, 1, &dev, "", 1, &prog, nullptr, nullptr, &err);
  std::string ll = linked ? build_log(linked, dev) : std::string();
  release_all();
  if (err != CL_SUCCESS || !linked) {
    if (linked) clReleaseProgram(linked);
    return Status(Errc::compile_failed, cl_error(err, "clLinkProgram") + (ll.empty() ? "" : "\n" + ll));
  }
  if (log) *log = l.empty() ? ll : (ll.empty() ? l : l + "\n" + ll);
  *out = linked;
  return Status();
}

struct ProgramCache::Impl {
  Cache& cache;
  std::atomic<uint64_t> source_builds{0}, binary_loads{0}, refused{0}, failed{0};
  explicit Impl(Cache& c) : cache(c) {}

  // A source build, counted in the stats.
  Status source_build(cl_context ctx, cl_device_id dev, const ProgramSource& p, cl_program* out, std::string* log) {
    source_builds.fetch_add(1, std::memory_order_relaxed);
    Status st = build_from_source(ctx, dev, p, out, log);
    if (!st.is_ok()) failed.fetch_add(1, std::memory_order_relaxed);
    return st;
  }

  // Whether `p` still has the key it was built under, its headers on disk
  // read again after the build: one that changed during it may be in the
  // binary, which is then not what the key says.
  static bool key_held(const DeviceDescription& d, const ProgramSource& p, const KeyInfo& key) {
    auto after = program_key(d, p);
    return after && after->key == key.key;
  }

  // A source build that is not stored.
  Expected<BuildResult> uncached(cl_context ctx, cl_device_id dev, const ProgramSource& p) {
    BuildResult r;
    KCACHE_RETURN_IF_ERROR(source_build(ctx, dev, p, &r.program, &r.log));
    return r;
  }

  // A source build whose binary replaces whatever is stored under `key`.
  Expected<BuildResult> rebuild(cl_context ctx, cl_device_id dev, const DeviceDescription& d, const ProgramSource& p,
                                const KeyInfo& key) {
    uint64_t t0 = util::now_mono_us();
    KCACHE_TRY(BuildResult r, uncached(ctx, dev, p));
    r.key = key.key;
    r.fell_back = true;
    auto bin = program_binary(r.program);
    if (bin && !bin->empty() && key_held(d, p, key))
      cache.put(key, {{"binary", std::move(*bin)}, {"log", r.log}}, util::now_mono_us() - t0);
    return r;
  }

  Expected<BuildResult> build(cl_context ctx, cl_device_id dev, const DeviceDescription& d, const ProgramSource& p) {
    auto keyed = program_key(d, p);
    if (!keyed && keyed.error().code() == Errc::unavailable) {
      KCACHE_LOG(LogLevel::warn, "opencl: program built without the cache: %s", keyed.error().message().c_str());
      return uncached(ctx, dev, p);
    }
    KCACHE_TRY(KeyInfo key, std::move(keyed));
    cl_program built = nullptr;
    std::string built_log;
    bool headers_moved = false;
    auto compile = [&]() -> Expected<std::vector<Artifact>> {
      KCACHE_RETURN_IF_ERROR(source_build(ctx, dev, p, &built, &built_log));
      if (!key_held(d, p, key)) {
        headers_moved = true;
        return Status(Errc::unavailable, "a header on disk changed during the build");
      }
      auto bin = program_binary(built);
      std::vector<Artifact> arts;
      if (bin && !bin->empty()) {
        arts.push_back({"binary", std::move(*bin)});
      } else {
        KCACHE_LOG(LogLevel::warn, "opencl: no program binary to store: %s",
                   bin ? "the driver returned none" : bin.error().to_string().c_str());
      }
      arts.push_back({"log", built_log});
      return arts;
    };
    Source src = Source::compiled;
    auto e = cache.get_or_compile(key, compile, &src);
    if (!e && headers_moved && built) {
      KCACHE_LOG(LogLevel::warn, "opencl: program %s not stored: a header on disk changed during the build",
                 key.key.hex().c_str());
      BuildResult r;
      r.key = key.key;
      r.program = built;
      r.log = std::move(built_log);
      return r;
    }
    if (!e && e.error().code() == Errc::unavailable) {
      // Another thread's build of the program saw a header change: its
      // answer says nothing of this build, which runs without the cache.
      if (built) clReleaseProgram(built);
      return uncached(ctx, dev, p);
    }
    if (!e) {
      if (built) clReleaseProgram(built);
      return std::move(e).error();
    }
    BuildResult r;
    r.key = key.key;
    r.source = src;
    if (built) {  // this thread ran the source build
      r.program = built;
      r.log = std::move(built_log);
      return r;
    }
    auto bin = e->artifact("binary");
    if (!bin) return rebuild(ctx, dev, d, p, key);
    auto loaded = load_binary(ctx, dev, *bin, p.options);
    if (!loaded) {
      refused.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::warn, "opencl: stored binary %s refused (%s); building from source", key.key.hex().c_str(),
                 loaded.error().message().c_str());
      return rebuild(ctx, dev, d, p, key);
    }
    binary_loads.fetch_add(1, std::memory_order_relaxed);
    r.program = *loaded;
    r.log = std::string(e->artifact("log").value_or(""));
    return r;
  }
};

ProgramCache::ProgramCache(Cache& cache) : impl_(std::make_unique<Impl>(cache)) {}
ProgramCache::~ProgramCache() = default;

Expected<BuildResult> ProgramCache::build(cl_context ctx, cl_device_id dev, const ProgramSource& p) {
  KCACHE_TRY(DeviceDescription d, describe(dev));
  return impl_->build(ctx, dev, d, p);
}

Expected<BuildResult> ProgramCache::build(cl_context ctx, cl_device_id dev, const DeviceDescription& d,
                                          const ProgramSource& p) {
  return impl_->build(ctx, dev, d, p);
}

ProgramCacheStats ProgramCache::stats() const {
  ProgramCacheStats s;
  s.source_builds = impl_->source_builds.load(std::memory_order_relaxed);
  s.binary_loads = impl_->binary_loads.load(std::memory_order_relaxed);
  s.refused_binaries = impl_->refused.load(std::memory_order_relaxed);
  s.failed_builds = impl_->failed.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kcache::opencl

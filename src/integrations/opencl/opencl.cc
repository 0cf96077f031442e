// Cached OpenCL program builds. build(): key from the device description and
// the program; the Cache's get_or_compile either hands back a stored binary
// (loaded with clCreateProgramWithBinary + clBuildProgram) or runs the
// source build in this thread, whose program is returned directly (so a
// miss never builds twice) and whose binary is stored.
#include "kcache/opencl.h"

#include <mutex>

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
      .add_list("options", split_options(p.options))
      .add_bytes("source", p.source)
      .add_map("headers", headers);
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

  // A source build whose binary replaces whatever is stored under `key`.
  Expected<BuildResult> rebuild(cl_context ctx, cl_device_id dev, const ProgramSource& p, const KeyInfo& key) {
    BuildResult r;
    r.key = key.key;
    r.fell_back = true;
    uint64_t t0 = util::now_mono_us();
    source_builds.fetch_add(1, std::memory_order_relaxed);
    Status st = build_from_source(ctx, dev, p, &r.program, &r.log);
    if (!st.is_ok()) {
      failed.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
    auto bin = program_binary(r.program);
    if (bin && !bin->empty()) cache.put(key, {{"binary", std::move(*bin)}, {"log", r.log}}, util::now_mono_us() - t0);
    return r;
  }

  Expected<BuildResult> build(cl_context ctx, cl_device_id dev, const DeviceDescription& d, const ProgramSource& p) {
    KCACHE_TRY(KeyInfo key, program_key(d, p));
    cl_program built = nullptr;
    std::string built_log;
    auto compile = [&]() -> Expected<std::vector<Artifact>> {
      source_builds.fetch_add(1, std::memory_order_relaxed);
      Status st = build_from_source(ctx, dev, p, &built, &built_log);
      if (!st.is_ok()) {
        failed.fetch_add(1, std::memory_order_relaxed);
        return st;
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
    if (!bin) return rebuild(ctx, dev, p, key);
    auto loaded = load_binary(ctx, dev, *bin, p.options);
    if (!loaded) {
      refused.fetch_add(1, std::memory_order_relaxed);
      KCACHE_LOG(LogLevel::warn, "opencl: stored binary %s refused (%s); building from source", key.key.hex().c_str(),
                 loaded.error().message().c_str());
      return rebuild(ctx, dev, p, key);
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

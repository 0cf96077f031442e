// kcache/opencl.h — cached OpenCL program builds.
//
// A `opencl::ProgramCache` builds a `cl_program` for one device from source,
// options and named headers. On a miss it builds from source and stores the
// device binary (clGetProgramInfo CL_PROGRAM_BINARIES) plus the build log as
// one kcache Entry (artifacts "binary" and "log"). On a hit it recreates the
// program with clCreateProgramWithBinary and finishes it with clBuildProgram,
// which skips the front end (and, for drivers whose binaries hold machine
// code, the back end too).
//
// What the key covers (namespace "kcache.opencl/1"): the platform name and
// version, the device name and version, the driver version (all as the
// driver reports them), the build id of the driver's library (see
// DeviceDescription), the options split into words
// (kept in order: for OpenCL compilers a later option may override an
// earlier one), the source, every named header (name and contents), the
// headers it can read from disk (by contents) and the caller's `extra_key`.
// A driver rebuilt or updated under the same version strings is a miss
// through its library's build id. Libraries the driver loads later (its
// compiler: PoCL's device modules and LLVM) are covered only by what they
// put into those strings; if yours can change code generation without
// changing them, put their identity into `DeviceDescription::extra`.
//
// A binary the driver refuses (clCreateProgramWithBinary or clBuildProgram
// fails: a driver update that kept its version string, a corrupt store)
// never fails the build: the program is built from source, the stored entry
// is replaced, a counter moves and one warning is logged.
//
// Failures. A source build that fails returns Errc::compile_failed whose
// message holds the full build log. Failures are not stored, so a fixed
// header is used by the next call.
//
// Headers. With headers the program is compiled with clCompileProgram
// (headers passed as embedded header programs) and linked with
// clLinkProgram (OpenCL 1.2). Headers the compiler can read from disk are in
// the key by their contents (see disk_headers): every path an #include,
// #embed or __has_include of the source, of a named header or of a header
// found on disk can reach through the options' -I, -isystem, -iquote,
// -idirafter and --include-directory folders, CPATH, C_INCLUDE_PATH and
// CPLUS_INCLUDE_PATH, an absolute path, the including header's own folder,
// the working folder, or -include, -imacros and --include. A program with
// what cannot be followed without running the preprocessor (an #include
// through a macro) or an option that moves the search otherwise
// (-iprefix, -include-pch, -Xclang, @file, ...) is built without the
// cache (one log line), and so is one whose headers on disk change while
// it builds (the binary is returned, not stored). The driver's own default
// folders are not looked at: they belong to the driver's identity.
//
// Thread-safety: a ProgramCache may be used from many threads; concurrent
// builds of one program for one device build once (the Cache's
// single-flight). The OpenCL objects passed in must be usable from the
// calling thread, as the OpenCL spec allows for contexts and devices.
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/cache.h"
#include "kcache/key.h"
#include "kcache/status.h"

namespace kcache::opencl {

inline constexpr std::string_view kNamespace = "kcache.opencl/1";

// What identifies the compiler that builds for a device.
struct DeviceDescription {
  std::string platform_name;     // CL_PLATFORM_NAME
  std::string platform_version;  // CL_PLATFORM_VERSION
  std::string device_name;       // CL_DEVICE_NAME
  std::string device_version;    // CL_DEVICE_VERSION
  std::string driver_version;    // CL_DRIVER_VERSION
  // The driver's own library: the GNU build id of the loaded object that
  // holds the platform's ICD dispatch table (the first word of every ICD
  // object), else "file:" and the digest of that object's file; "" when no
  // loaded object holds it (the key then has the five strings alone).
  std::string driver_library;
  // Anything else that decides the binary (e.g. a digest of the driver's
  // library). Names are prefixed with "device.extra." in the manifest.
  std::map<std::string, std::string> extra;
};

// Queries the five strings and the driver's library above.
Expected<DeviceDescription> describe(cl_device_id device);

struct Header {
  std::string name;  // the name the source #includes it by
  std::string contents;
};

struct ProgramSource {
  std::string source;
  std::string options;                           // as for clBuildProgram
  std::vector<Header> headers;                   // REQUIRES: names distinct and non-empty
  std::map<std::string, std::string> extra_key;  // "extra." in the manifest
};

// The options string split into words (whitespace-separated; double quotes
// group), in the given order. This is what is hashed.
std::vector<std::string> split_options(std::string_view options);

// The headers on disk that building `program` can read: for each path an
// #include can reach (see Headers above; a directive inside a conditional
// counts too), the digest of its contents, or "absent". Empty when the
// options name no include folder or file and no such path exists.
// Errors: unavailable when an #include names its file through a macro, or
// a header cannot be read.
Expected<std::map<std::string, std::string>> disk_headers(const ProgramSource& program);

// The options the driver adds to every build from its environment, as
// variable → value, those set: POCL_EXTRA_BUILD_FLAGS, AMD_OCL_BUILD_OPTIONS,
// AMD_OCL_BUILD_OPTIONS_APPEND. In the key ("driver_env.<variable>"), and
// their include options followed as the program's.
std::map<std::string, std::string> driver_flags();

// The key of `program` built for a device described by `device`. Reads the
// headers on disk (disk_headers), and fails as it does.
Expected<KeyInfo> program_key(const DeviceDescription& device, const ProgramSource& program);

struct BuildResult {
  // A built program for the device. The caller owns it: clReleaseProgram.
  cl_program program = nullptr;
  Key key;
  Source source = Source::compiled;  // where the binary came from
  // True when a stored binary was refused and the program was rebuilt.
  bool fell_back = false;
  std::string log;  // build log (warnings) of the build that made the binary
};

struct ProgramCacheStats {
  uint64_t source_builds = 0;     // builds that ran the compiler
  uint64_t binary_loads = 0;      // programs made from a stored binary
  uint64_t refused_binaries = 0;  // stored binaries the driver refused
  uint64_t failed_builds = 0;     // source builds that failed
};

class ProgramCache {
 public:
  // REQUIRES: `cache` outlives the ProgramCache.
  explicit ProgramCache(Cache& cache);
  ~ProgramCache();
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // Builds `program` for `device` in `context`, through the cache.
  // REQUIRES: device belongs to context.
  Expected<BuildResult> build(cl_context context, cl_device_id device, const ProgramSource& program);
  // Same, with a description the caller already has (or wants to extend
  // with `extra`); it must describe `device`.
  Expected<BuildResult> build(cl_context context, cl_device_id device, const DeviceDescription& description,
                              const ProgramSource& program);

  ProgramCacheStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds from source with no cache (the baseline, and what a miss runs).
// On success the caller owns *out and it is built for `device`.
Status build_from_source(cl_context context, cl_device_id device, const ProgramSource& program, cl_program* out,
                         std::string* log);

}  // namespace kcache::opencl

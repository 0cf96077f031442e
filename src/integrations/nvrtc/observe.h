// What NVRTC itself reads during a compile, observed rather than guessed.
//
// At first use the recorder finds libnvrtc's image in this process (dladdr
// on nvrtcVersion, dl_iterate_phdr for its program headers), walks its
// dynamic relocations (DT_RELA and DT_JMPREL: R_X86_64_JUMP_SLOT,
// R_X86_64_GLOB_DAT, R_X86_64_64) and points the import slots of the file
// functions it calls (fopen, fopen64, open, __xstat, __lxstat, access,
// opendir, realpath, readlink, chdir, getcwd, getenv, dlopen; and fork,
// execv, execve, execvp, system, syscall, which mark the compile unseen,
// mkdir, unlink, rmdir, remove, which count as writes, and pthread_create)
// at wrappers here; slots on pages the loader made read-only (RELRO) are
// made writable for the write and given back their protection, one write
// at a time.
// Each wrapper calls the libc function the slot would have bound to
// (dlsym / dlvsym of the same name and version from the global scope, never
// the slot's old value, which under lazy binding is the PLT resolver) and,
// only on a thread inside a ScopedRecording (the thread kcache compiles
// on), appends what it saw. Other threads and other libraries are
// forwarded unchanged. dlopen is a tail jump, so the loader sees libnvrtc
// as its caller (its search path is NVRTC's own); the names NVRTC loads
// are noted for the whole process, since it loads libnvrtc-builtins only
// once.
//
// Works whether the host linked libnvrtc or loaded it with dlopen (the
// symbol kcache calls is the one whose image is patched). Linux x86-64
// only; elsewhere install_recorder() fails and programs compile without
// the cache.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kcache/status.h"

namespace kcache::nvrtc::detail {

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileId&) const = default;
};
FileId id_of(const struct stat& st);

struct Access {
  enum class Kind : uint8_t {
    opened,    // fopen / open for reading: the bytes count
    stated,    // stat / lstat / an open that failed other than ENOENT (never stored): existence counts
    probed,    // access(): whether it succeeds counts
    listed,    // opendir: the names in the folder count
    linked,    // readlink: the target counts
    resolved,  // realpath: the resolved path counts
    env,       // getenv: `path` is the variable's name, `target` its value when `found`
  };
  Kind kind = Kind::opened;
  std::string path;  // absolute (joined to the working folder of the access)
  bool found = false;
  bool has_id = false;  // `id` is the identity NVRTC saw (opened / stated and found)
  FileId id;
  std::string target;  // linked / resolved: what NVRTC got
};

struct Recording {
  std::string cwd;  // the working folder at the start
  std::vector<Access> accesses;
  bool cwd_changed = false;  // NVRTC called chdir
  bool cwd_used = false;     // NVRTC asked getcwd, or named a relative path: the working folder is an input
  bool wrote = false;        // NVRTC opened a file for writing
  int64_t start_ns = 0;      // wall clock when the recording began (0: unknown)
  bool hooks_lost = false;   // a patched slot was found rebound at the end (lazy binding on another thread)
  // Why some of what NVRTC read was not seen (a thread or child it
  // started, a raw system call, a wrapper reached on an unrecorded thread
  // meanwhile); nullptr: none.
  const char* escaped = nullptr;
  // The first path whose open or stat failed other than ENOENT / ENOTDIR
  // (EACCES, ELOOP, ...): what NVRTC made of it is not known.
  std::string unreadable;
};

// Patches libnvrtc's import slots, once per process. OK, or why the
// accesses cannot be observed (then nothing may be cached).
const Status& install_recorder();

// While alive, NVRTC's accesses on this thread go to `r`.
// REQUIRES: install_recorder() is OK.
class ScopedRecording {
 public:
  explicit ScopedRecording(Recording* r);
  // Checks every patched slot again: one written over while recording
  // (the lazy resolver on another thread) sets `hooks_lost` and is patched
  // again.
  ~ScopedRecording();
  ScopedRecording(const ScopedRecording&) = delete;
  ScopedRecording& operator=(const ScopedRecording&) = delete;

 private:
  Recording* rec_;
  Recording* prev_;
  uint64_t unseen_at_ = 0;
};

// A library NVRTC loaded in this process: the name it passed to dlopen and
// the file the loader mapped (empty when the load failed).
struct Load {
  std::string name;
  std::string path;
};
// Every library NVRTC asked dlopen for in this process (any thread), and a
// libnvrtc-builtins that was loaded before the recorder was installed.
std::vector<Load> nvrtc_loads();
// The file dlopen(name) from libnvrtc maps now: the object of that name
// already loaded, else the first along libnvrtc's search path (dlinfo
// RTLD_DI_SERINFO: LD_LIBRARY_PATH, run paths, system folders); empty when
// none has it (the loader's cache may still find one: see `fallback`).
std::string resolve_library(const std::string& name, const std::string& fallback);

// Every environment variable NVRTC asked for on a recording thread in this
// process (some it asks for once, at its first compile), sorted.
std::vector<std::string> nvrtc_env_names();

// Compiles run with the recorder on since the process began; for tests
// (how many times NVRTC ran for the cache).
uint64_t recorded_compiles() noexcept;

// The libc functions whose libnvrtc import slots were pointed here.
std::vector<std::string> hooked_functions();

// For tests: writes libc's functions back into every patched slot, as the
// lazy resolver on another thread would.
void rebind_slots_for_test();

}  // namespace kcache::nvrtc::detail

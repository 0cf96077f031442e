// The recorder of NVRTC's file accesses (observe.h): libnvrtc's import
// slots pointed at wrappers that forward to libc and note what NVRTC asked
// for on the thread kcache compiles on.
// One concept: the wrappers, the calls that escape them, the slots written
// in libnvrtc's image and what NVRTC loads are one table of hooks.
#include "integrations/nvrtc/observe.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <nvrtc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "util/util.h"

namespace kcache::nvrtc::detail {

FileId id_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size, int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          int64_t(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

}  // namespace kcache::nvrtc::detail

#if defined(__x86_64__) && defined(__linux__)

// dlopen's wrapper is a tail jump: the loader takes the caller's return
// address to choose the search path (the caller's run path), so the return
// address must stay libnvrtc's. The note is taken first, registers saved.
extern "C" {
__attribute__((visibility("hidden"))) void* kcache_nvrtc_real_dlopen = nullptr;
__attribute__((visibility("hidden"))) void kcache_nvrtc_note_dlopen(const char* name) noexcept;
__attribute__((visibility("hidden"))) void* kcache_nvrtc_dlopen_hook(const char* name, int flags);
}
asm(R"(
    .text
    .p2align 4
    .globl kcache_nvrtc_dlopen_hook
    .hidden kcache_nvrtc_dlopen_hook
    .type kcache_nvrtc_dlopen_hook, @function
kcache_nvrtc_dlopen_hook:
    .cfi_startproc
    push %rdi
    .cfi_adjust_cfa_offset 8
    push %rsi
    .cfi_adjust_cfa_offset 8
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    call kcache_nvrtc_note_dlopen
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    pop %rsi
    .cfi_adjust_cfa_offset -8
    pop %rdi
    .cfi_adjust_cfa_offset -8
    jmp *kcache_nvrtc_real_dlopen(%rip)
    .cfi_endproc
    .size kcache_nvrtc_dlopen_hook, .-kcache_nvrtc_dlopen_hook
)");

namespace kcache::nvrtc::detail {
namespace {

thread_local Recording* t_rec = nullptr;
std::atomic<uint64_t> g_recorded{0};
// Recordings alive in the process, and the calls into the wrappers made
// meanwhile on threads with none (NVRTC's own threads, or an unrecorded
// compile beside a recorded one): a recording they overlap is not stored.
std::atomic<int> g_live{0};
std::atomic<uint64_t> g_unseen{0};

void unseen() {
  if (g_live.load() > 0) g_unseen.fetch_add(1);
}

// ---- the real functions ------------------------------------------------------

using fopen_fn = FILE* (*)(const char*, const char*);
using open_fn = int (*)(const char*, int, ...);
using xstat_fn = int (*)(int, const char*, struct stat*);
using access_fn = int (*)(const char*, int);
using opendir_fn = DIR* (*)(const char*);
using realpath_fn = char* (*)(const char*, char*);
using readlink_fn = ssize_t (*)(const char*, char*, size_t);
using chdir_fn = int (*)(const char*);
using getcwd_fn = char* (*)(char*, size_t);

fopen_fn real_fopen, real_fopen64;
open_fn real_open;
xstat_fn real_xstat, real_lxstat;
access_fn real_access;
opendir_fn real_opendir;
realpath_fn real_realpath;
readlink_fn real_readlink;
chdir_fn real_chdir;
getcwd_fn real_getcwd;

std::string absolute(const Recording& r, const char* path) {
  if (!path) return std::string();
  if (path[0] == '/' || r.cwd.empty()) return path;
  std::string out = r.cwd;
  if (out.back() != '/') out += '/';
  return out + path;
}

void note(Access::Kind kind, const char* path, bool found, const struct stat* st = nullptr,
          const char* target = nullptr) {
  Recording* r = t_rec;
  if (!r || !path) return;
  int saved = errno;
  if (path[0] != '/') r->cwd_used = true;
  try {
    Access a;
    a.kind = kind;
    a.path = absolute(*r, path);
    a.found = found;
    if (st) {
      a.has_id = true;
      a.id = id_of(*st);
    }
    if (target) a.target = target;
    r->accesses.push_back(std::move(a));
  } catch (...) {
    r->wrote = true;  // nothing kept can be trusted: never stored
  }
  errno = saved;
}

bool absent_errno(int e) { return e == ENOENT || e == ENOTDIR; }

// An open or stat on the recording thread that failed other than absent.
void unreadable(const char* path) {
  Recording* r = t_rec;
  if (!r || !path || !r->unreadable.empty()) return;
  int saved = errno;
  try {
    r->unreadable = absolute(*r, path);
  } catch (...) {
    r->wrote = true;  // never stored
  }
  errno = saved;
}

bool writes_mode(const char* mode) { return mode && (std::strpbrk(mode, "wa+") != nullptr); }

void noted_open(int fd, const char* path) {
  if (fd >= 0) {
    struct stat st;
    if (::fstat(fd, &st) == 0) note(Access::Kind::opened, path, true, &st);
    return;
  }
  int e = errno;
  note(absent_errno(e) ? Access::Kind::opened : Access::Kind::stated, path, !absent_errno(e));
  if (!absent_errno(e)) unreadable(path);
  errno = e;
}

FILE* do_fopen(fopen_fn real, const char* path, const char* mode) {
  FILE* f = real(path, mode);
  if (!t_rec) return unseen(), f;
  if (writes_mode(mode)) {
    t_rec->wrote = true;
    return f;
  }
  int e = errno;
  noted_open(f ? ::fileno(f) : -1, path);
  errno = e;
  return f;
}

FILE* w_fopen(const char* path, const char* mode) { return do_fopen(real_fopen, path, mode); }
FILE* w_fopen64(const char* path, const char* mode) { return do_fopen(real_fopen64, path, mode); }

int w_open(const char* path, int flags, ...) {
  unsigned mode = 0;
  if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, unsigned);
    va_end(ap);
  }
  int fd = real_open(path, flags, mode);
  if (!t_rec) return unseen(), fd;
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC))) {
    t_rec->wrote = true;
    return fd;
  }
  int e = errno;
  noted_open(fd, path);
  errno = e;
  return fd;
}

int do_xstat(xstat_fn real, int ver, const char* path, struct stat* st) {
  int rc = real(ver, path, st);
  if (!t_rec) return unseen(), rc;
  int e = errno;
  note(Access::Kind::stated, path, rc == 0 || !absent_errno(e), rc == 0 ? st : nullptr);
  if (rc != 0 && !absent_errno(e)) unreadable(path);
  errno = e;
  return rc;
}
int w_xstat(int ver, const char* path, struct stat* st) { return do_xstat(real_xstat, ver, path, st); }
int w_lxstat(int ver, const char* path, struct stat* st) { return do_xstat(real_lxstat, ver, path, st); }

int w_access(const char* path, int mode) {
  int rc = real_access(path, mode);
  if (!t_rec) return unseen(), rc;
  note(Access::Kind::probed, path, rc == 0);
  return rc;
}

DIR* w_opendir(const char* path) {
  DIR* d = real_opendir(path);
  if (!t_rec) return unseen(), d;
  note(Access::Kind::listed, path, d != nullptr);
  return d;
}

char* w_realpath(const char* path, char* resolved) {
  char* out = real_realpath(path, resolved);
  if (!t_rec) return unseen(), out;
  note(Access::Kind::resolved, path, out != nullptr, nullptr, out);
  return out;
}

ssize_t w_readlink(const char* path, char* buf, size_t n) {
  ssize_t rc = real_readlink(path, buf, n);
  if (!t_rec) unseen();
  if (t_rec) {
    int e = errno;
    std::string target = rc >= 0 ? std::string(buf, static_cast<size_t>(rc)) : std::string();
    note(Access::Kind::linked, path, rc >= 0, nullptr, target.c_str());
    errno = e;
  }
  return rc;
}

int w_chdir(const char* path) {
  int rc = real_chdir(path);
  if (!t_rec) unseen();
  if (t_rec && rc == 0) {
    int e = errno;
    t_rec->cwd_changed = true;
    char buf[PATH_MAX];
    if (::getcwd(buf, sizeof buf)) t_rec->cwd = buf;
    errno = e;
  }
  return rc;
}

char* w_getcwd(char* buf, size_t n) {
  char* out = real_getcwd(buf, n);
  if (!t_rec) unseen();
  if (t_rec) t_rec->cwd_used = true;
  return out;
}

// The environment variables NVRTC asks for on the recording thread: their
// values are inputs.
using getenv_fn = char* (*)(const char*);
getenv_fn real_getenv;
std::mutex g_env_mu;
std::set<std::string> g_env_names;  // GUARDED_BY(g_env_mu)

char* w_getenv(const char* name) {
  char* v = real_getenv(name);
  Recording* r = t_rec;
  if (!name) return v;
  if (!r) {
    // Another thread of NVRTC's (-split-compile's workers ask too) while a
    // recording is alive: the name is keyed, with its value at the end.
    if (g_live.load() > 0) {
      try {
        std::lock_guard lk(g_env_mu);
        g_env_names.insert(name);
      } catch (...) {
        unseen();
      }
    }
    return v;
  }
  int saved = errno;
  try {
    Access a;
    a.kind = Access::Kind::env;
    a.path = name;
    a.found = v != nullptr;
    if (v) a.target = v;
    {
      std::lock_guard lk(g_env_mu);
      g_env_names.insert(a.path);
    }
    r->accesses.push_back(std::move(a));
  } catch (...) {
    r->wrote = true;  // never stored
  }
  errno = saved;
  return v;
}

// ---- calls that leave what the recorder sees ----------------------------------

// A thread NVRTC starts, a child it forks or runs, a raw syscall: what they
// read is not seen, so the compile is not stored. Folders made or names
// removed are writes.
void escaped(const char* what) {
  if (Recording* r = t_rec; r && !r->escaped) r->escaped = what;
}

using pthread_create_fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
using fork_fn = pid_t (*)();
using execv_fn = int (*)(const char*, char* const[]);
using execve_fn = int (*)(const char*, char* const[], char* const[]);
using system_fn = int (*)(const char*);
using syscall_fn = long (*)(long, ...);
using mkdir_fn = int (*)(const char*, mode_t);
using unlink_fn = int (*)(const char*);

pthread_create_fn real_pthread_create;
fork_fn real_fork;
execv_fn real_execv, real_execvp;
execve_fn real_execve;
system_fn real_system;
syscall_fn real_syscall;
mkdir_fn real_mkdir;
unlink_fn real_unlink, real_rmdir, real_remove;

// A thread NVRTC starts (-split-compile's workers) is not recorded, but its
// file calls reach the same wrappers and, while a recording is alive, mark
// it unseen (`unseen()`): starting one is no reason to refuse.
int w_pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  return real_pthread_create(t, attr, fn, arg);
}
// A child, or a program run: on the recording thread the compile is unseen;
// on another, any live recording is.
void left(const char* what) {
  if (t_rec)
    escaped(what);
  else
    unseen();
}
pid_t w_fork() {
  left("NVRTC forked");
  return real_fork();
}
int w_execv(const char* path, char* const argv[]) {
  left("NVRTC ran a program");
  return real_execv(path, argv);
}
int w_execvp(const char* file, char* const argv[]) {
  left("NVRTC ran a program");
  return real_execvp(file, argv);
}
int w_execve(const char* path, char* const argv[], char* const envp[]) {
  left("NVRTC ran a program");
  return real_execve(path, argv, envp);
}
int w_system(const char* cmd) {
  left("NVRTC ran a program");
  return real_system(cmd);
}

// System calls that reach no file and start nothing.
bool harmless_syscall(long n) {
  switch (n) {
    case SYS_gettid:
    case SYS_getpid:
    case SYS_futex:
    case SYS_getrandom:
    case SYS_sched_yield:
    case SYS_sched_getaffinity:
    case SYS_clock_gettime:
    case SYS_gettimeofday:
    case SYS_membarrier:
    case SYS_madvise:
    case SYS_mmap:
    case SYS_munmap:
    case SYS_mprotect:
    case SYS_getrlimit:
    case SYS_prlimit64:
    case SYS_uname:
    case SYS_sysinfo:
    case SYS_get_mempolicy:
    case SYS_getcpu:
    case SYS_rseq:
    case SYS_set_robust_list:
    case SYS_rt_sigprocmask:
    case SYS_tgkill:
      return true;
    default:
      return false;
  }
}

long w_syscall(long n, ...) {
  // Six arguments, as the kernel takes: the ones not passed are unused.
  va_list ap;
  va_start(ap, n);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);
  va_end(ap);
  if (!harmless_syscall(n)) left("NVRTC made a system call the recorder does not follow");
  return real_syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int w_mkdir(const char* path, mode_t mode) {
  if (t_rec)
    t_rec->wrote = true;
  else
    unseen();
  return real_mkdir(path, mode);
}
int w_unlink(const char* path) {
  if (t_rec)
    t_rec->wrote = true;
  else
    unseen();
  return real_unlink(path);
}
int w_rmdir(const char* path) {
  if (t_rec)
    t_rec->wrote = true;
  else
    unseen();
  return real_rmdir(path);
}
int w_remove(const char* path) {
  if (t_rec)
    t_rec->wrote = true;
  else
    unseen();
  return real_remove(path);
}

// ---- the libraries NVRTC loads -------------------------------------------------

std::mutex g_loads_mu;
std::vector<std::string> g_load_names;  // GUARDED_BY(g_loads_mu)

// ---- the hooks -----------------------------------------------------------------

struct Hook {
  const char* name;
  const char* version;  // nullptr: the default version
  void* wrapper;
  void** real;
};

template <class F>
void** slot(F* f) {
  return reinterpret_cast<void**>(f);
}

const Hook kHooks[] = {
    {"fopen", nullptr, reinterpret_cast<void*>(&w_fopen), slot(&real_fopen)},
    {"fopen64", nullptr, reinterpret_cast<void*>(&w_fopen64), slot(&real_fopen64)},
    {"open", nullptr, reinterpret_cast<void*>(&w_open), slot(&real_open)},
    {"open64", nullptr, reinterpret_cast<void*>(&w_open), slot(&real_open)},
    {"__xstat", "GLIBC_2.2.5", reinterpret_cast<void*>(&w_xstat), slot(&real_xstat)},
    {"__xstat64", "GLIBC_2.2.5", reinterpret_cast<void*>(&w_xstat), slot(&real_xstat)},
    {"__lxstat", "GLIBC_2.2.5", reinterpret_cast<void*>(&w_lxstat), slot(&real_lxstat)},
    {"__lxstat64", "GLIBC_2.2.5", reinterpret_cast<void*>(&w_lxstat), slot(&real_lxstat)},
    {"access", nullptr, reinterpret_cast<void*>(&w_access), slot(&real_access)},
    {"opendir", nullptr, reinterpret_cast<void*>(&w_opendir), slot(&real_opendir)},
    {"realpath", nullptr, reinterpret_cast<void*>(&w_realpath), slot(&real_realpath)},
    {"readlink", nullptr, reinterpret_cast<void*>(&w_readlink), slot(&real_readlink)},
    {"chdir", nullptr, reinterpret_cast<void*>(&w_chdir), slot(&real_chdir)},
    {"getcwd", nullptr, reinterpret_cast<void*>(&w_getcwd), slot(&real_getcwd)},
    {"dlopen", nullptr, reinterpret_cast<void*>(&kcache_nvrtc_dlopen_hook), &kcache_nvrtc_real_dlopen},
    {"getenv", nullptr, reinterpret_cast<void*>(&w_getenv), slot(&real_getenv)},
    {"pthread_create", nullptr, reinterpret_cast<void*>(&w_pthread_create), slot(&real_pthread_create)},
    {"fork", nullptr, reinterpret_cast<void*>(&w_fork), slot(&real_fork)},
    {"execv", nullptr, reinterpret_cast<void*>(&w_execv), slot(&real_execv)},
    {"execvp", nullptr, reinterpret_cast<void*>(&w_execvp), slot(&real_execvp)},
    {"execve", nullptr, reinterpret_cast<void*>(&w_execve), slot(&real_execve)},
    {"system", nullptr, reinterpret_cast<void*>(&w_system), slot(&real_system)},
    {"syscall", nullptr, reinterpret_cast<void*>(&w_syscall), slot(&real_syscall)},
    {"mkdir", nullptr, reinterpret_cast<void*>(&w_mkdir), slot(&real_mkdir)},
    {"unlink", nullptr, reinterpret_cast<void*>(&w_unlink), slot(&real_unlink)},
    {"rmdir", nullptr, reinterpret_cast<void*>(&w_rmdir), slot(&real_rmdir)},
    {"remove", nullptr, reinterpret_cast<void*>(&w_remove), slot(&real_remove)},
};

// Import functions libnvrtc may call that reach files and that no wrapper
// covers: their presence refuses the recorder (a newer NVRTC calling
// openat or statx would otherwise read files unseen).
const char* const kUnhooked[] = {
    "openat",    "openat64",   "stat",    "stat64",      "lstat",        "lstat64",   "fstatat", "__fxstatat",
    "faccessat", "statx",      "scandir", "fdopendir",   "freopen",      "freopen64", "creat",   "truncate",
    "__open_2",  "__openat_2", "ftw",     "nftw",        "vfork",        "clone",     "execl",   "execlp",
    "execle",    "execvpe",    "fexecve", "posix_spawn", "posix_spawnp", "popen",     "rename",  "renameat",
    "mkdirat",   "unlinkat",   "chmod",   "link",        "symlink"};

struct Patched {
  void** at;
  void* value;
  void* real;  // what the loader binds the slot to
};

std::once_flag g_once;
Status g_status;
std::vector<Patched> g_patched;            // written once, under g_once
std::vector<std::string> g_hooked;         // names, sorted
uintptr_t g_relro_lo = 0, g_relro_hi = 0;  // libnvrtc's RELRO range
std::string g_nvrtc_path;

std::mutex g_slot_mu;  // one slot write at a time (each makes a page writable and read-only again)

// The protection of the mapping holding `a` (from /proc/self/maps); -1
// when not found.
int protection_of(uintptr_t a) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return -1;
  int prot = -1;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (a < lo || a >= hi) continue;
    prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) | (perms[2] == 'x' ? PROT_EXEC : 0);
    break;
  }
  std::fclose(f);
  return prot;
}

// Writes `value` into the slot `at`. The loader makes read-only only the
// whole pages of libnvrtc's RELRO range ([page_down(lo), page_down(hi)));
// a slot on such a page that is not writable now is made writable for the
// write, and its page given back the protection it had.
bool write_slot(void** at, void* value) {
  std::lock_guard lk(g_slot_mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(at);
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto down = [&](uintptr_t x) { return x & ~(page - 1); };
  const bool relro = a >= down(g_relro_lo) && a < down(g_relro_hi);
  int prot = relro ? protection_of(a) : -1;
  if (relro && prot < 0) prot = PROT_READ;  // as the loader left it
  const bool unprotect = relro && !(prot & PROT_WRITE);
  void* p = reinterpret_cast<void*>(down(a));
  if (unprotect && ::mprotect(p, page, prot | PROT_WRITE) != 0) return false;
  __atomic_store_n(at, value, __ATOMIC_SEQ_CST);
  if (unprotect) (void)::mprotect(p, page, prot);
  return true;
}

struct Image {
  uintptr_t target = 0;  // an address inside it
  const ElfW(Phdr) * phdr = nullptr;
  size_t phnum = 0;
  uintptr_t bias = 0;
  std::string name;
};

int find_image(struct dl_phdr_info* info, size_t, void* data) {
  auto* im = static_cast<Image*>(data);
  for (size_t i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (im->target >= lo && im->target < lo + ph.p_memsz) {
      im->phdr = info->dlpi_phdr;
      im->phnum = info->dlpi_phnum;
      im->bias = info->dlpi_addr;
      im->name = info->dlpi_name ? info->dlpi_name : "";
      return 1;
    }
  }
  return 0;
}

int find_builtins(struct dl_phdr_info* info, size_t, void* data) {
  const char* n = info->dlpi_name;
  const char* base = n ? std::strrchr(n, '/') : nullptr;
  base = base ? base + 1 : n;
  if (base && std::strncmp(base, "libnvrtc-builtins", 17) == 0)
    static_cast<std::vector<Load>*>(data)->push_back({base, n});
  return 0;
}

Status install() {
  Image im;
  im.target = reinterpret_cast<uintptr_t>(&nvrtcVersion);
  if (!::dl_iterate_phdr(find_image, &im)) return Status(Errc::unavailable, "nvrtc: libnvrtc's image is not found");
  g_nvrtc_path = im.name;
  const ElfW(Dyn)* dyn = nullptr;
  for (size_t i = 0; i < im.phnum; ++i) {
    if (im.phdr[i].p_type == PT_DYNAMIC) dyn = reinterpret_cast<const ElfW(Dyn)*>(im.bias + im.phdr[i].p_vaddr);
    if (im.phdr[i].p_type == PT_GNU_RELRO) {
      g_relro_lo = im.bias + im.phdr[i].p_vaddr;
      g_relro_hi = g_relro_lo + im.phdr[i].p_memsz;
    }
  }
  if (!dyn) return Status(Errc::unavailable, "nvrtc: libnvrtc has no dynamic section");
  // The loader relocates these in place on x86-64; an unrelocated value is
  // an offset from the load bias.
  auto addr = [&](ElfW(Addr) v) { return v < im.bias ? im.bias + v : v; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)* rela = nullptr, *jmprel = nullptr;
  size_t relasz = 0, pltrelsz = 0;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symtab = reinterpret_cast<const ElfW(Sym)*>(addr(d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        strtab = reinterpret_cast<const char*>(addr(d->d_un.d_ptr));
        break;
      case DT_RELA:
        rela = reinterpret_cast<const ElfW(Rela)*>(addr(d->d_un.d_ptr));
        break;
      case DT_RELASZ:
        relasz = d->d_un.d_val;
        break;
      case DT_JMPREL:
        jmprel = reinterpret_cast<const ElfW(Rela)*>(addr(d->d_un.d_ptr));
        break;
      case DT_PLTRELSZ:
        pltrelsz = d->d_un.d_val;
        break;
      case DT_PLTREL:
        if (d->d_un.d_val != DT_RELA)
          return Status(Errc::unavailable, "nvrtc: libnvrtc's PLT relocations are not RELA");
        break;
      default:
        break;
    }
  }
  if (!symtab || !strtab) return Status(Errc::unavailable, "nvrtc: libnvrtc has no dynamic symbols");
  // The object holding the wrappers stays mapped as long as libnvrtc does:
  // a dlclose of it would leave libnvrtc's slots pointing at unmapped code.
  // (In the main program it is never unloaded.)
  Image self;
  self.target = reinterpret_cast<uintptr_t>(&w_fopen);
  if (!::dl_iterate_phdr(find_image, &self))
    return Status(Errc::unavailable, "nvrtc: the recorder's own image is not found");
  if (!self.name.empty() && !::dlopen(self.name.c_str(), RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE))
    return Status(Errc::unavailable, "nvrtc: the recorder's library " + self.name + " cannot be kept loaded");
  for (const Hook& h : kHooks) {
    void* real = h.version ? ::dlvsym(RTLD_DEFAULT, h.name, h.version) : nullptr;
    if (!real) real = ::dlsym(RTLD_DEFAULT, h.name);
    if (real && !*h.real) *h.real = real;
  }
  std::set<std::string> hooked;
  std::vector<Patched> todo;
  for (auto [table, size] : {std::pair{rela, relasz}, std::pair{jmprel, pltrelsz}}) {
    if (!table) continue;
    for (size_t i = 0; i < size / sizeof(ElfW(Rela)); ++i) {
      const ElfW(Rela)& r = table[i];
      uint32_t type = ELF64_R_TYPE(r.r_info);
      if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT && type != R_X86_64_64) continue;
      uint32_t sym = ELF64_R_SYM(r.r_info);
      if (sym == 0) continue;
      const char* name = strtab + symtab[sym].st_name;
      if (symtab[sym].st_shndx != SHN_UNDEF) continue;  // libnvrtc's own definition
      for (const char* u : kUnhooked)
        if (std::strcmp(name, u) == 0)
          return Status(Errc::unavailable, std::string("nvrtc: libnvrtc imports ") + name + ", which is not observed");
      for (const Hook& h : kHooks) {
        if (std::strcmp(name, h.name) != 0) continue;
        if (!*h.real) return Status(Errc::unavailable, std::string("nvrtc: libc's ") + name + " is not found");
        const ElfW(Sxword) addend = type == R_X86_64_64 ? r.r_addend : 0;
        todo.push_back({reinterpret_cast<void**>(im.bias + r.r_offset), static_cast<char*>(h.wrapper) + addend,
                        static_cast<char*>(*h.real) + addend});
        hooked.insert(name);
      }
    }
  }
  // Builtins loaded before now (the host compiled with NVRTC first).
  std::vector<Load> early;
  ::dl_iterate_phdr(find_builtins, &early);
  {
    std::lock_guard lk(g_loads_mu);
    for (auto& l : early) g_load_names.push_back(l.name);
  }
  for (const auto& p : todo)
    if (!write_slot(p.at, p.value)) return util::errno_status(errno, "nvrtc: mprotect of libnvrtc's import table");
  g_patched = std::move(todo);
  g_hooked.assign(hooked.begin(), hooked.end());
  return Status();
}

}  // namespace
}  // namespace kcache::nvrtc::detail

extern "C" void kcache_nvrtc_note_dlopen(const char* name) noexcept {
  using namespace kcache::nvrtc::detail;
  if (!name) return;
  try {
    std::lock_guard lk(g_loads_mu);
    if (std::find(g_load_names.begin(), g_load_names.end(), name) == g_load_names.end())
      g_load_names.emplace_back(name);
  } catch (...) {}
}

namespace kcache::nvrtc::detail {

const Status& install_recorder() {
  std::call_once(g_once, [] {
    g_status = install();
    if (!g_status.is_ok())
      KCACHE_LOG(LogLevel::warn, "%s; NVRTC compiles without the cache", g_status.to_string().c_str());
  });
  return g_status;
}

// Whether every patched slot still points at its wrapper; the ones that do
// not are patched again. A slot resolved lazily by another thread while
// install() patched it is written over by the resolver (libnvrtc is not
// linked with BIND_NOW).
namespace {
bool repair_slots() {
  bool intact = true;
  for (const auto& p : g_patched) {
    if (__atomic_load_n(p.at, __ATOMIC_ACQUIRE) == p.value) continue;
    intact = false;
    (void)write_slot(p.at, p.value);
  }
  return intact;
}
}  // namespace

ScopedRecording::ScopedRecording(Recording* r) : rec_(r), prev_(t_rec) {
  (void)repair_slots();
  if (r->cwd.empty()) {
    char buf[PATH_MAX];
    if (::getcwd(buf, sizeof buf)) r->cwd = buf;
  }
  if (r->start_ns == 0) {
    struct timespec ts;
    ::clock_gettime(CLOCK_REALTIME, &ts);
    r->start_ns = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  g_live.fetch_add(1);
  unseen_at_ = g_unseen.load();
  t_rec = r;
  g_recorded.fetch_add(1, std::memory_order_relaxed);
}

ScopedRecording::~ScopedRecording() {
  t_rec = prev_;
  if (g_unseen.load() != unseen_at_ && !rec_->escaped)
    rec_->escaped = "NVRTC reached files on a thread kcache does not record (its own, or an unrecorded compile beside)";
  g_live.fetch_sub(1);
  // A slot rebound during the compile: some calls went to libc unseen.
  if (!repair_slots()) rec_->hooks_lost = true;
}

void rebind_slots_for_test() {
  (void)install_recorder();
  for (const auto& p : g_patched) (void)write_slot(p.at, p.real);
}

std::vector<Load> nvrtc_loads() {
  std::vector<std::string> names;
  {
    std::lock_guard lk(g_loads_mu);
    names = g_load_names;
  }
  std::vector<Load> out;
  for (const auto& n : names) {
    Load l{n, std::string()};
    if (void* h = ::dlopen(n.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
      struct link_map* lm = nullptr;
      if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) l.path = lm->l_name;
      ::dlclose(h);
    }
    out.push_back(std::move(l));
  }
  return out;
}

// The loader's counts of objects loaded and unloaded: while both stay, the
// set of loaded objects is the same.
struct LoadCounts {
  unsigned long long adds = 0, subs = 0;
  bool operator==(const LoadCounts&) const = default;
};
int first_counts(struct dl_phdr_info* info, size_t, void* data) {
  *static_cast<LoadCounts*>(data) = {info->dlpi_adds, info->dlpi_subs};
  return 1;
}

struct Resolved {
  std::string path;
  bool loaded = false;
  LoadCounts counts;
  uint64_t at_us = 0;
};

std::string resolve_library(const std::string& name, const std::string& fallback) {
  if (name.find('/') != std::string::npos) return name;
  // Answers are kept while nothing was loaded or unloaded: a loaded one for
  // as long, one found along the search for a second (the re-check period
  // of a watched manifest; the search stats every folder of the path).
  static std::mutex memo_mu;
  static std::map<std::pair<std::string, std::string>, Resolved> memo;
  LoadCounts counts;
  ::dl_iterate_phdr(first_counts, &counts);
  const uint64_t now = util::now_mono_us();
  {
    std::lock_guard lk(memo_mu);
    auto it = memo.find({name, fallback});
    if (it != memo.end() && it->second.counts == counts && (it->second.loaded || now - it->second.at_us < 1'000'000))
      return it->second.path;
  }
  auto keep = [&](std::string path, bool loaded) {
    std::lock_guard lk(memo_mu);
    if (memo.size() > 64) memo.clear();
    memo[{name, fallback}] = Resolved{path, loaded, counts, now};
    return path;
  };
  if (void* h = ::dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
    std::string path;
    struct link_map* lm = nullptr;
    if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) path = lm->l_name;
    ::dlclose(h);
    return keep(path, true);
  }
  // Not loaded: the first folder of libnvrtc's search that has it.
  void* self = g_nvrtc_path.empty() ? nullptr : ::dlopen(g_nvrtc_path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  std::string found;
  if (self) {
    Dl_serinfo size;
    if (::dlinfo(self, RTLD_DI_SERINFOSIZE, &size) == 0) {
      std::vector<char> buf(size.dls_size);
      auto* info = reinterpret_cast<Dl_serinfo*>(buf.data());
      info->dls_size = size.dls_size;
      info->dls_cnt = size.dls_cnt;
      if (::dlinfo(self, RTLD_DI_SERINFO, info) == 0) {
        for (unsigned i = 0; i < info->dls_cnt && found.empty(); ++i) {
          std::string p = std::string(info->dls_serpath[i].dls_name) + "/" + name;
          struct stat st;
          if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) found = p;
        }
      }
    }
    ::dlclose(self);
  }
  if (found.empty()) {
    struct stat st;
    if (!fallback.empty() && ::stat(fallback.c_str(), &st) == 0) found = fallback;
  }
  return keep(found, false);
}

uint64_t recorded_compiles() noexcept { return g_recorded.load(std::memory_order_relaxed); }

std::vector<std::string> nvrtc_env_names() {
  std::lock_guard lk(g_env_mu);
  return {g_env_names.begin(), g_env_names.end()};
}

std::vector<std::string> hooked_functions() {
  (void)install_recorder();
  return g_hooked;
}

}  // namespace kcache::nvrtc::detail

#else  // not Linux x86-64

namespace kcache::nvrtc::detail {
const Status& install_recorder() {
  static const Status s(Errc::unavailable, "nvrtc: file accesses are observed on Linux x86-64 only");
  return s;
}
ScopedRecording::ScopedRecording(Recording* r) : rec_(r), prev_(r) {}
ScopedRecording::~ScopedRecording() = default;
void rebind_slots_for_test() {}
std::vector<Load> nvrtc_loads() { return {}; }
std::string resolve_library(const std::string& name, const std::string&) { return name; }
std::vector<std::string> hooked_functions() { return {}; }
uint64_t recorded_compiles() noexcept { return 0; }
std::vector<std::string> nvrtc_env_names() { return {}; }
}  // namespace kcache::nvrtc::detail

#endif

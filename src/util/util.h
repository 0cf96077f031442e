// Private helpers shared by every component: logging, time, sizes, files.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "kcache/env.h"
#include "kcache/status.h"

namespace kcache::util {

// Marks memory never to be freed on purpose (what a child of fork()
// inherited and abandons: a parent thread may have been changing it) so a
// leak checker takes it, and what it points to, as in use. Returns p.
template <class T>
T* abandon(T* p) noexcept {
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(p);
#endif
  return p;
}

// ---- logging: one line per event, "kcache: <level>: <message>" ----------
// In a log file (set_log's `file`) each line starts with the UTC time and
// the process id: "2026-11-23T07:40:12.345Z [4242] kcache: warning: ...".
void set_log(LogLevel level, const std::string& file);
LogLevel log_level() noexcept;
void log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
#define KCACHE_LOG(level, ...)                                                             \
  do {                                                                                     \
    if (::kcache::util::log_level() >= (level)) ::kcache::util::log((level), __VA_ARGS__); \
  } while (0)

// The log goes to the file set_log names, else to descriptor 2, but only
// while descriptor 2 is what a log may be written to: open, not a store
// file (note_store_file), and either the file it was when the log was
// first used or one opened write-only (a redirection) or not a regular
// file (a terminal, pipe, socket, /dev/null). A line that may not be
// written is dropped: a data file that landed on descriptor 2 after a
// program closed it is never written to.

// ---- descriptors 0, 1 and 2 ------------------------------------------------
// A program started with descriptor 0, 1 or 2 closed (daemons, some
// launchers) would hand the next file opened that number, and whatever the
// program (or the log) then writes to its standard input, output or error
// would land in that file. Every store file kcache opens therefore opens
// above 2:
//
// Gives each closed descriptor among 0, 1 and 2 /dev/null, opened
// read-only and not close-on-exec, so no file opened next takes one of
// them. Writes to it fail with EBADF, as they did while it was closed: a
// program that checks its writes still sees that its output goes nowhere.
// Called before LMDB opens its files and before a disk store is assembled.
void reserve_std_fds() noexcept;
// open(2) that never returns 0, 1 or 2: a file that would take one of them
// is moved above 2 (F_DUPFD, close-on-exec as `flags` say) and the slot
// gets /dev/null. The POSIX Env, the lease table and bundles open through it.
int open_above_std(const char* path, int flags, unsigned mode = 0) noexcept;
// The same for a descriptor just opened some other way (openat, ...) with
// `flags`: returned as it is when above 2, else moved above 2 (the slot
// keeps /dev/null); -1 with errno when that fails.
int above_std(int fd, int flags) noexcept;
// Records that `fd` (or the file at `path`) is a file of a store: the log
// never writes to descriptor 2 while it is one of them.
void note_store_file(int fd) noexcept;
void note_store_file(const std::string& path) noexcept;

// ---- maps that other processes can shrink ----------------------------------
// A read of a page of a mapped file that lies past the file's end (the file
// was truncated, or rewritten in place, under the map) raises SIGBUS.
// run_guarded calls fn(arg) and returns true, or returns false as soon as a
// SIGBUS interrupts it on this thread: a process-wide SIGBUS handler,
// installed on first use, jumps back here (sigsetjmp/siglongjmp) when the
// fault happens inside a guarded call and otherwise does what the handler
// installed before it would have (by default: the process dies of SIGBUS).
// fn must be plain reads: it must take no lock, allocate nothing and own
// nothing that would need releasing when it is cut short.
bool run_guarded(void (*fn)(void*), void* arg) noexcept;
// memcpy that returns false instead of dying when `src` is a map whose
// file shrank (what was copied until then is unspecified).
bool copy_guarded(void* dst, const void* src, size_t n) noexcept;

// While one is alive on a thread, a disk hit on that thread is copied out
// of its map inside the lookup's SIGBUS guard and verified in the copy,
// never handed out as a view: for callers that copy every hit anyway (the
// C ABI, Python), so no read of a map happens after the guard ends.
class CopiedHits {
 public:
  CopiedHits() noexcept { ++depth_; }
  ~CopiedHits() { --depth_; }
  CopiedHits(const CopiedHits&) = delete;
  CopiedHits& operator=(const CopiedHits&) = delete;
  static bool active() noexcept { return depth_ > 0; }

 private:
  static thread_local int depth_;
};

// ---- time ----------------------------------------------------------------
uint64_t now_unix_ms() noexcept;
uint64_t now_mono_us() noexcept;

// Incremented in every child process fork() creates (pthread_atfork), so
// objects can tell cheaply that they were created before a fork and must not
// touch state they share with the parent (LMDB handles, threads, leases).
uint64_t fork_generation() noexcept;

// A random number, safe across fork() (reseeded in a new process).
uint64_t random_u64();

// ---- sizes: "4G", "512M", "100k", "1.5GiB", "1234" ------------------------
std::optional<uint64_t> parse_size(std::string_view s) noexcept;
std::string format_size(uint64_t bytes);

// ---- errno -> Status -------------------------------------------------------
Status errno_status(int err, std::string_view what);

// ---- files ---------------------------------------------------------------
// flock(fd, op) (LOCK_EX or LOCK_SH) that gives up after `bound_ms`: a
// process stopped while holding the lock can never hang the caller.
// Returns 0, ETIMEDOUT once the bound passed, or flock's own errno.
// The file helpers below do their system calls and waits through `env`.
int flock_within(int fd, int op, uint64_t bound_ms, Env& env = *Env::posix()) noexcept;
// mkdir -p with `mode` for the folders it creates.
Status make_dirs(const std::string& path, unsigned mode = 0700, Env& env = *Env::posix());
Expected<std::string> read_file(const std::string& path, uint64_t max_bytes = UINT64_MAX, Env& env = *Env::posix());
// Writes all of `data` at offset `at` of `fd` (pwrite, EINTR retried): 0,
// or the errno of the write that failed (ENOSPC for one that wrote nothing).
int pwrite_all(Env& env, int fd, std::string_view data, off_t at = 0);
// Writes to a temp file beside `path`, fsyncs when `sync`, renames into place.
Status write_file_atomic(const std::string& path, std::string_view data, bool sync = false, Env& env = *Env::posix());
// Writes `data` to a fresh temp file named `tmp_prefix`.<random>, then
// renames it to `path` (which may be in another folder of the same file
// system). The temp file is removed on any failure.
// `mode` is the new file's permission bits (before the umask).
Status write_file_atomic_via(const std::string& tmp_prefix, const std::string& path, std::string_view data,
                             bool sync = false, unsigned mode = 0600, Env& env = *Env::posix());
// The same within the folder `dir` (a descriptor): `name` and its temp file
// are resolved from it, so a folder renamed or replaced since `dir` was
// opened is never written through its old path.
Status write_file_atomic_at(int dir, const std::string& name, std::string_view data, unsigned mode = 0600,
                            Env& env = *Env::posix());
// ---- trust: files another user could have written -----------------------
// Who may own and write the files of a disk store. By default only this
// user (or root), and no one may have write permission through the group
// or others. A shared group also lets members of that group own the files
// and write through the group; write permission for others is never
// accepted.
struct StoreTrust {
  bool shared = false;
  unsigned group = 0;  // the shared group's gid, when shared
};
// The trust for sharing with `group` (a name or a number); invalid_argument
// when no such group exists or this process is not a member.
Expected<StoreTrust> shared_group_trust(const std::string& group);
// Ok when the file or folder at `path` (links followed) is owned and
// writable only as `trust` allows; not_found when it does not exist;
// unavailable with the reason (owner, mode) otherwise.
Status check_trusted(const std::string& path, const StoreTrust& trust, Env& env = *Env::posix());
// "uid 1000 (alice)" / "100 (users)": an id with its name where the
// system knows one, for messages about who owns or may write a path.
std::string user_label(uint32_t uid);
std::string group_label(uint32_t gid);
// Why a file or folder with these owner and mode bits is not trusted as
// `trust` allows (as check_trusted words it); empty when it is.
std::string untrusted_reason(const struct stat& st, const StoreTrust& trust);
// Gives a folder or file this process owns to the shared group with group
// write (folders also setgid, so what is made inside inherits the group).
// Does nothing without sharing or for a path owned by someone else.
void share_with_group(const std::string& path, const StoreTrust& trust);
// Whether `dir` is a folder shared with its group as share_with_group
// leaves it (setgid, group-writable). Stores make what they create inside
// such a folder readable (files) or writable (folders, counters, leases)
// by the group, whatever the umask.
bool folder_is_shared(const std::string& dir, Env& env = *Env::posix());

// "1", "true", "yes", "on" / "0", "false", "no", "off"; nullopt otherwise.
std::optional<bool> parse_bool(std::string_view s) noexcept;

// The rule of kcache/options.h ("Zero and defaults") for a field whose 0
// means unset: `value`, or `fallback` (the field's initialiser) when it is 0.
template <class T>
constexpr T or_default(T value, T fallback) noexcept {
  return value == T{} ? fallback : value;
}
std::string getenv_str(const char* name);

// Little-endian fixed-width encoding.
inline void put_u32(std::string& out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out.append(b, 4);
}
inline void put_u64(std::string& out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out.append(b, 8);
}
inline uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// JSON string escaping (for --json output and stats), without the quotes:
// the escapes json.dumps(s, ensure_ascii=False) writes, so the Python
// package's canonical text of a value is this too.
std::string json_escape(std::string_view s);

}  // namespace kcache::util

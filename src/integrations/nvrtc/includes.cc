// The #include closure of an NVRTC program over its include search, the
// process-wide memo of header digests by file identity, and the record that
// lets a later key check the closure by identity alone (includes.h).
#include "integrations/nvrtc/includes.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "util/util.h"

namespace kcache::nvrtc::detail {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }
bool is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

// The text with line splices joined and comments replaced by a space
// (newlines kept), string and character literals left as they are.
std::string clean(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  enum { code, line_comment, block_comment, str, chr } st = code;
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '\\' && i + 1 < in.size() &&
        (in[i + 1] == '\n' || (in[i + 1] == '\r' && i + 2 < in.size() && in[i + 2] == '\n'))) {
      i += in[i + 1] == '\r' ? 2 : 1;
      continue;
    }
    switch (st) {
      case code:
        if (c == '/' && i + 1 < in.size() && in[i + 1] == '/') {
          st = line_comment;
          out += ' ';
          ++i;
        } else if (c == '/' && i + 1 < in.size() && in[i + 1] == '*') {
          st = block_comment;
          out += ' ';
          ++i;
        } else {
          if (c == '"') st = str;
          // A quote after a digit or letter is a digit separator (1'000).
          if (c == '\'' && !(i > 0 && is_ident(in[i - 1]))) st = chr;
          out += c;
        }
        break;
      case line_comment:
        if (c == '\n') {
          st = code;
          out += c;
        }
        break;
      case block_comment:
        if (c == '\n') out += c;
        if (c == '*' && i + 1 < in.size() && in[i + 1] == '/') {
          st = code;
          ++i;
        }
        break;
      case str:
      case chr:
        out += c;
        if (c == '\\' && i + 1 < in.size()) {
          out += in[++i];
        } else if ((st == str && c == '"') || (st == chr && c == '\'') || c == '\n') {
          st = code;
        }
        break;
    }
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (is_space(s[b]) || s[b] == '\n')) ++b;
  while (e > b && (is_space(s[e - 1]) || s[e - 1] == '\n')) --e;
  return std::string(s.substr(b, e - b));
}

// The header name at the start of `s`: "name" or <name>; nullopt otherwise.
std::optional<std::pair<std::string, bool>> header_name(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  if (i >= s.size() || (s[i] != '"' && s[i] != '<')) return std::nullopt;
  char close = s[i] == '"' ? '"' : '>';
  size_t end = s.find(close, i + 1);
  if (end == std::string_view::npos || end == i + 1) return std::nullopt;
  return std::make_pair(std::string(s.substr(i + 1, end - i - 1)), close == '"');
}

// The macro text of a computed include or probe argument: up to the end of
// the line (include) or the matching parenthesis (probe).
std::string computed_text(std::string_view s, bool in_parens) {
  if (!in_parens) return trim(s);
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')' && depth-- == 0) return trim(s.substr(0, i));
  }
  return trim(s);
}

Directive directive_at(std::string_view s, Directive::Kind kind, bool in_parens) {
  Directive d;
  d.kind = kind;
  if (auto h = header_name(s)) {
    d.name = std::move(h->first);
    d.quoted = h->second;
  } else {
    d.computed = true;
    d.name = computed_text(s, in_parens);
  }
  return d;
}

// The start of a directive: `#` or the digraph `%:`, after blanks.
std::optional<size_t> directive_start(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && is_space(line[i])) ++i;
  if (i < line.size() && line[i] == '#') return i + 1;
  if (i + 1 < line.size() && line[i] == '%' && line[i + 1] == ':') return i + 2;
  return std::nullopt;
}

void scan_lines(std::string_view text, Scan* out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    auto start = directive_start(line);
    if (!start) continue;
    size_t i = *start;
    while (i < line.size() && is_space(line[i])) ++i;
    size_t w = i;
    while (i < line.size() && is_ident(line[i])) ++i;
    std::string_view word = line.substr(w, i - w);
    if (word == "include" || word == "import") {
      out->directives.push_back(directive_at(line.substr(i), Directive::Kind::include, false));
      continue;
    }
    if (word == "include_next") {
      out->directives.push_back(directive_at(line.substr(i), Directive::Kind::include_next, false));
      continue;
    }
    const bool define = word == "define";
    if (define) {
      while (i < line.size() && is_space(line[i])) ++i;
      size_t n = i;
      while (i < line.size() && is_ident(line[i])) ++i;
      if (i > n && (i >= line.size() || line[i] != '('))
        out->defines.push_back({std::string(line.substr(n, i - n)), trim(line.substr(i))});
    }
    const bool condition = word == "if" || word == "elif";
    if (!define && !condition) continue;
    // __has_include( ... ) / __has_include_next( ... ): a probe. In a
    // #define whose argument is not a header name it is a macro parameter
    // (`#define HAS(X) __has_include(X)`): the wrapper's uses are probes.
    for (size_t at = line.find("__has_include", i); at != std::string_view::npos;
         at = line.find("__has_include", at + 1)) {
      size_t j = at + 13;
      Directive::Kind kind = Directive::Kind::probe;
      if (starts_with(line.substr(j), "_next")) {
        j += 5;
        kind = Directive::Kind::probe_next;
      }
      while (j < line.size() && is_space(line[j])) ++j;
      if (j >= line.size() || line[j] != '(') continue;  // `#ifdef __has_include`, `defined(__has_include)`
      Directive d = directive_at(line.substr(j + 1), kind, true);
      if (define && d.computed) continue;
      out->directives.push_back(std::move(d));
    }
    if (!condition) continue;
    // Any other `IDENT( <name> )` or `IDENT( "name" )` in a condition: a
    // wrapper of __has_include (no other C++ expression takes a header name).
    for (size_t j = i; j < line.size(); ++j) {
      if (line[j] != '(') continue;
      size_t k = j + 1;
      while (k < line.size() && is_space(line[k])) ++k;
      if (k >= line.size() || (line[k] != '<' && line[k] != '"')) continue;
      if (auto h = header_name(line.substr(k))) {
        Directive d;
        d.kind = Directive::Kind::probe;
        d.name = std::move(h->first);
        d.quoted = h->second;
        out->directives.push_back(std::move(d));
      }
    }
  }
}

// ---- file identity and the digest memo -------------------------------------

FileId id_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size, int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          int64_t(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

// A file changed within this many nanoseconds of now may change again in
// the same timestamp tick without its identity changing: it is read every
// time until it is older.
constexpr int64_t kSettleNs = 2'000'000'000;

int64_t now_real_ns() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool young(const FileId& id, int64_t now) { return now - id.mtime_ns <= kSettleNs || now - id.ctime_ns <= kSettleNs; }

struct Scanned {
  FileId id;
  Digest digest;
  std::shared_ptr<const Scan> scan;
};

std::mutex g_memo_mu;
std::unordered_map<std::string, Scanned> g_memo;  // GUARDED_BY(g_memo_mu); path -> last read
std::atomic<uint64_t> g_reads{0};
std::atomic<uint64_t> g_walks{0};
constexpr size_t kMemoCap = 100000;

// The scan of a text, remembered by the text's digest (a file rewritten with
// bytes seen before, or the same header at two paths, is scanned once).
std::mutex g_text_mu;
std::unordered_map<Digest, std::shared_ptr<const Scan>> g_texts;  // GUARDED_BY(g_text_mu)
constexpr size_t kTextCap = 16384;

std::shared_ptr<const Scan> scan_digest(const Digest& d, std::string_view text) {
  {
    std::lock_guard lk(g_text_mu);
    if (auto it = g_texts.find(d); it != g_texts.end()) return it->second;
  }
  auto s = std::make_shared<const Scan>(scan_includes(text));
  std::lock_guard lk(g_text_mu);
  if (g_texts.size() >= kTextCap) g_texts.clear();
  g_texts.emplace(d, s);
  return s;
}

// The file's digest and directives; nullopt when `path` is not a readable
// regular file. `st` is its stat.
std::optional<Scanned> scan_file(const std::string& path, const struct stat& st, int64_t now) {
  FileId id = id_of(st);
  {
    std::lock_guard lk(g_memo_mu);
    auto it = g_memo.find(path);
    if (it != g_memo.end() && it->second.id == id) return it->second;
  }
  auto text = util::read_file(path, uint64_t(1) << 30);
  if (!text) return std::nullopt;
  g_reads.fetch_add(1, std::memory_order_relaxed);
  Scanned s;
  s.digest = hash_bytes(*text);
  s.scan = scan_digest(s.digest, *text);
  // Re-stat: the identity kept must be that of the bytes read.
  struct stat st2;
  if (::stat(path.c_str(), &st2) != 0) return std::nullopt;
  s.id = id_of(st2);
  if (!(s.id == id)) s.id = FileId{};  // changed while read: never matches a later stat
  if (s.id == id && !young(id, now)) {
    std::lock_guard lk(g_memo_mu);
    if (g_memo.size() >= kMemoCap) g_memo.clear();
    g_memo[path] = s;
  }
  return s;
}

// The scan of an in-memory text (the source, a named header).
std::shared_ptr<const Scan> scan_text(std::string_view text) { return scan_digest(hash_bytes(text), text); }

std::string join(const std::string& dir, const std::string& name) {
  if (!name.empty() && name[0] == '/') return name;
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return std::string();
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

// stat() of paths given in runs of the same folder, through a descriptor of
// the folder (O_PATH) kept while the folder repeats.
class FolderStat {
 public:
  FolderStat() = default;
  FolderStat(const FolderStat&) = delete;
  FolderStat& operator=(const FolderStat&) = delete;
  ~FolderStat() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool stat(const std::string& path, struct stat* st) {
    size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0) return ::stat(path.c_str(), st) == 0;
    std::string_view dir(path.data(), slash);
    if (fd_ < 0 || dir != dir_) {
      if (fd_ >= 0) ::close(fd_);
      dir_.assign(dir);
      fd_ = ::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (fd_ < 0) return ::stat(path.c_str(), st) == 0;
    return ::fstatat(fd_, path.c_str() + slash + 1, st, 0) == 0;
  }

 private:
  int fd_ = -1;
  std::string dir_;
};

std::string current_dir() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string("?");
}

// ---- options ---------------------------------------------------------------

std::string skip_blanks(std::string_view v) {
  size_t i = 0;
  while (i < v.size() && is_space(v[i])) ++i;
  return std::string(v.substr(i));
}

// Logged once per process per unresolved include and folder set.
std::mutex g_logged_mu;
std::set<std::string> g_logged;  // GUARDED_BY(g_logged_mu)

void log_once(const std::string& line) {
  {
    std::lock_guard lk(g_logged_mu);
    if (g_logged.size() > 1000 || !g_logged.insert(line).second) return;
  }
  KCACHE_LOG(LogLevel::warn, "%s", line.c_str());
}

class Walk {
 public:
  Walk(const Program& p, const ParsedOptions& o) : p_(p), o_(o), now_(now_real_ns()) {
    for (const auto& h : p.headers) named_.emplace(h.name, &h.contents);
    for (const auto& [name, body] : o.defines) macros_[name].insert(body);
    source_dir_ = dir_of(p.name.empty() ? std::string("default_program") : p.name);
  }

  Expected<Closure> run() {
    g_walks.fetch_add(1, std::memory_order_relaxed);
    add_scan(*scan_text(p_.source), nullptr);
    Directive pre;
    pre.quoted = true;
    for (const auto& name : o_.pre_includes) {
      pre.name = name;
      follow(pre, nullptr);
    }
    // Until nothing new: drain the files, then resolve the computed names
    // with every macro definition seen so far (new files can define more).
    for (;;) {
      while (!queue_.empty()) {
        auto [path, scan] = std::move(queue_.front());
        queue_.pop_front();
        add_scan(*scan, &path);
        if (files_.size() > kMaxDiskInputs) return too_many();
      }
      size_t before = files_.size() + present_.size() + absent_.size();
      for (size_t i = 0; i < computed_.size(); ++i) resolve(i);
      if (queue_.empty() && files_.size() + present_.size() + absent_.size() == before) break;
    }
    for (size_t i = 0; i < computed_.size(); ++i)
      if (!computed_[i].resolved) KCACHE_RETURN_IF_ERROR(fallback(computed_[i]));
    if (files_.size() > kMaxDiskInputs) return too_many();
    Closure c;
    c.settled = settled_;
    for (auto& [path, f] : files_) c.files.push_back({path, f.id, f.digest});
    c.present.assign(present_.begin(), present_.end());
    c.absent.assign(absent_.begin(), absent_.end());
    for (auto& [path, d] : dirs_) c.dirs.push_back(d);
    c.fallback = std::move(fallback_notes_);
    // A relative path (a quoted include beside a program name without a
    // folder, a relative -I) means the record holds for this working
    // folder only.
    auto relative = [](const std::string& path) { return path.empty() || path[0] != '/'; };
    bool rel = std::any_of(c.files.begin(), c.files.end(), [&](const auto& f) { return relative(f.path); }) ||
               std::any_of(c.present.begin(), c.present.end(), relative) ||
               std::any_of(c.absent.begin(), c.absent.end(), relative) ||
               std::any_of(c.dirs.begin(), c.dirs.end(), [&](const auto& d) { return relative(d.path); });
    if (rel) c.cwd = current_dir();
    return c;
  }

 private:
  struct Pending {
    Directive d;
    std::string from;  // the including file ("" = the source or a named header)
    bool from_disk = false;
    bool resolved = false;
    std::set<std::string> names;  // already followed
  };

  Status too_many() const {
    return Status(Errc::too_large, "more than " + std::to_string(kMaxDiskInputs) +
                                       " files on the include search could reach the compile");
  }

  void add_scan(const Scan& s, const std::string* from) {
    for (const auto& d : s.defines) macros_[d.name].insert(d.body);
    for (const auto& d : s.directives) {
      if (d.computed) {
        Pending pd{d, from ? *from : std::string(), from != nullptr, false, {}};
        computed_.push_back(std::move(pd));
      } else {
        follow(d, from);
      }
    }
  }

  void note_dir(const std::string& dir) {
    if (dirs_.count(dir)) return;
    Closure::Dir d;
    d.path = dir;
    struct stat st;
    if (::stat(dir.empty() ? "." : dir.c_str(), &st) == 0) {
      d.exists = true;
      d.id = id_of(st);
      if (young(d.id, now_)) settled_ = false;
    }
    dirs_.emplace(dir, std::move(d));
  }

  // One candidate path: a file (read and queued), a probe answered, or absent.
  enum class Found { file, other, absent };
  Found look(const std::string& path, bool probe_only) {
    if (files_.count(path)) return Found::file;
    if (probe_only && present_.count(path)) return Found::other;
    if (absent_.count(path)) return Found::absent;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      absent_.insert(path);
      note_dir(dir_of(path));
      return Found::absent;
    }
    if (probe_only) {
      present_.insert(path);
      return Found::other;
    }
    auto f = scan_file(path, st, now_);
    if (!f) {
      absent_.insert(path);
      note_dir(dir_of(path));
      return Found::absent;
    }
    if (young(f->id, now_) || f->id == FileId{}) settled_ = false;
    files_.emplace(path, FileState{f->id, f->digest});
    queue_.emplace_back(path, f->scan);
    return Found::file;
  }

  void follow(const Directive& d, const std::string* from) {
    if (d.name.empty()) return;
    const bool probe = d.kind == Directive::Kind::probe || d.kind == Directive::Kind::probe_next;
    const bool next = d.kind == Directive::Kind::include_next || d.kind == Directive::Kind::probe_next;
    // A named header of that name: NVRTC takes it from memory.
    if (auto it = named_.find(d.name); it != named_.end() && !probe && scanned_named_.insert(d.name).second)
      add_scan(*scan_text(*it->second), nullptr);
    std::vector<std::string> candidates;
    if (d.name[0] == '/') {
      candidates.push_back(d.name);
    } else {
      if (d.quoted && !next) {
        if (from)
          candidates.push_back(join(dir_of(*from), d.name));
        else if (o_.source_dir_searched)
          candidates.push_back(join(source_dir_, d.name));
      }
      for (const auto& dir : o_.include_dirs) candidates.push_back(join(dir, d.name));
    }
    for (const auto& c : candidates) {
      Found f = look(c, probe);
      // The first candidate found ends the search; include_next may land on
      // any later folder, so every one that exists is followed.
      if (f != Found::absent && !next) break;
    }
  }

  // ---- computed names --------------------------------------------------

  static constexpr size_t kMaxAlternatives = 256;
  static constexpr int kMaxDepth = 16;
  // Bytes produced plus calls made for one computed include: macros that
  // multiply their text stay cheap within the depth bound only in count.
  static constexpr size_t kMaxExpandWork = size_t{1} << 22;

  // Every text `text` can expand to with the macros seen; false when the
  // alternatives or the work exceed their bounds.
  bool expand(std::string_view text, std::set<std::string>* active, int depth, std::vector<std::string>* out) {
    if (++expand_work_ > kMaxExpandWork) return false;
    std::vector<std::string> acc{std::string()};
    auto spend = [&](size_t bytes) { return (expand_work_ += bytes) <= kMaxExpandWork; };
    size_t i = 0;
    while (i < text.size()) {
      if (is_ident(text[i]) && !(text[i] >= '0' && text[i] <= '9')) {
        size_t j = i;
        while (j < text.size() && is_ident(text[j])) ++j;
        std::string id(text.substr(i, j - i));
        i = j;
        auto it = macros_.find(id);
        if (it == macros_.end() || active->count(id) || depth >= kMaxDepth) {
          if (!spend(acc.size() * id.size())) return false;
          for (auto& a : acc) a += id;
          continue;
        }
        std::vector<std::string> alts;
        active->insert(id);
        for (const auto& body : it->second) {
          std::vector<std::string> sub;
          if (!expand(body, active, depth + 1, &sub)) {
            active->erase(id);
            return false;
          }
          alts.insert(alts.end(), sub.begin(), sub.end());
        }
        active->erase(id);
        if (acc.size() * alts.size() > kMaxAlternatives) return false;
        std::vector<std::string> next;
        for (const auto& a : acc)
          for (const auto& b : alts) {
            if (!spend(a.size() + b.size())) return false;
            next.push_back(a + b);
          }
        acc = std::move(next);
      } else {
        if (!spend(acc.size())) return false;
        for (auto& a : acc) a += text[i];
        ++i;
      }
    }
    std::sort(acc.begin(), acc.end());
    acc.erase(std::unique(acc.begin(), acc.end()), acc.end());
    out->insert(out->end(), acc.begin(), acc.end());
    return out->size() <= kMaxAlternatives;
  }

  void resolve(size_t i) {
    // follow() may grow computed_: no reference into it is held across it.
    const Directive::Kind kind = computed_[i].d.kind;
    const std::string from = computed_[i].from;
    const bool from_disk = computed_[i].from_disk;
    std::set<std::string> active;
    std::vector<std::string> texts;
    expand_work_ = 0;
    if (!expand(computed_[i].d.name, &active, 0, &texts)) return;
    bool any = false;
    for (const auto& t : texts) {
      auto h = header_name(t);
      if (!h) continue;
      any = true;
      std::string tag = (h->second ? "\"" : "<") + h->first;
      if (!computed_[i].names.insert(tag).second) continue;
      Directive d;
      d.kind = kind;
      d.name = h->first;
      d.quoted = h->second;
      follow(d, from_disk ? &from : nullptr);
    }
    if (any) computed_[i].resolved = true;
  }

  // An include no expansion resolves: every file under each folder it could
  // name: the -I folders, the source's folder when searched, and the
  // including file's own folder. The working folder is never walked: where
  // it would be one of them, or where there is no folder at all, the
  // program compiles without the cache rather than with a partial key.
  Status fallback(const Pending& pd) {
    std::string what = std::string(pd.d.kind == Directive::Kind::include ? "#include " : "probe of ") + pd.d.name +
                       " in " + (pd.from_disk ? pd.from : std::string("the source"));
    std::vector<std::string> roots(o_.include_dirs.begin(), o_.include_dirs.end());
    // The compile logs the reason once.
    auto give_up = [&](const std::string& why) { return Status(Errc::too_large, "unresolvable " + what + ": " + why); };
    auto add_root = [&](const std::string& dir) {
      if (dir.empty()) return false;
      if (std::find(roots.begin(), roots.end(), dir) == roots.end()) roots.push_back(dir);
      return true;
    };
    // The text may expand to a quoted name: its includer's folder counts.
    if (pd.from_disk) {
      if (!add_root(dir_of(pd.from))) return give_up("the including file has no folder");
    } else if (o_.source_dir_searched) {
      if (!add_root(source_dir_)) return give_up("the program name has no folder");
    }
    if (roots.empty()) return give_up("no folder to search");
    std::string folders;
    for (const auto& root : roots) {
      if (!fallback_roots_.insert(root).second) continue;
      folders += (folders.empty() ? "" : ", ") + root;
      fallback_notes_.push_back(what + ": folder " + root);
      std::vector<std::string> stack{root};
      while (!stack.empty()) {
        std::string dir = std::move(stack.back());
        stack.pop_back();
        note_dir(dir);
        DIR* dp = ::opendir(dir.c_str());
        if (!dp) continue;
        std::vector<std::string> names;
        while (struct dirent* e = ::readdir(dp)) {
          std::string n = e->d_name;
          if (n != "." && n != "..") names.push_back(std::move(n));
        }
        ::closedir(dp);
        for (const auto& n : names) {
          std::string path = join(dir, n);
          struct stat es;
          if (::lstat(path.c_str(), &es) != 0) continue;
          // Folders are entered only as themselves (a link to a folder
          // could loop); a link to a file counts as the file.
          if (S_ISLNK(es.st_mode) && (::stat(path.c_str(), &es) != 0 || S_ISDIR(es.st_mode))) continue;
          if (S_ISDIR(es.st_mode)) {
            stack.push_back(path);
          } else if (S_ISREG(es.st_mode) && !files_.count(path)) {
            if (++fallback_files_ > kMaxFallbackFiles) {
              log_once("nvrtc: cannot resolve " + what + "; more than " + std::to_string(kMaxFallbackFiles) +
                       " files under " + root + ": compiled without the cache");
              return Status(Errc::too_large, "unresolvable " + what + ": more than " +
                                                 std::to_string(kMaxFallbackFiles) + " files under " + root);
            }
            if (auto f = scan_file(path, es, now_)) {
              if (young(f->id, now_)) settled_ = false;
              files_.emplace(path, FileState{f->id, f->digest});
            }
          }
        }
      }
    }
    if (!folders.empty()) log_once("nvrtc: cannot resolve " + what + "; keying every file under " + folders);
    return Status();
  }

  struct FileState {
    FileId id;
    Digest digest;
  };

  const Program& p_;
  const ParsedOptions& o_;
  const int64_t now_;
  std::string source_dir_;
  std::map<std::string, const std::string*> named_;
  std::set<std::string> scanned_named_;
  std::map<std::string, FileState> files_;
  std::set<std::string> present_, absent_;
  std::map<std::string, Closure::Dir> dirs_;
  std::unordered_map<std::string, std::set<std::string>> macros_;
  std::vector<Pending> computed_;
  std::deque<std::pair<std::string, std::shared_ptr<const Scan>>> queue_;
  std::set<std::string> fallback_roots_;
  std::vector<std::string> fallback_notes_;
  size_t fallback_files_ = 0;
  size_t expand_work_ = 0;
  bool settled_ = true;
};

// Record encoding: a version byte, then counts and fields.
constexpr uint8_t kRecordVersion = 1;

void put_str(std::string& out, std::string_view s) {
  util::put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
void put_id(std::string& out, const FileId& id) {
  util::put_u64(out, static_cast<uint64_t>(id.dev));
  util::put_u64(out, static_cast<uint64_t>(id.ino));
  util::put_u64(out, static_cast<uint64_t>(id.size));
  util::put_u64(out, static_cast<uint64_t>(id.mtime_ns));
  util::put_u64(out, static_cast<uint64_t>(id.ctime_ns));
}

struct Reader {
  std::string_view s;
  bool ok = true;
  uint64_t u64() {
    if (s.size() < 8) return ok = false, 0;
    uint64_t v = util::get_u64(s.data());
    s.remove_prefix(8);
    return v;
  }
  uint32_t u32() {
    if (s.size() < 4) return ok = false, 0;
    uint32_t v = util::get_u32(s.data());
    s.remove_prefix(4);
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    if (!ok || s.size() < n) return ok = false, std::string();
    std::string v(s.substr(0, n));
    s.remove_prefix(n);
    return v;
  }
  FileId id() {
    FileId f;
    f.dev = static_cast<dev_t>(u64());
    f.ino = static_cast<ino_t>(u64());
    f.size = static_cast<off_t>(u64());
    f.mtime_ns = static_cast<int64_t>(u64());
    f.ctime_ns = static_cast<int64_t>(u64());
    return f;
  }
};

}  // namespace

// ---- public --------------------------------------------------------------------

Scan scan_includes(std::string_view text) {
  // Directives of the text with comments removed, and of the raw text too,
  // so that a comment or literal this scanner misreads can only add names.
  Scan raw, out;
  scan_lines(clean(text), &out);
  scan_lines(text, &raw);
  std::set<std::tuple<std::string, bool, bool, uint8_t>> seen;
  std::vector<Directive> unique;
  // The raw text adds literal names only: its "computed" includes are
  // splices and comments the clean text reads right.
  std::erase_if(raw.directives, [](const Directive& d) { return d.computed; });
  for (auto* v : {&out.directives, &raw.directives})
    for (auto& d : *v)
      if (seen.emplace(d.name, d.quoted, d.computed, static_cast<uint8_t>(d.kind)).second)
        unique.push_back(std::move(d));
  out.directives = std::move(unique);
  std::set<std::pair<std::string, std::string>> defs;
  std::vector<Define> defines;
  for (auto* v : {&out.defines, &raw.defines})
    for (auto& d : *v)
      if (defs.emplace(d.name, d.body).second) defines.push_back(std::move(d));
  out.defines = std::move(defines);
  return out;
}

ParsedOptions parse_options(const std::vector<std::string>& options) {
  ParsedOptions p;
  // name -> the last macro operation on it ("-DNAME=VALUE" or "-UNAME").
  std::map<std::string, std::string> macro_ops;
  auto value = [&](size_t* i, std::string_view short_form, std::string_view long_form,
                   bool glued) -> std::optional<std::string> {
    const std::string& o = options[*i];
    if (o == short_form || o == long_form) {
      if (*i + 1 >= options.size()) return std::nullopt;
      return skip_blanks(options[++*i]);
    }
    if (starts_with(o, std::string(long_form) + "=")) return o.substr(long_form.size() + 1);
    if (starts_with(o, std::string(short_form) + "=")) return o.substr(short_form.size() + 1);
    if (glued && starts_with(o, short_form)) {
      std::string v = skip_blanks(std::string_view(o).substr(short_form.size()));
      if (!v.empty() && v[0] == '=') v.erase(0, 1);
      return v;
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string& o = options[i];
    if (o == "-no-source-include" || o == "--no-source-include") {
      p.source_dir_searched = false;
      p.other.push_back("-no-source-include");
    } else if (auto d = value(&i, "-D", "--define-macro", true)) {
      std::string def = *d;
      size_t end = std::min(def.find('='), def.find('('));
      std::string name = def.substr(0, end);
      if (def.find('=') == std::string::npos) def += "=1";
      macro_ops[name] = "-D" + def;
    } else if (auto u = value(&i, "-U", "--undefine-macro", true)) {
      macro_ops[*u] = "-U" + *u;
    } else if (auto inc = value(&i, "-I", "--include-path", true)) {
      p.include_dirs.push_back(*inc);
    } else if (auto pre = value(&i, "-include", "--pre-include", false)) {
      p.pre_includes.push_back(*pre);
    } else {
      p.other.push_back(o);
    }
  }
  for (auto& [name, op] : macro_ops) {
    if (op[1] == 'D' && op.find('(') > op.find('=')) {
      size_t eq = op.find('=');
      p.defines.emplace_back(name, op.substr(eq + 1));
    }
    p.macros.push_back(std::move(op));
  }
  return p;
}

Expected<Closure> walk_closure(const Program& program, const ParsedOptions& options) {
  return Walk(program, options).run();
}

bool closure_still_valid(const Closure& c) {
  if (!c.settled) return false;
  if (!c.cwd.empty() && current_dir() != c.cwd) return false;
  const int64_t now = now_real_ns();
  struct stat st;
  for (const auto& d : c.dirs) {
    bool exists = ::stat(d.path.empty() ? "." : d.path.c_str(), &st) == 0;
    if (exists != d.exists) return false;
    if (exists && (!(id_of(st) == d.id) || young(d.id, now))) return false;
  }
  // Files are sorted by path, so those of one folder are together: each
  // folder is looked up once and its files stat'ed relative to it (a full
  // path lookup per file costs about as much again).
  FolderStat fs;
  for (const auto& f : c.files) {
    if (!fs.stat(f.path, &st) || !(id_of(st) == f.id) || young(f.id, now)) return false;
  }
  for (const auto& p : c.present)
    if (!fs.stat(p, &st)) return false;
  return true;
}

// ---- watched checks ----------------------------------------------------------

namespace {

// File systems whose inotify events cover every change (local ones). On
// others (NFS, FUSE, ...) a change made elsewhere raises no event.
bool local_fs(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53:      // ext2/3/4
    case 0x01021994:  // tmpfs
    case 0x58465342:  // xfs
    case 0x9123683E:  // btrfs
    case 0x794C7630:  // overlayfs
    case 0x2FC12FC1:  // zfs
    case 0xF2F52010:  // f2fs
      return true;
    default:
      return false;
  }
}

// One inotify descriptor for the process. Each folder a closure depends on
// is watched once; each read of the events stamps the folders that had any
// with a new sequence number.
class Watcher {
 public:
  // The process's watcher. A forked child makes its own: reading the
  // parent's descriptor would take events the parent waits for. The fork
  // handlers hold the lock across fork(), so the child never inherits it
  // held, and drop the child's copy of the parent's watcher (its lock may
  // be held by a thread the child does not have: it is left, never used).
  static Watcher& get() {
    std::lock_guard lk(g_mu);
    pid_t pid = ::getpid();
    if (!g_w || g_owner != pid) {
      if (!g_w) {
        static const int registered = ::pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, &in_child);
        (void)registered;
      }
      g_w = new Watcher(++g_generation);  // never destroyed: used until exit
      g_owner = pid;
    }
    return *g_w;
  }
  bool available() const { return fd_ >= 0; }
  uint64_t generation() const { return generation_; }

  // Watches every folder of `dirs`; false when one cannot be watched.
  bool watch(const std::vector<std::string>& dirs, std::vector<int>* wds) {
    std::lock_guard lk(mu_);
    for (const auto& d : dirs) {
      auto it = wd_of_.find(d);
      if (it == wd_of_.end()) {
        if (!local_fs(d)) return false;
        int wd = ::inotify_add_watch(fd_, d.c_str(),
                                     IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM |
                                         IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF);
        if (wd < 0) return false;
        it = wd_of_.emplace(d, wd).first;
        dir_of_[wd] = d;
      }
      wds->push_back(it->second);
    }
    return true;
  }

  // Reads the pending events; the current sequence number.
  uint64_t drain() {
    std::lock_guard lk(mu_);
    alignas(struct inotify_event) char buf[16384];
    bool any = false;
    for (;;) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      if (!any) ++seq_;
      any = true;
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const struct inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        if (e->mask & IN_Q_OVERFLOW) overflow_seq_ = seq_;
        last_event_[e->wd] = seq_;
        if (e->mask & IN_IGNORED) {  // the folder went: watched anew next time
          auto d = dir_of_.find(e->wd);
          if (d != dir_of_.end()) {
            wd_of_.erase(d->second);
            dir_of_.erase(d);
          }
        }
      }
    }
    return seq_;
  }

  // Whether any of `wds` had an event stamped `seq` or later.
  bool changed_since(const std::vector<int>& wds, uint64_t seq) {
    std::lock_guard lk(mu_);
    if (overflow_seq_ >= seq) return true;
    for (int wd : wds) {
      auto it = last_event_.find(wd);
      if (it != last_event_.end() && it->second >= seq) return true;
      if (!dir_of_.count(wd)) return true;  // no longer watched
    }
    return false;
  }

 private:
  explicit Watcher(uint64_t generation) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)), generation_(generation) {}
  static void in_child() {
    if (g_w && g_w->fd_ >= 0) ::close(g_w->fd_);
    g_w = nullptr;
    g_mu.unlock();
  }
  static inline std::mutex g_mu;
  static inline Watcher* g_w = nullptr;  // GUARDED_BY(g_mu)
  static inline pid_t g_owner = 0;       // GUARDED_BY(g_mu)
  static inline uint64_t g_generation = 0;
  const int fd_;
  const uint64_t generation_;
  std::mutex mu_;
  uint64_t seq_ = 1;                              // GUARDED_BY(mu_)
  uint64_t overflow_seq_ = 0;                     // GUARDED_BY(mu_)
  std::unordered_map<int, uint64_t> last_event_;  // GUARDED_BY(mu_)
  std::unordered_map<std::string, int> wd_of_;    // GUARDED_BY(mu_)
  std::unordered_map<int, std::string> dir_of_;   // GUARDED_BY(mu_)
};

// The folders whose events cover every change `c` depends on: the folder of
// each file and probe, each recorded folder, and for a folder that does not
// exist its nearest existing ancestor (where it would be created).
std::vector<std::string> watch_dirs(const Closure& c) {
  std::set<std::string> dirs;
  auto folder = [](const std::string& path) {
    std::string d = dir_of(path);
    return d.empty() ? std::string(".") : d;
  };
  for (const auto& f : c.files) dirs.insert(folder(f.path));
  for (const auto& p : c.present) dirs.insert(folder(p));
  for (const auto& d : c.dirs) {
    std::string at = d.path.empty() ? std::string(".") : d.path;
    struct stat st;
    while (::stat(at.c_str(), &st) != 0) {
      std::string up = dir_of(at);
      at = up.empty() ? std::string(".") : up;
      if (at == "/" || at == ".") break;
    }
    dirs.insert(at);
  }
  return {dirs.begin(), dirs.end()};
}

constexpr int64_t kRecheckNs = 1'000'000'000;

}  // namespace

bool closure_still_valid(const Closure& c, WatchState* w) {
  Watcher& watcher = Watcher::get();
  if (!watcher.available()) return closure_still_valid(c);
  const int64_t now = now_real_ns();
  uint64_t seq = watcher.drain();
  if (w->watched && w->generation == watcher.generation() && w->verified_seq != 0 &&
      now - w->verified_ns < kRecheckNs && !watcher.changed_since(w->wds, w->verified_seq) &&
      (c.cwd.empty() || current_dir() == c.cwd))
    return true;
  // The watches first, then the stats: a change after a stat raises an
  // event that the next check sees.
  if (w->generation != watcher.generation()) *w = WatchState{false, false, {}, 0, 0, watcher.generation()};
  if (!w->watched && !w->unwatchable) {
    w->wds.clear();
    w->watched = watcher.watch(watch_dirs(c), &w->wds);
    w->unwatchable = !w->watched;
    seq = watcher.drain();
  }
  w->verified_seq = 0;
  if (!closure_still_valid(c)) return false;
  if (w->watched) {
    w->verified_seq = seq + 1;
    w->verified_ns = now;
  }
  return true;
}

std::string encode_closure(const Closure& c) {
  std::string out;
  out.push_back(static_cast<char>(kRecordVersion));
  util::put_u32(out, static_cast<uint32_t>(c.files.size()));
  for (const auto& f : c.files) {
    put_str(out, f.path);
    put_id(out, f.id);
    out.append(reinterpret_cast<const char*>(f.digest.bytes.data()), f.digest.bytes.size());
  }
  for (const auto* list : {&c.present, &c.absent, &c.fallback}) {
    util::put_u32(out, static_cast<uint32_t>(list->size()));
    for (const auto& s : *list) put_str(out, s);
  }
  put_str(out, c.cwd);
  util::put_u32(out, static_cast<uint32_t>(c.dirs.size()));
  for (const auto& d : c.dirs) {
    put_str(out, d.path);
    out.push_back(d.exists ? 1 : 0);
    put_id(out, d.id);
  }
  return out;
}

std::optional<Closure> decode_closure(std::string_view bytes) {
  if (bytes.empty() || static_cast<uint8_t>(bytes[0]) != kRecordVersion) return std::nullopt;
  Reader r{bytes.substr(1)};
  Closure c;
  uint32_t n = r.u32();
  if (!r.ok || n > kMaxDiskInputs + kMaxFallbackFiles) return std::nullopt;
  c.files.resize(n);
  for (auto& f : c.files) {
    f.path = r.str();
    f.id = r.id();
    if (r.s.size() < f.digest.bytes.size()) return std::nullopt;
    std::copy(r.s.begin(), r.s.begin() + f.digest.bytes.size(), reinterpret_cast<char*>(f.digest.bytes.data()));
    r.s.remove_prefix(f.digest.bytes.size());
    if (!r.ok) return std::nullopt;
  }
  for (auto* list : {&c.present, &c.absent, &c.fallback}) {
    uint32_t m = r.u32();
    if (!r.ok || m > r.s.size()) return std::nullopt;
    list->resize(m);
    for (auto& s : *list) s = r.str();
  }
  c.cwd = r.str();
  uint32_t m = r.u32();
  if (!r.ok || m > r.s.size()) return std::nullopt;
  c.dirs.resize(m);
  for (auto& d : c.dirs) {
    d.path = r.str();
    if (r.s.empty()) return std::nullopt;
    d.exists = r.s[0] != 0;
    r.s.remove_prefix(1);
    d.id = r.id();
  }
  if (!r.ok || !r.s.empty()) return std::nullopt;
  return c;
}

uint64_t header_reads() noexcept { return g_reads.load(std::memory_order_relaxed); }
uint64_t closure_walks() noexcept { return g_walks.load(std::memory_order_relaxed); }

}  // namespace kcache::nvrtc::detail

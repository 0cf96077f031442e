// The #include closure of an NVRTC program over its include search, and the
// process-wide memo of header digests by file identity (includes.h).
#include "integrations/nvrtc/includes.h"

#include <dirent.h>
#include <sys/stat.h>

#include <atomic>
#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

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

// The header named at `s` ("name", <name>, or anything else: computed).
Directive header_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  Directive d;
  if (i < s.size() && (s[i] == '"' || s[i] == '<')) {
    char close = s[i] == '"' ? '"' : '>';
    size_t end = s.find(close, i + 1);
    if (end != std::string_view::npos && end > i + 1) {
      d.name = std::string(s.substr(i + 1, end - i - 1));
      d.quoted = close == '"';
      return d;
    }
  }
  d.computed = true;
  return d;
}

void scan_lines(std::string_view text, std::vector<Directive>* out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    size_t i = 0;
    while (i < line.size() && is_space(line[i])) ++i;
    if (i >= line.size() || line[i] != '#') continue;
    ++i;
    while (i < line.size() && is_space(line[i])) ++i;
    size_t w = i;
    while (i < line.size() && is_ident(line[i])) ++i;
    std::string_view word = line.substr(w, i - w);
    if (word == "include" || word == "include_next" || word == "import") {
      out->push_back(header_at(line.substr(i)));
      continue;
    }
    // __has_include( ... ) / __has_include_next( ... ) in #if and #elif.
    for (size_t at = line.find("__has_include", i); at != std::string_view::npos;
         at = line.find("__has_include", at + 1)) {
      size_t j = at + 13;
      if (starts_with(line.substr(j), "_next")) j += 5;
      while (j < line.size() && is_space(line[j])) ++j;
      if (j < line.size() && line[j] == '(')
        out->push_back(header_at(line.substr(j + 1)));
      else
        out->push_back(Directive{std::string(), false, true});
    }
  }
}

// ---- digests by file identity ----------------------------------------------

struct Identity {
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns, ctime_ns;
  bool operator==(const Identity&) const = default;
};

Identity identity_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size, int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          int64_t(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

struct Scanned {
  Identity id;
  Digest digest;
  std::shared_ptr<const std::vector<Directive>> includes;
};

// A file changed within this many nanoseconds of now may change again in
// the same timestamp tick without its identity changing: it is read every
// time until it is older.
constexpr int64_t kSettleNs = 2'000'000'000;

std::mutex g_memo_mu;
std::unordered_map<std::string, Scanned> g_memo;  // GUARDED_BY(g_memo_mu); path -> last read
std::atomic<uint64_t> g_reads{0};
constexpr size_t kMemoCap = 100000;

int64_t now_real_ns() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The file's digest and directives; nullopt when `path` is not a readable
// regular file.
std::optional<Scanned> scan_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  Identity id = identity_of(st);
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
  s.includes = std::make_shared<const std::vector<Directive>>(scan_includes(*text));
  // Re-stat: the identity stored must be that of the bytes read.
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  s.id = identity_of(st);
  const int64_t now = now_real_ns();
  if (s.id == id && now - id.mtime_ns > kSettleNs && now - id.ctime_ns > kSettleNs) {
    std::lock_guard lk(g_memo_mu);
    if (g_memo.size() >= kMemoCap) g_memo.clear();
    g_memo[path] = s;
  }
  return s;
}

// The directives of an in-memory text (the source, a named header),
// remembered by the text's digest: a warm compile hashes the text (which the
// key does anyway) instead of scanning it.
std::mutex g_text_mu;
std::unordered_map<Digest, std::shared_ptr<const std::vector<Directive>>> g_texts;  // GUARDED_BY(g_text_mu)
constexpr size_t kTextCap = 4096;

std::shared_ptr<const std::vector<Directive>> scan_text(std::string_view text) {
  Digest d = hash_bytes(text);
  {
    std::lock_guard lk(g_text_mu);
    if (auto it = g_texts.find(d); it != g_texts.end()) return it->second;
  }
  auto dirs = std::make_shared<const std::vector<Directive>>(scan_includes(text));
  std::lock_guard lk(g_text_mu);
  if (g_texts.size() >= kTextCap) g_texts.clear();
  g_texts.emplace(d, dirs);
  return dirs;
}

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

// Option value for the forms "-X<v>", "-X=<v>", "-X" "<v>" (as the next
// option; *i is advanced past it).
std::optional<std::string> option_value(const std::vector<std::string>& opts, size_t* i,
                                        std::initializer_list<std::string_view> spellings, bool glued) {
  const std::string& o = opts[*i];
  for (std::string_view s : spellings) {
    if (o == s) {
      if (*i + 1 < opts.size()) return opts[++*i];
      return std::nullopt;
    }
    if (starts_with(o, std::string(s) + "=")) return o.substr(s.size() + 1);
    if (glued && starts_with(o, s) && o.size() > s.size()) return o.substr(s.size());
  }
  return std::nullopt;
}

class Closure {
 public:
  Closure(const Program& p, IncludeSearch search) : p_(p), s_(std::move(search)) {
    for (const auto& h : p.headers) named_.emplace(h.name, &h.contents);
  }

  Expected<DiskInputs> run() {
    Directive pre;
    pre.quoted = true;
    add_text(*scan_text(p_.source), nullptr);
    for (const auto& name : s_.pre_includes) {
      pre.name = name;
      follow(pre, nullptr);
    }
    while (!queue_.empty()) {
      auto [path, dirs] = std::move(queue_.front());
      queue_.pop_front();
      add_text(*dirs, &path);
    }
    if (computed_) KCACHE_RETURN_IF_ERROR(add_folders());
    if (files_.size() > kMaxDiskInputs) return too_many();
    DiskInputs out;
    out.whole_folders = computed_;
    out.files.reserve(files_.size());
    for (const auto& [path, d] : files_) out.files.push_back(path + "\t" + d.hex());
    return out;
  }

 private:
  Status too_many() const {
    return Status(Errc::too_large, "more than " + std::to_string(kMaxDiskInputs) +
                                       " files on the include search could reach the compile");
  }

  // The directives of one text; `from` is its path on disk (null for the
  // source and named headers).
  void add_text(const std::vector<Directive>& dirs, const std::string* from) {
    for (const auto& d : dirs) follow(d, from);
  }

  void follow(const Directive& d, const std::string* from) {
    if (d.computed) {
      computed_ = true;
      return;
    }
    if (d.name.empty()) return;
    // A named header of that name: NVRTC takes it from memory.
    if (auto it = named_.find(d.name); it != named_.end() && scanned_named_.insert(d.name).second)
      add_text(*scan_text(*it->second), nullptr);
    std::vector<std::string> candidates;
    if (d.name[0] == '/') {
      candidates.push_back(d.name);
    } else {
      if (d.quoted) {
        if (from)
          candidates.push_back(join(dir_of(*from), d.name));
        else if (s_.source_dir_searched)
          candidates.push_back(join(s_.source_dir, d.name));
      }
      for (const auto& dir : s_.dirs) candidates.push_back(join(dir, d.name));
    }
    for (const auto& c : candidates) {
      if (files_.count(c) || missing_.count(c)) continue;
      if (files_.size() > kMaxDiskInputs) return;
      auto f = scan_file(c);
      if (!f) {
        missing_.insert(c);
        continue;
      }
      files_.emplace(c, f->digest);
      queue_.emplace_back(c, f->includes);
    }
  }

  // A computed include: every file under every search folder.
  Status add_folders() {
    std::vector<std::string> roots = s_.dirs;
    if (s_.source_dir_searched) roots.push_back(s_.source_dir.empty() ? std::string(".") : s_.source_dir);
    std::set<std::pair<dev_t, ino_t>> seen_dirs;
    for (const auto& root : roots) {
      std::vector<std::string> stack{root};
      while (!stack.empty()) {
        std::string dir = std::move(stack.back());
        stack.pop_back();
        struct stat st;
        if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (!seen_dirs.emplace(st.st_dev, st.st_ino).second) continue;
        DIR* dp = ::opendir(dir.c_str());
        if (!dp) continue;
        std::vector<std::string> names;
        while (struct dirent* e = ::readdir(dp)) {
          std::string n = e->d_name;
          if (n != "." && n != "..") names.push_back(std::move(n));
        }
        ::closedir(dp);
        for (const auto& n : names) {
          std::string path = (dir == "." && root == "." ? n : dir + "/" + n);
          struct stat es;
          if (::stat(path.c_str(), &es) != 0) continue;
          if (S_ISDIR(es.st_mode)) {
            stack.push_back(path);
          } else if (S_ISREG(es.st_mode) && !files_.count(path)) {
            if (files_.size() >= kMaxDiskInputs) return too_many();
            if (auto f = scan_file(path)) files_.emplace(path, f->digest);
          }
        }
      }
    }
    return Status();
  }

  const Program& p_;
  IncludeSearch s_;
  std::map<std::string, const std::string*> named_;
  std::set<std::string> scanned_named_;
  std::map<std::string, Digest> files_;  // path -> digest, sorted
  std::set<std::string> missing_;
  std::deque<std::pair<std::string, std::shared_ptr<const std::vector<Directive>>>> queue_;
  bool computed_ = false;
};

}  // namespace

std::vector<Directive> scan_includes(std::string_view text) {
  // Directives of the text with comments removed, and of the raw text too,
  // so that a comment or literal this scanner misreads can only add names.
  std::vector<Directive> out;
  scan_lines(clean(text), &out);
  scan_lines(text, &out);
  std::vector<Directive> unique;
  std::set<std::tuple<std::string, bool, bool>> seen;
  for (auto& d : out)
    if (seen.emplace(d.name, d.quoted, d.computed).second) unique.push_back(std::move(d));
  return unique;
}

IncludeSearch include_search(const std::vector<std::string>& options, std::string_view program_name) {
  IncludeSearch s;
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string& o = options[i];
    if (o == "-no-source-include" || o == "--no-source-include") {
      s.source_dir_searched = false;
    } else if (auto v = option_value(options, &i, {"--include-path"}, false)) {
      s.dirs.push_back(*v);
    } else if (auto v2 = option_value(options, &i, {"--pre-include", "-include"}, false)) {
      s.pre_includes.push_back(*v2);
    } else if (auto v3 = option_value(options, &i, {"-I"}, true)) {
      s.dirs.push_back(*v3);
    }
  }
  s.source_dir = dir_of(std::string(program_name));
  return s;
}

Expected<DiskInputs> disk_inputs(const Program& program) {
  Closure c(program, include_search(program.options, program.name.empty() ? "default_program" : program.name));
  return c.run();
}

uint64_t header_reads() noexcept { return g_reads.load(std::memory_order_relaxed); }

}  // namespace kcache::nvrtc::detail

// kcache tool — marks and bundles: `mark` prints a position in the disk
// store's recency records; `bundle create|keygen|import|ls|show|verify`
// makes, signs, imports and inspects bundle files (kcache/bundle.h).
#include <unistd.h>

#include <cstdio>
#include <set>

#include "cli.h"
#include "kcache/bundle.h"
#include "util/json.h"
#include "util/util.h"

namespace kcache::cli {

namespace {

// A progress bar on stderr when it is a terminal and the work is large.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), tty_(::isatty(2) == 1) {}
  ~Progress() {
    if (shown_) std::fprintf(stderr, "\n");
  }
  BundleProgress fn() {
    if (!tty_) return {};
    return [this](uint64_t done, uint64_t total) {
      if (total < 1000) return;
      int filled = static_cast<int>(30 * done / total);
      std::fprintf(stderr, "\r%s [%.*s%.*s] %llu/%llu", what_.c_str(), filled, "##############################",
                   30 - filled, "..............................", static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(total));
      std::fflush(stderr);
      shown_ = true;
    };
  }

 private:
  std::string what_;
  bool tty_;
  bool shown_ = false;
};

std::vector<std::string> trusted_keys() { return Options::from_env().bundles.trusted_keys; }

void info_json(util::JsonWriter& w, const BundleInfo& i) {
  w.field("version", static_cast<uint64_t>(i.version))
      .field("entry_version", static_cast<uint64_t>(i.entry_version))
      .field("entries", i.entries)
      .field("bytes", i.bytes)
      .field("created_ms", i.created_unix_ms)
      .field("signed", i.is_signed)
      .field("signer", i.signer)
      .field("trusted", i.trusted);
}

std::string signature_words(const BundleInfo& i) {
  if (!i.is_signed) return "unsigned";
  return "signed by " + i.signer.substr(0, 16) + (i.trusted ? " (trusted)" : "");
}

int bundle_create(Ctx& c) {
  const std::string* out = c.args.get("-o");
  if (!out || out->empty()) return usage_error(c.args.command, "create needs -o FILE");
  BundleSelection sel;
  if (const std::string* m = c.args.get("--since")) {
    auto v = parse_mark(*m);
    if (!v) return usage_error(c.args.command, "--since '" + *m + "' is not a mark (as `kcache mark` prints)");
    sel.since = *v;
  }
  for (const auto& [flag, value] : c.args.all_flags)
    if (flag == "--namespace") sel.namespaces.push_back(value);
  if (const std::string* f = c.args.get("--keys")) {
    auto text = util::read_file(*f, uint64_t(1) << 30);
    if (!text) return c.fail(kExitMiss, "--keys " + *f + ": " + text.error().message());
    size_t at = 0, line = 0;
    while (at < text->size()) {
      size_t end = text->find('\n', at);
      if (end == std::string::npos) end = text->size();
      std::string w = text->substr(at, end - at);
      at = end + 1;
      ++line;
      while (!w.empty() && (w.back() == '\r' || w.back() == ' ' || w.back() == '\t')) w.pop_back();
      if (w.empty() || w[0] == '#') continue;
      auto k = Digest::from_hex(w);
      if (!k)
        return usage_error(c.args.command,
                           fmt("--keys %s line %zu: '%s' is not a 32-digit hex key", f->c_str(), line, w.c_str()));
      sel.keys.push_back(*k);
    }
    if (sel.keys.empty()) return usage_error(c.args.command, "--keys " + *f + " names no key");
  }
  if (int rc = open_tiers(c, {.create = false, .remote = false, .honour_disable = false})) return rc;
  if (!c.store.disk) return c.fail(kExitError, "no store to make a bundle from: " + disk_failure(c));
  BundleWriteOptions o;
  if (const std::string* k = c.args.get("--sign")) o.sign_key_file = *k;
  Expected<BundleInfo> info = Status(Errc::internal, "");
  {
    Progress p("kcache: bundle create");
    o.progress = p.fn();
    // The writer peeks (Access::peek): recency records stay as they were.
    // Through the Cache: -o names a regular file or a link to one, never a
    // device it would replace, and stale temp files beside it are collected.
    info = write_bundle(*c.store.cache, sel, *out, o);
  }
  // A missing folder for -o is a file that cannot be written (3), not a miss.
  if (!info)
    return c.fail(info.error().code() == Errc::not_found ? kExitError : exit_for(info.error()), info.error().message());
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("path", *out);
    info_json(w, *info);
    return c.out(w.end_object().take() + "\n");
  }
  return c.out(fmt("wrote %s: %s, %s, %s\n", out->c_str(), entries_word(info->entries).c_str(),
                   util::format_size(info->bytes).c_str(), signature_words(*info).c_str()));
}

int bundle_keygen_cmd(Ctx& c, const std::string& file) {
  Status st = bundle_keygen(file);
  if (!st.is_ok()) return c.fail(st);
  if (c.json) {
    util::JsonWriter w;
    return c.out(w.begin_object().field("private", file).field("public", file + ".pub").end_object().take() + "\n");
  }
  return c.out("wrote " + file + " (private, keep it secret) and " + file + ".pub (public)\n");
}

int bundle_import(Ctx& c, const std::string& file) {
  if (int rc = open_tiers(c, {.create = true, .remote = false, .honour_disable = false})) return rc;
  if (!c.store.disk || !c.store.disk->writable())
    return c.fail(kExitError, "no writable store to import into: " + disk_failure(c));
  Expected<uint64_t> n = Status(Errc::internal, "");
  {
    Progress p("kcache: bundle import");
    n = import_bundle(file, *c.store.disk, c.store.options.bundles.trusted_keys, p.fn());
  }
  if (!n) return c.fail(n.error());
  if (kcache::Status st = c.store.cache->flush(); !st.is_ok()) return c.fail(st);
  if (c.json) {
    util::JsonWriter w;
    return c.out(w.begin_object()
                     .field("path", file)
                     .field("imported", *n)
                     .field("store", c.store.where.path)
                     .end_object()
                     .take() +
                 "\n");
  }
  return c.out(fmt("imported %s into %s\n", entries_word(*n).c_str(), c.store.where.path.c_str()));
}

int bundle_ls(Ctx& c, const std::string& file) {
  auto t = open_bundle(file, trusted_keys());
  if (!t) return c.fail(t.error());
  std::vector<ListItem> items;
  (void)(*t)->admin()->list([&](const ListItem& it) {
    items.push_back(it);
    return true;
  });
  uint64_t total = 0;
  for (const auto& it : items) total += it.size;
  if (c.json) {
    util::JsonWriter w;
    w.begin_object()
        .field("path", file)
        .field("count", items.size())
        .field("bytes", total)
        .key("entries")
        .begin_array();
    for (const auto& it : items) w.begin_object().field("key", it.key.hex()).field("size", it.size).end_object();
    return c.out(w.end_array().end_object().take() + "\n");
  }
  std::string out = fmt("%-32s  %10s\n", "KEY", "SIZE");
  for (const auto& it : items) out += fmt("%-32s  %10s\n", it.key.hex().c_str(), util::format_size(it.size).c_str());
  out += fmt("%s, %s\n", entries_word(items.size()).c_str(), util::format_size(total).c_str());
  return c.out(out);
}

int bundle_show(Ctx& c, const std::string& file) {
  auto i = bundle_info(file, trusted_keys());
  if (!i) return c.fail(i.error());
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("path", file);
    info_json(w, *i);
    return c.out(w.end_object().take() + "\n");
  }
  return c.out(
      fmt("bundle      %s\nversion     %u (entry format %u)\nentries     %llu\nsize        %s\n"
          "created     %s\nsignature   %s%s\n",
          file.c_str(), i->version, i->entry_version, static_cast<unsigned long long>(i->entries),
          util::format_size(i->bytes).c_str(), format_time(i->created_unix_ms).c_str(),
          i->is_signed ? "Ed25519, signer " : "none",
          i->is_signed ? (i->signer + (i->trusted ? " (trusted)" : "")).c_str() : ""));
}

int bundle_verify(Ctx& c, const std::string& file) {
  Expected<BundleVerifyReport> rep = Status(Errc::internal, "");
  {
    Progress p("kcache: bundle verify");
    rep = verify_bundle(file, trusted_keys(), p.fn());
  }
  if (!rep) {
    // A bundle that would be refused is a failed verification.
    if (rep.error().code() == Errc::corrupt || rep.error().code() == Errc::stale_format)
      return c.fail(kExitMiss, rep.error().message());
    return c.fail(rep.error());
  }
  int rc = rep->bad.empty() ? kExitOk : kExitMiss;
  if (c.json) {
    util::JsonWriter w;
    w.begin_object().field("path", file);
    info_json(w, rep->info);
    w.field("checked", rep->checked).field("other_format", rep->other_format).key("bad").begin_array();
    for (const auto& [k, why] : rep->bad) w.begin_object().field("key", k.hex()).field("reason", why).end_object();
    int o = c.out(w.end_array().end_object().take() + "\n");
    return o ? o : rc;
  }
  std::string out = fmt("checked %s of %s (%s): %zu bad", entries_word(rep->checked).c_str(), file.c_str(),
                        signature_words(rep->info).c_str(), rep->bad.size());
  if (rep->other_format)
    out += fmt(", %llu of another entry format", static_cast<unsigned long long>(rep->other_format));
  out += "\n";
  for (const auto& [k, why] : rep->bad) out += "  " + k.hex() + "  " + why + "\n";
  int o = c.out(out);
  return o ? o : rc;
}

}  // namespace

int cmd_mark(Ctx& c) {
  if (int rc = open_tiers(c, {.create = true, .remote = false, .honour_disable = false})) return rc;
  if (!c.store.admin) return c.fail(kExitError, "no store to mark: " + disk_failure(c));
  auto m = c.store.admin->mark();
  if (!m) return c.fail(m.error());
  if (c.json) {
    util::JsonWriter w;
    return c.out(w.begin_object().field("mark", *m).end_object().take() + "\n");
  }
  return c.out(std::to_string(*m) + "\n");
}

int cmd_bundle(Ctx& c) {
  const auto& pos = c.args.positional;
  if (pos.empty()) return usage_error(c.args.command, "which? create, keygen, import, ls, show or verify");
  const std::string& sub = pos[0];
  if (sub == "create") {
    if (pos.size() > 1) return usage_error(c.args.command, "unexpected argument '" + pos[1] + "'");
    return bundle_create(c);
  }
  std::set<std::string> takes_file = {"keygen", "import", "ls", "show", "verify"};
  if (!takes_file.count(sub)) return usage_error(c.args.command, "unknown bundle command '" + sub + "'");
  if (pos.size() != 2) return usage_error(c.args.command, sub + " takes one FILE");
  for (const char* f : {"-o", "--since", "--namespace", "--keys", "--sign"})
    if (c.args.has(f)) return usage_error(c.args.command, std::string(f) + " belongs to bundle create");
  const std::string& file = pos[1];
  if (sub == "keygen") return bundle_keygen_cmd(c, file);
  if (sub == "import") return bundle_import(c, file);
  if (sub == "ls") return bundle_ls(c, file);
  if (sub == "show") return bundle_show(c, file);
  return bundle_verify(c, file);
}

}  // namespace kcache::cli

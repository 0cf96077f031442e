// kcache/status.h — error values used across the library.
//
// kcache does not throw. An operation that can fail returns `Status` (no
// value) or `Expected<T>` (a value or a Status). A cache *miss* is never an
// error: lookups return std::optional and std::nullopt means "not there".
//
// Thread-safety: plain values; safe to copy between threads.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kcache {

enum class Errc {
  ok = 0,
  not_found,         // named thing does not exist (artifact, file, key on CLI)
  invalid_argument,  // the caller broke a documented precondition
  corrupt,           // stored bytes failed verification
  io_error,          // the operating system refused an operation
  no_space,          // ENOSPC / EDQUOT / MDB_MAP_FULL
  read_only,         // EROFS / EACCES on write, or a read-only tier
  unavailable,       // tier switched off (breaker open, disabled)
  timeout,           // a bounded wait ran out
  too_large,         // larger than a configured bound
  compile_failed,    // the user's compile function reported failure
  internal,          // a bug in kcache
  stale_format,      // stored by a build with another entry format version:
                     // a miss, neither corrupt nor removed
};

std::string_view errc_name(Errc e) noexcept;

enum class LogLevel : uint8_t { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() noexcept { return Status(); }

  bool is_ok() const noexcept { return code_ == Errc::ok; }
  explicit operator bool() const noexcept { return is_ok(); }
  Errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "corrupt: checksum mismatch in entry 01ab..." ; "ok" when ok.
  std::string to_string() const;

 private:
  Errc code_ = Errc::ok;
  std::string message_;
};

// A value of T or an error Status (never an ok Status).
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT
  Expected(Status error) : v_(std::in_place_index<1>, std::move(error)) {  // NOLINT
    assert(!std::get<1>(v_).is_ok() && "Expected built from an ok Status");
  }

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  // REQUIRES: has_value()
  T& value() & {
    assert(has_value());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(has_value());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(has_value());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // REQUIRES: !has_value()
  const Status& error() const& {
    assert(!has_value());
    return std::get<1>(v_);
  }
  Status&& error() && {
    assert(!has_value());
    return std::get<1>(std::move(v_));
  }
  Status status() const { return has_value() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kcache

// KCACHE_TRY(x, expr): evaluates expr (an Expected<T>); on error returns the
// Status from the enclosing function, else moves the value into `x`.
#define KCACHE_CONCAT_INNER(a, b) a##b
#define KCACHE_CONCAT(a, b) KCACHE_CONCAT_INNER(a, b)
#define KCACHE_TRY(lhs, expr)                                                                                \
  auto KCACHE_CONCAT(kcache_try_, __LINE__) = (expr);                                                        \
  if (!KCACHE_CONCAT(kcache_try_, __LINE__)) return std::move(KCACHE_CONCAT(kcache_try_, __LINE__)).error(); \
  lhs = std::move(KCACHE_CONCAT(kcache_try_, __LINE__)).value()

// KCACHE_RETURN_IF_ERROR(status_expr)
#define KCACHE_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::kcache::Status kcache_st_ = (expr);       \
    if (!kcache_st_.is_ok()) return kcache_st_; \
  } while (0)

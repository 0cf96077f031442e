// util::Fd: the one owning descriptor type. Move-only; closes its
// descriptor (through the Env that opened it) when destroyed or reset.
#pragma once

#include <utility>

#include "kcache/env.h"

namespace kcache::util {

class Fd {
 public:
  Fd() noexcept = default;
  // Owns `fd` (-1: none), closed through `env`, which must outlive it.
  explicit Fd(int fd, Env& env = *Env::posix()) noexcept : fd_(fd), env_(&env) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)), env_(o.env_) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
      env_ = o.env_;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  // Gives the descriptor up without closing it.
  int release() noexcept { return std::exchange(fd_, -1); }
  // Closes what it holds (errors ignored) and holds `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) (void)env_->close(fd_);
    fd_ = fd;
  }
  // Closes now, for callers that check what close says (a write's last
  // error can surface there): 0, or -1 with errno. Holds none after.
  int close() noexcept {
    if (fd_ < 0) return 0;
    return env_->close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
  Env* env_ = Env::posix().get();
};

}  // namespace kcache::util

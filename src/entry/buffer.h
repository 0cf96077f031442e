// Private: a 64-byte aligned heap buffer that tiers read into.
#pragma once

#include <cstdlib>
#include <memory>
#include <string_view>

#include "kcache/entry.h"

namespace kcache {

class AlignedBuffer final : public Buffer {
 public:
  explicit AlignedBuffer(size_t size)
      : data_(static_cast<char*>(std::aligned_alloc(64, round_up(size ? size : 1)))), size_(size) {
    if (!data_) throw std::bad_alloc();
  }
  ~AlignedBuffer() override { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::string_view bytes() const noexcept override { return {data_, size_}; }
  char* data() noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  void shrink(size_t n) noexcept {
    if (n < size_) size_ = n;
  }

 private:
  static size_t round_up(size_t n) { return (n + 63) & ~size_t(63); }
  char* data_;
  size_t size_;
};

}  // namespace kcache

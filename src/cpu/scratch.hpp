// Aligned fp32 buffers for the CPU backend, counted by the scratch accounting in tiles.hpp and, from 1 MiB, taken from
// and returned to its scratch cache (scratch_take / scratch_give).
#pragma once

#include <cstring>
#include <new>

#include "cpu/tiles.hpp"

namespace flashattn::cpu {

class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(std::size_t n) { reset(n); }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { release(); }

  // Returns false when the allocation failed.
  bool reset(std::size_t n) {
    release();
    if (n == 0) return true;
    constexpr std::size_t kAlign = 64;  // one cache line, the widest vector
    bytes_ = (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    data_ = static_cast<float*>(scratch_take(&bytes_));
    if (data_ == nullptr) {
      bytes_ = 0;
      return false;
    }
    note_alloc(bytes_);
    return true;
  }
  void zero() {
    if (data_) std::memset(data_, 0, bytes_);
  }
  float* data() const { return data_; }

 private:
  void release() {
    if (data_) {
      scratch_give(data_, bytes_);
      note_free(bytes_);
    }
    data_ = nullptr;
    bytes_ = 0;
  }
  float* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace flashattn::cpu

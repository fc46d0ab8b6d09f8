// The incoherent-processing rotation of fa_quantize_fp8 (flashattn.h): x' = x . diag(signs) . H_D / sqrt(D), H_D the
// Sylvester Hadamard matrix. The signs are a pure function of (seed, column), shared by the CPU quantisation, the
// CUDA one and fa_hadamard_sign, so that q and k quantised apart (even on different devices) get the same rotation.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace flashattn::detail {

// splitmix64's finaliser of (seed, column): +1 or -1.
FA_HOST_DEVICE int hadamard_sign(uint64_t seed, int column) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t(column) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z & 1) ? -1 : 1;
}

// In-place fast Walsh-Hadamard transform of n (a power of two) values, normalised by 1/sqrt(n): the butterfly order
// (stride 1, 2, 4, ...) every implementation follows, so that the CPU and CUDA paths round alike.
template <class T>
FA_HOST_DEVICE void walsh_hadamard(T* x, int n, T inv_sqrt_n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  for (int i = 0; i < n; ++i) x[i] *= inv_sqrt_n;
}

// The fp8 quantisation's largest finite value (e4m3fn) and the factor a group with maximum |x| gets: 1 for an
// all-zero group (its values quantise to 0 either way).
constexpr float kE4m3Max = 448.f;
FA_HOST_DEVICE float fp8_descale_of(float amax) { return amax > 0.f ? amax / kE4m3Max : 1.f; }

}  // namespace flashattn::detail

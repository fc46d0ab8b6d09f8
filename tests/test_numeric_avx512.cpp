// exp_nonpositive's AVX-512 form (cpu/numeric.hpp: 16-float vectors in the AVX-512 kernel builds) gives the generic
// definition's value bit for bit: every 997th float pattern (16 consecutive patterns each), every float around the
// flush-to-zero boundary (t = x log2(e) = -126), and the special values; NaN gives NaN. This unit is built with the
// AVX-512 flags of those builds and skips on processors without AVX-512F.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/numeric.hpp"

#if defined(__AVX512F__)
namespace {

using flashattn::cpu::exp_nonpositive;
typedef float v16 __attribute__((vector_size(64)));

// Patterns [first, first + 16) through both forms; returns the number of lanes that differ (NaN = NaN).
int differ(uint32_t first, float* at) {
  float in[16];
  for (int i = 0; i < 16; ++i) {
    const uint32_t b = first + uint32_t(i);
    std::memcpy(&in[i], &b, 4);
  }
  v16 x;
  std::memcpy(&x, in, sizeof x);
  const v16 y = exp_nonpositive(x);
  int n = 0;
  for (int i = 0; i < 16; ++i) {
    if (!(in[i] <= 1.f) && !std::isnan(in[i])) continue;  // the domain: x <= 0 (and rounding's small positives)
    const float want = exp_nonpositive(in[i]), got = y[i];
    if ((std::isnan(want) && std::isnan(got)) || std::memcmp(&want, &got, 4) == 0) continue;
    *at = in[i];
    ++n;
  }
  return n;
}

TEST(NumericAvx512, ExpVectorFormEqualsTheGenericOne) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512F on this processor";
  float at = 0.f;
  int64_t bad = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 997) bad += differ(uint32_t(u), &at);
  float boundary = -126.f / 1.44269504088896341f;
  uint32_t b;
  std::memcpy(&b, &boundary, 4);
  for (uint32_t u = b - 4096; u < b + 4096; u += 16) bad += differ(u, &at);
  for (float s : {0.f, -0.f, -INFINITY, INFINITY, NAN, -NAN, -1e-45f, -1e-38f, -87.f, -88.f, -104.f}) {
    std::memcpy(&b, &s, 4);
    bad += differ(b, &at);
  }
  EXPECT_EQ(bad, 0) << "e.g. at x = " << at;
}

}  // namespace
#endif

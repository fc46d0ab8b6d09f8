// The CPU kernels' elementary functions (src/cpu/numeric.hpp) against libm in double: exp_nonpositive and
// tanh_fast within a few fp32 ulps over their whole range, their special values, and the vector forms equal to the
// scalar ones bit for bit (the kernels use both).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "cpu/numeric.hpp"

namespace {

using flashattn::cpu::exp_nonpositive;
using flashattn::cpu::tanh_fast;
constexpr double kUlp = 5.9604644775390625e-8;  // 2^-24, fp32's unit roundoff

// The range reduction rounds x log2(e) to fp32, so the error grows with |x| as if x itself were off by an ulp
// (the rounding any fp32 argument already carries): bounded by 1.5 (4 + |x|) ulps (measured: 1.14).
TEST(Numeric, ExpNonpositiveWithinUlps) {
  double worst = 0, at = 0;
  for (double x = -87.0; x <= 0.0; x += 1.0 / 4096) {
    const float f = float(x);
    const double want = std::exp(double(f));
    const double err = std::fabs(double(exp_nonpositive(f)) - want) / want / (4 - x);
    if (err > worst) worst = err, at = f;
  }
  EXPECT_LT(worst, 1.5 * kUlp) << "at " << at;
  EXPECT_EQ(exp_nonpositive(0.f), 1.f);
  EXPECT_EQ(exp_nonpositive(-INFINITY), 0.f);
  EXPECT_TRUE(std::isnan(exp_nonpositive(NAN)));
}

// Near 0 the quotient (1 - e^-2a) / (1 + e^-2a) alone was 1.4e-2 off in relative terms (at 1e-6): the polynomial
// branch below |x| = 1 is what this bounds.
TEST(Numeric, TanhWithinUlpsEverywhere) {
  double worst = 0, at = 0;
  for (double x = 1e-30; x < 40; x *= 1.0001) {
    for (const float f : {float(x), -float(x)}) {
      const double want = std::tanh(double(f));
      const double err = std::fabs(double(tanh_fast(f)) - want) / std::fabs(want);
      if (err > worst) worst = err, at = f;
    }
  }
  EXPECT_LT(worst, 4 * kUlp) << "at " << at;
  EXPECT_EQ(tanh_fast(0.f), 0.f);
  EXPECT_EQ(tanh_fast(50.f), 1.f);
  EXPECT_EQ(tanh_fast(-INFINITY), -1.f);
  EXPECT_TRUE(std::isnan(tanh_fast(NAN)));
}

TEST(Numeric, VectorFormsEqualScalar) {
  // 16-byte vectors: the baseline x86-64 ISA of this unit (the kernels' wider ones are built per ISA).
  typedef float v4 __attribute__((vector_size(16)));
  const float xs[8] = {-3.5f, -1.f, -0.999f, -1e-5f, 0.f, 2e-3f, 0.75f, 9.f};
  for (int half = 0; half < 2; ++half) {
    v4 v;
    std::memcpy(&v, xs + 4 * half, sizeof v);
    const v4 t = tanh_fast(v), e = exp_nonpositive(v < 0.f ? v : -v);
    for (int i = 0; i < 4; ++i) {
      const float x = xs[4 * half + i];
      EXPECT_EQ(t[i], tanh_fast(x)) << x;
      EXPECT_EQ(e[i], exp_nonpositive(x < 0.f ? x : -x)) << x;
    }
  }
}

}  // namespace

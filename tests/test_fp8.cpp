// FP8 (e4m3) inputs on the CPU backend: the e4m3 conversions, the forward against the float64 reference of the
// dequantised inputs on odd shapes and every mask, the factors' shapes and rules, and fa_quantize_fp8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attention_case.hpp"
#include "core/hadamard.hpp"
#include "cpu/numeric.hpp"

namespace flashattn::testing {
namespace {

TEST(Fp8, E4m3RoundTripsEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float x = cpu::e4m3_to_float(uint8_t(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(x)) << code;
      continue;
    }
    EXPECT_EQ(cpu::float_to_e4m3(x), code == 0x80 ? 0x80 : code) << code << " = " << x;
  }
  EXPECT_EQ(cpu::e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(cpu::e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(cpu::e4m3_to_float(0x08), 0x1p-6f);
}

TEST(Fp8, E4m3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(cpu::float_to_e4m3(1.0625f), 0x38);     // tie between 1 and 1.125: the even mantissa (1)
  EXPECT_EQ(cpu::float_to_e4m3(1.1875f), 0x3a);     // tie between 1.125 and 1.25: 1.25
  EXPECT_EQ(cpu::float_to_e4m3(1.07f), 0x39);       // above the tie: 1.125
  EXPECT_EQ(cpu::float_to_e4m3(0x1p-10f), 0x00);    // half the smallest subnormal: ties to 0
  EXPECT_EQ(cpu::float_to_e4m3(0x1.8p-10f), 0x01);  // 0.75 of it: up
  EXPECT_EQ(cpu::float_to_e4m3(0x1.8p-9f), 0x02);   // 1.5 subnormal steps: the even 2
  EXPECT_EQ(cpu::float_to_e4m3(0x1.fp-7f), 0x08);   // 7.75 subnormal steps: up to 8, the smallest normal's code
  EXPECT_EQ(cpu::float_to_e4m3(464.f), 0x7e);       // past 448: saturated, not NaN
  EXPECT_EQ(cpu::float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(cpu::float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(cpu::float_to_e4m3(-3.f), 0xc4);
  EXPECT_EQ(cpu::float_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
  // Against the definition: the nearest representable value, ties to the even code, on random inputs.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mag(-12.f, 9.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(mag(rng)) * (i % 2 ? -1.f : 1.f);
    const uint8_t got = cpu::float_to_e4m3(x);
    const float gv = cpu::e4m3_to_float(got);
    float best = INFINITY;
    for (int c = 0; c < 256; ++c) {
      const float v = cpu::e4m3_to_float(uint8_t(c));
      if (!std::isnan(v)) best = std::fmin(best, std::fabs(v - x));
    }
    ASSERT_EQ(std::fabs(gv - x), best) << x;
  }
}

void expect_fp8_matches(Case c) {
  c.dtype = FA_FLOAT8_E4M3;
  c.backend = FA_BACKEND_CPU;
  expect_matches_reference(c, false);
}

class Fp8OddShapes : public ::testing::TestWithParam<std::tuple<std::pair<int64_t, int64_t>, int>> {};

TEST_P(Fp8OddShapes, MatchesReference) {
  auto [lens, mask] = GetParam();
  Case c = with_lengths(lens.first, lens.second);
  c.causal = mask != 0;
  c.top_left = mask == 2;
  expect_fp8_matches(c);
}

INSTANTIATE_TEST_SUITE_P(Seqlens, Fp8OddShapes,
                         ::testing::Combine(::testing::Values(std::make_pair(1, 1), std::make_pair(17, 17),
                                                              std::make_pair(239, 1), std::make_pair(1, 239),
                                                              std::make_pair(113, 203), std::make_pair(1023, 1024)),
                                            ::testing::Values(0, 1, 2)));

TEST(Fp8Cpu, FactorsGqaAndHeadDims) {
  for (auto descale : {Case::Descale::kNone, Case::Descale::kKvHeads, Case::Descale::kQueryHeads})
    for (auto [hq, hkv] : {std::pair<int, int>{4, 4}, {6, 2}, {8, 1}}) {
      Case c = with_lengths(65, 130);
      c.batch = 2;
      c.hq = hq;
      c.hkv = hkv;
      c.descale = descale;
      c.causal = true;
      expect_fp8_matches(c);
    }
  for (auto [d, dv] : {std::pair<int, int>{128, 128}, {256, 256}, {96, 64}, {8, 8}}) {
    Case c = with_lengths(40, 77);
    c.d = d;
    c.dv = dv;
    expect_fp8_matches(c);
  }
}

TEST(Fp8Cpu, VarlenWindowsModsSeqused) {
  Case v;
  v.lens_q = {1, 17, 0, 64};
  v.lens_k = {5, 17, 9, 100};
  v.causal = true;
  expect_fp8_matches(v);
  Case w = with_lengths(100, 140);
  w.wl = 16;
  w.wr = 3;
  expect_fp8_matches(w);
  Case m = with_lengths(50, 90);
  m.softcap = 20.f;
  m.alibi = Alibi::kHeads;
  m.sinks = true;
  expect_fp8_matches(m);
  Case u = with_lengths(9, 80);
  u.batch = 3;
  u.seqused_k = {80, 33, 0};
  u.nan_past_used = true;  // e4m3 NaN (0xff) in the unused cache rows
  expect_fp8_matches(u);
}

// A factor of 2 on v must double out exactly where nothing else changes; one on q_descale, like k's, scales the
// logits: out with (q x 2, k x 1) equals out with (q x 1, k x 2).
TEST(Fp8Cpu, FactorsEnterWhereTheSemanticsSay) {
  Case c = with_lengths(33, 47);
  c.dtype = FA_FLOAT8_E4M3;
  c.backend = FA_BACKEND_CPU;
  Problem a(c), b(c);
  for (float& f : b.v_descale) f *= 2.f;
  for (float& f : b.q_descale) f *= 2.f;
  for (float& f : a.k_descale) f *= 2.f;
  for (float& f : a.v_descale) f *= 2.f;
  ASSERT_TRUE(a.run_forward().ok());
  ASSERT_TRUE(b.run_forward().ok());
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size()), 0);
  Problem base(c);
  ASSERT_TRUE(base.run_forward().ok());
  EXPECT_NE(std::memcmp(a.out.data(), base.out.data(), a.out.size()), 0);
}

TEST(Fp8Validation, RulesNameTheArgument) {
  Case c = with_lengths(5, 7);
  c.dtype = FA_FLOAT8_E4M3;
  {
    Problem pr(c);
    FwdParams p = pr.fwd();
    p.attn.q_descale.shape[1] = 3;  // neither (B, Hkv) nor (B, Hq)
    Status st = forward(p, pr.exec());
    EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(st.message.find("q_descale: shape must be (batch, heads_kv)"), std::string::npos) << st.message;
  }
  {
    Problem pr(c);
    pr.k_descale[0] = -1.f;
    Status st = pr.run_forward();
    EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(st.message.find("k_descale: entries must be finite and >= 0"), std::string::npos) << st.message;
  }
  {
    Problem pr(c);
    FwdParams p = pr.fwd();
    p.out.dtype = FA_FLOAT8_E4M3;
    Status st = forward(p, pr.exec());
    EXPECT_NE(st.message.find("out: dtype must be bfloat16 (float8_e4m3fn inputs)"), std::string::npos) << st.message;
  }
  {
    Problem pr(c);
    Status st = backward(pr.bwd(), pr.exec());
    EXPECT_EQ(st.code, FA_ERROR_UNSUPPORTED);
    EXPECT_NE(st.message.find("float8_e4m3fn is forward only"), std::string::npos) << st.message;
  }
  {
    Case b = with_lengths(5, 7);  // 16-bit inputs take no factors
    Problem pr(b);
    FwdParams p = pr.fwd();
    p.attn.k_descale = make_tensor(pr.k_descale.data(), FA_FLOAT32, {1, 2});
    Status st = forward(p, pr.exec());
    EXPECT_NE(st.message.find("k_descale: is for float8_e4m3fn q/k/v only"), std::string::npos) << st.message;
  }
}

// fa_quantize_fp8: the factor is max |x'| / 448 per (batch, head); the bytes are x' / factor rounded to e4m3; with
// the rotation x' = x . diag(signs) . H / sqrt(D) (H Sylvester's), computed here in float64 from its definition.
TEST(Fp8Quantize, FactorsBytesAndRotation) {
  const int64_t B = 2, S = 37, H = 3, D = 64;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::bernoulli_distribution outlier(0.01);
  std::vector<float> x(size_t(B * S * H * D));
  for (float& v : x) v = dist(rng) + (outlier(rng) ? 40.f * dist(rng) : 0.f);
  for (int hadamard : {0, 1}) {
    std::vector<uint8_t> out(x.size(), 0xff);
    std::vector<float> descale(size_t(B * H), std::nanf(""));
    fa_quantize_params q{};
    q.x = make_tensor(x.data(), FA_FLOAT32, {B, S, H, D});
    q.out = make_tensor(out.data(), FA_FLOAT8_E4M3, {B, S, H, D});
    q.descale = make_tensor(descale.data(), FA_FLOAT32, {B, H});
    q.hadamard = hadamard;
    q.seed = 1234;
    const Status st = quantize_fp8(q);  // the C++ API's wrapper of fa_quantize_fp8
    ASSERT_TRUE(st.ok()) << st.message;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> rot(size_t(S * D));
        double amax = 0;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < D; ++j) {
            double acc = 0;
            for (int64_t c = 0; c < D; ++c) {
              const double xv = x[size_t(((b * S + s) * H + h) * D + c)];
              acc += hadamard ? xv * detail::hadamard_sign(1234, int(c)) *
                                    (__builtin_popcountll(uint64_t(c & j)) % 2 ? -1 : 1) / std::sqrt(double(D))
                              : (c == j ? xv : 0.0);
            }
            rot[size_t(s * D + j)] = acc;
            amax = std::max(amax, std::fabs(acc));
          }
        const float f = descale[size_t(b * H + h)];
        EXPECT_NEAR(f, amax / 448.0, amax / 448.0 * 1e-6) << b << "," << h;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < D; ++j) {
            const double want = rot[size_t(s * D + j)];
            const double got = double(cpu::e4m3_to_float(out[size_t(((b * S + s) * H + h) * D + j)])) * f;
            // e4m3's rounding: half a step of 3 mantissa bits, or of the subnormal grid.
            ASSERT_LE(std::fabs(got - want), std::max(std::fabs(want) * 0x1p-4, 0x1p-10 * f) * 1.0001)
                << hadamard << " " << b << "," << s << "," << h << "," << j;
          }
      }
  }
}

TEST(Fp8Quantize, HadamardKeepsTheLogitsAndRejectsOtherDims) {
  // The same rotation of q and k leaves q.k^T unchanged (up to fp32 and e4m3 rounding of the quantised values).
  const int64_t D = 128;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(D)), k(static_cast<size_t>(D));
  for (float& v : q) v = dist(rng);
  for (float& v : k) v = dist(rng);
  double exact = 0;
  for (int64_t c = 0; c < D; ++c) exact += double(q[size_t(c)]) * k[size_t(c)];
  std::vector<float> rq(q), rk(k);
  for (int64_t c = 0; c < D; ++c) {
    rq[size_t(c)] *= float(detail::hadamard_sign(7, int(c)));
    rk[size_t(c)] *= float(detail::hadamard_sign(7, int(c)));
  }
  detail::walsh_hadamard(rq.data(), int(D), 1.f / std::sqrt(float(D)));
  detail::walsh_hadamard(rk.data(), int(D), 1.f / std::sqrt(float(D)));
  double rotated = 0;
  for (int64_t c = 0; c < D; ++c) rotated += double(rq[size_t(c)]) * rk[size_t(c)];
  EXPECT_NEAR(rotated, exact, 1e-4);
  EXPECT_EQ(fa_hadamard_sign(7, 5), detail::hadamard_sign(7, 5));

  std::vector<float> x(size_t(2 * 48), 1.f);
  std::vector<uint8_t> out(x.size());
  std::vector<float> descale(2);
  fa_quantize_params p{};
  p.x = make_tensor(x.data(), FA_FLOAT32, {1, 2, 1, 48});
  p.out = make_tensor(out.data(), FA_FLOAT8_E4M3, {1, 2, 1, 48});
  p.descale = make_tensor(descale.data(), FA_FLOAT32, {1, 1});
  p.hadamard = 1;
  EXPECT_EQ(fa_quantize_fp8(&p, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("hadamard: needs a head dim"), std::string::npos) << fa_last_error();
  p.hadamard = 0;
  ASSERT_EQ(fa_quantize_fp8(&p, nullptr), FA_OK) << fa_last_error();
  EXPECT_EQ(descale[0], 1.f / 448.f);
  EXPECT_EQ(out[0], 0x7e);  // 1 / (1/448) = 448
  fa_exec cuda_exec = fa_exec_default();
  cuda_exec.backend = FA_BACKEND_CUDA_SM90;
  EXPECT_EQ(fa_quantize_fp8(&p, &cuda_exec), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("exec.backend: a CUDA backend needs CUDA tensors"), std::string::npos);
  cuda_exec.backend = fa_backend(9);
  EXPECT_EQ(fa_quantize_fp8(&p, &cuda_exec), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("exec.backend: unknown backend code 9"), std::string::npos);
  fa_quantize_params bad = p;
  bad.descale = make_tensor(descale.data(), FA_FLOAT32, {1, 2});
  EXPECT_EQ(fa_quantize_fp8(&bad, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("descale: shape must be (1, 1)"), std::string::npos) << fa_last_error();
  bad = p;
  bad.x.ndim = 3;
  EXPECT_EQ(fa_quantize_fp8(&bad, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("x: must have 4 dimensions"), std::string::npos) << fa_last_error();
  EXPECT_EQ(fa_quantize_fp8(nullptr, nullptr), FA_ERROR_INVALID_ARGUMENT);
  p.out = make_tensor(x.data(), FA_FLOAT8_E4M3, {1, 2, 1, 48});  // the output over its input
  EXPECT_EQ(fa_quantize_fp8(&p, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("out: must not overlap x"), std::string::npos) << fa_last_error();
}

}  // namespace
}  // namespace flashattn::testing

// Tiled CPU backward vs the float64 reference (and central finite differences on tiny shapes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "attention_case.hpp"
#include "cpu/tiles.hpp"

namespace flashattn::testing {
namespace {

void expect_backward_matches(const Case& c) { expect_matches_reference(c, true); }

class BwdShapes : public ::testing::TestWithParam<std::tuple<std::pair<int64_t, int64_t>, int>> {};

TEST_P(BwdShapes, MatchesReference) {
  auto [lens, mask] = GetParam();
  Case c = with_lengths(lens.first, lens.second);
  c.causal = mask != 0;
  c.top_left = mask == 2;
  expect_backward_matches(c);
}

INSTANTIATE_TEST_SUITE_P(Seqlens, BwdShapes,
                         ::testing::Combine(::testing::Values(std::make_pair(1, 1), std::make_pair(17, 17),
                                                              std::make_pair(239, 1), std::make_pair(113, 203),
                                                              std::make_pair(203, 113), std::make_pair(255, 256)),
                                            ::testing::Values(0, 1, 2)));

TEST(CpuBackward, HeadDimsAndDtypes) {
  for (auto [d, dv] : {std::pair<int, int>{8, 8}, {72, 72}, {96, 96}, {128, 64}, {192, 128}, {256, 256}}) {
    Case c = with_lengths(70, 90);
    c.d = d;
    c.dv = dv;
    c.causal = true;
    expect_backward_matches(c);
  }
  for (fa_dtype t : {FA_FLOAT32, FA_FLOAT16}) {
    Case c = with_lengths(100, 130);
    c.dtype = t;
    expect_backward_matches(c);
  }
}

// One visible key makes the exact dS = P * (dP - D) zero: dQ and dK are 0 by cancellation. FlashAttention's
// D = rowsum(dO * O) leaves fp32 noise there (dk ~2e-6 at these shapes) where the plain implementation's
// D = sum(P dP) cancels exactly, so without the reference's noise allowance (Grads::dk_noise) the 2x rule refused
// these correct fp32 backwards (the fuzz tier's deep run found them). The allowance stays below 1.4e-4 here: an
// error of 1e-3 must still fail.
TEST(CpuBackward, Fp32GradientsZeroByCancellation) {
  struct Shape {
    int64_t batch, sq, hq, hkv, d;
    bool alibi;
    int64_t pad;
  };
  for (const Shape& s :
       {Shape{2, 100, 1, 1, 16, false, 0}, Shape{1, 65, 2, 1, 64, true, 8}, Shape{2, 64, 6, 2, 24, false, 16}}) {
    Case c = with_lengths(s.sq, 1);
    c.dtype = FA_FLOAT32;
    c.batch = s.batch, c.hq = s.hq, c.hkv = s.hkv, c.d = s.d, c.head_pad = s.pad;
    c.alibi = s.alibi ? Alibi::kHeads : Alibi::kNone;
    SCOPED_TRACE(c.label());
    Problem pr(c);
    ASSERT_TRUE(pr.run_forward().ok());
    ASSERT_TRUE(pr.run_backward().ok());
    Accuracy g = pr.check_backward();
    EXPECT_TRUE(g.dq.passed()) << "dq: " << g.dq.summary();
    EXPECT_TRUE(g.dk.passed()) << "dk: " << g.dk.summary();
    float* dk = reinterpret_cast<float*>(pr.dk.data());
    dk[c.d / 2] += 1e-3f;
    EXPECT_FALSE(pr.check_backward().dk.passed()) << "a dk off by 1e-3 passed";
  }
}

TEST(CpuBackward, GqaWindowsSoftcapAlibi) {
  for (auto [hq, hkv] : {std::pair<int, int>{8, 1}, {6, 2}}) {
    Case c = with_lengths(80, 120);
    c.hq = hq;
    c.hkv = hkv;
    c.causal = true;
    expect_backward_matches(c);
  }
  Case w = with_lengths(150, 150);
  w.wl = 20;
  w.wr = 7;
  expect_backward_matches(w);
  w.top_left = true;
  w.softcap = 2.f;
  expect_backward_matches(w);
  Case a = with_lengths(90, 140);
  a.alibi = Alibi::kHeads;
  a.causal = true;
  expect_backward_matches(a);
}

// Learnable sinks: forward and backward (dq, dk, dv, dsinks) against the reference; bottom-right causal with more
// queries than keys leaves rows with no visible key (out 0, lse = the sink, no gradient but the sink's).
TEST(CpuBackward, Sinks) {
  for (fa_dtype t : {FA_FLOAT32, FA_BFLOAT16}) {
    Case c = with_lengths(130, 90);
    c.dtype = t;
    c.sinks = true;
    c.hq = 4;
    expect_backward_matches(c);
    c.causal = true;
    expect_backward_matches(c);
    c.causal = false;
    c.wl = 20, c.wr = 2, c.softcap = 3.f, c.hkv = 1;
    expect_backward_matches(c);
    Case v;
    v.lens_q = {5, 0, 40};
    v.lens_k = {70, 6, 1};
    v.dtype = t;
    v.sinks = true;
    v.causal = true;
    expect_backward_matches(v);
  }
}

// Dropout: the reference draws the same mask (core/dropout.hpp), so forward and backward match it element for
// element; with sinks, GQA, windows and varlen too.
TEST(CpuBackward, Dropout) {
  for (fa_dtype t : {FA_FLOAT32, FA_BFLOAT16}) {
    for (float p : {0.1f, 0.5f}) {
      Case c = with_lengths(70, 133);
      c.dtype = t;
      c.dropout_p = p;
      c.hq = 4;
      c.hkv = 2;
      expect_backward_matches(c);
      c.causal = true;
      c.sinks = true;
      c.dropout_seed = 7, c.dropout_offset = (uint64_t(1) << 40) + 3;
      expect_backward_matches(c);
    }
    Case v;
    v.lens_q = {5, 0, 40};
    v.lens_k = {70, 6, 1};
    v.dtype = t;
    v.dropout_p = 0.2f;
    v.wl = 9, v.wr = 2, v.softcap = 4.f;
    expect_backward_matches(v);
  }
}

// The generator against its authors' known answers (Random123's kat_vectors, philox4x32 at 7 and 10 rounds).
TEST(CpuBackward, PhiloxKnownAnswers) {
  auto words = [](const detail::PhiloxWords& w) { return std::vector<uint32_t>(w.w, w.w + 4); };
  using V = std::vector<uint32_t>;
  EXPECT_EQ(words(detail::philox4x32<10>(0, 0, 0, 0, 0, 0)), (V{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(words(detail::philox4x32<10>(~0u, ~0u, ~0u, ~0u, ~0u, ~0u)),
            (V{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(words(detail::philox4x32<10>(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u)),
            (V{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
  EXPECT_EQ(words(detail::philox4x32<7>(0, 0, 0, 0, 0, 0)), (V{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}));
  EXPECT_EQ(words(detail::philox4x32<7>(~0u, ~0u, ~0u, ~0u, ~0u, ~0u)),
            (V{0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}));
  EXPECT_EQ(words(detail::philox4x32<7>(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u)),
            (V{0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}));
}

// The mask is a pure function of its coordinates: the keep rate over 10^7 draws is within 4 sigma of 1 - p, and
// another seed or offset draws another mask.
TEST(CpuBackward, DropoutMaskStatistics) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const detail::DropoutRule rule(p, 1234, 5);
    int64_t kept = 0, n = 0;
    for (int64_t i = 0; i < 2500; ++i)
      for (int64_t j = 0; j < 4000; ++j, ++n) kept += rule.factor(i % 3, 4, i % 4, i, j) != 0.f;
    const double q = 1.0 - double(p), sigma = std::sqrt(double(n) * q * (1 - q));
    EXPECT_LE(std::fabs(double(kept) - double(n) * q), 4 * sigma) << "p " << p << ": kept " << kept << " of " << n;
  }
  const detail::DropoutRule a(0.5f, 1, 0), b(0.5f, 2, 0), c(0.5f, 1, 1);
  int same_b = 0, same_c = 0;
  for (int64_t j = 0; j < 1000; ++j) {
    same_b += (a.factor(0, 1, 0, 3, j) == b.factor(0, 1, 0, 3, j));
    same_c += (a.factor(0, 1, 0, 3, j) == c.factor(0, 1, 0, 3, j));
  }
  EXPECT_LT(same_b, 600);
  EXPECT_LT(same_c, 600);
  EXPECT_GT(same_b, 400);
}

// attn.dropout_rng (seed and offset in an int64 tensor) draws the mask of the same two integers: the reference
// agrees, and the outputs and gradients equal those of the integers bit for bit.
TEST(CpuBackward, DropoutRngTensor) {
  Case c = with_lengths(37, 70);
  c.dropout_p = 0.3f;
  c.causal = true;
  c.hq = 4;
  c.hkv = 2;
  c.dropout_seed = 0x123456789abcdefull, c.dropout_offset = (uint64_t(3) << 40) + 77;
  Case t = c;
  t.dropout_rng = true;
  expect_backward_matches(t);
  Problem a(c), b(t);
  ASSERT_TRUE(a.run_forward().ok());
  ASSERT_TRUE(b.run_forward().ok());
  ASSERT_TRUE(a.run_backward().ok());
  ASSERT_TRUE(b.run_backward().ok());
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  Case other = t;
  other.dropout_offset += 1;
  Problem o(other);
  ASSERT_TRUE(o.run_forward().ok());
  EXPECT_NE(o.out, b.out) << "another offset draws another mask";
}

TEST(CpuBackward, VarlenSequsedStrides) {
  Case c;
  c.lens_q = {177, 3, 1, 40};
  c.lens_k = {245, 2, 5, 40};
  c.hq = 4;
  c.hkv = 2;
  c.causal = true;
  expect_backward_matches(c);
  c.seqused_k = {200, 2, 0, 17};
  expect_backward_matches(c);
  Case s = with_lengths(70, 70);
  s.head_pad = 8;
  s.batch = 2;
  expect_backward_matches(s);
}

// Q and dO too large for a task's per-thread cache (8 query heads of one KV head x 320 padded rows x d256 x 2 in
// fp32 is 5.2 MB, above its 4 MB) are streamed, and the backward then takes its key blocks four at a time
// (kernels.cpp key_group): 5 key blocks, a group of four and a partial one (one thread), chunks of key blocks
// inside one group (two threads), a partial last key block, and masks that leave some blocks of a group unseen
// by a query block. fp32 and fp16 take this path on every ISA. (Three cases: the float64 reference takes ~15 s
// each at this size.)
TEST(CpuBackward, StreamedQueryTilesKeyGroups) {
  for (int variant = 0; variant < 3; ++variant) {
    Case c = with_lengths(260, variant == 0 ? 290 : variant == 1 ? 300 : 270);
    c.dtype = variant == 1 ? FA_FLOAT16 : FA_FLOAT32;
    c.hq = 8;
    c.hkv = 1;
    c.d = 256;
    c.threads = variant == 0 ? 1 : 2;
    c.causal = variant == 1;
    if (variant == 2) c.wl = 70, c.wr = 20, c.top_left = true;
    expect_backward_matches(c);
  }
}

// Causal problems over cpu::kWideMaskedKeys keys or more take the unmasked problems' 256-key bf16 tiles (tiles.hpp,
// builds with bf16 dot products; 64-key tiles elsewhere, where this checks the usual path): masked tiles of 256 keys,
// diagonal blocks that end inside a tile, the key length's partial tile. Bottom-right alignment (rows see 8.1k-8.2k
// keys) and top-left (rows see 1-100, so most tiles are past the diagonal).
TEST(CpuBackward, LongCausalWideKeyTiles) {
  for (const bool top_left : {false, true}) {
    Case c = with_lengths(100, cpu::kWideMaskedKeys + 37);
    c.dtype = FA_BFLOAT16;
    c.d = 64;
    c.causal = true;
    c.top_left = top_left;
    c.threads = 2;
    expect_backward_matches(c);
  }
  detail::Problem p;
  p.head_dim = 128;
  p.window_right = 0;
  p.seqlen_k = cpu::kWideMaskedKeys;
  EXPECT_EQ(cpu::cpu_tiles(p, true).block_k, 256);
  p.seqlen_k = cpu::kWideMaskedKeys - 1;
  EXPECT_EQ(cpu::cpu_tiles(p, true).block_k, 128);
  p.window_left = 4096;  // a left window: rows see at most 4097 keys however long the sequence
  p.seqlen_k = 4 * cpu::kWideMaskedKeys;
  EXPECT_EQ(cpu::cpu_tiles(p, true).block_k, 128);
  EXPECT_EQ(cpu::cpu_tiles(p, false).block_k, 64);
}

TEST(CpuBackward, FullyMaskedRowsHaveZeroGradient) {
  Case c = with_lengths(40, 10);
  c.top_left = true;
  c.wl = 0;
  c.wr = 0;
  expect_backward_matches(c);
}

TEST(CpuBackward, DeterministicRunToRun) {
  Case c = with_lengths(200, 260);
  c.hq = 4;
  c.hkv = 1;
  c.causal = true;
  Problem a(c), b(c);
  ASSERT_TRUE(a.run_forward().ok());
  ASSERT_TRUE(a.run_backward().ok());
  ASSERT_TRUE(b.run_forward().ok());
  ASSERT_TRUE(b.run_backward().ok());
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

// dL/dx for L = <dout, out> by central differences of the float64 reference, on fp32 storage: the
// perturbed inputs are stored in fp32, and the difference quotient divides by the stored difference.
TEST(CpuBackward, MatchesFiniteDifferences) {
  for (int variant = 0; variant < 3; ++variant) {
    Case c = with_lengths(5, 7);
    c.dtype = FA_FLOAT32;
    c.d = 8;
    c.hq = 2;
    c.hkv = 1;
    c.causal = variant == 1;
    c.softcap = variant == 2 ? 1.5f : 0.f;
    c.alibi = variant == 2 ? Alibi::kHeads : Alibi::kNone;
    c.wl = variant == 2 ? 3 : -1;
    SCOPED_TRACE(c.label());
    Problem pr(c);
    ASSERT_TRUE(pr.run_forward().ok());
    ASSERT_TRUE(pr.run_backward().ok());
    auto loss = [&]() {
      detail::Problem p = pr.view();
      reference::Forward f;
      reference::forward(p, reference::Rounding::kExact, &f);
      double l = 0;
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seqlen_q; ++i)
          for (int64_t x = 0; x < p.head_dim_v; ++x)
            l += f.out[size_t((h * p.total_q + i) * p.head_dim_v + x)] *
                 reference::load(p, p.dout, p.dout_layout, 0, i, h, x);
      return l;
    };
    const float step = 1e-2f;
    double max_abs = 0, max_err = 0;
    for (auto [input, grad] : {std::pair{&pr.q, &pr.dq}, {&pr.k, &pr.dk}, {&pr.v, &pr.dv}}) {
      const size_t n = input->size() / 4;
      for (size_t idx = 0; idx < n; ++idx) {
        float* x = reinterpret_cast<float*>(input->data()) + idx;
        const float orig = *x;
        *x = orig + step;
        const float up = *x;
        const double lu = loss();
        *x = orig - step;
        const float down = *x;
        const double ld = loss();
        *x = orig;
        const double fd = (lu - ld) / (double(up) - double(down));
        const double ours = reinterpret_cast<const float*>(grad->data())[idx];
        max_abs = std::max(max_abs, std::fabs(fd));
        max_err = std::max(max_err, std::fabs(fd - ours));
      }
    }
    // Central differences are O(step^2) accurate: 1e-4 scale, far above fp32 rounding of the kernel.
    EXPECT_LT(max_err, 1e-3 * std::max(1.0, max_abs)) << "max |fd - ours| " << max_err << " of max |fd| " << max_abs;
  }
}

}  // namespace
}  // namespace flashattn::testing

// Tiled CPU forward vs the float64 reference on odd shapes, every mask and feature.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attention_case.hpp"

namespace flashattn::testing {
namespace {

void expect_forward_matches(const Case& c) { expect_matches_reference(c, false); }

class OddShapes : public ::testing::TestWithParam<std::tuple<std::pair<int64_t, int64_t>, int>> {};

TEST_P(OddShapes, MatchesReference) {
  auto [lens, mask] = GetParam();
  Case c = with_lengths(lens.first, lens.second);
  c.causal = mask != 0;
  c.top_left = mask == 2;
  expect_forward_matches(c);
}

INSTANTIATE_TEST_SUITE_P(Seqlens, OddShapes,
                         ::testing::Combine(::testing::Values(std::make_pair(1, 1), std::make_pair(17, 17),
                                                              std::make_pair(239, 1), std::make_pair(1, 239),
                                                              std::make_pair(113, 203), std::make_pair(203, 113),
                                                              std::make_pair(1023, 1024)),
                                            ::testing::Values(0, 1, 2)));

class HeadDims : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(HeadDims, MatchesReference) {
  for (bool causal : {false, true}) {
    Case c = with_lengths(77, 130);
    c.d = GetParam().first;
    c.dv = GetParam().second;
    c.causal = causal;
    expect_forward_matches(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Dims, HeadDims,
                         ::testing::Values(std::make_pair(8, 8), std::make_pair(16, 16), std::make_pair(40, 40),
                                           std::make_pair(64, 64), std::make_pair(72, 72), std::make_pair(80, 80),
                                           std::make_pair(96, 96), std::make_pair(128, 128), std::make_pair(192, 192),
                                           std::make_pair(256, 256), std::make_pair(128, 64), std::make_pair(64, 128),
                                           std::make_pair(192, 128), std::make_pair(32, 256)));

TEST(CpuForward, DtypesAndThreads) {
  for (fa_dtype t : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (int threads : {1, 2}) {
      Case c = with_lengths(150, 311);
      c.dtype = t;
      c.threads = threads;
      c.causal = true;
      expect_forward_matches(c);
    }
}

// Logits spread over tens of binary orders: each row's running max jumps between key blocks (the online softmax's
// rescale of O), every 16-bit and 32-bit type and FP8 (the gain in q's factors), with and without a mask.
TEST(CpuForward, LargeLogits) {
  for (fa_dtype t : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16, FA_FLOAT8_E4M3})
    for (bool causal : {false, true}) {
      Case c = with_lengths(130, 900);
      c.dtype = t;
      c.causal = causal;
      c.q_gain = 30.f;
      expect_forward_matches(c);
    }
}

TEST(CpuForward, GroupedQueryAttention) {
  for (auto [hq, hkv] : {std::pair<int, int>{8, 1}, {6, 2}, {4, 1}, {4, 4}}) {
    Case c = with_lengths(97, 161);
    c.hq = hq;
    c.hkv = hkv;
    c.causal = true;
    expect_forward_matches(c);
  }
}

TEST(CpuForward, Windows) {
  for (auto [l, r] : {std::pair<int, int>{16, 0}, {8, 8}, {0, 0}, {-1, 5}, {32, -1}, {100, 3}})
    for (auto lens : {std::pair<int, int>{130, 130}, {70, 200}, {200, 70}}) {
      Case c = with_lengths(lens.first, lens.second);
      c.wl = l;
      c.wr = r;
      expect_forward_matches(c);
      c.top_left = true;
      expect_forward_matches(c);
    }
  Case c = with_lengths(150, 150);
  c.causal = true;
  c.wl = 40;
  expect_forward_matches(c);
}

TEST(CpuForward, SoftcapAndAlibi) {
  Case c = with_lengths(120, 190);
  c.softcap = 2.f;  // small cap: tanh is far from linear on these logits
  expect_forward_matches(c);
  c.softcap = 0.f;
  c.alibi = Alibi::kHeads;
  expect_forward_matches(c);
  c.causal = true;
  expect_forward_matches(c);
  c.softcap = 5.f;
  c.wl = 50;
  c.top_left = true;
  expect_forward_matches(c);
}

TEST(CpuForward, Varlen) {
  for (bool causal : {false, true}) {
    Case c;
    c.lens_q = {177, 3, 64, 1};
    c.lens_k = {845, 2, 64, 300};
    c.hq = 3;
    c.hkv = 1;
    c.causal = causal;
    expect_forward_matches(c);
    c.seqused_k = {700, 1, 0, 299};
    expect_forward_matches(c);
  }
}

// K/V of more keys than the per-thread cache holds (4 MiB: 8192 keys of d64 K and V): a task takes a group of up
// to eight query blocks that share each K/V tile (fp32, 600 rows: a group of eight blocks and one of two; bf16, 260
// rows: one of five), and fp32 tiles are read in place by the GEMMs, full ones at the tensor's row stride; the
// sequence's last, partial tile is copied.
TEST(CpuForward, LongKeysGroupedQueryBlocks) {
  for (fa_dtype dtype : {FA_FLOAT32, FA_BFLOAT16}) {
    Case c = with_lengths(dtype == FA_FLOAT32 ? 600 : 260, 8250);
    c.dtype = dtype;
    c.hq = c.hkv = 1;
    c.row_pad = 8;
    expect_forward_matches(c);
    c.causal = true;
    c.dropout_p = 0.2f;
    expect_forward_matches(c);
    Case v;
    v.dtype = dtype;
    v.lens_q = {140, 3};
    v.lens_k = {8300, 9};
    v.wl = 3000, v.wr = 100;
    expect_forward_matches(v);
  }
}

TEST(CpuForward, BatchedSequsedAndStrides) {
  Case c = with_lengths(65, 140);
  c.batch = 3;
  c.seqused_k = {140, 17, 0};
  c.head_pad = 8;
  c.causal = true;
  expect_forward_matches(c);
  c.lse = false;
  expect_forward_matches(c);
}

TEST(CpuForward, FullyMaskedRowsGiveZeroAndMinusInfLse) {
  // Top-left window (0, 0) with more queries than keys: rows >= seqlen_k see nothing.
  Case c = with_lengths(40, 10);
  c.top_left = true;
  c.wl = 0;
  c.wr = 0;
  Problem pr(c);
  ASSERT_TRUE(pr.run_forward().ok());
  const detail::Problem p = pr.view();
  for (int64_t h = 0; h < p.heads_q; ++h)
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      const float lse = p.lse[p.offset(p.lse_layout, 0, i, h)];
      if (i < 10) {
        EXPECT_TRUE(std::isfinite(lse)) << i;
      } else {
        EXPECT_EQ(lse, -INFINITY) << i;
        for (int64_t x = 0; x < p.head_dim_v; ++x) EXPECT_EQ(reference::load(p, p.out, p.out_layout, 0, i, h, x), 0.0);
      }
    }
  expect_forward_matches(c);
}

TEST(CpuForward, NanInputPropagatesToItsRowOnly) {
  Case c = with_lengths(70, 90);
  c.dtype = FA_FLOAT32;
  Problem pr(c);
  const float nan = std::nanf("");
  std::memcpy(pr.q.data() + size_t(5 * c.hq * c.d) * 4, &nan, 4);  // row 5, head 0, element 0
  ASSERT_TRUE(pr.run_forward().ok());
  const detail::Problem p = pr.view();
  for (int64_t i = 0; i < c.sq; ++i) {
    const double o = reference::load(p, p.out, p.out_layout, 0, i, 0, 0);
    if (i == 5) {
      EXPECT_TRUE(std::isnan(o));
      EXPECT_TRUE(std::isnan(p.lse[p.offset(p.lse_layout, 0, i, 0)]));
    } else {
      EXPECT_TRUE(std::isfinite(o)) << i;
    }
  }
  EXPECT_TRUE(std::isfinite(reference::load(p, p.out, p.out_layout, 0, 5, 1, 0)));  // other head untouched
}

TEST(CpuForward, ThreadCountDoesNotChangeBits) {
  Case c = with_lengths(300, 300);
  c.causal = true;
  c.threads = 1;
  Problem a(c);
  ASSERT_TRUE(a.run_forward().ok());
  Case c2 = c;
  c2.threads = 2;
  Problem b(c2);
  ASSERT_TRUE(b.run_forward().ok());
  EXPECT_EQ(a.out, b.out);
}

// fa_forward_probs (flash_attn's S_dmask): |probs| are the softmax probabilities and their sign the dropout mask the
// forward applied: out = sum_j |P_ij| keep_ij / (1 - p) v_j reproduces fa_forward's out (fp32), every row of a
// problem without sinks sums to 1 over its visible keys, and nothing is written past a sequence's queries or keys.
// Varlen: (B, Hq, max_seqlen_q, max_seqlen_k).
TEST(CpuForward, ProbsCarryTheDropoutMask) {
  for (int variant = 0; variant < 2; ++variant) {
    Case c = with_lengths(37, 53);
    if (variant == 1) c.lens_q = {5, 0, 9}, c.lens_k = {7, 3, 12};
    c.dtype = FA_FLOAT32;
    c.hq = 4, c.hkv = 2;
    c.causal = variant == 0;
    c.dropout_p = 0.3f;
    SCOPED_TRACE(c.label());
    Problem pr(c);
    ASSERT_TRUE(pr.run_forward().ok());
    const detail::Problem p = pr.view();
    const int64_t batch = c.varlen() ? int64_t(c.lens_q.size()) : c.batch;
    const int64_t shape[4] = {batch, c.hq, p.seqlen_q, p.seqlen_k};
    std::vector<float> probs(size_t(shape[0] * shape[1] * shape[2] * shape[3]), 7.f);
    const fa_tensor t = fa_make_tensor(probs.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, shape);
    const Status st = forward_probs(pr.fwd(), t, pr.exec());
    ASSERT_TRUE(st.ok()) << st.message;
    const auto* v = reinterpret_cast<const float*>(pr.v.data());
    const auto* out = reinterpret_cast<const float*>(pr.out.data());
    int64_t kept = 0, seen = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          const float* row = probs.data() + ((b * c.hq + h) * p.seqlen_q + i) * p.seqlen_k;
          double sum = 0;
          std::vector<double> o(size_t(c.d), 0.0);
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            if (i >= p.len_q(b) || j >= p.len_k(b)) {
              ASSERT_EQ(row[j], 0.f) << "written past the sequence at " << b << ", " << h << ", " << i << ", " << j;
              continue;
            }
            const bool keep = !std::signbit(row[j]);
            sum += std::fabs(row[j]);
            if (row[j] != 0.f) {
              ++seen;
              kept += keep;
            }
            if (!keep) continue;
            const float* vj = v + p.offset(p.v_layout, b, j, h / (c.hq / c.hkv));
            for (int64_t e = 0; e < c.d; ++e) o[size_t(e)] += std::fabs(row[j]) / (1.0 - c.dropout_p) * vj[e];
          }
          if (i >= p.len_q(b)) continue;
          if (p.len_k(b) > 0) EXPECT_NEAR(sum, 1.0, 1e-5);
          const float* orow = out + p.offset(p.out_layout, b, i, h);
          for (int64_t e = 0; e < c.d; ++e) ASSERT_NEAR(orow[e], o[size_t(e)], 1e-4) << b << ", " << h << ", " << i;
        }
    EXPECT_GT(seen, 500);
    EXPECT_NEAR(double(kept) / double(seen), 0.7, 0.08);  // 4 sigma at 500 draws
  }
}

TEST(CpuForward, ProbsRulesAreNamedErrors) {
  Case c = with_lengths(9, 11);
  c.dtype = FA_FLOAT32;
  Problem pr(c);
  std::vector<float> probs(size_t(c.batch * c.hq * 9 * 11));
  auto call = [&](fa_tensor t) {
    const Status st = forward_probs(pr.fwd(), t, pr.exec());
    EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT);
    return st.message;
  };
  const int64_t good[4] = {c.batch, c.hq, 9, 11}, bad[4] = {c.batch, c.hq, 9, 12};
  EXPECT_NE(call(fa_make_tensor(probs.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, bad)).find("probs: must have shape"),
            std::string::npos);
  EXPECT_NE(call(fa_make_tensor(probs.data(), FA_FLOAT16, FA_DEVICE_CPU, 4, good)).find("probs: must be float32"),
            std::string::npos);
  EXPECT_NE(call(fa_make_tensor(probs.data(), FA_FLOAT32, FA_DEVICE_CUDA, 4, good)).find("probs: must be host"),
            std::string::npos);
  EXPECT_NE(call(fa_make_tensor(probs.data(), FA_FLOAT32, FA_DEVICE_CPU, 3, good)).find("probs: must have 4"),
            std::string::npos);
  fa_tensor strided = fa_make_tensor(probs.data(), FA_FLOAT32, FA_DEVICE_CPU, 4, good);
  strided.stride[3] = 2;
  EXPECT_NE(call(strided).find("probs: must be contiguous"), std::string::npos);
  const FwdParams fp = pr.fwd();
  EXPECT_EQ(fa_forward_probs(&fp, nullptr, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("probs: null pointer"), std::string::npos);
}

}  // namespace
}  // namespace flashattn::testing

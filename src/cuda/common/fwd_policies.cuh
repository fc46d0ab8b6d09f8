// Device pieces every forward kernel shares (sm80 FlashAttention-2 and sm90 FlashAttention-3 designs): where a
// sequence lives, the mask policies (which key blocks a query block visits, which scores are masked), the score
// modifiers (softcap, ALiBi), and the online softmax over an accumulator viewed as (rows, cols). Both MMA
// families give each thread rows whose four owners form a quad of adjacent lanes (mma.sync m16n8k16 and wgmma
// m64nNk16 have the same row/column ownership per warp), so the row reductions are the same quad shuffles.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "core/mask_rule.hpp"
#include "cuda/common/dropout.cuh"
#include "cuda/fwd_params.hpp"

namespace flashattn::cuda {

// Where the sequence of batch entry b lives, and its lengths. SeqInfo and the mask policies are host-callable too:
// tests/gpu/mask_policy_test.cu checks their block arithmetic on the host.
struct SeqInfo {
  int q_start = 0, k_start = 0;  // varlen: first global row; batched: 0
  int len_q = 0, len_k = 0;
  __host__ __device__ SeqInfo(const FwdParams& p, int b) {
    if (p.cu_seqlens_q != nullptr) {
      q_start = p.cu_seqlens_q[b];
      k_start = p.cu_seqlens_k[b];
      len_q = p.cu_seqlens_q[b + 1] - q_start;
      len_k = p.cu_seqlens_k[b + 1] - k_start;
    } else {
      len_q = p.seqlen_q;
      len_k = p.seqlen_k;
    }
    // seqused_k is not read on the host for CUDA calls (no synchronisation per call; CUDA-graph capture): an
    // entry outside [0, keys of the sequence] is clamped here, so no key past the sequence is ever read.
    if (p.seqused_k != nullptr) len_k = max(0, min(p.seqused_k[b], len_k));
  }
};

struct BlockRange {
  int lo, hi;  // key blocks [lo, hi)
};

using ColRange = detail::IndexRange<int>;  // visible keys [lo, hi)

// Only the keys past the end of the sequence are masked.
struct KeyLengthMask {
  int len_k;
  __host__ __device__ KeyLengthMask(const FwdParams&, const SeqInfo& s) : len_k(s.len_k) {}
  __host__ __device__ BlockRange blocks(int /*m0*/, int /*rows*/, int block_n) const {
    return {0, (len_k + block_n - 1) / block_n};
  }
  __host__ __device__ bool block_needs_mask(int /*m0*/, int /*rows*/, int n0, int block_n) const {
    return n0 + block_n > len_k;
  }
  // Key blocks [lo, hi) that need no mask for query rows [m0, m0 + rows): block_needs_mask is false exactly there.
  __host__ __device__ BlockRange unmasked_blocks(int /*m0*/, int /*rows*/, int block_n) const {
    return {0, len_k / block_n};
  }
  __host__ __device__ ColRange cols(int /*row*/) const { return {0, len_k}; }
};

// Causal or sliding window: the rule of core/mask_rule.hpp (the reference's and the CPU backend's), held as its
// data, with the block arithmetic the mainloops need. Window starts and ends grow with the query row, so rows
// [m0, m0 + rows) touch keys from the top row's start to the bottom row's end and see a key block whole when it
// lies inside the bottom row's start and the top row's end. The expressions stay in this form rather than calls
// of MaskRule::visible: with the calls ptxas spilled 124 bytes in the sm90 d64 kernel and 96 in a d128 one, with
// these none (bench/results/2026-12-01_ptxas_sm90_mask_rule.txt). tests/gpu/mask_policy_test.cu checks them
// against the rule key by key. With both sides unbounded it is KeyLengthMask at the price of a few integer
// operations per block.
struct WindowMask {
  detail::MaskRule<int> rule;
  __host__ __device__ WindowMask(const FwdParams& p, const SeqInfo& s)
      : rule(detail::MaskRule<int>::make(p.bottom_right, p.window_left, p.window_right, s.len_q, s.len_k)) {}
  // Key blocks touched by query rows [m0, m0 + rows).
  __host__ __device__ BlockRange blocks(int m0, int rows, int block_n) const {
    const int hi = rule.right >= 0 ? min(rule.len_k, m0 + rows - 1 + rule.diag_off + rule.right + 1) : rule.len_k;
    const int lo = rule.left >= 0 ? max(0, m0 + rule.diag_off - rule.left) : 0;
    if (hi <= lo) return {0, 0};
    return {lo / block_n, (hi + block_n - 1) / block_n};
  }
  __host__ __device__ bool block_needs_mask(int m0, int rows, int n0, int block_n) const {
    const int last_col = n0 + block_n - 1;
    return last_col >= rule.len_k || (rule.right >= 0 && last_col > m0 + rule.diag_off + rule.right) ||
           (rule.left >= 0 && n0 < m0 + rows - 1 + rule.diag_off - rule.left);
  }
  __host__ __device__ BlockRange unmasked_blocks(int m0, int rows, int block_n) const {
    // The first key the top row cannot see, and the first key the bottom row sees.
    const int hi = rule.right >= 0 ? min(rule.len_k, m0 + rule.diag_off + rule.right + 1) : rule.len_k;
    const int lo = rule.left >= 0 ? m0 + rows - 1 + rule.diag_off - rule.left : 0;
    return {lo <= 0 ? 0 : (lo + block_n - 1) / block_n, hi < 0 ? 0 : hi / block_n};
  }
  // The keys row `row` sees; lo may be negative (the masks compare columns >= 0 with it).
  __host__ __device__ ColRange cols(int row) const {
    const int diag = row + rule.diag_off;
    return {rule.left >= 0 ? diag - rule.left : 0,
            rule.right >= 0 ? min(rule.len_k, diag + rule.right + 1) : rule.len_k};
  }
};

// Scores of one (query block, key block) tile: s is the accumulator viewed (rows, cols), coords the matching
// (row, col) positions inside the tile; m0 / n0 the tile's first query / key.
struct ScoreMods {
  float softcap, softcap_in_scale, alibi_slope;
  int diag_off;
  // The ALiBi slope is divided by the logit scale: the softmax multiplies every score by it later. `qk`: FP8's
  // q_descale * k_descale of the tile's head (1 otherwise): a factor of the raw scores, so it joins the scale inside
  // tanh with softcap and the logit scale without.
  __device__ ScoreMods(const FwdParams& p, const SeqInfo& s, int batch, int head, float qk = 1.f)
      : softcap(p.softcap),
        softcap_in_scale(p.softcap_in_scale * qk),
        alibi_slope(p.alibi != nullptr ? p.alibi[int64_t(batch) * p.alibi_batch_stride + head] /
                                             (p.logit_scale * (p.softcap > 0.f ? 1.f : qk))
                                       : 0.f),
        diag_off(p.bottom_right ? s.len_k - s.len_q : 0) {}
  template <class S, class C>
  __device__ void apply(S& s, const C& coords, int m0, int n0) const {
    if (softcap > 0.f) {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(s); ++i) s(i) = softcap * tanhf(s(i) * softcap_in_scale);
    }
    if (alibi_slope != 0.f) {
      CUTE_UNROLL
      for (int r = 0; r < cute::size<0>(s); ++r) {
        const int diag = m0 + cute::get<0>(coords(r, 0)) + diag_off - n0;
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(s); ++c)
          s(r, c) -= alibi_slope * float(abs(diag - cute::get<1>(coords(0, c))));
      }
    }
  }
};

// Sets the scores the mask hides to -inf (an assignment: a NaN or inf computed from a key past the end of the
// sequence never leaks into the row).
template <class Mask, class S, class C>
__device__ void apply_mask(const Mask& mask, S& s, const C& coords, int m0, int n0) {
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(s); ++r) {
    const ColRange cr = mask.cols(m0 + cute::get<0>(coords(r, 0)));
    const int lo = cr.lo - n0, hi = cr.hi - n0;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(s); ++c) {
      const int col = cute::get<1>(coords(0, c));
      if (col < lo || col >= hi) s(r, c) = -INFINITY;
    }
  }
}

// Dropout of the probabilities s (rows, cols) of one tile with queries as rows (cuda/common/dropout.cuh); coords as
// above, bh = batch entry * heads_q + query head. Kept ones are scaled by 1 / (1 - p) here.
template <bool kPairedAtoms, class S, class C>
__device__ __forceinline__ void apply_dropout(const detail::DropoutRule& d, S& s, const C& coords, int64_t bh, int m0,
                                              int n0) {
  dropout_query_rows<kPairedAtoms>(d, coords, bh, m0, n0,
                                   [&](int r, int c, bool kept) { s(r, c) = kept ? s(r, c) * d.keep_scale : 0.f; });
}

// fp32 accumulators -> fp16/bf16, two at a time (one cvt.rn.{bf16x2,f16x2}.f32 per pair).
template <typename To, class Engine, class Layout>
__device__ auto convert_fragment(const cute::Tensor<Engine, Layout>& src) {
  cute::Tensor dst = cute::make_tensor<To>(src.layout());
  static_assert(decltype(cute::size(src))::value % 2 == 0);
  cutlass::NumericArrayConverter<To, float, 2> convert;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(src); i += 2) {
    cutlass::Array<float, 2> pair;
    pair[0] = src(i);
    pair[1] = src(i + 1);
    const cutlass::Array<To, 2> out = convert(pair);
    dst(i) = out[0];
    dst(i + 1) = out[1];
  }
  return dst;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The four threads of an MMA quad share an accumulator row.
template <class Op>
__device__ __forceinline__ float quad_reduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return op(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// a[0] = op over a[0..N) as a tree (N a power of two): log2(N) dependent steps instead of N - 1.
template <int N, class Op>
__device__ __forceinline__ float tree_reduce(float (&a)[N], Op op) {
  static_assert((N & (N - 1)) == 0, "a power of two");
  CUTE_UNROLL
  for (int w = N / 2; w > 0; w /= 2) {
    CUTE_UNROLL
    for (int i = 0; i < w; ++i) a[i] = op(a[i], a[i + w]);
  }
  return a[0];
}

// Running max and sum of each accumulator row a thread holds. Scores stay unscaled until exponentiated:
// p = exp2(s * scale_log2 - max * scale_log2), one FFMA and one MUFU.EX2 per score.
// kPartials: each row's max and sum go through that many independent partials (column c into c % kPartials), then a
// tree. One chain per row puts kCols dependent FMNMX / FADD (about 4 cycles each) on the softmax's path, which in
// the sm90 kernel is the ping-pong's critical path (ncu of d128 at 4k: stalls on fixed-latency dependencies 1.9
// cycles per issued instruction against cuDNN's 0.9; four partials: +0.2-1.8 % at d128 1k-16k against one chain,
// bench/results/2026-12-03_h200_session26/README.md runs 3 and 4).
template <int kRows, int kPartials = 4>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];  // this thread's partial sums; reduced over the quad once, in finish()

  __device__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Turns the scores S (rows, cols) into probabilities; correction[r] is the factor the output accumulator's
  // row r must be multiplied by (1 when the max did not move). Returns whether any row of the warp changed its
  // max: once the running maxima settle (most key blocks of a long row) the rescale of O can be skipped.
  // Split from the rescale so that a kernel can exponentiate while an MMA still accumulates into O.
  template <bool kFirst, class S>
  __device__ bool exponentiate(S& s, float scale_log2, float (&correction)[kRows]) {
    constexpr int kCols = decltype(cute::size<1>(s))::value;
    constexpr int kP = kCols % kPartials == 0 ? kPartials : 1;
    const auto max_op = [](float a, float b) { return fmaxf(a, b); };
    bool changed = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float part[kP];
      CUTE_UNROLL
      for (int i = 0; i < kP; ++i) part[i] = s(r, i);
      CUTE_UNROLL
      for (int c = kP; c < kCols; ++c) part[c % kP] = fmaxf(part[c % kP], s(r, c));
      float m = fmaxf(row_max[r], tree_reduce(part, max_op));
      m = quad_reduce(m, max_op);
      // A row with nothing visible so far keeps max -inf; offsetting by 0 then keeps exp2(-inf) = 0 (not NaN).
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      correction[r] = 1.f;
      if (!kFirst) {
        correction[r] = fast_exp2(row_max[r] * scale_log2 - m_scaled);
        row_sum[r] *= correction[r];
        changed |= m != row_max[r];
      }
      row_max[r] = m;
      CUTE_UNROLL
      for (int i = 0; i < kP; ++i) part[i] = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const float e = fast_exp2(s(r, c) * scale_log2 - m_scaled);
        s(r, c) = e;
        part[c % kP] += e;
      }
      row_sum[r] += tree_reduce(part, [](float a, float b) { return a + b; });
    }
    return !kFirst && __any_sync(0xffffffffu, changed);
  }

  template <class O>
  __device__ static void rescale(O& o, const float (&correction)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= correction[r];
    }
  }

  // Exponentiates S and rescales the output accumulator O (rows, dv) in one step.
  template <bool kFirst, class S, class O>
  __device__ void update(S& s, O& o, float scale_log2) {
    float correction[kRows];
    if (exponentiate<kFirst>(s, scale_log2, correction)) rescale(o, correction);
  }

  // Normalises O and returns each row's natural-log LSE in lse[] (-inf and O = 0 for rows that saw no key;
  // a NaN sum stays NaN so that NaN inputs propagate). sink[r] (natural-log units; -inf: none) is row r's
  // learnable sink logit, which joins the denominator: lse = log(e^lse + e^sink), O scaled by e^(lse_0 - lse).
  template <class O>
  __device__ void finish(O& o, float logit_scale, float (&lse)[kRows], const float (&sink)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_reduce(row_sum[r], [](float a, float b) { return a + b; });
      float inv = sum == 0.f ? 0.f : 1.f / sum;
      lse[r] = sum == 0.f ? -INFINITY : row_max[r] * logit_scale + logf(sum);
      if (sink[r] != -INFINITY) {
        const float merged =
            lse[r] == -INFINITY ? sink[r] : fmaxf(lse[r], sink[r]) + log1pf(expf(-fabsf(lse[r] - sink[r])));
        if (sum != 0.f) inv *= expf(lse[r] - merged);
        lse[r] = merged;
      }
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= inv;
    }
  }
  // One sink logit for every row (a tile of one head), -inf without sinks.
  template <class O>
  __device__ void finish(O& o, float logit_scale, float (&lse)[kRows], float sink) {
    float sinks[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) sinks[r] = sink;
    finish(o, logit_scale, lse, sinks);
  }
};

}  // namespace flashattn::cuda

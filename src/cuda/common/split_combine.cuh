// The combine step of split-KV: the normalised partial outputs O_s and log-sum-exps L_s of the splits of one
// (head, query row) merged by the rule of core/merge_rule.hpp (the one fa_merge_partials follows),
//   L = log(sum_s exp(L_s) + exp(sink)),   O = sum_s exp(L_s - L) * O_s,
// into out (the call's dtype) and lse; the head's learnable sink logit (if any) is a split with O = 0, added
// here once (the splits leave it out). A split that saw no key has L_s = -inf and weight 0; a row no split saw
// keeps the forward's rule (out = 0, lse = -inf, or lse = sink). The partial layout is FwdParams' (fwd_params.hpp).
#pragma once

#include <cmath>

#include <cuda_runtime.h>

#include "core/merge_rule.hpp"
#include "cuda/fwd_params.hpp"

namespace flashattn::cuda {

constexpr int kCombineThreads = 128;  // 4 warps, one (head, row) each
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kCombineBatch = 16;                             // splits whose loads a lane issues together
constexpr int kCombineChunks = FwdParams::kMaxKvSplits / 32;  // a lane keeps split 32 c + lane's weight in w[c]

// One warp per (head, row). The lanes read the splits' LSEs once (split 32 c + lane into the lane's w[c]), form L
// and turn them into weights in place; then each lane adds 4 columns of every split, in split order, the weights
// broadcast by shuffles, kCombineBatch splits' 16-byte loads issued before their adds (the first batch before the
// LSEs). Their addresses must not depend on the weights: with each load predicated on its split's shuffled weight,
// sm_90a's SASS kept at most two of a batch's loads in flight (H200, decode 1 x 64k, 33 splits of 32 rows at d128:
// 7.2 us that way, 5.2 issued together; cuDNN's reduction 2.9; bench/results/2026-12-03_h200_session25/). The
// weights stay in registers, not shared memory: a combine that declares shared memory made each decode call's time
// beyond its kernels 14 -> 96 us at 1 x 64k (bench/results/2026-12-03_h200_session24/, presumably the SM's
// shared-memory carveout switched between the forward, which takes nearly all of it, and the combine).
//
// kWrittenHere: the partials were written by other CTAs of the running kernel (the sm90 forward's fused merge), so
// every load goes through L2 (ld.global.cg); the read-only path (__ldg) may serve lines it cached before they were
// written. The combine kernel reads what an earlier kernel wrote and keeps __ldg.
// Item head * partial_rows + row, by one whole warp (the shuffles below see every lane).
template <class Element, bool kWrittenHere>
__device__ __forceinline__ void combine_item(const FwdParams& p, int64_t item, int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const int64_t head = item / p.partial_rows, row = item % p.partial_rows;
  const int64_t split_stride = int64_t(p.heads_q) * p.partial_rows;
  const int splits = p.num_splits;

  const float* o_item = p.o_partial + item * p.head_dim_v;
  // One batch of kCombineBatch splits' 16-byte loads at columns col0 + 4 lane into o. Unpredicated: a split past
  // the last and a column past head_dim_v read split 0's first columns (always there), and the select in the sum
  // drops what they and weight-0 splits read (an empty split's partial may be stale, NaN included, and 0 * NaN is
  // not 0). Their addresses do not depend on the weights, so the first batch is issued before the LSE loads: the
  // LSE reduction then runs under its latency, where the loads after it made two dependent L2 round trips (the
  // SASS: every O load after the weights' shuffles; H100, decode d128: 3.7 -> 2.8 us at 1 x 64k, 16 splits, and
  // 4.0 -> 3.0 us at 8 x 16k, 2 splits, bench/results/2026-12-06_h100_session32/README.md). A decode call of up to 16
  // splits and head_dim_v <= 128 reads everything in that first batch.
  auto load_batch = [&](int col0, int first_split, float4(&o)[kCombineBatch]) {
    const int col = col0 + lane * 4;
    const bool in = col < p.head_dim_v;
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const int64_t s = first_split + j < splits ? first_split + j : 0;
      const float4* at = reinterpret_cast<const float4*>(o_item + s * split_stride * p.head_dim_v + (in ? col : 0));
      o[j] = kWrittenHere ? __ldcg(at) : __ldg(at);
    }
  };
  float4 first[kCombineBatch];
  load_batch(0, 0, first);

  using Rule = detail::LseMerge;
  const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;
  float w[kCombineChunks];
  float m = sink;
#pragma unroll
  for (int c = 0; c < kCombineChunks; ++c) {
    const int s = 32 * c + lane;
    const float* at = p.lse_partial + s * split_stride + item;
    w[c] = s < splits ? (kWrittenHere ? __ldcg(at) : *at) : -INFINITY;
    m = fmaxf(m, w[c]);
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(kAll, m, o));
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kCombineChunks; ++c)
    if (32 * c + lane < splits) sum += Rule::term(w[c], m);
  if (lane == 0 && sink != -INFINITY) sum += Rule::term(sink, m);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(kAll, sum, o);
  const float lse = Rule::lse_of(m, sum);
  // Absent splits weigh 0 whatever lse is (a NaN lse must not make them load).
#pragma unroll
  for (int c = 0; c < kCombineChunks; ++c) w[c] = 32 * c + lane < splits ? Rule::weight(w[c], lse) : 0.f;

  // Where (head, row) lives in out and lse: varlen rows are global token indices, batched rows b * Sq + i.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t b = varlen ? 0 : row / p.seqlen_q, i = varlen ? row : row % p.seqlen_q;
  if (p.lse != nullptr && lane == 0) p.lse[b * p.lse_batch + i * p.lse_row + head * p.lse_head] = lse;
  Element* out = static_cast<Element*>(p.out) + b * p.o_batch + i * p.o_row + head * p.o_head;
  // The sum of one batch (splits 32 c + j0 ...) into acc, in split order.
  auto add_batch = [&](float4& acc, float4(&o)[kCombineBatch], float wc, int j0, bool in) {
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const float ws = __shfl_sync(kAll, wc, j0 + j);
      if (!in || ws == 0.f) o[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc.x += ws * o[j].x, acc.y += ws * o[j].y, acc.z += ws * o[j].z, acc.w += ws * o[j].w;
    }
  };
  // Every lane runs every column round (the shuffles), past head_dim_v predicated; head_dim_v is a multiple of 8.
  // The first round's first batch is the one loaded above (peeled, so that it stays in registers).
  for (int col0 = 0; col0 < p.head_dim_v; col0 += 32 * 4) {
    const int col = col0 + lane * 4;
    const bool in = col < p.head_dim_v;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col0 == 0) add_batch(acc, first, w[0], 0, in);
#pragma unroll
    for (int c = 0; c < kCombineChunks; ++c) {
      if (32 * c >= splits) break;
      for (int j0 = c == 0 && col0 == 0 ? kCombineBatch : 0; j0 < 32 && 32 * c + j0 < splits; j0 += kCombineBatch) {
        float4 o[kCombineBatch];
        load_batch(col0, 32 * c + j0, o);
        add_batch(acc, o, w[c], j0, in);
      }
    }
    if (in) {
      out[col + 0] = Element(acc.x);
      out[col + 1] = Element(acc.y);
      out[col + 2] = Element(acc.z);
      out[col + 3] = Element(acc.w);
    }
  }
}

template <class Element>
__global__ void __launch_bounds__(kCombineThreads) split_combine_kernel(const FwdParams p) {
  const int64_t item = int64_t(blockIdx.x) * kCombineWarps + int(threadIdx.x) / 32;  // head * rows + row
  if (item >= int64_t(p.heads_q) * p.partial_rows) return;                           // the whole warp
  combine_item<Element, false>(p, item, int(threadIdx.x) % 32);
}

template <class Element>
cudaError_t launch_split_combine(const FwdParams& p, cudaStream_t stream) {
  const int64_t items = int64_t(p.heads_q) * p.partial_rows;
  const int64_t blocks = (items + kCombineWarps - 1) / kCombineWarps;
  if (blocks > 0x7fffffff || p.num_splits > FwdParams::kMaxKvSplits) return cudaErrorInvalidConfiguration;
  split_combine_kernel<Element><<<unsigned(blocks), kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashattn::cuda

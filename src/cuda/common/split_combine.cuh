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

template <class Element>
__global__ void __launch_bounds__(kCombineThreads) split_combine_kernel(const FwdParams p) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t item = (int64_t(blockIdx.x) * kCombineThreads + threadIdx.x) / 32;  // head * rows + row
  if (item >= int64_t(p.heads_q) * p.partial_rows) return;
  const int64_t head = item / p.partial_rows, row = item % p.partial_rows;
  const int64_t split_stride = int64_t(p.heads_q) * p.partial_rows;
  const float* lse_s = p.lse_partial + item;

  const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;
  float m = sink;
  for (int s = lane; s < p.num_splits; s += 32) m = fmaxf(m, lse_s[s * split_stride]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  using Rule = detail::LseMerge;
  float sum = 0.f;
  for (int s = lane; s < p.num_splits; s += 32) sum += Rule::term(lse_s[s * split_stride], m);
  if (lane == 0 && sink != -INFINITY) sum += Rule::term(sink, m);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = Rule::lse_of(m, sum);

  // Where (head, row) lives in out and lse: varlen rows are global token indices, batched rows b * Sq + i.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t b = varlen ? 0 : row / p.seqlen_q, i = varlen ? row : row % p.seqlen_q;
  if (p.lse != nullptr && lane == 0) p.lse[b * p.lse_batch + i * p.lse_row + head * p.lse_head] = lse;
  Element* out = static_cast<Element*>(p.out) + b * p.o_batch + i * p.o_row + head * p.o_head;
  for (int col = lane * 4; col < p.head_dim_v; col += 32 * 4) {  // head_dim_v is a multiple of 8
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = Rule::weight(lse_s[s * split_stride], lse);
      if (w == 0.f) continue;  // an empty split's O is 0, but 0 * a stale value must not be read
      const float4 o = *reinterpret_cast<const float4*>(p.o_partial + (s * split_stride + item) * p.head_dim_v + col);
      acc.x += w * o.x, acc.y += w * o.y, acc.z += w * o.z, acc.w += w * o.w;
    }
    out[col + 0] = Element(acc.x);
    out[col + 1] = Element(acc.y);
    out[col + 2] = Element(acc.z);
    out[col + 3] = Element(acc.w);
  }
}

template <class Element>
cudaError_t launch_split_combine(const FwdParams& p, cudaStream_t stream) {
  constexpr int kItemsPerBlock = kCombineThreads / 32;
  const int64_t items = int64_t(p.heads_q) * p.partial_rows;
  const int64_t blocks = (items + kItemsPerBlock - 1) / kItemsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  split_combine_kernel<Element><<<unsigned(blocks), kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashattn::cuda

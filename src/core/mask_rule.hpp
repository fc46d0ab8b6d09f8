// The one mask rule of flashattn.h's Semantics, for the float64 reference, the CPU backend and the CUDA kernels
// (their mask policies in cuda/common/fwd_policies.cuh hold it and compute their block ranges from its fields,
// checked against visible() key by key in tests/gpu/mask_policy_test.cu): query row i of a sequence of
// len_q queries and len_k keys sees the keys j with
//   i + off - left <= j <= i + off + right,   off = len_k - len_q (bottom-right) or 0 (top-left),
// a side of -1 being unbounded (causal: right = 0), clipped to [0, len_k). Index is int64_t on the host and int
// in the kernels (whose sequence lengths the validation bounds below 2^31).
#pragma once

#include "core/host_device.hpp"

namespace flashattn::detail {

template <class Index>
struct IndexRange {
  Index lo, hi;  // [lo, hi); empty when hi <= lo
};

template <class Index>
struct MaskRule {
  Index len_k, diag_off, left, right;

  FA_HOST_DEVICE static MaskRule make(bool bottom_right, Index left, Index right, Index len_q, Index len_k) {
    return {len_k, bottom_right ? len_k - len_q : Index(0), left, right};
  }
  // The keys query row i sees.
  FA_HOST_DEVICE IndexRange<Index> visible(Index i) const {
    const Index diag = i + diag_off;
    Index lo = left >= 0 ? diag - left : Index(0);
    Index hi = right >= 0 ? diag + right + 1 : len_k;
    if (lo < 0) lo = 0;
    if (hi > len_k) hi = len_k;
    return {lo, hi};
  }
};

}  // namespace flashattn::detail

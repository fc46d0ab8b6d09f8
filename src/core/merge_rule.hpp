// The one merge rule of attention partials (flashattn.h, fa_merge_partials), for the CPU merge, the CUDA merge
// kernel and the split-KV combine kernel (cuda/common/split_combine.cuh): attentions of the same query row over
// disjoint key sets, each as its normalised output O_s and log-sum-exp L_s, merge exactly into
//   L = log(sum_s e^(L_s)),   O = sum_s e^(L_s - L) O_s,
// computed against the largest L_s (m) so that no exponential overflows. A part that saw no key (L_s = -inf) has
// weight 0, and its O_s is not read (an empty part's O may be anything: 0 * NaN must not reach the sum); a row no
// part saw gets L = -inf and O = 0. A learnable sink logit joins as a part with O = 0 (split-KV adds it once).
#pragma once

#include <cmath>

#include "core/host_device.hpp"

namespace flashattn::detail {

// m is the largest L_s of a merge (fmaxf over the parts), sum the sum of term(L_s, m) over them.
struct LseMerge {
  // The merged log-sum-exp from m and the sum against it. A NaN part makes the sum NaN (fmaxf leaves NaN out of m),
  // and the merge NaN: never -inf, which would pass for a row that saw no key.
  FA_HOST_DEVICE static float lse_of(float m, float sum) {
    return sum > 0.f ? m + logf(sum) : sum == 0.f ? -INFINITY : sum;
  }
  // The weight of a part with log-sum-exp l in a merge whose log-sum-exp is lse: 0 for an empty part or an empty
  // merge (the caller then skips the part's O).
  FA_HOST_DEVICE static float weight(float l, float lse) { return lse == -INFINITY ? 0.f : expf(l - lse); }
  // The term a part adds to the sum once m is known (0 for an empty part, and for every part of an empty merge).
  FA_HOST_DEVICE static float term(float l, float m) { return m == -INFINITY ? 0.f : expf(l - m); }

  // Two parts at once, as a ring step folds each new partial into its running one: the merged L and both weights.
  FA_HOST_DEVICE static void two(float la, float lb, float* lse, float* wa, float* wb) {
    const float m = fmaxf(la, lb);
    *lse = lse_of(m, term(la, m) + term(lb, m));
    *wa = weight(la, *lse);
    *wb = weight(lb, *lse);
  }
};

}  // namespace flashattn::detail

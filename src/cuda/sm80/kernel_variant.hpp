// What one compiled sm80 kernel handles beyond the plain case. Each combination is its own instantiation, so the
// plain kernel (no score mods, head dims equal to the compiled one), which nearly every call takes, carries no
// code or registers for the others.
#pragma once

#include "cuda/plan.hpp"

namespace flashattn::cuda::sm80 {

template <bool kScoreMods_, bool kPaddedHeadDim_, bool kDeterministic_ = false>
struct KernelVariant {
  // softcap and/or ALiBi: their registers (tanh, per-score distances) spill the plain kernel.
  static constexpr bool kScoreMods = kScoreMods_;
  // head_dim or head_dim_v below the compiled head dim: loads zero-fill and stores skip the columns past them.
  // The plain kernel's column counts are compile-time constants instead, so its tile loads have no branch:
  // with the runtime test ptxas (sm_90a) spilled 40-104 bytes in the d256 forward and none without, which took
  // d256 from 0.96-1.00x to 0.99-1.05x of FA2 at seqlen 1k (H200,
  // bench/results/2026-11-30_sm80_tiles/run11_d256_abc.tsv).
  static constexpr bool kPaddedHeadDim = kPaddedHeadDim_;
  // Backward only: CTAs own dQ splits (plain adds in a fixed order) instead of accumulating dQ with atomics.
  static constexpr bool kDeterministic = kDeterministic_;
  static_assert(!kScoreMods || kPaddedHeadDim, "the score-mods kernel also serves padded head dims");
};

using PlainVariant = KernelVariant<false, false>;

// The instantiation the plan's variant names (plan.cpp decides it: the score-mods kernel serves any head dim,
// the plain one only head dims equal to the compiled one). Calls launch(KernelVariant{}) and returns its result.
template <bool kDeterministic, class Launch>
auto dispatch_variant(const Variant& v, Launch&& launch) {
  if (v.score_mods) return launch(KernelVariant<true, true, kDeterministic>{});
  if (v.padded_head_dim) return launch(KernelVariant<false, true, kDeterministic>{});
  return launch(KernelVariant<false, false, kDeterministic>{});
}

}  // namespace flashattn::cuda::sm80

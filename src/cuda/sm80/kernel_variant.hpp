// What one compiled sm80 kernel handles beyond the plain case, as a list of named options (the style of the sm90
// kernel's Mechanisms<>): KernelVariant<> is the plain kernel, KernelVariant<variant::PaddedHeadDim> the one for head
// dims below the compiled one, and so on. Each combination is its own instantiation, so the plain kernel (no score
// mods, head dims equal to the compiled one), which nearly every call takes, carries no code or registers for the
// others.
#pragma once

#include <type_traits>

#include "cuda/plan.hpp"

namespace flashattn::cuda::sm80 {

// The options (their own namespace: ScoreMods is also the score modifiers' policy, fwd_policies.cuh).
namespace variant {
// softcap and/or ALiBi: their registers (tanh, per-score distances) spill the plain kernel. The score-mods kernel
// also serves padded head dims.
struct ScoreMods {};
// head_dim or head_dim_v below the compiled head dim: loads zero-fill and stores skip the columns past them. The
// plain kernel's column counts are compile-time constants instead, so its tile loads have no branch: with the
// runtime test ptxas (sm_90a) spilled 40-104 bytes in the d256 forward and none without, which took d256 from
// 0.96-1.00x to 0.99-1.05x of FA2 at seqlen 1k (H200, bench/results/2026-11-30_sm80_tiles/run11_d256_abc.tsv).
struct PaddedHeadDim {};
// Backward only: CTAs own dQ splits (plain adds in a fixed order) instead of accumulating dQ with atomics.
struct Deterministic {};
// dropout_p > 0: the probabilities times the mask of core/dropout.hpp (forward: after the row sums, before P.V;
// backward: P and dP). Only with ScoreMods (one general kernel per mask: dropout is rare enough in training
// today that its own plain/padded split is not worth the build time).
struct Dropout {};
}  // namespace variant

template <class... Options>
struct KernelVariant {
  template <class Option>
  static constexpr bool kHas = (false || ... || std::is_same_v<Options, Option>);
  static constexpr bool kScoreMods = kHas<variant::ScoreMods>;
  static constexpr bool kPaddedHeadDim = kHas<variant::PaddedHeadDim> || kScoreMods;
  static constexpr bool kDeterministic = kHas<variant::Deterministic>;
  static constexpr bool kDropout = kHas<variant::Dropout>;
  static_assert(!kDropout || kScoreMods, "the dropout kernel is the score-mods one with the mask");
};

using PlainVariant = KernelVariant<>;

// The instantiation the plan's variant names (plan.cpp decides it: the score-mods kernel serves any head dim,
// the plain one only head dims equal to the compiled one). Calls launch(KernelVariant{}) and returns its result.
// kDropout: whether the dropout variants are among them (the forward launches its dropout kernel itself, with its
// own tile).
template <bool kDeterministic, bool kDropout, class Launch>
auto dispatch_variant(const Variant& v, Launch&& launch) {
  if constexpr (kDeterministic) {
    if constexpr (kDropout)
      if (v.dropout) return launch(KernelVariant<variant::ScoreMods, variant::Dropout, variant::Deterministic>{});
    if (v.score_mods) return launch(KernelVariant<variant::ScoreMods, variant::Deterministic>{});
    if (v.padded_head_dim) return launch(KernelVariant<variant::PaddedHeadDim, variant::Deterministic>{});
    return launch(KernelVariant<variant::Deterministic>{});
  } else {
    if constexpr (kDropout)
      if (v.dropout) return launch(KernelVariant<variant::ScoreMods, variant::Dropout>{});
    if (v.score_mods) return launch(KernelVariant<variant::ScoreMods>{});
    if (v.padded_head_dim) return launch(KernelVariant<variant::PaddedHeadDim>{});
    return launch(KernelVariant<>{});
  }
}

}  // namespace flashattn::cuda::sm80

// Host side of one compiled forward kernel: picks the mask policy, sizes shared memory, launches.
#pragma once

#include "cuda/common/element.hpp"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::cuda::sm80 {

template <class Traits, class Mask, class Variant>
cudaError_t launch_kernel(const FwdParams& p, cudaStream_t stream) {
  auto kernel = &fwd_kernel<Traits, Mask, Variant>;
  constexpr int kDefaultSmemLimit = 48 * 1024;  // larger dynamic smem must be opted into per kernel
  if (Traits::kSmemBytes > kDefaultSmemLimit) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
        e != cudaSuccess)
      return e;
  }
  kernel<<<TileScheduler::grid(p, Traits::kBlockM), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <class Traits, class Mask>
cudaError_t launch_variant(const FwdParams& p, const FwdPlan& plan, cudaStream_t stream) {
  return dispatch_variant<false, false>(
      plan.variant, [&](auto variant) { return launch_kernel<Traits, Mask, decltype(variant)>(p, stream); });
}

// The plan's mask policy and tile: causal/window problems always take the compact tile; unmasked ones only
// where compact_for_short_keys instantiates it. Dropout has its own tile (fwd_dropout_tiles) and one kernel per
// mask.
template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, const FwdPlan& plan, cudaStream_t stream) {
  using Element = typename ElementOf<kDtype>::type;
  if (plan.variant.dropout) {
    using Traits = FwdTraits<Element, kHeadDim, true, DropoutFwdTiles<kHeadDim>>;
    using Dropout = KernelVariant<variant::ScoreMods, variant::Dropout>;
    return plan.windowed ? launch_kernel<Traits, WindowMask, Dropout>(p, stream)
                         : launch_kernel<Traits, KeyLengthMask, Dropout>(p, stream);
  }
  if (plan.windowed) return launch_variant<FwdTraits<Element, kHeadDim, true>, WindowMask>(p, plan, stream);
  if constexpr (compact_for_short_keys(kHeadDim))
    if (plan.compact) return launch_variant<FwdTraits<Element, kHeadDim, true>, KeyLengthMask>(p, plan, stream);
  return launch_variant<FwdTraits<Element, kHeadDim, false>, KeyLengthMask>(p, plan, stream);
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes) {
  using Traits = FwdTraits<typename ElementOf<kDtype>::type, kHeadDim, false>;
  return cudaFuncGetAttributes(attributes, &fwd_kernel<Traits, KeyLengthMask, PlainVariant>);
}

}  // namespace flashattn::cuda::sm80

// Host side of one compiled forward kernel: picks the mask policy, sizes shared memory, launches.
#pragma once

#include <type_traits>

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

// The kernels of one mask policy (WindowMask where plan.windowed), and the plan's tile: causal/window problems always
// take the compact tile; unmasked ones only where compact_for_short_keys instantiates it. Dropout has its own tile
// (fwd_dropout_tiles) and one kernel per mask. WindowMask's kernels are a unit of their own where the build splits
// each (dtype, head dim) in two (FLASHATTN_FINE_UNITS, src/cuda/CMakeLists.txt).
template <fa_dtype kDtype, int kHeadDim, class Mask>
cudaError_t launch_fwd_mask(const FwdParams& p, const FwdPlan& plan, cudaStream_t stream) {
  using Element = typename ElementOf<kDtype>::type;
  if (plan.variant.dropout) {
    using Traits = FwdTraits<Element, kHeadDim, true, DropoutFwdTiles<kHeadDim>>;
    return launch_kernel<Traits, Mask, KernelVariant<variant::ScoreMods, variant::Dropout>>(p, stream);
  }
  if constexpr (std::is_same_v<Mask, WindowMask>) {
    return launch_variant<FwdTraits<Element, kHeadDim, true>, WindowMask>(p, plan, stream);
  } else {
    if constexpr (compact_for_short_keys(kHeadDim))
      if (plan.compact) return launch_variant<FwdTraits<Element, kHeadDim, true>, KeyLengthMask>(p, plan, stream);
    return launch_variant<FwdTraits<Element, kHeadDim, false>, KeyLengthMask>(p, plan, stream);
  }
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, const FwdPlan& plan, cudaStream_t stream) {
  return plan.windowed ? launch_fwd_mask<kDtype, kHeadDim, WindowMask>(p, plan, stream)
                       : launch_fwd_mask<kDtype, kHeadDim, KeyLengthMask>(p, plan, stream);
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes) {
  using Traits = FwdTraits<typename ElementOf<kDtype>::type, kHeadDim, false>;
  return cudaFuncGetAttributes(attributes, &fwd_kernel<Traits, KeyLengthMask, PlainVariant>);
}

}  // namespace flashattn::cuda::sm80

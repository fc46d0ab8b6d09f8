// Host side of one compiled forward kernel: picks the mask policy, sizes shared memory, launches.
#pragma once

#include "cuda/common/element.hpp"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::cuda::sm80 {

template <class Traits, class Mask, bool kScoreMods>
cudaError_t launch_kernel(const FwdParams& p, cudaStream_t stream) {
  auto kernel = &fwd_kernel<Traits, Mask, kScoreMods>;
  constexpr int kDefaultSmemLimit = 48 * 1024;  // larger dynamic smem must be opted into per kernel
  if (Traits::kSmemBytes > kDefaultSmemLimit) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
        e != cudaSuccess)
      return e;
  }
  kernel<<<TileScheduler::grid(p, Traits::kBlockM), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Element = typename ElementOf<kDtype>::type;
  using Windowed = FwdTraits<Element, kHeadDim, true>;
  using Plain = FwdTraits<Element, kHeadDim, false>;
  const bool mods = p.softcap > 0.f || p.alibi != nullptr;
  if (p.has_window)
    return mods ? launch_kernel<Windowed, WindowMask, true>(p, stream) : launch_kernel<Windowed, WindowMask, false>(p, stream);
  return mods ? launch_kernel<Plain, KeyLengthMask, true>(p, stream) : launch_kernel<Plain, KeyLengthMask, false>(p, stream);
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes) {
  using Traits = FwdTraits<typename ElementOf<kDtype>::type, kHeadDim, false>;
  return cudaFuncGetAttributes(attributes, &fwd_kernel<Traits, KeyLengthMask, false>);
}

}  // namespace flashattn::cuda::sm80

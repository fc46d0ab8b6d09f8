// Host side of one compiled forward kernel: picks the mask policy, sizes shared memory, launches.
#pragma once

#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::cuda::sm80 {

template <fa_dtype kDtype>
struct ElementOf;
template <>
struct ElementOf<FA_FLOAT16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<FA_BFLOAT16> {
  using type = cutlass::bfloat16_t;
};

template <class Traits, class Mask>
cudaError_t launch_with_mask(const FwdParams& p, cudaStream_t stream) {
  auto kernel = &fwd_kernel<Traits, Mask>;
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
  using Traits = FwdTraits<typename ElementOf<kDtype>::type, kHeadDim>;
  if (p.has_window) return launch_with_mask<Traits, WindowMask>(p, stream);
  return launch_with_mask<Traits, KeyLengthMask>(p, stream);
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes) {
  using Traits = FwdTraits<typename ElementOf<kDtype>::type, kHeadDim>;
  return cudaFuncGetAttributes(attributes, &fwd_kernel<Traits, KeyLengthMask>);
}

}  // namespace flashattn::cuda::sm80

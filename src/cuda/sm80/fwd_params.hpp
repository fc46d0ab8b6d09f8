// The sm80 forward kernels read the shared forward parameters (src/cuda/fwd_params.hpp).
#pragma once

#include "cuda/fwd_params.hpp"
#include "cuda/plan.hpp"

namespace flashattn::cuda::sm80 {

using cuda::FwdParams;

// One compiled forward kernel (dtype x head dim); defined in the generated fwd_<dtype>_hdim<d>.cu units.
template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& params, const FwdPlan& plan, cudaStream_t stream);
// Attributes of that kernel; fails with cudaErrorInvalidDeviceFunction when the build holds no code this
// device can run (the kernels were compiled for other architectures).
template <fa_dtype kDtype, int kHeadDim>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes);

}  // namespace flashattn::cuda::sm80

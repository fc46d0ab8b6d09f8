// The sm80 backward's entry points; its parameters and workspace are the shared ones (src/cuda/bwd_params.hpp).
#pragma once

#include "cuda/bwd_params.hpp"
#include "cuda/sm80/fwd_params.hpp"

namespace flashattn::cuda::sm80 {

using cuda::BwdParams;

// One compiled backward (dtype x head dim); defined in the generated bwd_<dtype>_hdim<d>.cu units. Launches the
// preprocess, main (dK/dV), dQ and postprocess kernels on `stream`; the workspace pointers must be set.
template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& params, const BwdPlan& plan, cudaStream_t stream);

}  // namespace flashattn::cuda::sm80

// The sm90 backward's entry point; its parameters and workspace are the shared ones (src/cuda/bwd_params.hpp).
#pragma once

#include "cuda/bwd_params.hpp"
#include "cuda/plan.hpp"

namespace flashattn::cuda::sm90 {

// One compiled backward (dtype x head dim x dropout); defined in the generated sm90_bwd_*.cu units. Launches the
// preprocess, main, dQ postprocess and GQA reduction kernels on `stream`; the workspace pointers must be set
// (dsum, dq_acc; dk_acc/dv_acc for GQA).
template <fa_dtype kDtype, int kHeadDim, bool kDropout>
cudaError_t launch_bwd(const BwdParams& params, const BwdPlan& plan, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90

// The sm90 forward kernels read the shared forward parameters (src/cuda/fwd_params.hpp); the TMA descriptors
// are built per call by the launch code of each instantiation (fwd_launch.cuh).
#pragma once

#include "cuda/fwd_params.hpp"
#include "cuda/plan.hpp"
#include "cuda/sm90/mechanisms.hpp"

namespace flashattn::cuda::sm90 {

using cuda::FwdParams;

// The launch's counters (FwdPlan::counter_ints): [0] the dynamic schedule's tile counter (TileScheduler), then the
// fused split-KV merge's arrivals (FwdParams::merge_counter). They must be zero when the kernel starts, and the
// kernel leaves them at zero. `zeroed`: they are (the per-stream counters of Workspace, which only such kernels use);
// otherwise (a graph-owned workspace) run_forward zeroes them first in stream order.
struct TileCounter {
  int* ptr = nullptr;
  bool zeroed = false;
};

// One compiled forward kernel (dtype x head dim x score modifiers x dropout x mechanisms); defined in the generated
// sm90_fwd_*.cu units. `Mech` is a Mechanisms<...> list (fwd_kernel.cuh); the default set uses Mechanisms<>.
template <fa_dtype kDtype, int kHeadDim, bool kScoreMods, bool kDropout, class Mech>
cudaError_t launch_fwd(const FwdParams& params, const FwdPlan& plan, TileCounter counter, cudaStream_t stream);
// Attributes of that kernel; fails when the build holds no code this device can run.
template <fa_dtype kDtype, int kHeadDim, bool kScoreMods, bool kDropout, class Mech>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes);
// Split-KV: merges the partials of a launch with params.num_splits > 1 into out and lse (split_combine.cu).
cudaError_t launch_split_combine(const FwdParams& params, fa_dtype dtype, cudaStream_t stream);
// FP8: V (params.v) transposed into params.v_t (v_t_keys keys per row), ahead of the kernel (fp8_v_transpose.cu).
cudaError_t launch_fp8_v_transpose(const FwdParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90

// Host helpers shared by the CUDA backends, and what each kernel family offers the dispatcher (dispatch.cpp) and
// the planner (plan.cpp). The families never call each other: the dispatcher runs the family the plan names.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "core/backend.hpp"
#include "core/problem.hpp"
#include "cuda/bwd_params.hpp"
#include "cuda/fwd_params.hpp"
#include "cuda/plan.hpp"

namespace flashattn::cuda {

FwdParams make_fwd_params(const detail::Problem& p);
BwdParams make_bwd_params(const detail::Problem& p, const BwdPlan& plan);
// The backward of either family: allocates the plan's fp32 workspace in stream order (inside a CUDA graph capture
// it becomes the graph's own memory node), points the parameters at it, runs `launch`, then the sinks' gradient,
// and frees it. `family` names the kernels in errors.
using BwdLaunch = cudaError_t (*)(const BwdParams&, const BwdPlan&, cudaStream_t);
detail::Error run_backward_in_workspace(const detail::Problem& p, const BwdPlan& plan, const char* family,
                                        BwdLaunch launch, cudaStream_t stream);

// Paged calls a family cannot read natively (PagedLoad::kGather): the problem over contiguous (B, seqlen_k, Hkv,
// D/Dv) copies of its keys at k / v (null when only planning), and the bytes of each copy. The gather kernel
// (paged_gather.cu) fills them: the used keys of each sequence, zeros past them and for out-of-range pages.
detail::Problem contiguous_kv(const detail::Problem& p, void* k, void* v);
// Where the copies lie at the workspace's start: K at 0, V at v_offset, the kernels' workspace at bytes (256-byte
// aligned). False when the sizes overflow.
struct GatherLayout {
  int64_t v_offset = 0, bytes = 0;
};
bool gather_layout(const detail::Problem& p, GatherLayout* layout);
cudaError_t launch_paged_gather(const detail::Problem& p, void* k, void* v, cudaStream_t stream);

// A tensor the kernel will read must be device memory of the device it runs on (a host pointer labelled
// CUDA would otherwise fault the context). Null pointers (absent optional tensors) pass.
detail::Error check_device_pointer(const char* name, const void* ptr, int device);

// The device properties plans read, queried once per device.
struct DeviceInfo {
  int arch = 0;  // compute capability major * 10 + minor
  int sms = 0;
  int l2_bytes = 0;
};
detail::Error device_info(int device, DeviceInfo* info);

// A compiled kernel instance of a family's table: the head dim it serves problems up to (max(d, dv) <= it).
struct Instance {
  int index = -1;
  int head_dim = 0;
  bool found() const { return index >= 0; }
};

namespace sm80 {
// Whether the sm80 kernels contain code this device can run (the build's FLASHATTN_SM80_ARCHS).
cudaError_t kernels_runnable(int device);
// The smallest compiled head dim >= need for the dtype (less predicated-away math); not found: none built.
Instance find_fwd(fa_dtype dtype, int64_t need);
Instance find_bwd(fa_dtype dtype, int64_t need);
std::string built_list();  // "bfloat16/d64, ..." for messages
// Launch the planned kernels on `stream` (the plan is for this family; device current, pointers checked).
detail::Error run_forward(const detail::Problem& p, const FwdPlan& plan, cudaStream_t stream);
detail::Error run_backward(const detail::Problem& p, const BwdPlan& plan, cudaStream_t stream);
}  // namespace sm80

namespace sm90 {
// Whether the sm90a kernels can run on this device (built only when FLASHATTN_CUDA_ARCHS lists 90a).
cudaError_t kernels_runnable(int device);
// Kernels with or without score mods / dropout (each its own instantiation); not found: none built for this dtype and
// head dim.
Instance find_fwd(fa_dtype dtype, int64_t need, bool score_mods, bool dropout);
Instance find_bwd(fa_dtype dtype, int64_t need, bool dropout);
detail::Error run_backward(const detail::Problem& p, const BwdPlan& plan, cudaStream_t stream);
// `workspace`: plan.workspace_bytes of device memory ordered on `stream` (null when the plan needs none).
// `counter`: the dynamic schedule's tile counter, an int at zero that the kernel leaves at zero (Workspace); null:
// the workspace's first int, zeroed by the launch.
detail::Error run_forward(const detail::Problem& p, const FwdPlan& plan, void* workspace, int* counter,
                          cudaStream_t stream);
}  // namespace sm90

// The plan of a call for the family of the backend that was selected (plan.cpp): the sm90 family falls back to
// sm80 for problems its kernels cannot take unless the caller asked for cuda-sm90 explicitly.
detail::Error plan_forward(const detail::Problem& p, const fa_exec& exec, Family selected, FwdPlan* plan);
detail::Error plan_backward(const detail::Problem& p, const fa_exec& exec, Family selected, BwdPlan* plan);

const char* family_name(Family f);
// The backend object of a family (dispatch.cpp): its requirements, and forward / backward / tile_shape through the
// plan.
const detail::Backend& backend(Family f);

}  // namespace flashattn::cuda

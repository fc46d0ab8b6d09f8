// The sm90 (FlashAttention-3 design) family's host side: its forward and backward kernel tables and the launches
// of a plan. Which problems this family takes and the fallback to sm80 are decided by the planner, not here.
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda::sm90 {

#define FA_SM90_FWD(dtype, hdim, mods, dropout)                                                                      \
  extern template cudaError_t launch_fwd<dtype, hdim, mods, dropout, Mechanisms<>>(const FwdParams&, const FwdPlan&, \
                                                                                   TileCounter, cudaStream_t);       \
  extern template cudaError_t fwd_attributes<dtype, hdim, mods, dropout, Mechanisms<>>(cudaFuncAttributes*);
#include "sm90_fwd_kernels.inc"
#undef FA_SM90_FWD

#define FA_SM90_BWD(dtype, hdim, dropout) \
  extern template cudaError_t launch_bwd<dtype, hdim, dropout>(const BwdParams&, const BwdPlan&, cudaStream_t);
#include "sm90_bwd_kernels.inc"
#undef FA_SM90_BWD

#define FA_SM90_ABLATION(name, hdim, dropout, ...)                                        \
  extern template cudaError_t launch_fwd<FA_BFLOAT16, hdim, false, dropout, __VA_ARGS__>( \
      const FwdParams&, const FwdPlan&, TileCounter, cudaStream_t);
#include "sm90_fwd_ablations.inc"
#undef FA_SM90_ABLATION

namespace {

using Launch = cudaError_t (*)(const FwdParams&, const FwdPlan&, TileCounter, cudaStream_t);

// Ablation builds (FLASHATTN_SM90_ABLATIONS): FLASHATTN_SM90_MECHANISMS=<variant> makes bf16 forwards of the
// variant's head dim (d128 unless named) without softcap/ALiBi, with dropout where the variant is the dropout
// kernel's and without it otherwise, packed or not, run that variant of the kernel
// (one mechanism changed), read at every call so that a benchmark can switch between variants in one process. Empty
// in default builds.
struct Ablation {
  const char* name;
  int head_dim;
  bool dropout;  // the dropout kernel's variant: serves the plans with dropout, and only those
  Launch launch;
};
const Ablation kAblations[] = {
#define FA_SM90_ABLATION(name, hdim, dropout, ...) \
  {#name, hdim, dropout, &launch_fwd<FA_BFLOAT16, hdim, false, dropout, __VA_ARGS__>},
#include "sm90_fwd_ablations.inc"
#undef FA_SM90_ABLATION
    {nullptr, 0, false, nullptr}};

// The plans the default table serves with its plain bf16 kernel of the variant's head dim (packed GQA included:
// decode takes it).
Launch ablation_launch(const detail::Problem& p, const FwdPlan& plan) {
  if (kAblations[0].name == nullptr || p.dtype != FA_BFLOAT16 || plan.variant.score_mods) return nullptr;
  const char* want = std::getenv("FLASHATTN_SM90_MECHANISMS");
  if (want == nullptr) return nullptr;
  for (const Ablation& a : kAblations)
    if (a.name != nullptr && a.head_dim == plan.head_dim && a.dropout == plan.variant.dropout &&
        std::strcmp(a.name, want) == 0)
      return a.launch;
  return nullptr;
}

struct FwdKernel {
  fa_dtype dtype;
  int head_dim;  // compiled head dim; serves every problem with max(d, dv) <= it
  bool score_mods;
  bool dropout;
  Launch launch;
  cudaError_t (*attributes)(cudaFuncAttributes*);
};

constexpr FwdKernel kFwdKernels[] = {
#define FA_SM90_FWD(dtype, hdim, mods, dropout)           \
  {dtype,                                                 \
   hdim,                                                  \
   mods,                                                  \
   dropout,                                               \
   &launch_fwd<dtype, hdim, mods, dropout, Mechanisms<>>, \
   &fwd_attributes<dtype, hdim, mods, dropout, Mechanisms<>>},
#include "sm90_fwd_kernels.inc"
#undef FA_SM90_FWD
};

struct BwdKernel {
  fa_dtype dtype;
  int head_dim;
  bool dropout;
  BwdLaunch launch;
};

constexpr BwdKernel kBwdKernels[] = {
#define FA_SM90_BWD(dtype, hdim, dropout) {dtype, hdim, dropout, &launch_bwd<dtype, hdim, dropout>},
#include "sm90_bwd_kernels.inc"
#undef FA_SM90_BWD
    {FA_FLOAT32, 0, false, nullptr}};  // end marker (builds without sm90 backward instances)

}  // namespace

Instance find_bwd(fa_dtype dtype, int64_t need, bool dropout) {
  Instance best;
  for (size_t i = 0; kBwdKernels[i].launch != nullptr; ++i) {
    const BwdKernel& k = kBwdKernels[i];
    if (k.dtype == dtype && k.dropout == dropout && k.head_dim >= need && (!best.found() || k.head_dim < best.head_dim))
      best = {int(i), k.head_dim};
  }
  return best;
}

detail::Error run_backward(const detail::Problem& p, const BwdPlan& plan, cudaStream_t stream) {
  return run_backward_in_workspace(p, plan, "cuda-sm90", kBwdKernels[plan.instance].launch, stream);
}

// The smallest compiled head dim that covers the problem (less zero-filled math).
Instance find_fwd(fa_dtype dtype, int64_t need, bool score_mods, bool dropout) {
  Instance best;
  for (size_t i = 0; i < sizeof(kFwdKernels) / sizeof(kFwdKernels[0]); ++i) {
    const FwdKernel& k = kFwdKernels[i];
    if (k.dtype == dtype && k.score_mods == score_mods && k.dropout == dropout && k.head_dim >= need &&
        (!best.found() || k.head_dim < best.head_dim))
      best = {int(i), k.head_dim};
  }
  return best;
}

detail::Error run_forward(const detail::Problem& p, const FwdPlan& plan, void* workspace, int* counter,
                          cudaStream_t stream) {
  FwdParams params = make_fwd_params(p);
  if (plan.paged == PagedLoad::kTmaBlocks || plan.paged == PagedLoad::kTmaRows)
    params.paged_box_rows = plan.paged == PagedLoad::kTmaBlocks ? plan.block_k : kPageBoxRows;
  params.paged_rows = plan.paged == PagedLoad::kRows;
  if (plan.num_splits > 1) {
    params.num_splits = plan.num_splits;
    params.lse_partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.split.lse_offset);
    params.o_partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.split.o_offset);
    params.partial_rows = p.varlen ? p.total_q : p.batch * p.seqlen_q;
  }
  if (plan.v_t_keys > 0) {  // FP8: V transposed into the workspace first (fp8_v_transpose.cu)
    params.v_t = static_cast<char*>(workspace) + plan.v_t_offset;
    params.v_t_keys = plan.v_t_keys;
    if (cudaError_t e = launch_fp8_v_transpose(params, stream); e != cudaSuccess)
      return runtime_error("cuda-sm90 FP8 V transpose kernel launch", e);
  }
  Launch launch = ablation_launch(p, plan);
  if (launch == nullptr) launch = kFwdKernels[plan.instance].launch;
  // The counters (plan.counter_ints): the per-stream ones (zero between launches), else the workspace's first ints.
  TileCounter tiles{counter != nullptr ? counter : static_cast<int*>(workspace), counter != nullptr};
#ifdef FLASHATTN_SM90_ABLATIONS
  // Ablation builds: FLASHATTN_SM90_COUNTER_MEMSET=1 zeroes the counters before every launch, as before they were
  // kept at zero (read at every call: both in one process).
  if (const char* v = std::getenv("FLASHATTN_SM90_COUNTER_MEMSET"); v != nullptr && std::strcmp(v, "1") == 0)
    tiles.zeroed = false;
#endif
  if (plan.counter_ints > 0 && !tiles.zeroed)
    if (cudaError_t e = cudaMemsetAsync(tiles.ptr, 0, size_t(plan.counter_ints) * sizeof(int), stream);
        e != cudaSuccess)
      return runtime_error("cuda-sm90 forward counters (cudaMemsetAsync)", e);
  if (plan.fused_combine) params.merge_counter = tiles.ptr + 1;
  if (cudaError_t e = launch(params, plan, tiles, stream); e != cudaSuccess)
    return runtime_error("cuda-sm90 forward kernel launch", e);
  if (plan.num_splits > 1 && !plan.fused_combine)
    if (cudaError_t e = launch_split_combine(params, p.out_dtype, stream); e != cudaSuccess)
      return runtime_error("cuda-sm90 split-KV combine kernel launch", e);
  return detail::ok();
}

cudaError_t kernels_runnable(int /*device*/) {
  cudaFuncAttributes a{};
  return kFwdKernels[0].attributes(&a);
}

}  // namespace flashattn::cuda::sm90

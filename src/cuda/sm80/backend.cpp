// The sm80 (FlashAttention-2 design) family's host side: its kernel tables and the launches of a plan.
#include <string>

#include "core/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"
#include "cuda/sm80/bwd_params.hpp"
#include "cuda/sm80/fwd_params.hpp"

namespace flashattn::cuda::sm80 {

// Declarations of the generated instantiations (sm80_fwd_kernels.inc lists them).
#define FA_SM80_FWD(dtype, hdim)                                                                        \
  extern template cudaError_t launch_fwd<dtype, hdim>(const FwdParams&, const FwdPlan&, cudaStream_t); \
  extern template cudaError_t fwd_attributes<dtype, hdim>(cudaFuncAttributes*);
#include "sm80_fwd_kernels.inc"
#undef FA_SM80_FWD
#define FA_SM80_BWD(dtype, hdim) \
  extern template cudaError_t launch_bwd<dtype, hdim>(const BwdParams&, const BwdPlan&, cudaStream_t);
#include "sm80_bwd_kernels.inc"
#undef FA_SM80_BWD

namespace {

struct FwdKernel {
  fa_dtype dtype;
  int head_dim;  // compiled head dim; serves every problem with max(d, dv) <= it
  cudaError_t (*launch)(const FwdParams&, const FwdPlan&, cudaStream_t);
  cudaError_t (*attributes)(cudaFuncAttributes*);
};

constexpr FwdKernel kFwdKernels[] = {
#define FA_SM80_FWD(dtype, hdim) {dtype, hdim, &launch_fwd<dtype, hdim>, &fwd_attributes<dtype, hdim>},
#include "sm80_fwd_kernels.inc"
#undef FA_SM80_FWD
};

struct BwdKernel {
  fa_dtype dtype;
  int head_dim;  // compiled head dim; serves every problem with max(d, dv) <= it
  cudaError_t (*launch)(const BwdParams&, const BwdPlan&, cudaStream_t);
};

constexpr BwdKernel kBwdKernels[] = {
#define FA_SM80_BWD(dtype, hdim) {dtype, hdim, &launch_bwd<dtype, hdim>},
#include "sm80_bwd_kernels.inc"
#undef FA_SM80_BWD
};

// The smallest compiled head dim of `table` that covers `need` (less predicated-away math).
template <class Kernel, size_t kCount>
Instance find(const Kernel (&table)[kCount], fa_dtype dtype, int64_t need) {
  Instance best;
  for (size_t i = 0; i < kCount; ++i)
    if (table[i].dtype == dtype && table[i].head_dim >= need && (!best.found() || table[i].head_dim < best.head_dim))
      best = {int(i), table[i].head_dim};
  return best;
}

BwdParams make_bwd_params(const detail::Problem& p, const BwdPlan& plan) {
  BwdParams k;
  static_cast<FwdParams&>(k) = make_fwd_params(p);
  k.dout = p.dout;
  k.dq = p.dq;
  k.dk = p.dk;
  k.dv = p.dv;
  k.do_batch = p.dout_layout.batch, k.do_row = p.dout_layout.row, k.do_head = p.dout_layout.head;
  k.dq_batch = p.dq_layout.batch, k.dq_row = p.dq_layout.row, k.dq_head = p.dq_layout.head;
  k.dk_batch = p.dk_layout.batch, k.dk_row = p.dk_layout.row, k.dk_head = p.dk_layout.head;
  k.dv_batch = p.dv_layout.batch, k.dv_row = p.dv_layout.row, k.dv_head = p.dv_layout.head;
  k.scale = p.scale;
  k.heads_kv = int(p.heads_kv);
  k.rows_q = p.varlen ? p.total_q : p.batch * p.seqlen_q;
  k.rows_k = p.varlen ? p.total_k : p.batch * p.seqlen_k;
  k.deterministic = plan.deterministic;
  k.dq_tile = plan.dq_tile;
  k.dq_blocks = plan.dq_blocks;
  k.dq_splits = plan.dq_splits;
  return k;
}

}  // namespace

Instance find_fwd(fa_dtype dtype, int64_t need) { return find(kFwdKernels, dtype, need); }
Instance find_bwd(fa_dtype dtype, int64_t need) { return find(kBwdKernels, dtype, need); }

std::string built_list() {
  std::string s;
  for (const FwdKernel& k : kFwdKernels)
    s += (s.empty() ? "" : ", ") + std::string(dtype_name(k.dtype)) + "/d" + std::to_string(k.head_dim);
  return s;
}

cudaError_t kernels_runnable(int /*device*/) {
  cudaFuncAttributes a{};
  return kFwdKernels[0].attributes(&a);
}

detail::Error run_forward(const detail::Problem& p, const FwdPlan& plan, cudaStream_t stream) {
  const FwdParams params = make_fwd_params(p);
  if (cudaError_t e = kFwdKernels[plan.instance].launch(params, plan, stream); e != cudaSuccess)
    return runtime_error("cuda-sm80 forward kernel launch", e);
  return detail::ok();
}

detail::Error run_backward(const detail::Problem& p, const BwdPlan& plan, cudaStream_t stream) {
  BwdParams params = make_bwd_params(p, plan);
  const BwdWorkspace ws = bwd_workspace(params);
  // The dQ / dK / dV accumulators are as large as the gradients (fp32): allocated in stream order per call
  // (inside a CUDA graph capture they become the graph's own memory nodes).
  void* buffer = nullptr;
  if (ws.total() > 0) {
    if (cudaError_t e = cudaMallocAsync(&buffer, size_t(ws.total()) * sizeof(float), stream); e != cudaSuccess)
      return runtime_error("cuda-sm80 backward workspace (cudaMallocAsync of " +
                               std::to_string(ws.total() * int64_t(sizeof(float))) + " bytes)",
                           e);
  }
  float* base = static_cast<float*>(buffer);
  params.dsum = ws.dsum ? base : nullptr;
  params.dq_acc = ws.dq_acc ? base + ws.dsum : nullptr;
  params.dk_acc = ws.dk_acc ? base + ws.dsum + ws.dq_acc : nullptr;
  params.dv_acc = ws.dv_acc ? base + ws.dsum + ws.dq_acc + ws.dk_acc : nullptr;
  params.dsinks = p.dsinks;
  cudaError_t launched = kBwdKernels[plan.instance].launch(params, plan, stream);
  if (launched == cudaSuccess && p.dsinks != nullptr) launched = launch_sink_grad(params, stream);
  const cudaError_t freed = buffer ? cudaFreeAsync(buffer, stream) : cudaSuccess;
  if (launched != cudaSuccess) return runtime_error("cuda-sm80 backward kernel launch", launched);
  if (freed != cudaSuccess) return runtime_error("cuda-sm80 backward workspace cudaFreeAsync", freed);
  return detail::ok();
}

}  // namespace flashattn::cuda::sm80

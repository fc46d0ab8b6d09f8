// The sm80 (FlashAttention-2 design) family's host side: its kernel tables and the launches of a plan.
#include <string>

#include "core/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"
#include "cuda/sm80/bwd_params.hpp"
#include "cuda/sm80/fwd_params.hpp"
#include "flashattn/flashattn.hpp"  // dtype_name: the one spelling of a dtype in messages

namespace flashattn::cuda::sm80 {

// Declarations of the generated instantiations (sm80_fwd_kernels.inc lists them).
#define FA_SM80_FWD(dtype, hdim)                                                                       \
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

}  // namespace

Instance find_fwd(fa_dtype dtype, int64_t need) { return find(kFwdKernels, dtype, need); }
Instance find_bwd(fa_dtype dtype, int64_t need) { return find(kBwdKernels, dtype, need); }

std::string built_list() {
  std::string s;
  for (const FwdKernel& k : kFwdKernels)
    s += (s.empty() ? "" : ", ") + std::string(flashattn::dtype_name(k.dtype)) + "/d" + std::to_string(k.head_dim);
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
  return run_backward_in_workspace(p, plan, "cuda-sm80", kBwdKernels[plan.instance].launch, stream);
}

}  // namespace flashattn::cuda::sm80

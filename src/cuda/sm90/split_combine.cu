// The split-KV combine kernels of the sm90 forward (common/split_combine.cuh), one per storage dtype.
#include "cuda/common/element.hpp"
#include "cuda/common/split_combine.cuh"
#include "cuda/sm90/fwd_params.hpp"

namespace flashattn::cuda::sm90 {

cudaError_t launch_split_combine(const FwdParams& p, fa_dtype dtype, cudaStream_t stream) {
  if (dtype == FA_FLOAT16) return cuda::launch_split_combine<cutlass::half_t>(p, stream);
  return cuda::launch_split_combine<cutlass::bfloat16_t>(p, stream);
}

}  // namespace flashattn::cuda::sm90

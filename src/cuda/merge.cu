// fa_merge_partials on CUDA (flashattn.h): one warp per (batch, row, head) folds (out_b, lse_b) into (out, lse) by
// the merge rule of core/merge_rule.hpp, which the CPU merge (src/cpu/merge.cpp) and the split-KV combine
// (common/split_combine.cuh) follow too; float32 arithmetic, out rounded once. Memory bound: one read of each part
// and one write.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/merge_rule.hpp"
#include "core/problem.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"

namespace flashattn::cuda {

namespace {

constexpr int kMergeWarps = 8;

template <class T>
__device__ float to_float(T x) {
  return float(x);
}
template <>
__device__ float to_float(__half x) {
  return __half2float(x);
}
template <>
__device__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ T from_float(float x) {
  return T(x);
}
template <>
__device__ __half from_float(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 from_float(float x) {
  return __float2bfloat16_rn(x);
}

template <class Out, class OutB>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(const detail::MergeProblem p) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t items = p.batch * p.seqlen * p.heads;
  for (int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; item < items;
       item += int64_t(gridDim.x) * kMergeWarps) {
    const int64_t h = item % p.heads, i = (item / p.heads) % p.seqlen, b = item / (p.heads * p.seqlen);
    float* lse = p.lse + b * p.lse_batch + h * p.lse_head + i * p.lse_row;
    float merged, wa, wb;
    detail::LseMerge::two(*lse, p.lse_b[b * p.lse_b_batch + h * p.lse_b_head + i * p.lse_b_row], &merged, &wa, &wb);
    Out* out = static_cast<Out*>(p.out) + b * p.out_batch + i * p.out_row + h * p.out_head;
    const OutB* out_b = static_cast<const OutB*>(p.out_b) + b * p.out_b_batch + i * p.out_b_row + h * p.out_b_head;
    for (int64_t c = lane; c < p.dim; c += 32) {
      // A part of weight 0 is not read (its out may hold anything); NaN weights are read and propagate.
      float x = wa == 0.f ? 0.f : wa * to_float(out[c]);
      if (wb != 0.f) x += wb * to_float(out_b[c]);
      out[c] = from_float<Out>(x);
    }
    __syncwarp();  // every lane has read lse before lane 0 overwrites it
    if (lane == 0) *lse = merged;
  }
}

template <class Out>
cudaError_t launch_merge(const detail::MergeProblem& p, unsigned blocks, cudaStream_t stream) {
  switch (p.out_b_dtype) {
    case FA_FLOAT16: merge_kernel<Out, __half><<<blocks, kMergeWarps * 32, 0, stream>>>(p); break;
    case FA_BFLOAT16: merge_kernel<Out, __nv_bfloat16><<<blocks, kMergeWarps * 32, 0, stream>>>(p); break;
    default: merge_kernel<Out, float><<<blocks, kMergeWarps * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

}  // namespace flashattn::cuda

namespace flashattn::detail {

Error merge_partials_cuda(const MergeProblem& p, void* stream_ptr) {
  using namespace flashattn::cuda;
  const int64_t items = p.batch * p.seqlen * p.heads;
  if (items == 0) return detail::ok();
  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  // The rest must be memory of the device (a host pointer labelled CUDA would fault in the kernel).
  if (Error e = check_device_pointer("lse", p.lse, p.device_index); !e.ok()) return e;
  if (Error e = check_device_pointer("lse_b", p.lse_b, p.device_index); !e.ok()) return e;
  if (p.dim > 0) {
    if (Error e = check_device_pointer("out", p.out, p.device_index); !e.ok()) return e;
    if (Error e = check_device_pointer("out_b", p.out_b, p.device_index); !e.ok()) return e;
  }
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const auto blocks = unsigned(std::min<int64_t>((items + kMergeWarps - 1) / kMergeWarps, int64_t(1) << 20));
  cudaError_t e = p.out_dtype == FA_FLOAT16    ? launch_merge<__half>(p, blocks, stream)
                  : p.out_dtype == FA_BFLOAT16 ? launch_merge<__nv_bfloat16>(p, blocks, stream)
                                               : launch_merge<float>(p, blocks, stream);
  if (e != cudaSuccess) return runtime_error("fa_merge_partials kernel launch", e);
  return detail::ok();
}

}  // namespace flashattn::detail

// Host side of one compiled sm90 backward: TMA descriptors from the parameters, then the preprocess, main, dQ
// postprocess and (GQA) reduction kernels on the caller's stream.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/common/element.hpp"
#include "cuda/plan.hpp"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/fwd_launch.cuh"

namespace flashattn::cuda::sm90 {

template <class Traits, class Mask, class Opts>
cudaError_t launch_bwd_main(const BwdParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int batch = varlen ? 1 : p.batch;
  BwdKernelParams<Traits> kp;
  kp.p = p;
  auto mQ = gmem_tensor(static_cast<const Element*>(p.q), p.tensor_rows_q, p.head_dim, p.heads_q, batch, p.q_row,
                        p.q_head, p.q_batch);
  auto mdO = gmem_tensor(static_cast<const Element*>(p.dout), p.tensor_rows_q, p.head_dim_v, p.heads_q, batch, p.do_row,
                         p.do_head, p.do_batch);
  auto mK = gmem_tensor(static_cast<const Element*>(p.k), p.tensor_rows_k, p.head_dim, p.heads_kv, batch, p.k_row,
                        p.k_head, p.k_batch);
  auto mV = gmem_tensor(static_cast<const Element*>(p.v), p.tensor_rows_k, p.head_dim_v, p.heads_kv, batch, p.v_row,
                        p.v_head, p.v_batch);
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{});
  kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename Traits::SmemLayoutQ{}),
                            Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{});
  kp.tma_k =
      make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kp.tma_v =
      make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kp.shape_q = mQ.shape();
  kp.shape_do = mdO.shape();
  kp.shape_k = mK.shape();
  kp.shape_v = mV.shape();
  // dK/dV by TMA store where every box lies in its own (head, batch) and TMA can address them: no GQA partials,
  // batched (a varlen box would run into the next sequence's rows), 16-byte aligned base and strides (the
  // caller's tensors may have any stride: bwd_epilogue.cuh's copy_rows takes the rest). Otherwise descriptors of a
  // stand-in tile at dK's address rounded down to 16 bytes, never used (encoding reads no memory).
  auto addressable = [&](const void* ptr, int64_t row, int64_t head, int64_t batch_stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && tma_stride_fits<Element>(row, p.tensor_rows_k) &&
           tma_stride_fits<Element>(head, p.heads_q) && tma_stride_fits<Element>(batch_stride, batch);
  };
  kp.tma_dkv = p.group == 1 && !varlen && addressable(p.dk, p.dk_row, p.dk_head, p.dk_batch) &&
               addressable(p.dv, p.dv_row, p.dv_head, p.dv_batch);
  Element* stand_in =
      reinterpret_cast<Element*>(std::max<uintptr_t>(reinterpret_cast<uintptr_t>(p.dk) & ~uintptr_t(15), 256));
  auto store_tensor = [&](void* ptr, int cols, int64_t row, int64_t head, int64_t batch_stride) {
    return kp.tma_dkv ? gmem_tensor(static_cast<Element*>(ptr), p.tensor_rows_k, cols, p.heads_q, batch, row, head,
                                    batch_stride)
                      : gmem_tensor(stand_in, kBlockN, kHeadDim, 1, 1, kHeadDim, 0, 0);
  };
  auto mdK = store_tensor(p.dk, p.head_dim, p.dk_row, p.dk_head, p.dk_batch);
  auto mdV = store_tensor(p.dv, p.head_dim_v, p.dv_row, p.dv_head, p.dv_batch);
  kp.tma_dk =
      make_tma_copy(SM90_TMA_STORE{}, mdK, typename Traits::SmemLayoutK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kp.tma_dv =
      make_tma_copy(SM90_TMA_STORE{}, mdV, typename Traits::SmemLayoutV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kp.shape_dk = mdK.shape();
  kp.shape_dv = mdV.shape();

  auto kernel = &bwd_kernel<Traits, Mask, Opts>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
      e != cudaSuccess)
    return e;
  const dim3 grid(unsigned((p.seqlen_k + kBlockN - 1) / kBlockN), unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

// kDropout: the table entry's flag (dropout kernels are their own units).
template <fa_dtype kDtype, int kHeadDim, bool kDropout>
cudaError_t launch_bwd(const BwdParams& p, const BwdPlan& /*plan*/, cudaStream_t stream) {
  using Traits = BwdTraits<typename ElementOf<kDtype>::type, kHeadDim>;
  using Opts = BwdVariantOf<kDropout>;
  if (cudaError_t e = launch_preprocess<kDtype>(p, stream); e != cudaSuccess) return e;
  if (p.seqlen_k > 0) {
    const cudaError_t e = p.has_window ? launch_bwd_main<Traits, WindowMask, Opts>(p, stream)
                                       : launch_bwd_main<Traits, KeyLengthMask, Opts>(p, stream);
    if (e != cudaSuccess) return e;
  }
  if (p.seqlen_q > 0) {
    const dim3 grid(unsigned((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM), unsigned(p.heads_q),
                    unsigned(p.batch));
    dq_convert_kernel<Traits><<<grid, Traits::kConsumerThreads, 0, stream>>>(p);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return launch_dkdv_reduce<kDtype>(p, stream);
}

}  // namespace flashattn::cuda::sm90

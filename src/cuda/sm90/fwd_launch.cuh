// Host side of one compiled sm90 forward kernel: TMA descriptors from the parameters, grid, launch.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda/common/element.hpp"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/plan.hpp"
#include "cuda/sm90/fwd_params.hpp"

namespace flashattn::cuda::sm90 {

// TMA takes strides that are multiples of 16 bytes; a dimension of extent 1 is never stepped along, so any such
// stride will do for it (the layouts may give 0 there).
template <class Element>
int64_t tma_stride(int64_t stride, int64_t extent) {
  constexpr int64_t kMinStride = 16 / int64_t(sizeof(Element));
  return extent <= 1 && stride == 0 ? kMinStride : stride;
}

template <class Traits, class Ptr>
auto gmem_tensor(Ptr ptr, int64_t rows, int dim, int heads, int batch, int64_t row, int64_t head, int64_t batch_stride) {
  using Element = typename Traits::Element;
  return make_tensor(make_gmem_ptr(ptr),
                     make_shape(int32_t(rows), int32_t(dim), int32_t(heads), int32_t(batch)),
                     make_stride(tma_stride<Element>(row, rows), _1{}, tma_stride<Element>(head, heads),
                                 tma_stride<Element>(batch_stride, batch)));
}

// One kernel of the plan: TMA descriptors, grid and scheduler from the plan's fields. `counter`: the plan's
// workspace (an int), zeroed here in stream order, for the dynamic schedule.
template <class Traits, bool kScoreMods, bool kPackGQA>
cudaError_t launch_kernel(const FwdParams& p, const FwdPlan& plan, int* counter, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kWgRows = Traits::kWgRows, kHeadDim = Traits::kHeadDim, kBlockN = Traits::kBlockN;
  static_assert(Traits::kBlockM == fwd_tiles(kHeadDim, Traits::kWindowed).block_q(), "the plan's block_q");
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int batch = varlen ? 1 : p.batch;  // varlen: one tensor of total rows; sequences are row offsets
  const int heads_kv = p.heads_q / p.group;

  KernelParams<Traits> kp;
  kp.p = p;
  auto mQ = gmem_tensor<Traits>(static_cast<const Element*>(p.q), p.tensor_rows_q, p.head_dim, p.heads_q, batch,
                                p.q_row, p.q_head, p.q_batch);
  auto mK = gmem_tensor<Traits>(static_cast<const Element*>(p.k), p.tensor_rows_k, p.head_dim, heads_kv, batch,
                                p.k_row, p.k_head, p.k_batch);
  auto mV = gmem_tensor<Traits>(static_cast<const Element*>(p.v), p.tensor_rows_k, p.head_dim_v, heads_kv, batch,
                                p.v_row, p.v_head, p.v_batch);
  auto mO = gmem_tensor<Traits>(static_cast<Element*>(p.out), p.tensor_rows_q, p.head_dim_v, p.heads_q, batch,
                                p.o_row, p.o_head, p.o_batch);
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}),
                           Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutV{}),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kp.tma_o = make_tma_copy(SM90_TMA_STORE{}, mO, take<0, 2>(typename Traits::SmemLayoutO{}),
                           Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{});
  kp.shape_q = mQ.shape();
  kp.shape_k = mK.shape();
  kp.shape_v = mV.shape();
  kp.shape_o = mO.shape();
  kp.num_m_blocks = int(plan.m_blocks);
  kp.section_heads = plan.section_heads;

  auto kernel = &fwd_kernel<Traits, kScoreMods, kPackGQA>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
      e != cudaSuccess)
    return e;
  // The ablation variant without persistence runs one CTA per tile whatever the plan says.
  const bool persistent = Traits::Mech::kPersistent && plan.schedule != Schedule::kPerTile;
  const int grid = persistent ? plan.grid : int(plan.tiles * plan.num_splits);
  if (persistent && plan.schedule == Schedule::kPersistentDynamic) {
    if (counter == nullptr) return cudaErrorInvalidValue;  // the plan's workspace was not provided
    if (cudaError_t e = cudaMemsetAsync(counter, 0, sizeof(int), stream); e != cudaSuccess) return e;
    kp.tile_counter = counter;
  }
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

// The plan's tiles: causal/window and packed problems take the windowed tile table entry, the rest the other one
// (a second kernel only where the two entries differ); packed GQA and score mods are their own instantiations.
template <fa_dtype kDtype, int kHeadDim, bool kScoreMods, class Mech>
cudaError_t launch_fwd(const FwdParams& p, const FwdPlan& plan, int* counter, cudaStream_t stream) {
  using Element = typename ElementOf<kDtype>::type;
  using Windowed = FwdTraits<Element, kHeadDim, true, Mech>;
  if constexpr (std::is_same_v<Mech, Mechanisms<>>) {
    if (plan.pack_gqa) return launch_kernel<Windowed, kScoreMods, true>(p, plan, counter, stream);
  }
  if constexpr (fwd_tiles(kHeadDim, true).block_k != fwd_tiles(kHeadDim, false).block_k ||
                fwd_tiles(kHeadDim, true).consumer_warpgroups != fwd_tiles(kHeadDim, false).consumer_warpgroups ||
                fwd_tiles(kHeadDim, true).stages != fwd_tiles(kHeadDim, false).stages) {
    if (!plan.windowed) return launch_kernel<FwdTraits<Element, kHeadDim, false, Mech>, kScoreMods, false>(p, plan, counter, stream);
  }
  return launch_kernel<Windowed, kScoreMods, false>(p, plan, counter, stream);
}

template <fa_dtype kDtype, int kHeadDim, bool kScoreMods, class Mech>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes) {
  return cudaFuncGetAttributes(attributes,
                               &fwd_kernel<FwdTraits<typename ElementOf<kDtype>::type, kHeadDim, true, Mech>, kScoreMods, false>);
}

}  // namespace flashattn::cuda::sm90

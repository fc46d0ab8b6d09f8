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
// stride will do for it where the layout's would not encode (0, or any value the validation lets a dimension of
// extent 1 have: a paged cache of one page).
template <class Element>
int64_t tma_stride(int64_t stride, int64_t extent) {
  constexpr int64_t kMinStride = 16 / int64_t(sizeof(Element));
  return extent <= 1 && (stride == 0 || stride % kMinStride != 0) ? kMinStride : stride;
}
// Whether TMA takes the stride as gmem_tensor passes it (after tma_stride): the caller's tensors that may have any
// stride (the backward's dK/dV) check it before they choose TMA.
template <class Element>
bool tma_stride_fits(int64_t stride, int64_t extent) {
  return tma_stride<Element>(stride, extent) % (16 / int64_t(sizeof(Element))) == 0;
}

template <class Ptr>
auto gmem_tensor(Ptr ptr, int64_t rows, int dim, int heads, int batch, int64_t row, int64_t head,
                 int64_t batch_stride) {
  using Element = std::remove_cv_t<std::remove_pointer_t<Ptr>>;
  return make_tensor(make_gmem_ptr(ptr), make_shape(int32_t(rows), int32_t(dim), int32_t(heads), int32_t(batch)),
                     make_stride(tma_stride<Element>(row, rows), _1{}, tma_stride<Element>(head, heads),
                                 tma_stride<Element>(batch_stride, batch)));
}

// One kernel of the plan: TMA descriptors, grid and scheduler from the plan's fields. `counter`: the dynamic
// schedule's tile counter (zero: run_forward).
template <class Traits, class Opts>
cudaError_t launch_kernel(const FwdParams& p, const FwdPlan& plan, TileCounter counter, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using OutElement = typename Traits::OutElement;
  constexpr int kWgRows = Traits::kWgRows, kHeadDim = Traits::kHeadDim, kBlockN = Traits::kBlockN;
  // The plan's query blocks (m_blocks, tiles) are this kernel's: a plan of another entry would skip rows.
  if (plan.block_q != Traits::kBlockM) return cudaErrorInvalidValue;
  // A fused merge needs a kernel that has it: without, the partials would never reach out.
  if (p.merge_counter != nullptr && !FwdEpilogue<Traits, Opts>::kFusedMerge) return cudaErrorInvalidValue;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int batch = varlen ? 1 : p.batch;  // varlen: one tensor of total rows; sequences are row offsets
  const int heads_kv = p.heads_q / p.group;

  KernelParams<Traits> kp;
  kp.p = p;
  // Paged K/V: (page_size rows, d, heads, pages). The whole-block descriptor of a call read in row boxes or gathered
  // rows is never used; its rows are padded to one block so that it stays encodable.
  const bool paged = p.block_table != nullptr;
  const int kv_batch = paged ? p.num_pages : batch;
  const bool rows_read = paged && p.paged_box_rows != kBlockN;
  const int64_t kv_rows = rows_read ? std::max<int64_t>(p.tensor_rows_k, kBlockN) : p.tensor_rows_k;
  auto mQ = gmem_tensor(static_cast<const Element*>(p.q), p.tensor_rows_q, p.head_dim, p.heads_q, batch, p.q_row,
                        p.q_head, p.q_batch);
  auto mK = gmem_tensor(static_cast<const Element*>(p.k), kv_rows, p.head_dim, heads_kv, kv_batch, p.k_row, p.k_head,
                        p.k_batch);
  auto mV = gmem_tensor(static_cast<const Element*>(p.v), kv_rows, p.head_dim_v, heads_kv, kv_batch, p.v_row, p.v_head,
                        p.v_batch);
  if (paged && p.paged_box_rows == kPageBoxRows) {
    using Box = Shape<Int<kPageBoxRows>, Int<Traits::kAtomCols>>;
    auto mKp = gmem_tensor(static_cast<const Element*>(p.k), p.tensor_rows_k, p.head_dim, heads_kv, kv_batch, p.k_row,
                           p.k_head, p.k_batch);
    auto mVp = gmem_tensor(static_cast<const Element*>(p.v), p.tensor_rows_k, p.head_dim_v, heads_kv, kv_batch, p.v_row,
                           p.v_head, p.v_batch);
    kp.tma_k_page = make_tma_copy(SM90_TMA_LOAD{}, mKp, typename Traits::SmemLayoutPageBox{}, Box{}, _1{});
    kp.tma_v_page = make_tma_copy(SM90_TMA_LOAD{}, mVp, typename Traits::SmemLayoutPageBox{}, Box{}, _1{});
  }
  auto mO = gmem_tensor(static_cast<OutElement*>(p.out), p.tensor_rows_q, p.head_dim_v, p.heads_q, batch, p.o_row,
                        p.o_head, p.o_batch);
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}),
                           Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  if constexpr (Traits::kVTransposed) {
    // V transposed (FP8): (d, keys, heads, batch), rows of v_t_keys keys, written by the launch's transpose.
    auto mVt = gmem_tensor(static_cast<const Element*>(p.v_t), p.head_dim_v, int(p.v_t_keys), heads_kv, batch,
                           p.v_t_keys, p.head_dim_v * p.v_t_keys, heads_kv * p.head_dim_v * p.v_t_keys);
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mVt, take<0, 2>(typename Traits::SmemLayoutVt{}),
                             Shape<Int<kHeadDim>, Int<kBlockN>>{}, _1{});
    kp.shape_v = mVt.shape();
  } else {
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutV{}),
                             Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
    kp.shape_v = mV.shape();
  }
  kp.tma_o = make_tma_copy(SM90_TMA_STORE{}, mO, take<0, 2>(typename Traits::SmemLayoutO{}),
                           Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{});
  kp.shape_q = mQ.shape();
  kp.shape_k = mK.shape();
  kp.shape_o = mO.shape();
  if (p.paged_rows) kp.page_size_div = cutlass::FastDivmod(p.page_size);
  // Packed tiles have one KV head each (their head is the KV head): group 1 for TileScheduler::kv_head.
  constexpr bool kPackGQA = Opts::kPackGQA;
  kp.sched = TileScheduler::make(int(plan.m_blocks), kPackGQA ? heads_kv : p.heads_q, p.batch, p.num_splits,
                                 p.has_window, plan.section_heads, kPackGQA ? 1 : p.group, nullptr);

  auto kernel = &fwd_kernel<Traits, Opts>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
      e != cudaSuccess)
    return e;
  // Tiles of several CTAs per SM need the whole carveout for shared memory to be resident together.
  if constexpr (Traits::kCtasPerSm > 1)
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             int(cudaSharedmemCarveoutMaxShared));
        e != cudaSuccess)
      return e;
  // The ablation variant without persistence runs one CTA per tile whatever the plan says.
  const bool persistent = Traits::Mech::kPersistent && plan.schedule != Schedule::kPerTile;
  const int grid = persistent ? plan.grid : int(plan.tiles * plan.num_splits);
  if (persistent && plan.schedule == Schedule::kPersistentDynamic) {
    if (counter.ptr == nullptr) return cudaErrorInvalidValue;  // the plan's workspace was not provided
    kp.sched.counter = counter.ptr;                            // zero (run_forward)
  }
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

// The plan's entry of the tile table (tiles.hpp). Packed GQA and dropout take the windowed entry (its kernel is
// always instantiated); the wide and short entries have kernels of their own only where their tiles differ from the
// windowed one's and from each other's, and otherwise run the kernel with the same tiles. Packed GQA, score mods and
// dropout are their own instantiations (kScoreMods / kDropout: the table entry's flags; dropout is never packed).
template <fa_dtype kDtype, int kHeadDim, bool kScoreMods, bool kDropout, class Mech>
cudaError_t launch_fwd(const FwdParams& p, const FwdPlan& plan, TileCounter counter, cudaStream_t stream) {
  using Element = typename ElementOf<kDtype>::type;
  using Windowed = FwdTraits<Element, kHeadDim, FwdEntry::kWindowed, Mech>;
  using Unpacked = FwdVariantOf<kScoreMods, kDropout, false>;
  constexpr bool kFp8 = Windowed::kFp8;  // no packed FP8 kernel (plan.cpp)
  if constexpr (!kFp8 && !kDropout) {
    using Packed = FwdVariantOf<kScoreMods, false, true>;
    if constexpr (!kScoreMods &&
                  !same_tiles(fwd_tiles(kHeadDim, FwdEntry::kDecode), fwd_tiles(kHeadDim, FwdEntry::kWindowed))) {
      if (plan.pack_gqa && plan.tiles_entry == FwdEntry::kDecode)
        return launch_kernel<FwdTraits<Element, kHeadDim, FwdEntry::kDecode, Mech>, Packed>(p, plan, counter, stream);
    }
    if (plan.pack_gqa) return launch_kernel<Windowed, Packed>(p, plan, counter, stream);
    if constexpr (!kScoreMods &&
                  !same_tiles(fwd_tiles(kHeadDim, FwdEntry::kNarrow), fwd_tiles(kHeadDim, FwdEntry::kWindowed))) {
      if (plan.tiles_entry == FwdEntry::kNarrow)
        return launch_kernel<FwdTraits<Element, kHeadDim, FwdEntry::kNarrow, Mech>, Unpacked>(p, plan, counter, stream);
    }
  }
  if constexpr (!kDropout) {
    constexpr FwdTiles kWindowedTiles = fwd_tiles(kHeadDim, FwdEntry::kWindowed, kFp8);
    constexpr FwdTiles kWideTiles = fwd_tiles(kHeadDim, FwdEntry::kWide, kFp8);
    constexpr FwdTiles kShortTiles = fwd_tiles(kHeadDim, FwdEntry::kShort, kFp8);
    if constexpr (!same_tiles(kWideTiles, kWindowedTiles)) {
      if (plan.tiles_entry == FwdEntry::kWide ||
          (plan.tiles_entry == FwdEntry::kShort && same_tiles(kShortTiles, kWideTiles)))
        return launch_kernel<FwdTraits<Element, kHeadDim, FwdEntry::kWide, Mech>, Unpacked>(p, plan, counter, stream);
    }
    if constexpr (!same_tiles(kShortTiles, kWindowedTiles) && !same_tiles(kShortTiles, kWideTiles)) {
      if (plan.tiles_entry == FwdEntry::kShort)
        return launch_kernel<FwdTraits<Element, kHeadDim, FwdEntry::kShort, Mech>, Unpacked>(p, plan, counter, stream);
    }
  }
  return launch_kernel<Windowed, Unpacked>(p, plan, counter, stream);
}

template <fa_dtype kDtype, int kHeadDim, bool kScoreMods, bool kDropout, class Mech>
cudaError_t fwd_attributes(cudaFuncAttributes* attributes) {
  return cudaFuncGetAttributes(
      attributes, &fwd_kernel<FwdTraits<typename ElementOf<kDtype>::type, kHeadDim, FwdEntry::kWindowed, Mech>,
                              FwdVariantOf<kScoreMods, kDropout, false>>);
}

}  // namespace flashattn::cuda::sm90

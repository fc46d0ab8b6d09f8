// Types every part of the sm90 forward shares: the traits of one compiled kernel (tiles, shared-memory layouts,
// MMAs, TMA types), the kernel's parameters, the named barriers between the roles, and small wgmma helpers.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/fast_math.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/common/fwd_policies.cuh"
#include "cuda/sm90/gemm.cuh"
#include "cuda/sm90/mechanisms.hpp"
#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda::sm90 {

using namespace cute;

// ------------------------------------------------------------------------------------------- traits
template <class Element_, int kHeadDim_, bool kWindowed_, class Mech_ = Mechanisms<>>
struct FwdTraits {
  using Element = Element_;
  using Mech = Mech_;
  static constexpr bool kWindowed = kWindowed_;  // causal/window problems (tile choice; the mask is run time)
  static constexpr FwdTiles kTiles = fwd_tiles(kHeadDim_, kWindowed_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWgRows = kWarpgroupRows;
  static constexpr int kConsumerWGs = kTiles.consumer_warpgroups;
  static constexpr int kBlockM = kTiles.block_q();
  static constexpr int kBlockN = Mech::kBlockN > 0 ? Mech::kBlockN : kTiles.block_k;
  static constexpr int kStages = Mech::kStages > 0 ? Mech::kStages : kTiles.stages;
  static constexpr int kWgThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kConsumerThreads = kConsumerWGs * kWgThreads;
  static constexpr int kThreads = kConsumerThreads + kWgThreads;  // + the producer warpgroup
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "wgmma K steps are 16 elements");

  // Register split (setmaxnreg): the producer keeps the minimum (24); the consumers share the rest of the
  // 64K-register file, rounded down to the multiple of 8 setmaxnreg takes and capped at 240. The registers the
  // producer gives back are all the consumers get: the CTA launches with 168 per thread (two consumer
  // warpgroups), and 240 for them leaves exactly 24 for the producer (with 32 the consumers' setmaxnreg waited
  // forever).
  static constexpr int kRegisterFile = 64 * 1024;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegsRaw = (kRegisterFile / kWgThreads - kProducerRegs) / kConsumerWGs / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsRaw > 240 ? 240 : kConsumerRegsRaw;

  // MMAs of one consumer warpgroup: S (64 x kBlockN) = Q (64 x d) K^T, both from shared memory; O (64 x d) +=
  // P (64 x kBlockN, registers) V, V read as the MN-major B operand straight from its (keys, d) tile.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kBlockN>, Int<kHeadDim>>>()));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>()));

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  // Q and O: (64 rows, d, warpgroup): each warpgroup's rows are one contiguous region, so a warpgroup may
  // overwrite its own Q rows with its O while the others still read theirs.
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kWgRows>, Int<kHeadDim>, Int<kConsumerWGs>>{}));
  using SmemLayoutO = SmemLayoutQ;
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V as the (d, keys) B operand of P.V: the same bytes, keys the contiguous (MN-major) mode.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  static constexpr int kTileBytesQ = kWgRows * kHeadDim * int(sizeof(Element));  // one warpgroup's rows
  static constexpr int kTileBytesKV = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kMaxSmemBytes = 227 * 1024;  // sm90 opt-in limit per CTA
  static constexpr int kMainSmemBytes = int(sizeof(Element)) * int(cosize_v<SmemLayoutQ> + 2 * cosize_v<SmemLayoutK>);
  static constexpr int kBarrierSlack = 1024;  // pipelines' mbarriers + alignment
  // O gets its own tile when it fits: the next tile's Q load then overlaps this tile's epilogue. Otherwise
  // (d256, and d128 with 176-key blocks) each warpgroup stages O in its own Q rows.
  static constexpr bool kSeparateO = kMainSmemBytes + kConsumerWGs * kTileBytesQ + kBarrierSlack <= kMaxSmemBytes;
  static constexpr int kSmemO = kSeparateO ? int(cosize_v<SmemLayoutO>) : 1;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, kSmemO, 1024> o;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
    int tile_idx;                // the tile whose Q load barrier_q announces (count(): no more tiles)
    uint64_t row_addr[kBlockN];  // paged rows gathered by the producer warp: each row's address (FwdLoad::load_rows)
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= kMaxSmemBytes, "tile table entry does not fit shared memory");

  // Global tensors as TMA sees them: (rows, d, heads, batch); varlen: (total rows, d, heads, 1).
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemIn = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{}, GmemStride{}));
  using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), GmemShape{}, GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, take<0, 2>(SmemLayoutK{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, take<0, 2>(SmemLayoutO{}),
                                      Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{}));

  // Paged K/V in boxes of kPageBoxRows rows (PagedLoad::kTmaRows): one box per swizzle-atom column, so that it
  // lands on the contiguous run the stage's layout gives those rows there (atoms stack along the rows first).
  static constexpr int kAtomCols = decltype(size<1>(SmemAtom{}))::value;
  static_assert(kBlockN % kPageBoxRows == 0 && kHeadDim % kAtomCols == 0);
  using SmemLayoutPageBox = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kPageBoxRows>, Int<kAtomCols>>{}));
  using TmaPage = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemLayoutPageBox{},
                                         Shape<Int<kPageBoxRows>, Int<kAtomCols>>{}, _1{}));

  // Epilogue for varlen: 128-bit vectors from shared memory to global, 128 threads of one warpgroup.
  static constexpr int kVecElems = int(sizeof(cute::uint128_t) / sizeof(Element));
  // Threads per row: the largest power of two dividing the row's vectors, so that the thread grid covers all
  // 128 threads and tiles the (64, d) tile exactly (d96: 12 vectors per row, 4 threads, 3 vectors each; one
  // thread per vector would leave 8 threads outside the grid, addressing past the tile).
  static constexpr int kVecsPerRow = kHeadDim / kVecElems;
  static constexpr int kThreadsPerRow = kVecsPerRow & -kVecsPerRow;
  static_assert(kWgThreads % kThreadsPerRow == 0 && kWgRows % (kWgThreads / kThreadsPerRow) == 0);
  using GmemStoreO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
      Layout<Shape<Int<kWgThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>{},
      Layout<Shape<_1, Int<kVecElems>>>{}));
};

template <class Traits>
struct KernelParams {
  FwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;
  typename Traits::TmaPage tma_k_page, tma_v_page;  // paged K/V in row boxes (built for those calls only)
  typename Traits::GmemShape shape_q, shape_k, shape_v, shape_o;
  cutlass::FastDivmod page_size_div;  // paged rows (FwdLoad::load_rows): key -> (page, slot)
  int num_m_blocks = 0;
  int section_heads = 1;        // TileScheduler
  int* tile_counter = nullptr;  // dynamic scheduling (zeroed before the launch); null: static
};

// ------------------------------------------------------------------------------------------- helpers
// Named barriers (ids above CUTLASS's reserved ones).
enum Barrier : int {
  kQFree = 0,          // consumers -> producer: the previous tile's Q (and, aliased, O) space may be reloaded
  kSchedulerBase = 1,  // one per consumer warpgroup: its turn to issue GEMMs (ping-pong)
  kEpilogueBase = 4,   // one per consumer warpgroup: its O tile is complete in shared memory
  kVTail = 7,          // all consumers: the zeroed V rows past the keys of the partial block are in place
  kBarrierCount
};
// CUTLASS offsets these ids by the barriers it reserves; the hardware has 16.
static_assert(kBarrierCount + int(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier) <= 16, "named barrier ids");

// The tile index travels from the producer to the consumers through shared memory, ordered by barrier_q (the
// producer writes before its arrive, the consumers read after their wait). CUTLASS's mbarrier asm carries no
// memory clobber, so compiler barriers keep the store and the load on their side of it.
__device__ __forceinline__ void publish_tile(int& slot, int idx) {
  *reinterpret_cast<volatile int*>(&slot) = idx;
  asm volatile("" ::: "memory");
}
__device__ __forceinline__ int published_tile(const int& slot) {
  asm volatile("" ::: "memory");
  return *reinterpret_cast<const volatile int*>(&slot);
}

}  // namespace flashattn::cuda::sm90

// Types every part of the sm90 backward shares: the traits of one compiled kernel (tiles, shared-memory layouts,
// MMAs, TMA types), the kernel's parameters and the named barriers between its roles.
//
// The GEMMs of one step (head dims up to 128: a CTA owns a block of 128 keys, two consumer warpgroups 64 keys each;
// a step is one block of block_q query rows). Every warpgroup keeps its keys' dK and dV in registers; S and dP
// are computed transposed (keys as the wgmma M mode), so that the accumulators of P^T and dS^T are directly the
// register A operands of the two GEMMs that reduce over the queries:
//   S^T  (64 x block_q) = K_w . Q^T       A = K rows of the warpgroup (smem, K-major), B = Q (smem, K-major)
//   dP^T (64 x block_q) = V_w . dO^T      A = V rows, B = dO
//   dV_w (64 x d)      += P^T . dO        A = P^T (registers), B = dO read (queries, d) MN-major
//   dK_w (64 x d)      += dS^T . Q        A = dS^T (registers), B = Q, MN-major
//   dQ   (block_q x d)  = dS . K          A = dS from shared memory (both warpgroups' keys), B = K MN-major;
//                                          each warpgroup computes 64 x dq_cols of it (block_q 128: its 64 rows;
//                                          block_q 64: its half of the head dim)
// dQ is added into the fp32 workspace by one bulk reduce-add per warpgroup and step (cp.reduce.async.bulk), from
// a shared-memory staging tile in the accumulator's register order (conflict-free 16-byte stores), issued by a
// warp of the producer warpgroup so that the consumers neither wait for it nor synchronise to issue it.
//
// Above head dim 128 (kSplitHeadDim, tiles.hpp) a CTA owns 64 keys and the warpgroups split the other modes:
//   S^T, dP^T (64 x 32 each)   warpgroup w takes query columns [32w, 32w + 32)
//   P^T, dS^T                  to shared memory (bf16), both warpgroups' halves, one barrier
//   dV_w, dK_w (64 x d/2)     += P^T . dO[:, half w], dS^T . Q[:, half w]: A and B from shared memory
//   dQ (64 x d/2 per warpgroup) = dS . K[:, half w], as at head dim 128
// and dQ is added by each consumer thread with vector reductions (red.global.add.v4.f32) in the same register
// order, since no staging tile fits beside two stages of 64 x 256 Q and dO tiles.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/bwd_params.hpp"
#include "cuda/common/bwd_common.cuh"
#include "cuda/sm90/gemm.cuh"
#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda::sm90 {

using namespace cute;

template <class Element_, int kHeadDim_>
struct BwdTraits {
  using Element = Element_;
  static constexpr BwdTiles kTiles = bwd_tiles(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTiles.block_q;
  static constexpr int kBlockN = kTiles.block_k;
  static constexpr int kStages = kTiles.stages;
  static constexpr bool kSplitHeadDim = kTiles.split_head_dim;
  static constexpr int kWgRows = kWarpgroupRows;  // keys per consumer warpgroup (split: all the CTA's keys)
  static constexpr int kConsumerWGs = 2;
  static_assert(kSplitHeadDim ? kBlockN == kWgRows && kBlockM == 64 : kBlockN == kConsumerWGs * kWgRows);
  static constexpr int kWgThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kConsumerThreads = kConsumerWGs * kWgThreads;
  static constexpr int kThreads = kConsumerThreads + kWgThreads;
  static_assert(kBlockM == 64 || kBlockM == 128);
  // dQ per warpgroup: block_q 128 splits the rows, block_q 64 the head dim.
  static constexpr bool kDqSplitRows = kBlockM == 2 * kWgRows;
  static constexpr int kDqCols = kDqSplitRows ? kHeadDim : kHeadDim / 2;
  static_assert(kDqCols % 16 == 0, "wgmma N of dQ");
  static constexpr bool kDsFromRoundedP = kBlockM == 2 * kWgRows;  // bwd_mainloop.cuh
  // dQ through staging tiles and the writer warp (bwd_epilogue.cuh), or reduced from registers (split).
  static constexpr bool kDqStaged = !kSplitHeadDim;

  // One CTA per SM (__launch_bounds__(kThreads, 1)): 24 for the producer leaves 240 for each consumer warpgroup
  // (tiles.hpp: consumer_regs).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = consumer_regs(1, kConsumerWGs, kProducerRegs);
  static_assert(kThreads == (kConsumerWGs + 1) * kWgThreads);

  // Tiled over both consumer warpgroups (thread index 0..255 of the consumers): S^T, dP^T and dK/dV split the
  // keys, dQ its rows (block_q 128) or its head dim (block_q 64). Split: S^T and dP^T split the queries, dK/dV
  // and dQ the head dim.
  using WgRows = Layout<Shape<Int<kConsumerWGs>, _1, _1>>;
  using WgCols = Layout<Shape<_1, Int<kConsumerWGs>, _1>>;
  using WgKeys = std::conditional_t<kSplitHeadDim, WgCols, WgRows>;
  using WgDq = std::conditional_t<kDqSplitRows, WgRows, WgCols>;
  static constexpr int kSdPCols = kSplitHeadDim ? kBlockM / kConsumerWGs : kBlockM;  // query columns a warpgroup
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kSdPCols>, Int<kHeadDim>>>(), WgKeys{}));
  // dK/dV: A = P^T / dS^T from registers (their own accumulators), or from shared memory (split).
  using MmadKVOp = std::conditional_t<
      kSplitHeadDim,
      decltype(GMMA::ss_op_selector<Element, Element, float,
                                    Shape<Int<kWgRows>, Int<kHeadDim / kConsumerWGs>, Int<kBlockM>>, GMMA::Major::K,
                                    GMMA::Major::MN>()),
      decltype(GMMA::rs_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kHeadDim>, Int<kBlockM>>,
                                    GMMA::Major::K, GMMA::Major::MN>())>;
  using TiledMmadKV = decltype(make_tiled_mma(MmadKVOp{}, WgKeys{}));
  // Split at d256: each warpgroup's dQ columns as two 64-column slices, issued as two groups so that the first
  // slice's reductions run under the second, dV and dK (bwd_mainloop_split.cuh). The N permutation keeps a warpgroup's
  // columns contiguous (warpgroup w, slice j: [kDqCols * w + 64 j, + 64)), so the fragment holds the same columns
  // in the same register order as one m64 x kDqCols atom and the workspace order does not change. (d192's 48-column
  // slices would start inside a 32-column SW64 atom of K: one slice there.)
  static constexpr int kDqSlices = kSplitHeadDim && kDqCols % 128 == 0 ? 2 : 1;
  static constexpr int kDqSliceCols = kDqCols / kDqSlices;
  using DqPermutation = Tile<
      Underscore,
      Layout<Shape<Int<kDqSliceCols>, Int<kConsumerWGs>, Int<kDqSlices>>, Stride<_1, Int<kDqCols>, Int<kDqSliceCols>>>,
      Underscore>;
  using MmadQOp =
      decltype(GMMA::ss_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kDqSliceCols>, Int<kBlockN>>,
                                    GMMA::Major::MN, GMMA::Major::MN>());
  using TiledMmadQ = std::conditional_t<(kDqSlices > 1), decltype(make_tiled_mma(MmadQOp{}, WgDq{}, DqPermutation{})),
                                        decltype(make_tiled_mma(MmadQOp{}, WgDq{}))>;

  // Q and dO: (block_q, d, stage). Their transposed views (d, block_q, stage) are the MN-major B operands of dK/dV.
  // (Split: an atom that divides half the head dim, since each warpgroup's dK/dV B operand starts there.)
  using SmemAtomQ = decltype(smem_atom_k_major<Element, kSplitHeadDim ? kHeadDim / kConsumerWGs : kHeadDim>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K: (keys, d) with an atom narrow enough that dQ's B operand may take half the head dim (block_q 64).
  using SmemAtomK = decltype(smem_atom_k_major<Element, kDqCols>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // dS: (block_q, keys, 2 buffers), queries contiguous (MN-major A of dQ); written through its (keys, queries) view.
  using SmemLayoutdS =
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  // Split: P^T and dS^T as the K-major A operands of dV and dK, (keys, queries, 2 buffers). At 64 x 64 the K-major
  // tiling of dS^T is the same map as SmemLayoutdS's MN-major one, so one buffer serves dK and dQ.
  using SmemLayoutPt =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  static constexpr int kDqWgFloats = kWgRows * kDqCols;  // one warpgroup's dQ staging tile
  // Two staging tiles per warpgroup when they fit: a step's reduce-add then reads one while the next step writes
  // the other.
  static constexpr int kSmemOneStaging = int(sizeof(Element)) * int(2 * cosize_v<SmemLayoutQ> + cosize_v<SmemLayoutK> +
                                                                    cosize_v<SmemLayoutV> + cosize_v<SmemLayoutdS>) +
                                         int(sizeof(float)) * (kConsumerWGs * kDqWgFloats + 2 * kStages * kBlockM);
  static constexpr int kDqStages = kSmemOneStaging + kConsumerWGs * kDqWgFloats * 4 + 1024 <= 227 * 1024 ? 2 : 1;
  static constexpr int kDqStagingFloats = kDqStaged ? kConsumerWGs * kDqStages * kDqWgFloats : 4;
  static constexpr int kPtElements = kSplitHeadDim ? int(cosize_v<SmemLayoutPt>) : 8;

  static constexpr int kTileBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kTileBytesKV = kBlockN * kHeadDim * int(sizeof(Element));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds;
    cute::array_aligned<float, kDqStagingFloats, 128> dq;  // staged dQ only
    // LSE (log2 units) and D of a stage's query rows, one buffer per Q/dO stage (bwd_load.cuh: BwdStatsLoad).
    cute::array_aligned<float, kBlockM * kStages, 128> lse;
    cute::array_aligned<float, kBlockM * kStages, 128> dsum;
    typename Pipeline::SharedStorage pipeline_q;
    typename Pipeline::SharedStorage pipeline_do;
    cutlass::arch::ClusterTransactionBarrier barrier_kv;
    // Split only (a 16-byte stub otherwise, last so that it adds no alignment padding: d64 fills shared memory).
    cute::array_aligned<Element, kPtElements, kSplitHeadDim ? 1024 : 16> pt;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "tile table entry does not fit shared memory");

  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;  // (rows, d, heads, batch)
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemIn = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{}, GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK =
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemLayoutK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV =
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemLayoutV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // dK and dV stored from K's and V's tiles (bwd_epilogue.cuh), in the layouts their loads use.
  using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), GmemShape{}, GmemStride{}));
  using TmaStoreK =
      decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, SmemLayoutK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaStoreV =
      decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, SmemLayoutV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
};

template <class Traits>
struct BwdKernelParams {
  BwdParams p;
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::GmemShape shape_q, shape_do, shape_k, shape_v;
  // dK/dV by TMA store (bwd_epilogue.cuh: one query head per KV head, batched, 16-byte aligned), else unused.
  bool tma_dkv;
  typename Traits::TmaStoreK tma_dk;
  typename Traits::TmaStoreV tma_dv;
  typename Traits::GmemShape shape_dk, shape_dv;
};

// Named barriers (ids above CUTLASS's reserved ones).
enum BwdBarrier : int {
  kdSReady = 0,    // both consumer warpgroups: this step's dS is in shared memory
  kDqEmpty = 1,    // one per consumer warpgroup (1, 2) with the dQ writer warp: the next staging tile may be written
  kDqFull = 3,     // one per consumer warpgroup (3, 4) with the dQ writer warp: this step's staging tile is written
  kTails = 5,      // both consumer warpgroups: zeroed tail rows of K, Q, dO in place
  kDqOrdered = 6,  // both consumer warpgroups (split mainloop, deterministic): the dQ tile's turn, its adds issued
  kBwdBarrierCount
};
// User ids 0 .. count - 1 are hardware barriers FirstUserBarrier + id, the last at most 15 (as fwd_traits.cuh checks).
static_assert(kBwdBarrierCount + int(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier) <= 16,
              "named barrier ids");

// The index of a (query head, sequence)'s first dQ tile (bwd_params.hpp: dq_blocks tiles per head, each sequence
// starting on a tile of its own); tile m of the sequence follows at index + m. Its floats start at index * dq_tile
// of dq_acc, its order counter (dq_ordered) at index of dq_order.
__device__ __forceinline__ int64_t dq_tile_index(const BwdParams& p, int head, int batch, int64_t q_row0, int block_q) {
  return int64_t(head) * p.dq_blocks + (q_row0 + int64_t(batch) * block_q) / block_q;
}
__device__ __forceinline__ float* dq_workspace_tiles(const BwdParams& p, int head, int batch, int64_t q_row0,
                                                     int block_q) {
  return p.dq_acc + dq_tile_index(p, head, batch, q_row0, block_q) * p.dq_tile;
}
// Their order counters in deterministic mode (dq_ordered), null otherwise.
__device__ __forceinline__ int* dq_order_tiles(const BwdParams& p, int head, int batch, int64_t q_row0, int block_q) {
  return p.dq_order == nullptr ? nullptr : p.dq_order + dq_tile_index(p, head, batch, q_row0, block_q);
}
// Their claims (dq_first_stores outside deterministic mode), null otherwise.
__device__ __forceinline__ int* dq_claim_tiles(const BwdParams& p, int head, int batch, int64_t q_row0, int block_q) {
  return p.dq_claim == nullptr ? nullptr : p.dq_claim + dq_tile_index(p, head, batch, q_row0, block_q);
}

// The ordered dQ adds (dq_ordered): a tile's counter says how many key blocks have added into it. wait_for_count
// (acquire) and count_one (release) order generic-proxy adds (red.global); wait_for_turn and end_turn the dQ
// writer's bulk reduce-adds, which run in the async proxy: the proxy fences order them after the acquire and, once
// complete, before the release.
__device__ __forceinline__ void wait_for_count(const int* counter, int count) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != count);
}
__device__ __forceinline__ void count_one(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}
__device__ __forceinline__ void wait_for_turn(const int* counter, int count) {
  wait_for_count(counter, count);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// The calling thread's bulk writes complete (not only their reads, .read) and ordered before its next release.
__device__ __forceinline__ void bulk_writes_done() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void end_turn(int* counter) {
  bulk_writes_done();
  count_one(counter);
}

// A dQ tile's claim (dq_claim): 0 -> 1 by the first CTA to ask, whose adds store instead (dq_first_stores); the
// others wait for its publish_tile (2, wait_for_turn) before their reduce-adds. No CTA waits for one that has not
// claimed: the claimer is running and publishes once its own consumers have staged the tile.
__device__ __forceinline__ bool claim_tile(int* claim) { return atomicCAS(claim, 0, 1) == 0; }
__device__ __forceinline__ void publish_tile(int* claim) {
  bulk_writes_done();
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(claim), "r"(2) : "memory");
}

// One arrival on the mbarrier `bar` (release: the calling thread's earlier shared-memory writes are visible to the
// threads that wait for the phase), with a memory clobber so that the compiler keeps those writes above it.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(unsigned(__cvta_generic_to_shared(bar))) : "memory");
}

// fp32 bulk reduce-add of `bytes` (a multiple of 16) from shared to global memory, in the calling thread's bulk
// group; cute::tma_store_arrive commits the group, tma_store_wait<0> waits until its reads are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  const unsigned src = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem), "r"(src),
               "r"(bytes)
               : "memory");
}
// The same as a plain copy (a dQ tile's first add, dq_first_stores).
__device__ __forceinline__ void bulk_store_f32(float* gmem, const float* smem, int bytes) {
  const unsigned src = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(src), "r"(bytes)
               : "memory");
}

}  // namespace flashattn::cuda::sm90

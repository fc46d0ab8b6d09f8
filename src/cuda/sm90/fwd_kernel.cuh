// The sm90 forward kernel (FlashAttention-3 design) written with CuTe/CUTLASS sm90 primitives:
//   tile scheduler  -> persistent CTAs walk (query block, head, batch) tiles; longest first under causal/window
//   producer        -> one warp of the producer warpgroup issues TMA loads of Q (per tile) and of K/V (per key
//                      block) into a multi-stage pipeline completing on mbarriers; the warpgroup gives its
//                      registers to the consumers (setmaxnreg). GQA-packed tiles (kPackGQA) gather Q in the
//                      consumers instead: their rows are (position, head) pairs, not a TMA box
//   consumers       -> 2 or 3 warpgroups, 64 query rows each: S = Q.K^T as wgmma with both operands in shared
//                      memory, online softmax in registers, O += P.V as wgmma with P from registers;
//                      ping-pong (named barriers order the warpgroups' GEMM issue so that one's softmax runs
//                      under the other's GEMMs) and intra-warpgroup overlap (Q.K^T of a key block and P.V of
//                      the previous one are issued together; the softmax of the first runs while the second
//                      is in flight)
//   epilogue        -> normalise, then O through shared memory: TMA store (batched) or predicated 128-bit
//                      stores (varlen, where a box could spill into the next sequence); or, for 176-key d128
//                      whose O has no shared-memory tile of its own, straight from registers (kDirectO); LSE
//                      from registers
// Masks (causal both alignments, window), softcap, ALiBi, GQA, varlen and seqused_k use the policies shared
// with the sm80 kernel (src/cuda/common/fwd_policies.cuh). Head dims below the compiled one: the TMA boxes are
// zero filled past the tensor's real head dim, and the stores are clipped (TMA) or predicated.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/common/fwd_policies.cuh"
#include "cuda/sm90/mechanisms.hpp"
#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda::sm90 {

using namespace cute;

// ------------------------------------------------------------------------------------------- traits
// K-major shared-memory atom with the widest swizzle the head dim allows (128-byte rows of 64 elements when the
// head dim is a multiple of 64): the layout wgmma reads without bank conflicts and TMA writes in one box row.
template <class Element, int kHeadDim>
constexpr auto smem_atom_k_major() {
  if constexpr (kHeadDim % 64 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};
  else if constexpr (kHeadDim % 32 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};
  else return GMMA::Layout_K_SW32_Atom<Element>{};
}

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
  // 64K-register file, rounded down to the multiple of 8 setmaxnreg takes and capped at 240.
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
  static constexpr int kMainSmemBytes =
      int(sizeof(Element)) * int(cosize_v<SmemLayoutQ> + 2 * cosize_v<SmemLayoutK>);
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
    int tile_idx;  // the tile whose Q load barrier_q announces (count(): no more tiles)
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
  typename Traits::GmemShape shape_q, shape_k, shape_v, shape_o;
  int num_m_blocks = 0;
  int section_heads = 1;        // TileScheduler
  int* tile_counter = nullptr;  // dynamic scheduling (zeroed before the launch); null: static
};

// Where packed row `row` (position * group + head-in-group) of a tile lives; unpacked: rows_per_pos = 1.
struct PackedRow {
  int pos, head;
  __device__ PackedRow(int row, int rows_per_pos, int head0) : pos(row / rows_per_pos), head(head0 + row % rows_per_pos) {}
};

// apply_mask for packed rows: the mask sees query positions, not tile rows.
template <class Mask, class S, class C>
__device__ void apply_mask_packed(const Mask& mask, S& s, const C& coords, int m0, int rows_per_pos, int n0) {
  CUTE_UNROLL
  for (int r = 0; r < size<0>(s); ++r) {
    const ColRange cr = mask.cols((m0 + get<0>(coords(r, 0))) / rows_per_pos);
    const int lo = cr.lo - n0, hi = cr.hi - n0;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s); ++c) {
      const int col = get<1>(coords(0, c));
      if (col < lo || col >= hi) s(r, c) = -INFINITY;
    }
  }
}

// ------------------------------------------------------------------------------------------- tile scheduler
// Tiles are numbered 0..count-1. CTA c starts with tile c; without a window it then takes c + gridDim.x, ...
// (static: every tile costs the same), and the query blocks of one (head, batch) are consecutive so that CTAs
// running together share its K/V in L2. Under causal/window the longest query blocks (the last ones) go first
// and a CTA asks a global counter for its next tile when it finishes one (dynamic: tile lengths differ, and a
// static round-robin left whole waves waiting on one long tile: d128 causal 16k ran at 532 TFLOP/s persistent-
// static against 588 with one CTA per tile). To keep the K/V of CTAs running together in L2, the longest-first
// order is taken within sections of `section_heads` consecutive (batch, head) pairs whose K/V fit in about half
// of L2 (without sections, causal d128 at 2k reached 0.83x of cuDNN, every CTA of a wave on another head).
struct TileScheduler {
  struct Tile {
    int m_block, head, batch;
  };
  int num_m_blocks, heads, batch;
  bool longest_first;
  int section_heads;
  __device__ int count() const { return num_m_blocks * heads * batch; }
  __device__ Tile tile(int idx) const {
    int m, hb;
    if (longest_first) {
      const int hb_count = heads * batch;
      const int section = idx / (section_heads * num_m_blocks);
      const int first_hb = section * section_heads;
      const int section_hb = min(section_heads, hb_count - first_hb);
      const int r = idx - first_hb * num_m_blocks;
      m = num_m_blocks - 1 - r / section_hb;
      hb = first_hb + r % section_hb;
    } else {
      m = idx % num_m_blocks;
      hb = idx / num_m_blocks;
    }
    return {m, hb % heads, hb / heads};
  }
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

// wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) viewed as (rows, cols): value mode 0 holds two adjacent
// columns, mode 1 the row 8 below, mode 2 the 8-column groups.
template <class L>
__device__ constexpr auto rows_cols(L l) {
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The accumulator of S reused as the register A operand of P.V: the m64nNk16 accumulator of columns
// [16j, 16j + 16) is exactly the A fragment of k-slice j, so ((2, 2, N/8), M, 1) -> ((2, 2, 2), M, N/16).
template <class L>
__device__ constexpr auto acc_as_a_operand(L l) {
  static_assert(decltype(size<2>(l))::value == 1);
  auto groups = logical_divide(layout<0, 2>(l), Layout<_2>{});  // (2, N/16)
  return make_layout(make_layout(layout<0, 0>(l), layout<0, 1>(l), layout<0>(groups)), layout<1>(l),
                     layout<1>(groups));
}

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

// acc (+)= A.B over the K mode as a batch of wgmmas of one warpgroup, committed as one group: the caller waits
// for it with warpgroup_wait<N>() (N = groups it lets run on).
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_gemm(Mma& mma, const TA& a, const TB& b, TC& c) {
  // A from shared memory is a tensor of wgmma descriptors; from registers, the values themselves.
  constexpr bool kARegs = !std::is_same_v<std::decay_t<decltype(a.data())>, GMMA::DescriptorIterator>;
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegs) warpgroup_fence_operand(const_cast<TA&>(a));
}

// ------------------------------------------------------------------------------------------- the kernel
// kScoreMods: softcap and/or ALiBi present (their own instantiation keeps the plain kernel's registers free).
// kPackGQA: GQA query-head packing for query sequences shorter than a tile: a tile's rows are (query position,
// head of the group) pairs, position-major, so that the tile is full and one K/V pass serves the whole group;
// tiles then run over KV heads. Its own instantiation: the row gathers and per-row addresses cost registers
// the plain kernels do not have to spare (d64 and 176-key d128 spilled with packing decided at run time).
template <class Traits, bool kScoreMods, bool kPackGQA>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel(const __grid_constant__ KernelParams<Traits> kp) {
  using Element = typename Traits::Element;
  using Mech = typename Traits::Mech;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  constexpr int kWgRows = Traits::kWgRows, kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kWGs = Traits::kConsumerWGs, kWgThreads = Traits::kWgThreads;
  constexpr int kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kProducerWarpThreads = 32;
  // O from registers to global memory where it would otherwise be staged in Q's space (no room for a tile of its
  // own): the next tile's Q then loads while this tile's last P.V and epilogue run, as with a separate O tile.
  // Measured on the H200 (src/cuda/NOTES.md, session 3): +3% for 176-key d128 at 1k and 16k, even elsewhere;
  // d256 lost 3-7% at 1k-4k (64 column-pair stores per thread against 16 stmatrix and one TMA store), so it
  // keeps the staged path. Packed tiles keep it too (their rows are (position, head) pairs).
  constexpr bool kDirectO = !Traits::kSeparateO && Mech::kDirectEpilogue && !kPackGQA && kHeadDim <= 128;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const FwdParams& p = kp.p;

  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync();
  const bool is_tma_thread = threadIdx.x == 0;

  if (is_tma_thread) {
    prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_o.get_tma_descriptor());
    ss.barrier_q.init(1);
  }
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kTileBytesKV;
  pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = is_tma_thread;
  pipe_params.num_consumers = kConsumerThreads;
  Pipeline pipe_k(ss.pipeline_k, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipe_v(ss.pipeline_v, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // every mbarrier is initialised before anyone waits on it

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
  Tensor sO = make_tensor(make_smem_ptr(Traits::kSeparateO ? ss.o.data() : ss.q.data()), typename Traits::SmemLayoutO{});

  const int rows_per_pos = kPackGQA ? p.group : 1;  // tile rows per query position
  const TileScheduler sched{kp.num_m_blocks, kPackGQA ? p.heads_q / p.group : p.heads_q, p.batch, p.has_window,
                            kp.section_heads};
  const bool varlen = p.cu_seqlens_q != nullptr;
  // The query positions [lo, hi) of tile rows [m0, m0 + rows) of a sequence of len_q positions.
  auto positions = [&](int m0, int rows, int len_q) {
    return BlockRange{m0 / rows_per_pos, min(len_q, (m0 + rows + rows_per_pos - 1) / rows_per_pos)};
  };

  if (warp_group == 0) {
    // ------------------------------------------------------------------ producer
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp != 0) return;  // one warp issues the loads; the other three have nothing to do
    PipelineState k_write = cutlass::make_producer_start_state<Pipeline>();
    PipelineState v_write = cutlass::make_producer_start_state<Pipeline>();
    bool first_tile = true;
    auto next_tile = [&](int current) {
      if (kp.tile_counter == nullptr) return current + int(gridDim.x);
      int next = 0;
      if (is_tma_thread) next = atomicAdd(kp.tile_counter, 1) + int(gridDim.x);  // the first wave is blockIdx
      return __shfl_sync(0xffffffffu, next, 0);
    };
    for (int idx = blockIdx.x; idx < sched.count(); idx = next_tile(idx)) {
      const TileScheduler::Tile t = sched.tile(idx);
      const SeqInfo seq(p, t.batch);
      const int m0 = t.m_block * kBlockM;
      if (m0 >= seq.len_q * rows_per_pos) continue;  // varlen: this sequence is shorter than max_seqlen_q
      const WindowMask mask(p, seq);
      const BlockRange pos = positions(m0, kBlockM, seq.len_q);
      const BlockRange range = mask.blocks(pos.lo, pos.hi - pos.lo, kBlockN);
      const int b = varlen ? 0 : t.batch;
      const int kv_head = kPackGQA ? t.head : t.head / p.group;

      Tensor mQ = domain_offset(make_coord(seq.q_start, _0{}), kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, t.head, b));
      Tensor mK = domain_offset(make_coord(seq.k_start, _0{}), kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, kv_head, b));
      Tensor mV = domain_offset(make_coord(seq.k_start, _0{}), kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, kv_head, b));
      Tensor gQ = local_tile(mQ, Shape<Int<kWgRows>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (64, d, m/64)
      Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, d, n)
      Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
      auto q_parts = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      Tensor tQg = get<0>(q_parts);
      Tensor tQs = get<1>(q_parts);
      auto k_parts = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      Tensor tKg = get<0>(k_parts);
      Tensor tKs = get<1>(k_parts);
      auto v_parts = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      Tensor tVg = get<0>(v_parts);
      Tensor tVs = get<1>(v_parts);

      auto load_k = [&](int n) {
        pipe_k.producer_acquire(k_write);
        if (is_tma_thread)
          copy(kp.tma_k.with(*pipe_k.producer_get_barrier(k_write)), tKg(_, n), tKs(_, k_write.index()));
        ++k_write;
      };
      auto load_v = [&](int n) {
        pipe_v.producer_acquire(v_write);
        if (is_tma_thread)
          copy(kp.tma_v.with(*pipe_v.producer_get_barrier(v_write)), tVg(_, n), tVs(_, v_write.index()));
        ++v_write;
      };

      // Key blocks from the last to the first (the one partial block is masked first). K of the first block
      // only waits for a free stage, so it streams in while the previous tile's epilogue still runs.
      if (range.hi > range.lo) load_k(range.hi - 1);
      if (!first_tile)
        cutlass::arch::NamedBarrier::sync(kConsumerThreads + kProducerWarpThreads, Barrier::kQFree);
      first_tile = false;
      if (is_tma_thread) {
        publish_tile(ss.tile_idx, idx);
        if constexpr (kPackGQA) {
          ss.barrier_q.arrive();  // packed rows are no TMA box: each consumer warpgroup gathers its own
        } else {
          ss.barrier_q.arrive_and_expect_tx(Traits::kTileBytesQ * kWGs);
          CUTE_UNROLL
          for (int w = 0; w < kWGs; ++w)
            copy(kp.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q)), tQg(_, t.m_block * kWGs + w), tQs(_, w));
        }
      }
      // Q.K^T of block n-1 is issued before P.V of block n (intra-warpgroup overlap): K(n-1) before V(n).
      for (int n = range.hi - 1; n > range.lo; --n) {
        load_k(n - 1);
        load_v(n);
      }
      if (range.hi > range.lo) load_v(range.lo);
    }
    // Matches the consumers' release of the last tile's Q space (every arrive has its sync), then tells them
    // there is no further tile.
    if (!first_tile) cutlass::arch::NamedBarrier::sync(kConsumerThreads + kProducerWarpThreads, Barrier::kQFree);
    if (is_tma_thread) {
      publish_tile(ss.tile_idx, sched.count());
      ss.barrier_q.arrive();
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int wg = warp_group - 1;
  const int tid = int(threadIdx.x) % kWgThreads;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor sQw = sQ(_, _, wg);
  Tensor sOw = sO(_, _, wg);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQw);  // (MMA, 1, d/16) descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, 1, d/16, stages)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, 1, N/16, stages)

  Tensor cS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kWgRows>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), rows_cols(cS.layout()));
  Tensor cO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
  Tensor cO_rc = make_tensor(cO.data(), rows_cols(cO.layout()));

  // Ping-pong: warpgroup w issues its GEMMs after warpgroup w-1 did (cyclically); the last one lets the first
  // start. Every wait has a matching arrive: the first warpgroup consumes the final one after its last tile.
  auto scheduler_wait = [&] {
    if constexpr (Mech::kPingpong) cutlass::arch::NamedBarrier::sync(2 * kWgThreads, Barrier::kSchedulerBase + wg);
  };
  auto scheduler_signal = [&] {
    if constexpr (Mech::kPingpong)
      cutlass::arch::NamedBarrier::arrive(2 * kWgThreads, Barrier::kSchedulerBase + (wg + 1) % kWGs);
  };
  if constexpr (Mech::kPingpong)
    if (wg == kWGs - 1) cutlass::arch::NamedBarrier::arrive(2 * kWgThreads, Barrier::kSchedulerBase);

  PipelineState k_read, v_read;
  int q_phase = 0;

  // The producer publishes each tile it loads (skipping empty varlen tiles) with its Q load, and a final
  // past-the-end index.
  for (;;) {
    ss.barrier_q.wait(q_phase);
    q_phase ^= 1;
    const int idx = published_tile(ss.tile_idx);
    if (idx >= sched.count()) break;
    const TileScheduler::Tile t = sched.tile(idx);
    const SeqInfo seq(p, t.batch);
    const int m0 = t.m_block * kBlockM;
    const int m0_wg = m0 + wg * kWgRows;  // this warpgroup's first tile row
    const WindowMask mask(p, seq);
    // Unpacked tiles keep the plain form: at d64's 160-register budget ptxas spilled (140 bytes) when the
    // range went through positions() even with one row per position.
    const BlockRange range = [&] {
      if constexpr (kPackGQA) {
        const BlockRange pos = positions(m0, kBlockM, seq.len_q);
        return mask.blocks(pos.lo, pos.hi - pos.lo, kBlockN);
      } else {
        return mask.blocks(m0, min(kBlockM, seq.len_q - m0), kBlockN);
      }
    }();
    const int head0 = kPackGQA ? t.head * p.group : t.head;  // query head of the tile's first row
    const ScoreMods mods(p, seq, t.batch, t.head);  // ALiBi never runs packed (its slope is per head)

    if constexpr (kPackGQA) {
      // Gather this warpgroup's 64 packed rows of Q into its Q tile with 16-byte loads (rows past the sequence
      // and columns past head_dim are zero), then make them visible to wgmma (async proxy).
      cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);  // the previous tile's reads of
                                                                                    // this space are done
      typename Traits::GmemStoreO gather;  // the same 128-thread, 16-byte-vector partition as the O stores
      auto gthr = gather.get_thread_slice(tid);
      Tensor tQs = gthr.partition_D(sQw);
      Tensor tQc = gthr.partition_D(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
      const Element* q_base = static_cast<const Element*>(p.q) +
                              (varlen ? int64_t(seq.q_start) * p.q_row : int64_t(t.batch) * p.q_batch);
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tQs); ++m) {
        const PackedRow r(m0_wg + get<0>(tQc(0, m, 0)), rows_per_pos, head0);
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tQs); ++k) {
          const int col = get<1>(tQc(0, m, k));
          cute::uint128_t v{};
          if (r.pos < seq.len_q && col < p.head_dim)
            v = *reinterpret_cast<const cute::uint128_t*>(q_base + int64_t(r.pos) * p.q_row + int64_t(r.head) * p.q_head + col);
          *reinterpret_cast<cute::uint128_t*>(raw_pointer_cast(&tQs(0, m, k))) = v;
        }
      }
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);
    }

    Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kWgRows>, Int<kHeadDim>>{});
    Tensor o_rc = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
    clear(tOrO);
    OnlineSoftmax<decltype(size<0>(o_rc))::value> softmax;

    // Masks, score modifiers and exponentiation of one score tile; returns whether O needs the rescale.
    auto softmax_step = [&](auto& tSrS, int n, auto is_first, float (&correction)[decltype(size<0>(o_rc))::value]) {
      Tensor s = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
      const int n0 = n * kBlockN;
      if constexpr (kScoreMods) mods.apply(s, cS_rc, m0_wg, n0);
      if constexpr (kPackGQA) {
        const BlockRange pos_wg = positions(m0_wg, kWgRows, seq.len_q);
        if (mask.block_needs_mask(pos_wg.lo, max(pos_wg.hi - pos_wg.lo, 1), n0, kBlockN))
          apply_mask_packed(mask, s, cS_rc, m0_wg, rows_per_pos, n0);
      } else if (mask.block_needs_mask(m0_wg, kWgRows, n0, kBlockN)) {
        apply_mask(mask, s, cS_rc, m0_wg, n0);
      }
      return softmax.template exponentiate<decltype(is_first)::value>(s, p.scale_log2, correction);
    };

    // The partial key block's V box runs past the sequence's keys into memory TMA does not zero-fill (rows past
    // seqused_k, the next varlen sequence). P is 0 there, but 0 * Inf = NaN, so those rows are zeroed before any
    // P.V reads the stage, as the sm80 kernel's predicated loads do. Every consumer warpgroup of the CTA runs the
    // same range, so the barrier over all of them is reached by each; it sits after the first block's Q.K^T and
    // before any ping-pong wait that could need another warpgroup to pass it first.
    const bool zero_v_tail = (varlen || p.seqused_k != nullptr) && range.hi > range.lo &&
                             range.hi * kBlockN > seq.len_k;
    auto zero_v_tail_rows = [&] {
      constexpr int kChunk = Traits::kVecElems;  // 16-byte chunks stay contiguous under the swizzle
      constexpr int kChunksPerRow = Traits::kVecsPerRow;
      const int first = seq.len_k - (range.hi - 1) * kBlockN;
      pipe_v.consumer_wait(v_read);  // waited for again before the P.V; the phase stays complete until released
      Tensor sVs = sV(_, _, v_read.index());
      for (int i = int(threadIdx.x) - kWgThreads; i < (kBlockN - first) * kChunksPerRow; i += kConsumerThreads)
        *reinterpret_cast<cute::uint128_t*>(raw_pointer_cast(&sVs(first + i / kChunksPerRow, i % kChunksPerRow * kChunk))) =
            cute::uint128_t{};
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, Barrier::kVTail);
    };

    if (range.hi > range.lo) {
      float correction[decltype(size<0>(o_rc))::value];
      Tensor rP = make_tensor<Element>(partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{}).layout());
      Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));
      auto to_probs = [&](const auto& tSrS) {
        Tensor converted = convert_fragment<Element>(tSrS);
        CUTE_UNROLL
        for (int i = 0; i < size(rP); ++i) rP(i) = converted(i);
      };

      if constexpr (Mech::kIntraWgOverlap) {
        int n = range.hi - 1;
        {
          Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{});
          pipe_k.consumer_wait(k_read);
          scheduler_wait();
          wgmma_gemm<true>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), tSrS);
          scheduler_signal();
          warpgroup_wait<0>();
          pipe_k.consumer_release(k_read);
          ++k_read;
          softmax_step(tSrS, n, cute::true_type{}, correction);
          to_probs(tSrS);
          if (zero_v_tail) zero_v_tail_rows();
        }
        for (--n; n >= range.lo; --n) {
          Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{});
          pipe_k.consumer_wait(k_read);
          scheduler_wait();
          wgmma_gemm<true>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), tSrS);
          pipe_v.consumer_wait(v_read);
          wgmma_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
          scheduler_signal();
          warpgroup_wait<1>();  // S(n) is ready; P(n+1).V(n+1) may still run
          pipe_k.consumer_release(k_read);
          ++k_read;
          const bool rescale = softmax_step(tSrS, n, cute::false_type{}, correction);
          warpgroup_wait<0>();
          pipe_v.consumer_release(v_read);
          ++v_read;
          if (rescale) softmax.rescale(o_rc, correction);
          to_probs(tSrS);
        }
        pipe_v.consumer_wait(v_read);
        wgmma_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
        warpgroup_wait<0>();
        pipe_v.consumer_release(v_read);
        ++v_read;
      } else {
        for (int n = range.hi - 1; n >= range.lo; --n) {
          Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{});
          pipe_k.consumer_wait(k_read);
          scheduler_wait();
          wgmma_gemm<true>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), tSrS);
          scheduler_signal();
          warpgroup_wait<0>();
          pipe_k.consumer_release(k_read);
          ++k_read;
          const bool rescale = n == range.hi - 1 ? softmax_step(tSrS, n, cute::true_type{}, correction)
                                                 : softmax_step(tSrS, n, cute::false_type{}, correction);
          if (rescale) softmax.rescale(o_rc, correction);
          to_probs(tSrS);
          if (zero_v_tail && n == range.hi - 1) zero_v_tail_rows();
          pipe_v.consumer_wait(v_read);
          wgmma_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
          warpgroup_wait<0>();
          pipe_v.consumer_release(v_read);
          ++v_read;
        }
      }
    }
    // Q is no longer read: with a separate O tile, or O stored from registers, the producer may load the next
    // tile's Q right away.
    if constexpr (Traits::kSeparateO || kDirectO)
      cutlass::arch::NamedBarrier::arrive(kConsumerThreads + kProducerWarpThreads, Barrier::kQFree);

    // ---------------------------------------------------------------- epilogue
    float lse[decltype(size<0>(o_rc))::value];
    softmax.finish(o_rc, p.logit_scale, lse);
    Tensor out_frag = convert_fragment<Element>(tOrO);

    if constexpr (!kDirectO) {
      // The previous tile's store has finished reading this warpgroup's O tile (its issuing thread waited).
      cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);
      // stmatrix: each warp writes 8x8 sub-tiles of its accumulator rows, 16 bytes per lane per matrix, instead
      // of one 2-byte store per value.
      auto smem_store_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
      auto smem_store_thr = smem_store_o.get_thread_slice(tid);
      copy(smem_store_o, smem_store_thr.retile_S(out_frag), smem_store_thr.partition_D(sOw));
    }

    if (p.lse != nullptr) {
      const int64_t lse_base = varlen ? int64_t(seq.q_start) * p.lse_row : int64_t(t.batch) * p.lse_batch;
      if constexpr (kPackGQA) {
        CUTE_UNROLL
        for (int r = 0; r < int(sizeof(lse) / sizeof(lse[0])); ++r) {
          const PackedRow row(m0_wg + get<0>(cO_rc(r, 0)), rows_per_pos, head0);
          // One writer per row: the quad's thread that holds column 0.
          if (get<1>(cO_rc(r, 0)) == 0 && row.pos < seq.len_q)
            p.lse[lse_base + int64_t(row.pos) * p.lse_row + int64_t(row.head) * p.lse_head] = lse[r];
        }
      } else {
        float* lse_ptr = p.lse + lse_base + int64_t(t.head) * p.lse_head;
        CUTE_UNROLL
        for (int r = 0; r < int(sizeof(lse) / sizeof(lse[0])); ++r) {
          const int row = m0_wg + get<0>(cO_rc(r, 0));
          if (get<1>(cO_rc(r, 0)) == 0 && row < seq.len_q) lse_ptr[int64_t(row) * p.lse_row] = lse[r];
        }
      }
    }
    const int rows_here = seq.len_q - m0_wg;
    if constexpr (kDirectO) {
      // Each thread stores its accumulator's column pairs (4 bytes; a warp instruction covers 8 rows x 16 bytes).
      // Nothing waits for these stores, and shared memory is not involved.
      Element* o_ptr = static_cast<Element*>(p.out) + int64_t(t.head) * p.o_head +
                       (varlen ? int64_t(seq.q_start) * p.o_row : int64_t(t.batch) * p.o_batch);
      Tensor o_vals = make_tensor(out_frag.data(), rows_cols(out_frag.layout()));
      static_assert(size<1>(decltype(o_vals.layout()){}) % 2 == 0, "column pairs");
      CUTE_UNROLL
      for (int r = 0; r < size<0>(o_vals); ++r) {
        const int row = get<0>(cO_rc(r, 0));
        if (row >= rows_here) continue;
        Element* row_ptr = o_ptr + int64_t(m0_wg + row) * p.o_row;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(o_vals); c += 2) {
          const int col = get<1>(cO_rc(r, c));  // mode 0 of the accumulator: columns col and col + 1
          if (col < p.head_dim_v) {
            cutlass::AlignedArray<Element, 2> pair;  // 4-byte aligned: one 32-bit store, not two 16-bit ones
            pair[0] = o_vals(r, c);
            pair[1] = o_vals(r, c + 1);
            *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(row_ptr + col) = pair;
          }
        }
      }
      continue;
    }
    cutlass::arch::fence_view_async_shared();  // the generic-proxy smem writes become visible to the TMA store (async proxy)
    cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);

    if (!varlen && !kPackGQA) {
      // The TMA box is clipped at the tensor's rows and head dim: partial tiles need no predicates.
      if (tid == 0 && rows_here > 0) {
        Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o)(_, _, t.head, t.batch);
        Tensor gO = local_tile(mO, Shape<Int<kWgRows>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        auto o_parts = tma_partition(kp.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOw), group_modes<0, 2>(gO));
        Tensor tOg = get<0>(o_parts);
        Tensor tOs = get<1>(o_parts);
        copy(kp.tma_o, tOs, tOg(_, t.m_block * kWGs + wg));
        tma_store_arrive();
        tma_store_wait<0>();
      }
    } else if constexpr (!kPackGQA) {
      // A box would write past the end of this sequence into the next one's rows: predicated vector stores.
      Element* o_ptr = static_cast<Element*>(p.out) + int64_t(seq.q_start) * p.o_row + int64_t(t.head) * p.o_head;
      Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(seq.len_q, Int<kHeadDim>{}), make_stride(p.o_row, _1{}));
      Tensor gO = local_tile(mO, Shape<Int<kWgRows>, Int<kHeadDim>>{}, make_coord(t.m_block * kWGs + wg, 0));
      typename Traits::GmemStoreO store;
      auto sthr = store.get_thread_slice(tid);
      Tensor tOs = sthr.partition_S(sOw);
      Tensor tOg = sthr.partition_D(gO);
      Tensor tOc = sthr.partition_D(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tOg); ++m) {
        if (get<0>(tOc(0, m, 0)) >= rows_here) continue;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOg); ++k)
          if (get<1>(tOc(0, m, k)) < p.head_dim_v) copy(store, tOs(_, m, k), tOg(_, m, k));
      }
    }
    if constexpr (kPackGQA) {
      // Packed rows are no box: predicated 16-byte stores, one row address each.
      Element* o_base = static_cast<Element*>(p.out) +
                        (varlen ? int64_t(seq.q_start) * p.o_row : int64_t(t.batch) * p.o_batch);
      typename Traits::GmemStoreO store;
      auto sthr = store.get_thread_slice(tid);
      Tensor tOs = sthr.partition_S(sOw);
      Tensor tOc = sthr.partition_D(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tOs); ++m) {
        const PackedRow r(m0_wg + get<0>(tOc(0, m, 0)), rows_per_pos, head0);
        if (r.pos >= seq.len_q) continue;
        Element* row_ptr = o_base + int64_t(r.pos) * p.o_row + int64_t(r.head) * p.o_head;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOs); ++k) {
          const int col = get<1>(tOc(0, m, k));
          if (col < p.head_dim_v)
            *reinterpret_cast<cute::uint128_t*>(row_ptr + col) =
                *reinterpret_cast<const cute::uint128_t*>(raw_pointer_cast(&tOs(0, m, k)));
        }
      }
    }
    if constexpr (!Traits::kSeparateO) {
      // O lived in this warpgroup's Q rows: the next Q may be loaded once every warpgroup's stores have read it.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::arrive(kConsumerThreads + kProducerWarpThreads, Barrier::kQFree);
    }
  }
  if constexpr (Mech::kPingpong)
    if (wg == 0) cutlass::arch::NamedBarrier::sync(2 * kWgThreads, Barrier::kSchedulerBase);
}

}  // namespace flashattn::cuda::sm90

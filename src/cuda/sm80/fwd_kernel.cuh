// The sm80 forward kernel (FlashAttention-2 algorithm) written with CuTe:
//   tile scheduler  -> which (query block, head, batch) this CTA computes
//   mask policy     -> which key blocks it visits and which scores it masks
//   mainloop        -> cp.async loads of K/V overlapped with mma.sync m16n8k16 (fp32 accumulation) and the
//                      online softmax in registers (exp2 with the softmax scale folded into one FFMA)
//   epilogue        -> normalise, stage O through shared memory, predicated 128-bit stores, LSE
// Head dims smaller than the compiled one are handled by predication: the missing columns of Q/K/V are zero
// filled in shared memory (they add nothing to Q.K^T, and produce O columns that are never stored).
#pragma once

#include <cmath>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "cuda/common/fwd_policies.cuh"
#include "cuda/sm80/fwd_params.hpp"
#include "cuda/sm80/kernel_variant.hpp"
#include "cuda/sm80/tiles.hpp"

namespace flashattn::cuda::sm80 {

using namespace cute;

// Tiles::value is the tile; dev benchmarks instantiate other shapes to measure them against fwd_tiles().
template <typename Element_, int kHeadDim_, bool kCompact_, class Tiles = DefaultFwdTiles<kHeadDim_, kCompact_>>
struct FwdTraits {
  using Element = Element_;
  static constexpr FwdTiles kTiles = Tiles::value;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTiles.block_q;
  static constexpr int kBlockN = kTiles.block_k;
  static constexpr int kWarps = kTiles.warps;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kHeadDim % 32 == 0, "compiled head dims are multiples of 32 (smaller dims are predicated)");

  // Tensor cores: one warp computes a 16-row slab; warps tile the query rows (FA2 work split), so the row
  // statistics of the softmax never leave a warp.
  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                                   SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma = TiledMMA<MMA_Atom<MmaOp>, Layout<Shape<Int<kWarps>, _1, _1>>, Tile<Int<16 * kWarps>, _16, _16>>;

  // Shared memory rows are cut into chunks of 64 elements (128 bytes) where the head dim allows, 32 otherwise;
  // the XOR swizzle of the 16-byte vectors within 8 rows makes both the 128-bit cp.async stores and the
  // ldmatrix reads (8 rows x 16 bytes per phase) conflict-free.
  static constexpr int kSmemChunk = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kVecElems = int(sizeof(cute::uint128_t) / sizeof(Element));
  // Swizzle<B, M, S>: the vector index (bits [M, M+B) of the element offset) is XORed with the bits S above it.
  static constexpr int kVecBits = 3;                             // log2(kVecElems): 16-byte vectors stay whole
  static constexpr int kSwizzleBits = kSmemChunk == 64 ? 3 : 2;  // log2(vectors per chunk row)
  static constexpr int kSwizzleShift = 3;                        // XOR with the row bits (8 rows per atom)
  static_assert(kVecElems == (1 << kVecBits));
  using SmemAtom = decltype(composition(Swizzle<kSwizzleBits, kVecBits, kSwizzleShift>{},
                                        Layout<Shape<_8, Int<kSmemChunk>>, Stride<Int<kSmemChunk>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V read as the B operand of P.V: the same bytes viewed (head_dim, keys).
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  static constexpr int kSmemElems = int(size(SmemLayoutQ{}) + 2 * size(SmemLayoutKV{}));
  static constexpr int kSmemBytes = kSmemElems * int(sizeof(Element));

  // Global <-> shared: each thread moves 16-byte vectors; a row of a chunk is covered by kThreadsPerRow threads.
  static constexpr int kThreadsPerRow = kSmemChunk / kVecElems;
  static_assert(kThreads % kThreadsPerRow == 0);
  using GmemThreads =
      Layout<Shape<Int<kThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>;
  using GmemVec = Layout<Shape<_1, Int<kVecElems>>>;
  using GmemLoad = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                            GmemThreads{}, GmemVec{}));
  using GmemStore =
      decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, GmemThreads{}, GmemVec{}));
  using SmemLoadQK = Copy_Atom<SM75_U32x4_LDSM_N, Element>;  // ldmatrix
  using SmemLoadVt = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // ldmatrix.trans: V is (keys, d) in smem
  using SmemStoreO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

// ------------------------------------------------------------------------------------------- tile scheduler
struct TileScheduler {
  struct Tile {
    int m_block, head, batch;
  };
  static dim3 grid(const FwdParams& p, int block_m) {
    return dim3(unsigned((p.seqlen_q + block_m - 1) / block_m), unsigned(p.heads_q), unsigned(p.batch));
  }
  // Query blocks are issued last-first: under a causal mask the last blocks see the most keys, so the longest
  // CTAs start in the first wave and the short ones fill the tail.
  __device__ static Tile current() { return {int(gridDim.x - 1 - blockIdx.x), int(blockIdx.y), int(blockIdx.z)}; }
};

// ------------------------------------------------------------------------------------------- helpers
// MMA accumulator ((2,2), MMA_M, MMA_N) viewed as (rows, cols): value mode 0 holds two adjacent columns,
// value mode 1 the row 8 below.
template <class Layout>
__device__ constexpr auto acc_rows_cols(Layout l) {
  static_assert(decltype(rank(l))::value == 3);
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// The accumulator of S = Q.K^T reused as the A operand of P.V: an m16n8k16 A fragment of 16 keys is the C
// fragments of two adjacent 8-key tiles, so ((2,2), M, N) -> ((2,2,2), M, N/2).
template <class Layout>
__device__ constexpr auto acc_as_a_operand(Layout l) {
  auto d = logical_divide(l, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(d), get<2, 0>(d)), get<1>(d), get<2, 1>(d));
}

// Tile load. A full tile (all rows inside the tensor, head dim equal to the compiled one) is copied
// unpredicated; otherwise rows >= `rows` or columns >= `cols` are zero-filled in shared memory rather than read,
// so partial tiles and padded head dims never touch memory outside the tensors. Callers pass compile-time row and
// column counts where they can (interior key blocks, the plain KernelVariant), which removes the test.
template <int kTileRows, int kTileCols, class TiledCopy, class Src, class Dst, class Coord>
__device__ void load_tile(const TiledCopy& copy, const Src& src, Dst&& dst, const Coord& coord, int rows, int cols) {
  if (rows >= kTileRows && cols == kTileCols) {
    cute::copy(copy, src, dst);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coord(0, m, 0)) < rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) {
        if (get<1>(coord(0, m, k)) < cols)
          cute::copy(copy, src(_, m, k), dst(_, m, k));
        else
          cute::clear(dst(_, m, k));
      }
    } else {
      cute::clear(dst(_, m, _));
    }
  }
}

// acc += A.B with both operands read from shared memory k-slice by k-slice; the next slice's ldmatrix is issued
// before the current slice's MMAs so that the loads hide behind the math.
template <class Acc, class RA, class RB, class SA, class SB, class Mma, class CopyA, class CopyB, class ThrCopyA,
          class ThrCopyB>
__device__ void gemm_smem_smem(Acc& acc, RA& rA, RB& rB, const SA& sA, const SB& sB, const Mma& mma,
                               const CopyA& copy_a, const CopyB& copy_b, const ThrCopyA& thr_a, const ThrCopyB& thr_b) {
  Tensor rA_view = thr_a.retile_D(rA);
  Tensor rB_view = thr_b.retile_D(rB);
  cute::copy(copy_a, sA(_, _, 0), rA_view(_, _, 0));
  cute::copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      cute::copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      cute::copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A.B with A already in registers (the probabilities P) and B read from shared memory.
template <class Acc, class RA, class RB, class SB, class Mma, class CopyB, class ThrCopyB>
__device__ __forceinline__ void gemm_reg_smem(Acc& acc, const RA& rA, RB& rB, const SB& sB, const Mma& mma,
                                              const CopyB& copy_b, const ThrCopyB& thr_b) {
  Tensor rB_view = thr_b.retile_D(rB);
  cute::copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) cute::copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// ------------------------------------------------------------------------------------------- the kernel
// Variant: a KernelVariant (score mods, padded head dims).
template <class Traits, class Mask, class Variant>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(128) char smem_raw[];

  const TileScheduler::Tile tile = TileScheduler::current();
  const SeqInfo seq(p, tile.batch);
  const int m0 = tile.m_block * kBlockM;
  if (m0 >= seq.len_q) return;  // varlen: this sequence is shorter than max_seqlen_q
  const int rows_here = min(kBlockM, seq.len_q - m0);
  const int tid = int(threadIdx.x);
  const int kv_head = tile.head / p.group;
  const int head_dim = Variant::kPaddedHeadDim ? p.head_dim : kHeadDim;
  const int head_dim_v = Variant::kPaddedHeadDim ? p.head_dim_v : kHeadDim;

  // ---- global tensors of this (batch, head): (rows, compiled head dim), columns past head_dim predicated
  const int64_t bq = p.cu_seqlens_q ? int64_t(seq.q_start) * p.q_row : int64_t(tile.batch) * p.q_batch;
  const int64_t bk = p.cu_seqlens_k ? int64_t(seq.k_start) * p.k_row : int64_t(tile.batch) * p.k_batch;
  const int64_t bv = p.cu_seqlens_k ? int64_t(seq.k_start) * p.v_row : int64_t(tile.batch) * p.v_batch;
  const int64_t bo = p.cu_seqlens_q ? int64_t(seq.q_start) * p.o_row : int64_t(tile.batch) * p.o_batch;
  const Element* q_ptr = static_cast<const Element*>(p.q) + bq + tile.head * p.q_head;
  const Element* k_ptr = static_cast<const Element*>(p.k) + bk + kv_head * p.k_head;
  const Element* v_ptr = static_cast<const Element*>(p.v) + bv + kv_head * p.v_head;
  Element* o_ptr = static_cast<Element*>(p.out) + bo + tile.head * p.o_head;

  Tensor mQ = make_tensor(make_gmem_ptr(q_ptr), make_shape(seq.len_q, Int<kHeadDim>{}), make_stride(p.q_row, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(seq.len_k, Int<kHeadDim>{}), make_stride(p.k_row, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(seq.len_k, Int<kHeadDim>{}), make_stride(p.v_row, _1{}));
  Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(seq.len_q, Int<kHeadDim>{}), make_stride(p.o_row, _1{}));
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, 0));
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, 0));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (N, D, n_blocks)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));

  // ---- shared memory: Q | K | V (O is staged through Q's space in the epilogue)
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem + size(sQ)), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem + size(sQ) + size(sK)), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});

  typename Traits::GmemLoad gmem_load;
  auto gthr = gmem_load.get_thread_slice(tid);
  Tensor tQg = gthr.partition_S(gQ);
  Tensor tQs = gthr.partition_D(sQ);
  Tensor tKg = gthr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n_blocks)
  Tensor tKs = gthr.partition_D(sK);
  Tensor tVg = gthr.partition_S(gV);
  Tensor tVs = gthr.partition_D(sV);
  Tensor tQc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));

  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor rQ = thr_mma.partition_fragment_A(sQ);
  Tensor rK = thr_mma.partition_fragment_B(sK);
  Tensor rVt = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem), make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);

  auto smem_q = make_tiled_copy_A(typename Traits::SmemLoadQK{}, mma);
  auto smem_q_thr = smem_q.get_thread_slice(tid);
  Tensor tSsQ = smem_q_thr.partition_S(sQ);
  auto smem_k = make_tiled_copy_B(typename Traits::SmemLoadQK{}, mma);
  auto smem_k_thr = smem_k.get_thread_slice(tid);
  Tensor tSsK = smem_k_thr.partition_S(sK);
  auto smem_v = make_tiled_copy_B(typename Traits::SmemLoadVt{}, mma);
  auto smem_v_thr = smem_v.get_thread_slice(tid);
  Tensor tOsVt = smem_v_thr.partition_S(sVt);

  // Accumulator coordinates within the (query block, key block) tile, for masks and ALiBi.
  Tensor cS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), acc_rows_cols(cS.layout()));
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_rows_cols(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  OnlineSoftmax<kRows> softmax;

  const Mask mask(p, seq);
  const BlockRange range = mask.blocks(m0, rows_here, kBlockN);
  const ScoreMods mods(p, seq, tile.batch, tile.head);

  // ---- mainloop: key blocks from the last to the first, so the one partial block comes first. One step per
  // block; a step is compiled in two forms: edge blocks (the first, and those on a mask border) take the
  // predicated V load and the mask test, interior blocks run neither, so their loop body is straight-line code
  // the compiler can schedule across (FA2 splits its loop the same way).
  auto step = [&](const int n, auto first, auto edge) CUTLASS_LAMBDA_FUNC_INLINE {
    constexpr bool kFirst = decltype(first)::value, kEdge = decltype(edge)::value;
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cute::cp_async_wait<0>();
    __syncthreads();  // K(n) (and Q) landed; every warp is done reading V(n+1)
    // V(n) streams in while S = Q.K^T is computed. Only the sequence's last key block can be partial, and when
    // visited it is the first.
    const int n0 = n * kBlockN;
    load_tile<kBlockN, kHeadDim>(gmem_load, tVg(_, _, _, n), tVs, tKVc, kFirst ? seq.len_k - n0 : kBlockN, head_dim_v);
    cute::cp_async_fence();
    gemm_smem_smem(acc_s, rQ, rK, tSsQ, tSsK, mma, smem_q, smem_k, smem_q_thr, smem_k_thr);

    Tensor s = make_tensor(acc_s.data(), acc_rows_cols(acc_s.layout()));
    if constexpr (Variant::kScoreMods) mods.apply(s, cS_rc, m0, n0);
    if constexpr (kEdge)
      if (mask.block_needs_mask(m0, rows_here, n0, kBlockN)) apply_mask(mask, s, cS_rc, m0, n0);

    cute::cp_async_wait<0>();
    __syncthreads();     // V(n) landed; every warp is done reading K(n)
    if (n > range.lo) {  // K(n - 1) is a whole block: it lies below the first
      load_tile<kBlockN, kHeadDim>(gmem_load, tKg(_, _, _, n - 1), tKs, tKVc, kBlockN, head_dim);
      cute::cp_async_fence();
    }

    softmax.template update<kFirst>(s, acc_o_rc, p.scale_log2);
    // After the row sums (the normaliser is the undropped softmax's), before P.V.
    if constexpr (Variant::kDropout)
      apply_dropout<false>(p.dropout, s, cS_rc, int64_t(tile.batch) * p.heads_q + tile.head, m0, n0);
    Tensor probs = convert_fragment<Element>(acc_s);
    Tensor rP = make_tensor(probs.data(), acc_as_a_operand(probs.layout()));
    gemm_reg_smem(acc_o, rP, rVt, tOsVt, mma, smem_v, smem_v_thr);
  };
  if (range.hi > range.lo) {
    int n = range.hi - 1;
    load_tile<kBlockM, kHeadDim>(gmem_load, tQg, tQs, tQc, rows_here, head_dim);
    load_tile<kBlockN, kHeadDim>(gmem_load, tKg(_, _, _, n), tKs, tKVc, seq.len_k - n * kBlockN, head_dim);
    cute::cp_async_fence();
    // Blocks >= inner.hi (diagonal, right window border) and < inner.lo (left window border) are edges.
    const BlockRange inner = mask.unmasked_blocks(m0, rows_here, kBlockN);
    step(n--, std::true_type{}, std::true_type{});
    for (; n >= max(inner.hi, range.lo); --n) step(n, std::false_type{}, std::true_type{});
    for (; n >= max(inner.lo, range.lo); --n) step(n, std::false_type{}, std::false_type{});
    for (; n >= range.lo; --n) step(n, std::false_type{}, std::true_type{});
  }

  // ---- epilogue
  float lse[kRows];
  softmax.finish(acc_o_rc, p.logit_scale, lse, p.sinks != nullptr ? p.sinks[tile.head] : -INFINITY);

  Tensor out_frag = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutQ{});
  auto smem_o = make_tiled_copy_C(typename Traits::SmemStoreO{}, mma);
  auto smem_o_thr = smem_o.get_thread_slice(tid);
  // No barrier before O overwrites Q's space: the last step's second barrier came after every warp's last read
  // of Q (its S = Q.K^T), and no copy into Q is in flight.
  cute::copy(smem_o, smem_o_thr.retile_S(out_frag), smem_o_thr.partition_D(sO));

  if (p.lse != nullptr) {
    Tensor cO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor cO_rc = make_tensor(cO.data(), acc_rows_cols(cO.layout()));
    const int64_t lse_base = p.cu_seqlens_q ? int64_t(seq.q_start) * p.lse_row : int64_t(tile.batch) * p.lse_batch;
    float* lse_ptr = p.lse + lse_base + int64_t(tile.head) * p.lse_head;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(cO_rc(r, 0));
      // One writer per row: the quad's thread that holds column 0.
      if (get<1>(cO_rc(r, 0)) == 0 && row < rows_here) lse_ptr[int64_t(m0 + row) * p.lse_row] = lse[r];
    }
  }
  __syncthreads();  // O tile complete in shared memory

  typename Traits::GmemStore gmem_store;
  auto sthr = gmem_store.get_thread_slice(tid);
  Tensor tOs = sthr.partition_S(sO);
  Tensor tOg = sthr.partition_D(gO);
  Tensor tOc = sthr.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOg); ++m) {
    if (get<0>(tOc(0, m, 0)) >= rows_here) continue;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOg); ++k)
      if (get<1>(tOc(0, m, k)) < head_dim_v) cute::copy(gmem_store, tOs(_, m, k), tOg(_, m, k));
  }
}

}  // namespace flashattn::cuda::sm80

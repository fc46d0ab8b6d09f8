// Backward of the sm80 backend: the FlashAttention-2 algorithm (Dao 2023, Alg. 2) written with CuTe, in the
// style of the forward (fwd_kernel.cuh, whose tile helpers, sequence info and mask policies it reuses).
//   1. preprocess (common/bwd_common.cuh, shared with sm90): D = rowsum(dO * O) per (query head, row) in fp32;
//      the same kernel zeroes the dQ workspace.
//   2. main (dkdv_kernel): grid = key blocks x query heads x batch. K/V of the block sit in shared memory and
//      dK/dV in registers while the CTA walks the query blocks that see the block (causal / window skipping),
//      Q and dO double-buffered with cp.async. Per step S = Q.K^T and dP = dO.V^T stay in registers;
//      P = exp2(S * scale_log2 - LSE * log2 e) and dS = P (dP - D) (times the softcap derivative) are formed
//      there, rounded to the storage dtype and written to shared memory once, because the three GEMMs that
//      read them want other warp tilings: dV += P^T.dO, dK += dS^T.Q (P^T, dS^T, dO^T, Q^T through
//      ldmatrix.trans) and dQ = dS.K, whose fp32 tile is added to the workspace (atomics, or plain adds by the
//      split's one owner when deterministic).
//   3. postprocess: dQ splits summed in order, times the softmax scale -> output dtype; GQA (common/bwd_common.cuh):
//      the per-query-head fp32 dK/dV summed over each group in a fixed order -> output dtype.
// The softmax scale is factored out of dS (applied once to dK and dQ at the end), as FA2 does. Head dims below
// the compiled one are zero-filled shared-memory columns (they add nothing) and predicated stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/common/bwd_common.cuh"
#include "cuda/sm80/bwd_params.hpp"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/sm80/fwd_launch.cuh"
#include "cuda/sm80/tiles.hpp"

namespace flashattn::cuda::sm80 {
namespace bwd {

// Tiles::value is the tile; dev benchmarks instantiate other shapes to measure them against bwd_tiles().
template <typename Element_, int kHeadDim_, class Tiles = DefaultBwdTiles<kHeadDim_>>
struct BwdTraits {
  using Element = Element_;
  static constexpr BwdTiles kTiles = Tiles::value;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTiles.block_q;
  static constexpr int kBlockN = kTiles.block_k;
  static constexpr int kWarps = kTiles.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStagesQ = 2;
  static constexpr int kStagesdO = kTiles.do_stages;
  static_assert(kHeadDim % 32 == 0, "compiled head dims are multiples of 32 (smaller dims are predicated)");
  static_assert(kStagesdO == 1 || kStagesdO == 2);

  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                                   SM80_16x8x16_F32BF16BF16F32_TN>;
  // A warp grid of kRowWarps x (kWarps / kRowWarps); each warp's share of a tile is 16 x 16 (two 16x8 atoms
  // along N, so that one ldmatrix.x4 feeds the B operand).
  template <int kRowWarps>
  using Mma = TiledMMA<MMA_Atom<MmaOp>, Layout<Shape<Int<kRowWarps>, Int<kWarps / kRowWarps>, _1>>,
                       Tile<Int<16 * kRowWarps>, Int<16 * (kWarps / kRowWarps)>, _16>>;
  using MmaSdP = Mma<kTiles.sdp_warps_m>;  // (query rows, keys)
  using MmadKV = Mma<kTiles.dkv_warps_n>;  // (keys, head dim)
  using MmadQ = Mma<kTiles.dq_warps_m>;    // (query rows, head dim)

  // XOR-swizzled rows of 64-element (128-byte) chunks, 32 where the width is not a multiple of 64: conflict-free
  // 128-bit cp.async stores and ldmatrix / ldmatrix.trans reads (see FwdTraits).
  template <int kCols>
  static constexpr auto smem_atom() {
    constexpr int kChunk = kCols % 64 == 0 ? 64 : 32;
    return composition(Swizzle<kChunk == 64 ? 3 : 2, 3, 3>{},
                       Layout<Shape<_8, Int<kChunk>>, Stride<Int<kChunk>, _1>>{});
  }
  using SmemLayoutQ = decltype(tile_to_shape(smem_atom<kHeadDim>(), Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(smem_atom<kHeadDim>(), Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(smem_atom<kBlockN>(), Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // The same bytes read transposed (ldmatrix.trans): Q^T / dO^T (d, rows), K^T (d, keys), P^T / dS^T (keys, rows).
  using SmemLayoutQt =
      decltype(composition(SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutPdSt =
      decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));

  static constexpr int kQElems = int(size(SmemLayoutQ{}));
  static constexpr int kKVElems = int(size(SmemLayoutKV{}));
  static constexpr int kPdSElems = int(size(SmemLayoutPdS{}));
  static constexpr int kSmemElems = (kStagesQ + kStagesdO) * kQElems + 2 * kKVElems + 2 * kPdSElems;
  // LSE and D of a query block (2 * kBlockM floats) travel with its Q tile, one set per Q stage.
  static constexpr int kStatsFloats = 2 * kBlockM;
  static_assert(kStatsFloats <= kThreads, "one thread per LSE / D value");
  static constexpr int kSmemBytes = kSmemElems * int(sizeof(Element)) + kStagesQ * kStatsFloats * int(sizeof(float));

  static constexpr int kVecElems = int(sizeof(cute::uint128_t) / sizeof(Element));
  static constexpr int kThreadsPerRow = (kHeadDim % 64 == 0 ? 64 : 32) / kVecElems;
  static_assert(kThreads % kThreadsPerRow == 0);
  using GmemThreads =
      Layout<Shape<Int<kThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>;
  using GmemVec = Layout<Shape<_1, Int<kVecElems>>>;
  using GmemLoad = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                            GmemThreads{}, GmemVec{}));
  using GmemStore =
      decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, GmemThreads{}, GmemVec{}));
  using LdsmN = Copy_Atom<SM75_U32x4_LDSM_N, Element>;  // operand stored K-major
  using LdsmT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // operand stored M/N-major: ldmatrix.trans
  using SmemStoreC = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

// 4-byte cp.async; src_bytes = 0 zero-fills the destination without reading the source.
__device__ __forceinline__ void cp_async_f32(float* smem_dst, const float* gmem_src, bool valid) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(valid ? 4 : 0));
}

// ------------------------------------------------------------------------------------------- sequences, masks
// Tile of the dQ workspace that holds query block m_block of this sequence (see BwdParams::dq_acc).
__device__ inline float* dq_tile(const BwdParams& p, const BwdSeq& s, int split, int head, int batch, int m_block,
                                 int block_m) {
  const int64_t blk = (s.q_row0 + int64_t(batch) * block_m) / block_m + m_block;
  return p.dq_acc + ((int64_t(split) * p.heads_q + head) * p.dq_blocks + blk) * p.dq_tile;
}

// Order of a dQ tile in the workspace: element i of thread t of the dQ MMA sits at
// ((i / kDqVec) * threads + t) * kDqVec + i % kDqVec, so that a warp's kDqVec-wide adds cover 32 * kDqVec
// consecutive floats. sm90 adds 4 floats per instruction (red.global.add.v4.f32: a quarter of the L2 atomic
// transactions); sm80 has only scalar float reductions, for which kDqVec = 1 keeps each warp-wide add on 32
// consecutive floats. Main and postprocess kernels are compiled for the same architecture, so they agree.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kDqVec = 4;
#else
constexpr int kDqVec = 1;
#endif
template <int kThreads>
__device__ __forceinline__ int dq_index(int i, int tid) {
  return ((i / kDqVec) * kThreads + tid) * kDqVec + i % kDqVec;
}

// Adds kDqVec consecutive accumulators to dst[0 .. kDqVec). No "memory" clobber: nothing in the main kernel
// reads the dQ workspace, and a clobber would pin the surrounding schedule (it cost 50-130 bytes of spills).
__device__ __forceinline__ void dq_reduce(float* dst, const float* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]));
#else
  atomicAdd(dst, v[0]);
#endif
}

// Converts an fp32 accumulator tile, stages it through swizzled shared memory and writes rows [0, rows) x
// columns [0, cols) with 128-bit stores. The caller makes sure nobody still reads `smem`.
template <class Tr, int kRows, class SmemLayout, class Mma, class Acc, class GTensor>
__device__ void store_tile(const Acc& acc, const Mma& mma, typename Tr::Element* smem, GTensor&& gdst, int rows,
                           int cols) {
  using Element = typename Tr::Element;
  const int tid = int(threadIdx.x);
  Tensor staged = make_tensor(make_smem_ptr(smem), SmemLayout{});
  Tensor frag = convert_fragment<Element>(acc);
  auto smem_store = make_tiled_copy_C(typename Tr::SmemStoreC{}, mma);
  auto smem_thr = smem_store.get_thread_slice(tid);
  cute::copy(smem_store, smem_thr.retile_S(frag), smem_thr.partition_D(staged));
  __syncthreads();
  typename Tr::GmemStore gmem_store;
  auto gthr = gmem_store.get_thread_slice(tid);
  Tensor ts = gthr.partition_S(staged);
  Tensor tg = gthr.partition_D(gdst);
  Tensor tc = gthr.partition_D(make_identity_tensor(Shape<Int<kRows>, Int<Tr::kHeadDim>>{}));
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tg); ++m) {
    if (get<0>(tc(0, m, 0)) >= rows) continue;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tg); ++k)
      if (get<1>(tc(0, m, k)) < cols) cute::copy(gmem_store, ts(_, m, k), tg(_, m, k));
  }
}

// GQA: an fp32 accumulator tile (keys, head dim) written unconverted to the per-query-head workspace.
template <class Acc, class Coord>
__device__ void store_fp32(const Acc& acc, const Coord& coord, float* dst, int64_t row_stride, int rows, int cols) {
  static_assert(decltype(size(acc))::value % 2 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {  // accumulator elements 2i, 2i+1 are adjacent columns of one row
    const int r = get<0>(coord(i)), c = get<1>(coord(i));
    if (r < rows && c < cols)
      *reinterpret_cast<float2*>(dst + int64_t(r) * row_stride + c) = make_float2(acc(i), acc(i + 1));
  }
}

// ------------------------------------------------------------------------------------------- main kernel
// Variant: a KernelVariant (score mods, padded head dims, deterministic). Deterministic: grid.x = dq_splits CTAs
// per (head, batch) walk the key blocks with that stride and own their dQ split (plain adds); otherwise one key
// block per CTA and dQ atomics.
template <class Tr, class Mask, class Variant>
__global__ void __launch_bounds__(Tr::kThreads, 1) dkdv_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Tr::Element;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kHeadDim = Tr::kHeadDim;
  constexpr bool kScoreMods = Variant::kScoreMods, kDeterministic = Variant::kDeterministic;
  extern __shared__ __align__(128) char smem_raw[];
  const int tid = int(threadIdx.x);
  const int head = int(blockIdx.y), batch = int(blockIdx.z);
  const int kv_head = head / p.group;
  const int head_dim = Variant::kPaddedHeadDim ? p.head_dim : kHeadDim;
  const int head_dim_v = Variant::kPaddedHeadDim ? p.head_dim_v : kHeadDim;
  const BwdSeq seq(p, batch);
  const Mask mask(p, seq);
  const int split = kDeterministic ? int(blockIdx.x) : 0;

  // ---- global tensors of this (batch, head)
  const int64_t bq = p.cu_seqlens_q ? int64_t(seq.q_start) * p.q_row : int64_t(batch) * p.q_batch;
  const int64_t bdo = p.cu_seqlens_q ? int64_t(seq.q_start) * p.do_row : int64_t(batch) * p.do_batch;
  const int64_t bk = p.cu_seqlens_k ? int64_t(seq.k_start) * p.k_row : int64_t(batch) * p.k_batch;
  const int64_t bv = p.cu_seqlens_k ? int64_t(seq.k_start) * p.v_row : int64_t(batch) * p.v_batch;
  const int64_t blse = p.cu_seqlens_q ? int64_t(seq.q_start) * p.lse_row : int64_t(batch) * p.lse_batch;
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<const Element*>(p.q) + bq + head * p.q_head),
                          make_shape(seq.len_q, Int<kHeadDim>{}), make_stride(p.q_row, _1{}));
  Tensor mdO = make_tensor(make_gmem_ptr(static_cast<const Element*>(p.dout) + bdo + head * p.do_head),
                           make_shape(seq.len_q, Int<kHeadDim>{}), make_stride(p.do_row, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<const Element*>(p.k) + bk + kv_head * p.k_head),
                          make_shape(seq.rows_k, Int<kHeadDim>{}), make_stride(p.k_row, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<const Element*>(p.v) + bv + kv_head * p.v_head),
                          make_shape(seq.rows_k, Int<kHeadDim>{}), make_stride(p.v_row, _1{}));
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, 0));  // (M, D, m_blocks)
  Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, 0));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (N, D, n_blocks)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
  const float* lse_ptr = p.lse + blse + int64_t(head) * p.lse_head;
  const float* dsum_ptr = p.dsum + int64_t(head) * p.dsum_stride + seq.q_row0;

  // ---- shared memory: Q[kStagesQ] | dO[kStagesdO] | K | V | P | dS | (LSE, D)[kStagesQ]
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  Element* smem_q = smem;
  Element* smem_do = smem_q + Tr::kStagesQ * Tr::kQElems;
  Element* smem_k = smem_do + Tr::kStagesdO * Tr::kQElems;
  Element* smem_v = smem_k + Tr::kKVElems;
  Element* smem_p = smem_v + Tr::kKVElems;
  Element* smem_ds = smem_p + Tr::kPdSElems;
  float* smem_stats = reinterpret_cast<float*>(smem_ds + Tr::kPdSElems);
  auto sQ = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_q + stage * Tr::kQElems), typename Tr::SmemLayoutQ{});
  };
  auto sQt = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_q + stage * Tr::kQElems), typename Tr::SmemLayoutQt{});
  };
  auto sdO = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_do + stage * Tr::kQElems), typename Tr::SmemLayoutQ{});
  };
  auto sdOt = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_do + stage * Tr::kQElems), typename Tr::SmemLayoutQt{});
  };
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutKV{});
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdS{});
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdSt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Tr::SmemLayoutPdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Tr::SmemLayoutPdSt{});

  typename Tr::GmemLoad gmem_load;
  auto gthr = gmem_load.get_thread_slice(tid);
  Tensor tQg = gthr.partition_S(gQ);  // (CPY, CPY_M, CPY_D, m_blocks)
  Tensor tdOg = gthr.partition_S(gdO);
  Tensor tKg = gthr.partition_S(gK);
  Tensor tVg = gthr.partition_S(gV);
  Tensor tKs = gthr.partition_D(sK);
  Tensor tVs = gthr.partition_D(sV);
  Tensor tQc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));

  // ---- MMAs and their shared-memory operand copies
  typename Tr::MmaSdP mma_sdp;
  typename Tr::MmadKV mma_dkv;
  typename Tr::MmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  // S = Q.K^T, dP = dO.V^T
  Tensor rQ = thr_sdp.partition_fragment_A(sQ(0));
  Tensor rK = thr_sdp.partition_fragment_B(sK);
  Tensor rdO = thr_sdp.partition_fragment_A(sdO(0));
  Tensor rV = thr_sdp.partition_fragment_B(sV);
  auto copy_sdp_a = make_tiled_copy_A(typename Tr::LdsmN{}, mma_sdp);
  auto copy_sdp_a_thr = copy_sdp_a.get_thread_slice(tid);
  auto copy_sdp_b = make_tiled_copy_B(typename Tr::LdsmN{}, mma_sdp);
  auto copy_sdp_b_thr = copy_sdp_b.get_thread_slice(tid);
  Tensor tSsK = copy_sdp_b_thr.partition_S(sK);
  Tensor tdPsV = copy_sdp_b_thr.partition_S(sV);
  // dV += P^T.dO, dK += dS^T.Q: every operand transposed
  Tensor rPt = thr_dkv.partition_fragment_A(sPt);
  Tensor rdSt = thr_dkv.partition_fragment_A(sdSt);
  Tensor rdOt = thr_dkv.partition_fragment_B(sdOt(0));
  Tensor rQt = thr_dkv.partition_fragment_B(sQt(0));
  auto copy_dkv_a = make_tiled_copy_A(typename Tr::LdsmT{}, mma_dkv);
  auto copy_dkv_a_thr = copy_dkv_a.get_thread_slice(tid);
  auto copy_dkv_b = make_tiled_copy_B(typename Tr::LdsmT{}, mma_dkv);
  auto copy_dkv_b_thr = copy_dkv_b.get_thread_slice(tid);
  Tensor tdVsPt = copy_dkv_a_thr.partition_S(sPt);
  Tensor tdKsdSt = copy_dkv_a_thr.partition_S(sdSt);
  // dQ = dS.K: dS as stored, K transposed
  Tensor rdS = thr_dq.partition_fragment_A(sdS);
  Tensor rKt = thr_dq.partition_fragment_B(sKt);
  auto copy_dq_a = make_tiled_copy_A(typename Tr::LdsmN{}, mma_dq);
  auto copy_dq_a_thr = copy_dq_a.get_thread_slice(tid);
  auto copy_dq_b = make_tiled_copy_B(typename Tr::LdsmT{}, mma_dq);
  auto copy_dq_b_thr = copy_dq_b.get_thread_slice(tid);
  Tensor tdQsdS = copy_dq_a_thr.partition_S(sdS);
  Tensor tdQsKt = copy_dq_b_thr.partition_S(sKt);
  // P and dS (accumulator layout of S/dP) -> shared memory
  auto copy_pds = make_tiled_copy_C(typename Tr::SmemStoreC{}, mma_sdp);
  auto copy_pds_thr = copy_pds.get_thread_slice(tid);
  Tensor tPsP = copy_pds_thr.partition_D(sP);
  Tensor tdSsdS = copy_pds_thr.partition_D(sdS);

  // Coordinates of the S/dP accumulators within a (query block, key block) tile.
  Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cS_rc = make_tensor(cS.data(), acc_rows_cols(cS.layout()));
  constexpr int kRows = decltype(size<0>(cS_rc))::value;
  constexpr int kCols = decltype(size<1>(cS_rc))::value;

  const float alibi_slope =
      kScoreMods && p.alibi != nullptr ? p.alibi[int64_t(batch) * p.alibi_batch_stride + head] / p.logit_scale : 0.f;
  const int diag_off = p.bottom_right ? seq.len_k - seq.len_q : 0;  // query i sits at key i + diag_off
  const int n_blocks = (seq.rows_k + kBlockN - 1) / kBlockN;
  const int n_first = int(blockIdx.x);
  const int n_stride = kDeterministic ? int(gridDim.x) : n_blocks;  // deterministic: the split's key blocks

  for (int n_block = n_first; n_block < n_blocks; n_block += n_stride) {
    const int n0 = n_block * kBlockN;
    const RowRange rows = query_rows(mask, seq, n0, kBlockN);
    const int m_lo = rows.lo / kBlockM, m_hi = (rows.hi + kBlockM - 1) / kBlockM;

    Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    clear(acc_dk);
    clear(acc_dv);

    // rows_valid: rows of the block inside the sequence (kBlockM for a whole block).
    auto load_q_do = [&](int m_block, int rows_valid, int q_stage, int do_stage, bool load_q, bool load_do)
                         CUTLASS_LAMBDA_FUNC_INLINE {
                           if (load_q) {
                             load_tile<kBlockM, kHeadDim>(gmem_load, tQg(_, _, _, m_block),
                                                          gthr.partition_D(sQ(q_stage)), tQc, rows_valid, head_dim);
                             if (tid < Tr::kStatsFloats) {  // rows past the sequence read as 0 (they are masked)
                               const int r = tid % kBlockM, row = m_block * kBlockM + r;
                               const bool valid = r < rows_valid;
                               const float* src = tid < kBlockM ? lse_ptr + int64_t(valid ? row : 0) * p.lse_row
                                                                : dsum_ptr + (valid ? row : 0);
                               cp_async_f32(smem_stats + q_stage * Tr::kStatsFloats + tid, src, valid);
                             }
                           }
                           if (load_do)
                             load_tile<kBlockM, kHeadDim>(gmem_load, tdOg(_, _, _, m_block),
                                                          gthr.partition_D(sdO(do_stage)), tQc, rows_valid, head_dim_v);
                         };

    if (m_lo < m_hi) {
      const int keys_valid = seq.len_k - n0;
      __syncthreads();  // the previous key block's epilogue is done with shared memory
      load_tile<kBlockN, kHeadDim>(gmem_load, tKg(_, _, _, n_block), tKs, tKc, keys_valid, head_dim);
      load_tile<kBlockN, kHeadDim>(gmem_load, tVg(_, _, _, n_block), tVs, tKc, keys_valid, head_dim_v);
      // Query blocks walk down from the last (FA2's order): without a mask the key-block CTAs of a head walk the
      // same Q / dO / dQ tiles in step (L2 reuse) either way; under a causal mask ascending would start each key
      // block at its diagonal, out of step with its neighbours (descending measured 0-3% faster: docs/journal/cuda.md,
      // device run B2-3). Only the first block can be partial, so the loads of the next block are never row-predicated.
      const int steps = m_hi - m_lo;
      load_q_do(m_hi - 1, seq.len_q - (m_hi - 1) * kBlockM, 0, 0, true, true);
      cute::cp_async_fence();

      // One step per query block, compiled in two forms: edge blocks (partial, or on a mask border) set the
      // hidden scores to -inf; interior blocks are straight-line code without the mask test.
      auto step_body = [&](const int step, auto edge) CUTLASS_LAMBDA_FUNC_INLINE {
        constexpr bool kEdge = decltype(edge)::value;
        const int m_block = m_hi - 1 - step;
        const int q_stage = step % Tr::kStagesQ, do_stage = step % Tr::kStagesdO;
        const int m0 = m_block * kBlockM;
        const bool has_next = step + 1 < steps;

        cute::cp_async_wait<0>();
        __syncthreads();  // Q(m), dO(m) (and K, V) landed; every warp is done with step m-1's buffers
        if (has_next) {
          // With one dO buffer the next dO waits until dV's GEMM has read this one.
          load_q_do(m_block - 1, kBlockM, (step + 1) % Tr::kStagesQ, (step + 1) % Tr::kStagesdO, true,
                    Tr::kStagesdO > 1);
          cute::cp_async_fence();
        }

        Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        clear(acc_dp);
        gemm_smem_smem(acc_s, rQ, rK, copy_sdp_a_thr.partition_S(sQ(q_stage)), tSsK, mma_sdp, copy_sdp_a, copy_sdp_b,
                       copy_sdp_a_thr, copy_sdp_b_thr);
        gemm_smem_smem(acc_dp, rdO, rV, copy_sdp_a_thr.partition_S(sdO(do_stage)), tdPsV, mma_sdp, copy_sdp_a,
                       copy_sdp_b, copy_sdp_a_thr, copy_sdp_b_thr);

        // P and dS in place of S and dP.
        Tensor s = make_tensor(acc_s.data(), acc_rows_cols(acc_s.layout()));
        Tensor dp = make_tensor(acc_dp.data(), acc_rows_cols(acc_dp.layout()));
        const int rows_here = min(kBlockM, seq.len_q - m0);
        const float* lse_s = smem_stats + q_stage * Tr::kStatsFloats;
        const float* dsum_s = lse_s + kBlockM;
        // Plain kernel: a block on a mask edge (diagonal, window border, last key or query block) gets its
        // hidden scores set to -inf first (exp2 makes them 0), so the step below has no per-score test. With
        // softcap / ALiBi the derivative needs the unmasked logit, so those kernels test each score instead.
        auto visible_cols = [&](int row) {
          const ColRange cr = row < rows_here ? mask.cols(m0 + row) : ColRange{n0, n0};
          return ColRange{cr.lo - n0, cr.hi - n0};
        };
        if constexpr (!kScoreMods && kEdge) {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const ColRange visible = visible_cols(get<0>(cS_rc(r, 0)));
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
              const int col = get<1>(cS_rc(0, c));
              if (col < visible.lo || col >= visible.hi) s(r, c) = -INFINITY;
            }
          }
        }
        struct RowState {
          ColRange visible;
          float lse_log2, dsum;
        };
        auto row_state = [&](int r) CUTLASS_LAMBDA_FUNC_INLINE {
          const int row = get<0>(cS_rc(r, 0));
          // A row that saw no key in the forward has LSE = -inf; its scores are all masked here too.
          const float lse = lse_s[row];
          return RowState{kScoreMods && kEdge ? visible_cols(row) : ColRange{0, kBlockN},
                          lse == -INFINITY ? 0.f : lse * kLog2e, dsum_s[row]};
        };
        // z: the dropout factor of the element (1 without dropout). With dropout the forward multiplied P by it
        // before P.V, so dV takes P * z and dP = (dO.V^T) * z; D = rowsum(dO * O) is unchanged.
        auto element = [&](int r, int c, const RowState& rs, float z) CUTLASS_LAMBDA_FUNC_INLINE {
          const int col = get<1>(cS_rc(0, c));
          float x = s(r, c);
          float dscore = 1.f;  // d logit / d (scale * raw score): the softcap's tanh derivative
          if constexpr (kScoreMods) {
            if (p.softcap > 0.f) {
              const float th = tanhf(x * p.softcap_in_scale);
              x = p.softcap * th;
              dscore = 1.f - th * th;
            }
            if (p.alibi != nullptr) x -= alibi_slope * float(abs(m0 + get<0>(cS_rc(r, 0)) + diag_off - n0 - col));
          }
          float prob = fast_exp2(x * p.scale_log2 - rs.lse_log2);
          if constexpr (kScoreMods) prob = col >= rs.visible.lo && col < rs.visible.hi ? prob : 0.f;
          s(r, c) = prob * z;
          dp(r, c) = prob * (dp(r, c) * z - rs.dsum) * dscore;
        };
        if constexpr (Variant::kDropout) {
          // The mask rule's walk over a query-rows fragment (cuda/common/dropout.cuh); this kernel's warp grids may
          // split a 16-key block between warps, so a Philox call serves a quad.
          const int64_t bh = int64_t(batch) * p.heads_q + head;
          RowState rows[kRows];
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) rows[r] = row_state(r);
          dropout_query_rows<false>(p.dropout, cS_rc, bh, m0, n0, [&](int r, int c, bool kept) {
            element(r, c, rows[r], kept ? p.dropout.keep_scale : 0.f);
          });
        } else {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const RowState rs = row_state(r);
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) element(r, c, rs, 1.f);
          }
        }
        Tensor probs = convert_fragment<Element>(acc_s);
        Tensor dscores = convert_fragment<Element>(acc_dp);
        cute::copy(copy_pds, copy_pds_thr.retile_S(probs), tPsP);
        cute::copy(copy_pds, copy_pds_thr.retile_S(dscores), tdSsdS);
        __syncthreads();  // P and dS complete

        gemm_smem_smem(acc_dv, rPt, rdOt, tdVsPt, copy_dkv_b_thr.partition_S(sdOt(do_stage)), mma_dkv, copy_dkv_a,
                       copy_dkv_b, copy_dkv_a_thr, copy_dkv_b_thr);
        if (Tr::kStagesdO == 1 && has_next) {
          __syncthreads();  // every warp's dV GEMM has read dO(m)
          load_q_do(m_block - 1, kBlockM, 0, 0, false, true);
          cute::cp_async_fence();
        }

        Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
        clear(acc_dq);
        gemm_smem_smem(acc_dq, rdS, rKt, tdQsdS, tdQsKt, mma_dq, copy_dq_a, copy_dq_b, copy_dq_a_thr, copy_dq_b_thr);
        float* dq_dst = dq_tile(p, seq, split, head, batch, m_block, kBlockM);
        static_assert(decltype(size(acc_dq))::value % kDqVec == 0);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += kDqVec) {
          float v[kDqVec];
          CUTE_UNROLL
          for (int j = 0; j < kDqVec; ++j) v[j] = acc_dq(i + j);
          float* dst = dq_dst + dq_index<Tr::kThreads>(i, tid);
          if constexpr (kDeterministic) {  // this CTA is the split's only writer: a plain add keeps the order
            CUTE_UNROLL
            for (int j = 0; j < kDqVec; ++j) dst[j] += v[j];
          } else {
            dq_reduce(dst, v);
          }
        }

        gemm_smem_smem(acc_dk, rdSt, rQt, tdKsdSt, copy_dkv_b_thr.partition_S(sQt(q_stage)), mma_dkv, copy_dkv_a,
                       copy_dkv_b, copy_dkv_a_thr, copy_dkv_b_thr);
      };
      for (int step = 0; step < steps; ++step) {
        const int m0 = (m_hi - 1 - step) * kBlockM;
        const int rows_here = min(kBlockM, seq.len_q - m0);
        if (rows_here < kBlockM || mask.block_needs_mask(m0, rows_here, n0, kBlockN))
          step_body(step, std::true_type{});
        else
          step_body(step, std::false_type{});
      }
    }

    // ---- epilogue: every stored key row of the block (keys past seqused_k and keys no query sees get zeros)
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
    const int rows_out = min(kBlockN, seq.rows_k - n0);
    __syncthreads();  // every warp is done reading K and V (dQ, dP GEMMs)
    if (p.group == 1) {
      const int64_t bdk = p.cu_seqlens_k ? int64_t(seq.k_start) * p.dk_row : int64_t(batch) * p.dk_batch;
      const int64_t bdv = p.cu_seqlens_k ? int64_t(seq.k_start) * p.dv_row : int64_t(batch) * p.dv_batch;
      Tensor mdK = make_tensor(make_gmem_ptr(static_cast<Element*>(p.dk) + bdk + head * p.dk_head),
                               make_shape(seq.rows_k, Int<kHeadDim>{}), make_stride(p.dk_row, _1{}));
      Tensor mdV = make_tensor(make_gmem_ptr(static_cast<Element*>(p.dv) + bdv + head * p.dv_head),
                               make_shape(seq.rows_k, Int<kHeadDim>{}), make_stride(p.dv_row, _1{}));
      store_tile<Tr, kBlockN, typename Tr::SmemLayoutKV>(
          acc_dk, mma_dkv, smem_k, local_tile(mdK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, 0)),
          rows_out, head_dim);
      store_tile<Tr, kBlockN, typename Tr::SmemLayoutKV>(
          acc_dv, mma_dkv, smem_v, local_tile(mdV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, 0)),
          rows_out, head_dim_v);
    } else {
      Tensor cKV = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
      const int64_t row0 = int64_t(head) * p.rows_k + seq.k_row0 + n0;
      store_fp32(acc_dk, cKV, p.dk_acc + row0 * head_dim, head_dim, rows_out, head_dim);
      store_fp32(acc_dv, cKV, p.dv_acc + row0 * head_dim_v, head_dim_v, rows_out, head_dim_v);
    }
  }
}

// ------------------------------------------------------------------------------------------- dQ postprocess
// One CTA per (query block, head, batch), same thread count and dQ MMA as the main kernel (so each thread reads
// back the elements it would have held): sum the splits in order, apply the softmax scale, convert, store.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) dq_convert_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Tr::Element;
  constexpr int kBlockM = Tr::kBlockM, kHeadDim = Tr::kHeadDim;
  extern __shared__ __align__(128) char smem_raw[];
  const int m_block = int(blockIdx.x), head = int(blockIdx.y), batch = int(blockIdx.z), tid = int(threadIdx.x);
  const BwdSeq seq(p, batch);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.len_q) return;

  typename Tr::MmadQ mma_dq;
  Tensor acc = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc);
  for (int split = 0; split < p.dq_splits; ++split) {
    const float* src = dq_tile(p, seq, split, head, batch, m_block, kBlockM);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) acc(i) += src[dq_index<Tr::kThreads>(i, tid)];
  }
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) *= p.scale;

  const int64_t bdq = p.cu_seqlens_q ? int64_t(seq.q_start) * p.dq_row : int64_t(batch) * p.dq_batch;
  Tensor mdQ = make_tensor(make_gmem_ptr(static_cast<Element*>(p.dq) + bdq + head * p.dq_head),
                           make_shape(seq.len_q, Int<kHeadDim>{}), make_stride(p.dq_row, _1{}));
  store_tile<Tr, kBlockM, typename Tr::SmemLayoutQ>(
      acc, mma_dq, reinterpret_cast<Element*>(smem_raw),
      local_tile(mdQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0)), seq.len_q - m0, p.head_dim);
}

template <class Kernel>
cudaError_t opt_in_smem(Kernel kernel, int bytes) {
  constexpr int kDefaultSmemLimit = 48 * 1024;  // larger dynamic smem must be opted into per kernel
  if (bytes <= kDefaultSmemLimit) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <class Tr, class Mask, class Variant>
cudaError_t launch_main(const BwdParams& p, cudaStream_t stream) {
  auto kernel = &dkdv_kernel<Tr, Mask, Variant>;
  if (cudaError_t e = opt_in_smem(kernel, Tr::kSmemBytes); e != cudaSuccess) return e;
  const unsigned key_blocks = unsigned((p.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN);
  const dim3 grid(Variant::kDeterministic ? unsigned(p.dq_splits) : key_blocks, unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <class Tr, class Mask>
cudaError_t launch_main(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  auto launch = [&](auto variant) { return launch_main<Tr, Mask, decltype(variant)>(p, stream); };
  return plan.deterministic ? dispatch_variant<true, true>(plan.variant, launch)
                            : dispatch_variant<false, true>(plan.variant, launch);
}

// Main kernel, then the dQ postprocess with the same tiles (it reads the workspace in the main kernel's order).
template <class Tr, class Mask>
cudaError_t launch_main_and_dq(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  if (p.seqlen_k > 0)
    if (cudaError_t e = launch_main<Tr, Mask>(p, plan, stream); e != cudaSuccess) return e;
  if (p.seqlen_q > 0) {
    auto kernel = &dq_convert_kernel<Tr>;
    constexpr int kSmemBytes = Tr::kQElems * int(sizeof(typename Tr::Element));
    if (cudaError_t e = opt_in_smem(kernel, kSmemBytes); e != cudaSuccess) return e;
    const dim3 grid(unsigned((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM), unsigned(p.heads_q), unsigned(p.batch));
    kernel<<<grid, Tr::kThreads, kSmemBytes, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace bwd

// The main kernels and dQ postprocess of one mask policy: a unit of its own for WindowMask where the build splits
// each (dtype, head dim) in two (FLASHATTN_FINE_UNITS, src/cuda/CMakeLists.txt).
template <fa_dtype kDtype, int kHeadDim, class Mask>
cudaError_t launch_bwd_mask(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  return bwd::launch_main_and_dq<bwd::BwdTraits<typename ElementOf<kDtype>::type, kHeadDim>, Mask>(p, plan, stream);
}

template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  if (cudaError_t e = launch_preprocess<kDtype>(p, stream); e != cudaSuccess) return e;
  const cudaError_t e = p.has_window ? launch_bwd_mask<kDtype, kHeadDim, WindowMask>(p, plan, stream)
                                     : launch_bwd_mask<kDtype, kHeadDim, KeyLengthMask>(p, plan, stream);
  if (e != cudaSuccess) return e;
  return launch_dkdv_reduce<kDtype>(p, stream);
}

}  // namespace flashattn::cuda::sm80

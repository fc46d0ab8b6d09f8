// The epilogue collectives of the sm90 backward: dK (times the softmax scale) and dV of a key block from the
// consumers' registers to global memory (GQA: fp32 per query head into the workspace, reduced afterwards), and
// the dQ postprocess that turns the fp32 workspace into dQ.
#pragma once

#include <cstdint>

#include "cuda/sm90/bwd_traits.cuh"

namespace flashattn::cuda::sm90 {

template <class Traits>
struct BwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;

  // Every stored key row of the block is written (rows no query sees and keys past seqused_k hold zeros). dK and dV
  // in the output dtype leave through shared memory: K's and V's tiles, free once both warpgroups' last GEMMs have
  // read them (dQ reads K, dP^T V), take the accumulators' column pairs, and then either one thread issues their
  // TMA stores (kp.tma_dkv: the CTA's other threads exit at once; the thread waits only for the tiles' reads), or
  // the consumers copy whole rows in 16-byte chunks. Stored straight from the MMA layout, each 4-byte store of a
  // warp spans 8 rows, half of every 32-byte sector it touches: +4-8 % at 512-1k tokens, +1-4 % at 2k (H200,
  // bench/results/2026-12-03_h200_session25/README.md). The row copy took 3.2 us of a d128 CTA's 20-24 us at 512
  // tokens (H100 trace, bench/results/2026-12-07_h100_session48/README.md); the TMA store gained 1-3.4 % at 512-1k
  // and nothing measurable from 4k (H100, bench/results/2026-12-07_h100_session49/README.md, runs 1 and 4).
  // GQA's fp32 partials (the workspace, reduced afterwards) keep the direct stores.
  template <class Acc, class Seq>
  __device__ static void store(const BwdKernelParams<Traits>& kp, typename Traits::SharedStorage& ss, const Seq& seq,
                               int n_block, int head, int batch, Acc& acc_dk, Acc& acc_dv, int ctid) {
    const BwdParams& p = kp.p;
    typename Traits::TiledMmadKV mma_dkv;
    Tensor cKV = mma_dkv.get_thread_slice(ctid).partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    const int n0 = n_block * kBlockN;
    const int rows = min(kBlockN, seq.rows_k - n0);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
    static_assert(decltype(size(acc_dk))::value % 2 == 0);
    if (p.group == 1) {
      const bool varlen = p.cu_seqlens_k != nullptr;
      Element* dk = static_cast<Element*>(p.dk) +
                    (varlen ? int64_t(seq.k_start) * p.dk_row : int64_t(batch) * p.dk_batch) +
                    int64_t(head) * p.dk_head;
      Element* dv = static_cast<Element*>(p.dv) +
                    (varlen ? int64_t(seq.k_start) * p.dv_row : int64_t(batch) * p.dv_batch) +
                    int64_t(head) * p.dv_head;
      Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});  // (keys, d)
      Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
      // (kTails' id: its one use, at the mainloop's start, has completed; the same 256 threads.)
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kTails);
      // stmatrix (8 x 8 blocks of 16-byte rows; the swizzle applied to offsets, as dS's in bwd_mainloop.cuh): the
      // column-pair stores with their swizzled addresses took about 340 instructions a consumer warp at d64 (ncu
      // source counters, H100: bench/results/2026-12-07_h100_session50/README.md).
      auto copy_kv = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
      auto copy_kv_thr = copy_kv.get_thread_slice(ctid);
      cute::copy(copy_kv, copy_kv_thr.retile_S(convert_fragment<Element>(acc_dk)),
                 copy_kv_thr.partition_D(as_position_independent_swizzle_tensor(sK)));
      cute::copy(copy_kv, copy_kv_thr.retile_S(convert_fragment<Element>(acc_dv)),
                 copy_kv_thr.partition_D(as_position_independent_swizzle_tensor(sV)));
      if (kp.tma_dkv) {
        cutlass::arch::fence_view_async_shared();  // the generic-proxy writes, visible to the TMA store
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kTails);
        if (ctid == 0) {
          // The box is clipped at the tensor's rows (seqlen_k) and head dim: a partial block needs no predicates.
          auto tile = Shape<Int<kBlockN>, Int<kHeadDim>>{};
          Tensor gdK =
              local_tile(kp.tma_dk.get_tma_tensor(kp.shape_dk)(_, _, head, batch), tile, make_coord(n_block, 0));
          Tensor gdV =
              local_tile(kp.tma_dv.get_tma_tensor(kp.shape_dv)(_, _, head, batch), tile, make_coord(n_block, 0));
          auto dk_parts = tma_partition(kp.tma_dk, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gdK));
          auto dv_parts = tma_partition(kp.tma_dv, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gdV));
          copy(kp.tma_dk, get<1>(dk_parts), get<0>(dk_parts));
          copy(kp.tma_dv, get<1>(dv_parts), get<0>(dv_parts));
          tma_store_arrive();
          tma_store_wait<0>();  // the tiles are read (.read): shared memory may be released
        }
        return;
      }
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kTails);
      copy_rows([&](int r, int c) { return &sK(r, c); }, dk + int64_t(n0) * p.dk_row, p.dk_row, rows, p.head_dim, ctid);
      copy_rows([&](int r, int c) { return &sV(r, c); }, dv + int64_t(n0) * p.dv_row, p.dv_row, rows, p.head_dim_v,
                ctid);
    } else {
      const int64_t row0 = int64_t(head) * p.rows_k + seq.k_row0;
      store_pairs(acc_dk, cKV, p.dk_acc + row0 * p.head_dim, p.head_dim, n0, rows, p.head_dim);
      store_pairs(acc_dv, cKV, p.dv_acc + row0 * p.head_dim_v, p.head_dim_v, n0, rows, p.head_dim_v);
    }
  }

  // Accumulator column pairs, converted, into a shared tile (at(r, c): the address of its element r, c): elements
  // c, c + 1 (c even) are adjacent there (the swizzles move whole 16-byte chunks; padded pitches keep rows whole).
  template <class Acc, class Coord, class At>
  __device__ static void pairs_to(const Acc& acc, const Coord& coord, At at) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      cutlass::Array<float, 2> pair;
      pair[0] = acc(i);
      pair[1] = acc(i + 1);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(at(get<0>(coord(i)), get<1>(coord(i)))) =
          cutlass::NumericArrayConverter<Element, float, 2>{}(pair);
    }
  }

  // Rows [0, rows) of a shared (rows, kHeadDim) tile (at(r, c): the address of its element r, c) to dst (row stride
  // row_stride), columns below cols, by the consumers' threads: 16-byte chunks where dst and every row start are
  // 16-byte aligned (dQ, dK and dV are the caller's tensors: any stride), else elements.
  template <class At>
  __device__ static void copy_rows(At at, Element* dst, int64_t row_stride, int rows, int cols, int ctid) {
    constexpr int kChunk = 16 / int(sizeof(Element));
    constexpr int kChunksPerRow = kHeadDim / kChunk;
    const bool chunks = cols % kChunk == 0 && row_stride % kChunk == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    if (chunks) {
      for (int i = ctid; i < rows * kChunksPerRow; i += kConsumerThreads) {
        const int r = i / kChunksPerRow, c = i % kChunksPerRow * kChunk;
        if (c < cols)
          *reinterpret_cast<cute::uint128_t*>(dst + int64_t(r) * row_stride + c) =
              *reinterpret_cast<const cute::uint128_t*>(at(r, c));
      }
    } else {
      for (int i = ctid; i < rows * kHeadDim; i += kConsumerThreads) {
        const int r = i / kHeadDim, c = i % kHeadDim;
        if (c < cols) dst[int64_t(r) * row_stride + c] = *at(r, c);
      }
    }
  }

  // Accumulator elements 2i, 2i + 1 are adjacent columns of one row; T is the storage type or float.
  template <class Acc, class Coord, class T>
  __device__ static void store_pairs(const Acc& acc, const Coord& coord, T* dst, int64_t row_stride, int n0, int rows,
                                     int cols) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      const int r = get<0>(coord(i)), c = get<1>(coord(i));
      if (r >= rows || c >= cols) continue;
      T* at = dst + int64_t(n0 + r) * row_stride + c;
      if constexpr (std::is_same_v<T, float>) {
        *reinterpret_cast<float2*>(at) = make_float2(acc(i), acc(i + 1));
      } else {
        cutlass::Array<float, 2> pair;
        pair[0] = acc(i);
        pair[1] = acc(i + 1);
        *reinterpret_cast<cutlass::Array<T, 2>*>(at) = cutlass::NumericArrayConverter<T, float, 2>{}(pair);
      }
    }
  }
};

// The dQ writer: one warp of the producer warpgroup that adds each step's dQ staging tiles (one per consumer
// warpgroup, written in bwd_mainloop.cuh) into the fp32 workspace by bulk reduce-adds. Per step and warpgroup it
// waits for kDqFull, issues, and after the step's group it tells both warpgroups (kDqEmpty) that the staging
// tiles of the step kDqStages - 1 back have been read: the tiles their next step writes. Arrivals and waits
// alternate on each barrier (a warpgroup's next kDqFull comes only after its kDqEmpty), so none overruns.
// Deterministic mode (dq_order): before a tile's adds it waits for its turn among the key blocks that meet the tile
// (descending, last_key_block), and after them for their completion before it counts itself. The kernel launches
// higher key blocks first in this mode (bwd_kernel.cuh), so every CTA waited for is resident or done.
// A tile's first adds are stores (dq_first_stores: the preprocess does not zero the accumulator): turn 0's in
// deterministic mode; otherwise the writer claims the tile (claim_tile) before waiting for its staging tiles, and
// either stores and publishes once the stores are complete, or waits for the claimer's publication and adds.
template <class Traits>
struct BwdDqWriter {
  static constexpr int kBlockM = Traits::kBlockM, kConsumerWGs = Traits::kConsumerWGs;
  static constexpr int kSyncThreads = Traits::kWgThreads + cutlass::NumThreadsPerWarp;

  template <class Block>
  __device__ static void run(const BwdParams& p, typename Traits::SharedStorage& ss, const Block& blk) {
    const bool leader = cute::elect_one_sync();
    float* dq_base = dq_workspace_tiles(p, blk.head, blk.batch, blk.seq.q_row0, kBlockM);
    int* order = dq_order_tiles(p, blk.head, blk.batch, blk.seq.q_row0, kBlockM);
    int* claim = dq_claim_tiles(p, blk.head, blk.batch, blk.seq.q_row0, kBlockM);
    for (int m = blk.m_lo, step = 0; m < blk.m_hi; ++m, ++step) {
      bool store = false;  // (the leader's) this CTA's adds are the tile's first
      if (order != nullptr) {
        const int turn = blk.dq_turn(m);
        if (leader) wait_for_turn(order + m, turn);
        store = p.dq_first_stores && turn == 0;
        __syncwarp();  // converged for the aligned barriers below
      } else if (claim != nullptr) {
        if (leader) {
          store = claim_tile(claim + m);
          if (!store) wait_for_turn(claim + m, 2);
        }
        __syncwarp();
      }
      CUTE_UNROLL
      for (int wg = 0; wg < kConsumerWGs; ++wg) {
        cutlass::arch::NamedBarrier::sync(kSyncThreads, BwdBarrier::kDqFull + wg);
        if (leader) {
          float* dst = dq_base + int64_t(m) * p.dq_tile + wg * Traits::kDqWgFloats;
          const float* src = ss.dq.data() + (wg * Traits::kDqStages + step % Traits::kDqStages) * Traits::kDqWgFloats;
          if (store)
            bulk_store_f32(dst, src, Traits::kDqWgFloats * int(sizeof(float)));
          else
            bulk_reduce_add_f32(dst, src, Traits::kDqWgFloats * int(sizeof(float)));
        }
      }
      if (leader) {
        tma_store_arrive();
        if (order != nullptr)
          end_turn(order + m);
        else if (store)
          publish_tile(claim + m);
        else
          tma_store_wait<Traits::kDqStages - 1>();
      }
      __syncwarp();
      if (m + 1 < blk.m_hi) {
        CUTE_UNROLL
        for (int wg = 0; wg < kConsumerWGs; ++wg)
          cutlass::arch::NamedBarrier::arrive(kSyncThreads, BwdBarrier::kDqEmpty + wg);
      }
    }
    if (leader) tma_store_wait<0>();  // shared memory stays valid until the last reduce has read it
    __syncwarp();
  }
};

// dQ postprocess: one CTA (the consumers' 256 threads, each reading back the elements its dQ MMA slice held in
// the main kernel, in the staging order of bwd_mainloop.cuh: coalesced 16-byte loads) per (query block, head,
// batch): times the softmax scale, converted, then through a padded shared tile so that dQ leaves in 16-byte row
// chunks. With dq_first_stores a tile no key block stored (its rows see no key) is zero. (Stored straight from the MMA
// layout, each 4-byte store of a warp spans 8 rows: half of every 32-byte sector it touches; this kernel then ran at
// about half the copy bandwidth.)
template <class Traits>
__global__ void __launch_bounds__(Traits::kConsumerThreads) dq_convert_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim, kWgThreads = Traits::kWgThreads;
  constexpr int kChunk = 16 / int(sizeof(Element));  // elements per 16-byte chunk
  // Row pitch padded by one chunk: the MMA layout's 8 rows x 4 column pairs of a warp then hit 32 distinct banks.
  constexpr int kPitch = kHeadDim + kChunk;
  __shared__ __align__(16) Element tile[kBlockM * kPitch];
  const int m_block = int(blockIdx.x), head = int(blockIdx.y), batch = int(blockIdx.z), ctid = int(threadIdx.x);
  const BwdSeq seq(p, batch);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.len_q) return;
  typename Traits::TiledMmadQ mma_dq;
  auto thr = mma_dq.get_thread_slice(ctid);
  Tensor acc = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor cQ = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  const float* src = dq_workspace_tiles(p, head, batch, seq.q_row0, kBlockM) + int64_t(m_block) * p.dq_tile +
                     ctid / kWgThreads * Traits::kDqWgFloats;
  const int* state = p.dq_ordered ? dq_order_tiles(p, head, batch, seq.q_row0, kBlockM)
                                  : dq_claim_tiles(p, head, batch, seq.q_row0, kBlockM);
  const bool stored = !p.dq_first_stores || state[m_block] != 0;
  static_assert(decltype(size(acc))::value % 4 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 4) {
    const float4 v = stored ? *reinterpret_cast<const float4*>(src + (i / 4 * kWgThreads + ctid % kWgThreads) * 4)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
    acc(i) = v.x * p.scale;
    acc(i + 1) = v.y * p.scale;
    acc(i + 2) = v.z * p.scale;
    acc(i + 3) = v.w * p.scale;
  }
  using Epilogue = BwdEpilogue<Traits>;
  auto at = [&](int r, int c) { return &tile[r * kPitch + c]; };
  Epilogue::pairs_to(acc, cQ, at);
  __syncthreads();
  const bool varlen = p.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? int64_t(seq.q_start) * p.dq_row : int64_t(batch) * p.dq_batch) +
                int64_t(head) * p.dq_head + int64_t(m0) * p.dq_row;
  Epilogue::copy_rows(at, dq, p.dq_row, min(kBlockM, seq.len_q - m0), p.head_dim, ctid);
}

}  // namespace flashattn::cuda::sm90

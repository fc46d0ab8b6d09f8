// The epilogue collective of the sm90 forward, run by each consumer warpgroup once its tile's O is normalised:
// LSE from registers, then O by one of four stores, chosen at compile time from the tile and the traits:
//   direct   from registers to global memory (kDirectO: where O would otherwise be staged in Q's space)
//   TMA      through shared memory (stmatrix), one TMA store per warpgroup (batched, the box is clipped)
//   varlen   through shared memory, predicated 16-byte stores (a box could spill into the next sequence)
//   packed   through shared memory, predicated 16-byte stores, one row address each ((position, head) rows)
// or, under split-KV (chosen at run time: the launch's num_splits), the fifth: fp32 O and LSE partials from
// registers into the plan's workspace (store_partials), merged by the combine kernel (common/split_combine.cuh) or,
// with merge_counter (plan.fused_combine), by the tile's last warpgroup to store them (merge_if_last).
#pragma once

#include "cuda/common/split_combine.cuh"
#include "cuda/sm90/fwd_tile.cuh"

namespace flashattn::cuda::sm90 {

template <class Traits, class Opts>
struct FwdEpilogue {
  static constexpr bool kPackGQA = Opts::kPackGQA;
  using Element = typename Traits::OutElement;  // of O (bfloat16 for FP8 inputs)
  using Mech = typename Traits::Mech;
  using Tile = FwdTile<Traits, Opts>;
  static constexpr int kWgRows = Traits::kWgRows, kHeadDim = Traits::kHeadDim, kWGs = Traits::kConsumerWGs;
  static constexpr int kWgThreads = Traits::kWgThreads;
  // O from registers to global memory where it would otherwise be staged in Q's space (no room for a tile of its
  // own): the next tile's Q then loads while this tile's last P.V and epilogue run, as with a separate O tile.
  // Measured on the H200 (src/cuda/NOTES.md, the sm90 ablation table of session 3): +3% for 176-key d128 at 1k
  // and 16k, even elsewhere; d256 lost 3-7% at 1k-4k (64 column-pair stores per thread against 16 stmatrix and one
  // TMA store), so it keeps the staged path. Packed tiles keep it too (their rows are (position, head) pairs).
  static constexpr bool kDirectO = !Traits::kSeparateO && Mech::kDirectEpilogue && !kPackGQA && kHeadDim <= 128;
  // Whether O is staged in Q's space: the Q space is then released only after the stores have read it.
  static constexpr bool kOInQSpace = !Traits::kSeparateO && !kDirectO;
  // O in its own tile: the thread that issued a warpgroup's TMA store waits for it to have read the tile only when
  // the tile is written again (the next store) or the CTA exits (drain), not right after the issue, where its warp,
  // and with it the warpgroup's next wgmma, would stall (FlashAttention-3 lets all but one warp go on). O staged in
  // Q's space must be read before the Q space is released, right away.
  static constexpr bool kLateStoreWait = Traits::kSeparateO && Traits::Mech::kLateStoreWait;

  // The (row, column) in the warpgroup's O tile of each accumulator element thread `tid` holds, viewed (rows, cols).
  __device__ static auto acc_coords(int tid) {
    typename Traits::TiledMmaPV mma_pv;
    Tensor cO = mma_pv.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
    return make_tensor(cO.data(), rows_cols(cO.layout()));
  }

  // Before the CTA exits: the last store has read its tile (kLateStoreWait).
  __device__ static void drain(int tid) {
    if constexpr (kLateStoreWait)
      if (tid == 0) tma_store_wait<0>();
  }

  // The sink logit of each accumulator row a thread holds: its query head's (rows of a packed tile are of several
  // heads); -inf without sinks and under split-KV, whose combine adds the sink once.
  template <int kRows>
  __device__ static void row_sinks(const FwdParams& p, const Tile& tile, int wg, int tid, float (&sink)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) sink[r] = -INFINITY;
    if (p.sinks == nullptr || p.num_splits > 1) return;
    if constexpr (!kPackGQA) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) sink[r] = p.sinks[tile.t.head];
    } else {
      Tensor cO_rc = acc_coords(tid);
      static_assert(size<0>(decltype(cO_rc.layout()){}) == kRows, "one sink per accumulator row");
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r)
        sink[r] =
            p.sinks[PackedRow(tile.m0 + wg * kWgRows + get<0>(cO_rc(r, 0)), tile.rows_per_pos, tile.head0(p)).head];
    }
  }

  // Split-KV: this split's normalised O (fp32, column pairs from registers) and LSE at row (head, q row) of its
  // split's slice of the workspace; rows past the sequence are not written (the combine never reads them).
  template <class AccO, int kRows>
  __device__ static void store_partials(const FwdParams& p, const Tile& tile, const AccO& tOrO,
                                        const float (&lse)[kRows], int wg, int tid) {
    const TileScheduler::Tile& t = tile.t;
    const int m0_wg = tile.m0 + wg * kWgRows;
    const int head0 = tile.head0(p);
    Tensor cO_rc = acc_coords(tid);
    Tensor o_vals = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
    static_assert(size<1>(decltype(o_vals.layout()){}) % 2 == 0, "column pairs");
    const int64_t first_row = p.cu_seqlens_q != nullptr ? int64_t(tile.seq.q_start) : int64_t(t.batch) * p.seqlen_q;
    const int64_t split_heads = int64_t(t.split) * p.heads_q;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(o_vals); ++r) {
      const PackedRow row(m0_wg + get<0>(cO_rc(r, 0)), tile.rows_per_pos, head0);
      if (row.pos >= tile.seq.len_q) continue;
      const int64_t at = (split_heads + row.head) * p.partial_rows + first_row + row.pos;
      if (get<1>(cO_rc(r, 0)) == 0) p.lse_partial[at] = lse[r];
      float* o_row = p.o_partial + at * p.head_dim_v;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o_vals); c += 2) {
        const int col = get<1>(cO_rc(r, c));  // columns col and col + 1 (head_dim_v is a multiple of 8)
        if (col < p.head_dim_v) *reinterpret_cast<float2*>(o_row + col) = make_float2(o_vals(r, c), o_vals(r, c + 1));
      }
    }
  }

  // The fused split-KV merge (plan.fused_combine). Each consumer warpgroup, its partials stored, arrives at its
  // tile's counter; the tile's last arrival (num_splits x warpgroups) merges every row of the tile, a row per warp at
  // a time, with the combine kernel's code, and returns the counter to zero for the next launch. The arrival is the
  // threadfence-reduction pattern: every thread's partial stores are fenced (acq_rel, GPU scope) before the
  // warpgroup's barrier, thread 0's atomic comes after it, and the merging warpgroup fences again before it reads
  // the other CTAs' partials through L2. Nothing waits on another CTA, so no schedule can hang on it. The plan takes
  // this path for the decode entry's tiles of a few rows only, where one warpgroup's merge is as parallel as the
  // combine kernel's. Only the decode kernels have it (kFusedMerge): inlined into every kernel's epilogue it took the
  // inliner's budget from FwdLoad::load, which then spilled 2.4 KB at its 24 registers, and a call instead cost the
  // wide kernel's consumers 308 bytes of spill stores (ptxas sm_90a, the bf16 d128 unit); the decode kernels compile
  // without spills either way.
  static constexpr bool kFusedMerge = Traits::kEntry == FwdEntry::kDecode;
  __device__ static void merge_if_last(const KernelParams<Traits>& kp, const Tile& tile, int wg, int tid) {
    const FwdParams& p = kp.p;
    const TileScheduler::Tile& t = tile.t;
    const int barrier = Barrier::kEpilogueBase + wg;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // release: this thread's partials before the arrival
    cutlass::arch::NamedBarrier::sync(kWgThreads, barrier);
    bool last = false;
    if (tid == 0) {
      const int64_t heads = kPackGQA ? p.heads_q / p.group : p.heads_q;  // packed tiles run over KV heads
      int* counter = p.merge_counter + (t.batch * heads + t.head) * kp.sched.num_m_blocks + t.m_block;
      last = atomicAdd(counter, 1) == p.num_splits * kWGs - 1;
      if (last) atomicExch(counter, 0);  // every arrival of this launch is in
    }
    if (!named_barrier_or(kWgThreads, barrier, last)) return;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // acquire: the other arrivals' partials after it
    const int64_t first_row = p.cu_seqlens_q != nullptr ? int64_t(tile.seq.q_start) : int64_t(t.batch) * p.seqlen_q;
    const int head0 = tile.head0(p);
    for (int r = tid / 32; r < Traits::kBlockM; r += kWgThreads / 32) {
      const PackedRow row(tile.m0 + r, tile.rows_per_pos, head0);
      if (row.pos >= tile.seq.len_q) break;  // rows are position-major: the later ones are past the sequence too
      combine_item<Element, true>(p, int64_t(row.head) * p.partial_rows + first_row + row.pos, tid % 32);
    }
  }

  template <class AccO, int kRows>
  __device__ static void store(const KernelParams<Traits>& kp, typename Traits::SharedStorage& ss, const Tile& tile,
                               const AccO& tOrO, const float (&lse)[kRows], int wg, int tid) {
    const FwdParams& p = kp.p;
    if (p.num_splits > 1) {
      store_partials(p, tile, tOrO, lse, wg, tid);
      if constexpr (kFusedMerge)
        if (p.merge_counter != nullptr) merge_if_last(kp, tile, wg, tid);
      return;
    }
    const TileScheduler::Tile& t = tile.t;
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int m0_wg = tile.m0 + wg * kWgRows;
    const int head0 = tile.head0(p);
    typename Traits::TiledMmaPV mma_pv;
    Tensor cO_rc = acc_coords(tid);
    Tensor sO = make_tensor(make_smem_ptr(Traits::kSeparateO ? ss.o.data() : reinterpret_cast<Element*>(ss.q.data())),
                            typename Traits::SmemLayoutO{});
    Tensor sOw = sO(_, _, wg);
    Tensor out_frag = convert_fragment<Element>(tOrO);

    if constexpr (!kDirectO) {
      // The previous tile's store has finished reading this warpgroup's O tile (its issuing thread waited).
      if constexpr (kLateStoreWait)
        if (tid == 0) tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);
      // stmatrix: each warp writes 8x8 sub-tiles of its accumulator rows, 16 bytes per lane per matrix, instead
      // of one 2-byte store per value.
      auto smem_store_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
      auto smem_store_thr = smem_store_o.get_thread_slice(tid);
      copy(smem_store_o, smem_store_thr.retile_S(out_frag), smem_store_thr.partition_D(sOw));
    }

    if (p.lse != nullptr) {
      const int64_t lse_base = varlen ? int64_t(tile.seq.q_start) * p.lse_row : int64_t(t.batch) * p.lse_batch;
      if constexpr (kPackGQA) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const PackedRow row(m0_wg + get<0>(cO_rc(r, 0)), tile.rows_per_pos, head0);
          // One writer per row: the quad's thread that holds column 0.
          if (get<1>(cO_rc(r, 0)) == 0 && row.pos < tile.seq.len_q)
            p.lse[lse_base + int64_t(row.pos) * p.lse_row + int64_t(row.head) * p.lse_head] = lse[r];
        }
      } else {
        float* lse_ptr = p.lse + lse_base + int64_t(t.head) * p.lse_head;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int row = m0_wg + get<0>(cO_rc(r, 0));
          if (get<1>(cO_rc(r, 0)) == 0 && row < tile.seq.len_q) lse_ptr[int64_t(row) * p.lse_row] = lse[r];
        }
      }
    }
    const int rows_here = tile.seq.len_q - m0_wg;
    if constexpr (kDirectO) {
      // Each thread stores its accumulator's column pairs (4 bytes; a warp instruction covers 8 rows x 16 bytes).
      // Nothing waits for these stores, and shared memory is not involved.
      Element* o_ptr = static_cast<Element*>(p.out) + int64_t(t.head) * p.o_head +
                       (varlen ? int64_t(tile.seq.q_start) * p.o_row : int64_t(t.batch) * p.o_batch);
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
      return;
    }
    cutlass::arch::fence_view_async_shared();  // the generic-proxy smem writes become visible to the TMA store (async
                                               // proxy)
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
        if constexpr (!kLateStoreWait) tma_store_wait<0>();
      }
    } else if constexpr (!kPackGQA) {
      // A box would write past the end of this sequence into the next one's rows: predicated vector stores.
      Element* o_ptr = static_cast<Element*>(p.out) + int64_t(tile.seq.q_start) * p.o_row + int64_t(t.head) * p.o_head;
      Tensor mO =
          make_tensor(make_gmem_ptr(o_ptr), make_shape(tile.seq.len_q, Int<kHeadDim>{}), make_stride(p.o_row, _1{}));
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
      Element* o_base =
          static_cast<Element*>(p.out) + (varlen ? int64_t(tile.seq.q_start) * p.o_row : int64_t(t.batch) * p.o_batch);
      typename Traits::GmemStoreO store;
      auto sthr = store.get_thread_slice(tid);
      Tensor tOs = sthr.partition_S(sOw);
      Tensor tOc = sthr.partition_D(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tOs); ++m) {
        const PackedRow r(m0_wg + get<0>(tOc(0, m, 0)), tile.rows_per_pos, head0);
        if (r.pos >= tile.seq.len_q) continue;
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
  }
};

}  // namespace flashattn::cuda::sm90

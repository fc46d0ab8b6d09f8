// The mainloop collective of the sm90 backward above head dim 128 (bwd_traits.cuh, kSplitHeadDim): a CTA owns 64
// keys, and a thread cannot hold its keys' dK and dV over the whole head dim (2 * 64 * 256 / 128 accumulators at
// d256), so the two consumer warpgroups split it. Per step:
//   S^T, dP^T   each warpgroup for its 32 of the 64 query columns (K and V rows as A, Q and dO rows as B)
//   P, dS       formed in registers as in BwdMainloop, written as P^T and dS^T (bf16) to shared memory; one barrier
//               (both warpgroups' halves in place; the buffers alternate per step: the other warpgroup may still
//               read the previous step's)
//   dQ[:, half w] = dS . K[:, half w] in slices (Traits::kDqSlices), then dV_w += P^T . dO[:, half w] and
//               dK_w += dS^T . Q[:, half w], all from shared memory
// The dQ reductions are the d256 backward's limit: with them compiled out it ran 1.37-1.54x as fast (H100,
// bench/results/2026-12-06_h100_session37/README.md). So every GEMM of the step after the exponentials is issued
// behind dQ's first slice, and each slice's reductions run under the GEMMs issued after it. That order measured
// +7-16 % at d256 against dQ issued last (its reductions with no GEMM in flight), and issuing dV there rather than
// before dS is formed (FlashAttention-3's order, which hides the dS arithmetic under dV) another 0-4 %.
// Each thread adds its dQ fragment into the fp32 workspace with vector reductions, in the register order of
// the staging tiles (dq_convert_kernel reads that order). A role split instead (warpgroup 0 S^T and P, warpgroup
// 1 dP^T and dS, 64 query columns each, P handed over through shared memory) measured 4-7% slower without a mask
// and 1-4% faster causal at d256 (bench/results/2026-12-02_h200_session14/dev4_bwd_dev.csv against dev3_).

#pragma once

#include "cuda/sm90/bwd_mainloop.cuh"

namespace flashattn::cuda::sm90 {

// fp32 vector reduce-add of four consecutive floats (16-byte aligned) in global memory; sm_90's red.v4.
__device__ __forceinline__ void red_add_f32x4(float* gmem, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

template <class Traits, class Mask, class Opts>
struct BwdMainloopSplit : BwdConsumer<Traits, Mask> {
  using Base = BwdConsumer<Traits, Mask>;
  static constexpr bool kDropout = Opts::kDropout;
  using Base::Base;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kWgThreads, Base::kConsumerThreads;
  using Base::ss, Base::pipe_q, Base::pipe_do, Base::ctid, Base::wg, Base::tid, Base::q_read, Base::do_read;
  using typename Base::AccKV;
  using typename Base::Block;
  using typename Base::Element;
  static_assert(Traits::kSplitHeadDim && !Traits::kDqStaged && !Traits::kDsFromRoundedP);

  __device__ void run(const BwdParams& p, const Block& blk, AccKV& acc_dk, AccKV& acc_dv) {
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmadKV mma_dkv;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(ctid);  // accumulators
    const int wg0 = this->wg_thread0();             // operands (BwdConsumer::wg_thread0)
    auto wg_sdp = mma_sdp.get_thread_slice(wg0);
    auto wg_dkv = mma_dkv.get_thread_slice(wg0);
    auto wg_dq = mma_dq.get_thread_slice(wg0);
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdS{});   // (queries, keys)
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutPt{});  // (keys, queries)
    Tensor sPt = make_tensor(make_smem_ptr(ss.pt.data()), typename Traits::SmemLayoutPt{});

    Tensor tSrK = wg_sdp.partition_fragment_A(sK);  // (MMA, 1, d/16)
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);  // (MMA, 1, d/16, stages)
    Tensor tdPrV = wg_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrPt = wg_dkv.partition_fragment_A(sPt);   // (MMA, 1, M/16, 2)
    Tensor tdVrdO = wg_dkv.partition_fragment_B(sdOt);  // (MMA, 1, M/16, stages)
    Tensor tdKrdSt = wg_dkv.partition_fragment_A(sdSt);
    Tensor tdKrQ = wg_dkv.partition_fragment_B(sQt);
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);  // (MMA, 1, N/16, 2)
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);  // (MMA, 1, N/16)
    // P^T and dS^T rows (keys) of 8 queries are 16 contiguous bytes of the K-major SmemLayoutPt: stmatrix, as
    // BwdMainloop's dS store.
    auto copy_c = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto copy_c_thr = copy_c.get_thread_slice(ctid);
    Tensor tPsP = copy_c_thr.partition_D(sPt);     // (CPY, CPY_N, CPY_M, 2)
    Tensor tdSsdS = copy_c_thr.partition_D(sdSt);  // (CPY, CPY_N, CPY_M, 2)

    Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor cS_rc = make_tensor(cS.data(), rows_cols(cS.layout()));  // (keys, queries) of this thread
    constexpr int kRows = decltype(size<0>(cS_rc))::value, kCols = decltype(size<1>(cS_rc))::value;

    const int n0 = blk.n0, len_q = blk.seq.len_q;
    const bool varlen = p.cu_seqlens_q != nullptr;
    this->kv_tails(p, blk);
    const int64_t bh = int64_t(blk.batch) * p.heads_q + blk.head;  // the dropout mask's key
    const int lane = ctid % cutlass::NumThreadsPerWarp;
    [[maybe_unused]] BwdDropoutMask<kRows, kCols> drop;  // as in BwdMainloop: the next step's drawn during dQ
    if constexpr (kDropout) drop.draw(p, cS_rc, bh, n0, blk.m_lo * kBlockM, lane);
    float* dq_tiles = dq_workspace_tiles(p, blk.head, blk.batch, blk.seq.q_row0, kBlockM) + wg * Traits::kDqWgFloats;
    // Deterministic mode: each tile's adds in key-block order, as BwdDqWriter orders them (bwd_epilogue.cuh).
    int* order = dq_order_tiles(p, blk.head, blk.batch, blk.seq.q_row0, kBlockM);

    for (int m = blk.m_lo, step = 0; m < blk.m_hi; ++m, ++step) {
      const int m0 = m * kBlockM;
      const int q_stage = q_read.index(), do_stage = do_read.index(), buf = step % 2;
      const bool has_next = m + 1 < blk.m_hi;
      const int rows_here = min(kBlockM, len_q - m0);
      const bool edge = rows_here < kBlockM || blk.mask.block_needs_mask(m0, rows_here, n0, kBlockN);
      if (varlen && rows_here < kBlockM) this->q_tails(rows_here);

      // 8 query columns a thread: their LSE and D (which arrive with Q and dO) in registers, read before the GEMMs.
      const float* lse = ss.lse.data() + q_stage * kBlockM;
      const float* dsum = ss.dsum.data() + do_stage * kBlockM;
      float lse_cols[kCols], dsum_cols[kCols];
      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      this->pipe_q.consumer_wait(q_read);
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) lse_cols[c] = lse[get<1>(cS_rc(0, c))];
      wgmma_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, q_stage), tSrS);
      this->pipe_do.consumer_wait(do_read);
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) dsum_cols[c] = dsum[get<1>(cS_rc(0, c))];
      wgmma_gemm<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, do_stage), tdPrdP);

      Tensor s = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
      Tensor dp = make_tensor(tdPrdP.data(), rows_cols(tdPrdP.layout()));
      warpgroup_wait<1>();  // S^T is ready; dP^T may still run
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) s(r, c) = fast_exp2(s(r, c) * p.scale_log2 - lse_cols[c]);
      }
      if (edge) Base::mask_step(s, cS_rc, blk, m0, rows_here, 0.f);  // as in BwdMainloop
      if constexpr (kDropout) {
        Tensor rP = drop.template kept_probs<Element>(tSrS);
        cute::copy(copy_c, copy_c_thr.retile_S(rP), tPsP(_, _, _, buf));
      } else {
        Tensor rP = convert_fragment<Element>(tSrS);
        cute::copy(copy_c, copy_c_thr.retile_S(rP), tPsP(_, _, _, buf));
      }
      warpgroup_wait<0>();  // dP^T is ready
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r)
          dp(r, c) = s(r, c) * ((kDropout ? drop.dp(p, r, c, dp(r, c)) : dp(r, c)) - dsum_cols[c]);
      }
      Tensor rdS = convert_fragment<Element>(tdPrdP);
      cute::copy(copy_c, copy_c_thr.retile_S(rdS), tdSsdS(_, _, _, buf));
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kdSReady);

      // dQ's slices, dV, dK (the file's header says why this order).
      constexpr int kSlices = Traits::kDqSlices;
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, 1, kSlices)
      for_each(make_int_sequence<kSlices>{}, [&](auto j) {
        wgmma_gemm_slice<true, decltype(j)::value>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, acc_dq);
      });
      wgmma_gemm<false>(mma_dkv, tdVrPt(_, _, _, buf), tdVrdO(_, _, _, do_stage), acc_dv);
      wgmma_gemm<false>(mma_dkv, tdKrdSt(_, _, _, buf), tdKrQ(_, _, _, q_stage), acc_dk);
      if constexpr (kDropout)
        if (has_next) drop.draw(p, cS_rc, bh, n0, m0 + kBlockM, lane);

      float* dq = dq_tiles + int64_t(m) * p.dq_tile;
      // Deterministic: thread 0 waits for the tile's turn, every consumer thread adds, and after a barrier thread 0
      // counts the block (the release covers the other threads' reductions, which the barrier ordered before it,
      // as in CUTLASS's GenericBarrier).
      if (order != nullptr) {
        if (ctid == 0) wait_for_count(order + m, blk.dq_turn(m));
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kDqOrdered);
      }
      constexpr int kSliceFloats = decltype(size(acc_dq))::value / kSlices;
      static_assert(kSliceFloats % 4 == 0);
      for_each(make_int_sequence<kSlices>{}, [&](auto j) {
        constexpr int kJ = decltype(j)::value;
        warpgroup_wait<kSlices - kJ + 1>();  // slice j is done; the later slices, dV and dK may run
        CUTE_UNROLL
        for (int i = kJ * kSliceFloats; i < (kJ + 1) * kSliceFloats; i += 4)
          red_add_f32x4(dq + (i / 4 * kWgThreads + tid) * 4, acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
      });
      if (order != nullptr) {
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kDqOrdered);
        if (ctid == 0) count_one(order + m);
      }
      warpgroup_wait<0>();
      this->release_step();
    }
  }
};

}  // namespace flashattn::cuda::sm90

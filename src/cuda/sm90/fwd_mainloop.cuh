// The mainloop collective of the sm90 forward, run by each consumer warpgroup (64 query rows) for one tile:
// S = Q.K^T as wgmma with both operands in shared memory, the score slots (score modifiers, then the mask), the
// online softmax in registers, the probability slot, then O += P.V as wgmma with P from registers. Ping-pong
// (named barriers order the warpgroups' GEMM issue so that one's softmax runs under the other's GEMMs) and
// intra-warpgroup overlap (Q.K^T of a key block and P.V of the previous one are issued together; the softmax of
// the first runs while the second is in flight) are the Mechanisms' switches.
#pragma once

#include "cuda/sm90/fwd_load.cuh"
#include "cuda/sm90/fwd_tile.cuh"

namespace flashattn::cuda::sm90 {

// The probability slot: apply runs on each tile of exponentiated scores (rows_cols view, unnormalised P in fp32,
// after the row sums took them) before it becomes the A operand of P.V, draw ahead of it (at the top of the key
// block's step, where neither this block's scores nor the previous block's are live), and scale_output on the tile's
// normalised O. NoProbMod is empty; DropoutProbs (variant::Dropout) zeroes the dropped probabilities.
struct NoProbMod {
  __device__ NoProbMod(const FwdParams&, int /*batch*/, int /*head*/) {}
  template <class C>
  __device__ void draw(const C&, int /*m0*/, int /*n0*/) {}
  template <class S>
  __device__ void apply(S&) const {}
  template <class O>
  __device__ static void scale_output(const FwdParams&, O&) {}
};

// Dropout (core/dropout.hpp): a wgmma fragment holds whole groups of the mask rule, so one Philox call serves eight
// probabilities. The mask is drawn into bits at the top of the block's step: drawn beside the live scores, ptxas
// sm_90a spilled at d64 (three warpgroups of 160 registers). The kept probabilities keep their value and O is
// scaled by 1 / (1 - p) once, after normalisation.
template <int kRows, int kCols>
struct DropoutProbs {
  const detail::DropoutRule& rule;
  int64_t bh;  // batch entry * heads_q + query head: the rule's key
  KeepBits<kRows, kCols> keep;
  __device__ DropoutProbs(const FwdParams& p, int batch, int head)
      : rule(p.dropout), bh(int64_t(batch) * p.heads_q + head) {}
  template <class C>
  __device__ void draw(const C& coords, int m0, int n0) {
    keep.clear();
    dropout_query_rows<true>(rule, coords, bh, m0, n0, [&](int r, int c, bool kept) { keep.set(r, c, kept); });
  }
  template <class S>
  __device__ void apply(S& s) const {
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) s(r, c) = keep.kept(r, c) ? s(r, c) : 0.f;
    }
  }
  template <class O>
  __device__ static void scale_output(const FwdParams& p, O& o) {
    CUTE_UNROLL
    for (int i = 0; i < size(o); ++i) o(i) *= p.dropout.keep_scale;
  }
};

// Ping-pong between the consumer warpgroups: warpgroup w issues its GEMMs after warpgroup w-1 did (cyclically);
// the last one lets the first start. Every wait has a matching arrive: the first warpgroup consumes the final one
// after its last tile (drain). A single consumer warpgroup (the decode tiles) has no one to alternate with.
template <class Traits>
struct PingPong {
  static constexpr int kWGs = Traits::kConsumerWGs, kWgThreads = Traits::kWgThreads;
  static constexpr bool kOn = Traits::Mech::kPingpong && kWGs > 1;
  int wg;
  __device__ void prime() const {
    if constexpr (kOn)
      if (wg == kWGs - 1) cutlass::arch::NamedBarrier::arrive(2 * kWgThreads, Barrier::kSchedulerBase);
  }
  __device__ void wait() const {
    if constexpr (kOn) cutlass::arch::NamedBarrier::sync(2 * kWgThreads, Barrier::kSchedulerBase + wg);
  }
  __device__ void signal() const {
    if constexpr (kOn) cutlass::arch::NamedBarrier::arrive(2 * kWgThreads, Barrier::kSchedulerBase + (wg + 1) % kWGs);
  }
  __device__ void drain() const {
    if constexpr (kOn)
      if (wg == 0) cutlass::arch::NamedBarrier::sync(2 * kWgThreads, Barrier::kSchedulerBase);
  }
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

// Opts: a FwdVariant (score mods, packed GQA, dropout: the probability slot's policy).
template <class Traits, class Opts>
struct FwdMainloop {
  static constexpr bool kScoreMods = Opts::kScoreMods, kPackGQA = Opts::kPackGQA;
  static_assert(!(Opts::kDropout && Opts::kPackGQA), "the dropout mask is keyed by one query head per tile");
  using Element = typename Traits::Element;
  using Mech = typename Traits::Mech;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using Tile = FwdTile<Traits, Opts>;
  static constexpr int kWgRows = Traits::kWgRows, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kWgThreads = Traits::kWgThreads, kConsumerThreads = Traits::kConsumerThreads;

  // O of one warpgroup (64 x d, fp32 in registers) and the softmax statistics of its rows.
  using AccO = decltype(partition_fragment_C(typename Traits::TiledMmaPV{}, Shape<Int<kWgRows>, Int<kHeadDim>>{}));
  __device__ static AccO make_acc_o() {
    return partition_fragment_C(typename Traits::TiledMmaPV{}, Shape<Int<kWgRows>, Int<kHeadDim>>{});
  }
  static constexpr int kRowsPerThread = decltype(size<0>(rows_cols(typename AccO::layout_type{})))::value;
  using Softmax = OnlineSoftmax<kRowsPerThread, Mech::kRowPartials>;
  // The probability slot's policy, sized by the score fragment ((rows, cols) per thread).
  using AccS = decltype(partition_fragment_C(typename Traits::TiledMmaQK{}, Shape<Int<kWgRows>, Int<kBlockN>>{}));
  static constexpr int kScoreCols = decltype(size<1>(rows_cols(typename AccS::layout_type{})))::value;
  using ProbMod = std::conditional_t<Opts::kDropout, DropoutProbs<kRowsPerThread, kScoreCols>, NoProbMod>;

  typename Traits::SharedStorage& ss;
  Pipeline& pipe_k;
  Pipeline& pipe_v;
  PingPong<Traits> pingpong;
  int wg, tid;
  PipelineState k_read, v_read;

  __device__ FwdMainloop(typename Traits::SharedStorage& ss_, Pipeline& k, Pipeline& v, int wg_, int tid_)
      : ss(ss_), pipe_k(k), pipe_v(v), pingpong{wg_}, wg(wg_), tid(tid_) {}

  // The tile's key blocks into tOrO (cleared first) and softmax (fresh), its Q in buffer q_stage. Blocks run from
  // the last to the first.
  // scale_log2: the logits' factor in base 2 (FwdParams::scale_log2, times FP8's q_descale * k_descale `qk` where
  // the factor is not inside softcap's tanh). q_done() is called exactly once, as soon as this warpgroup's Q is no
  // longer read: after the last Q.K^T has completed (before the last P.V), or at once for an empty range.
  template <class QDone>
  __device__ void run(const FwdParams& p, const Tile& tile, int q_stage, AccO& tOrO, Softmax& softmax, float scale_log2,
                      float qk, QDone&& q_done) {
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data() + q_stage * cosize_v<typename Traits::SmemLayoutQ>),
                            typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
    Tensor sQw = sQ(_, _, wg);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQw);  // (MMA, 1, d/16) descriptors
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, 1, d/16, stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, 1, N/16, stages)
    Tensor cS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kWgRows>, Int<kBlockN>>{}));
    Tensor cS_rc = make_tensor(cS.data(), rows_cols(cS.layout()));
    Tensor o_rc = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));

    const BlockRange range = tile.range;
    const int m0_wg = tile.m0 + wg * kWgRows;  // this warpgroup's first tile row
    const bool varlen = p.cu_seqlens_q != nullptr;
    const ScoreMods mods(p, tile.seq, tile.t.batch, tile.t.head, qk);  // ALiBi never runs packed (slope per head)
    ProbMod prob_mod(p, tile.t.batch, tile.t.head);

    if constexpr (kPackGQA) FwdLoad<Traits, Opts>::gather_q_packed(p, tile, sQw, wg, tid);

    clear(tOrO);

    // The score slots (modifiers, mask) and the exponentiation of one score tile; returns whether O needs the
    // rescale. The probability slot runs on the result.
    auto softmax_step = [&](auto& tSrS, int n, auto is_first, float (&correction)[kRowsPerThread]) {
      Tensor s = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
      const int n0 = n * kBlockN;
      if constexpr (kScoreMods) mods.apply(s, cS_rc, m0_wg, n0);
      if constexpr (kPackGQA) {
        const BlockRange pos_wg = tile.positions(m0_wg, kWgRows);
        if (tile.mask.block_needs_mask(pos_wg.lo, max(pos_wg.hi - pos_wg.lo, 1), n0, kBlockN))
          apply_mask_packed(tile.mask, s, cS_rc, m0_wg, tile.rows_per_pos, n0);
      } else if (tile.mask.block_needs_mask(m0_wg, kWgRows, n0, kBlockN)) {
        apply_mask(tile.mask, s, cS_rc, m0_wg, n0);
      }
      const bool rescale = softmax.template exponentiate<decltype(is_first)::value>(s, scale_log2, correction);
      prob_mod.apply(s);
      return rescale;
    };

    // The partial key block's V box runs past the sequence's keys into memory TMA does not zero-fill (rows past
    // seqused_k, the next varlen sequence, the unused slots of a sequence's last page). P is 0 there, but 0 * Inf =
    // NaN, so those rows are zeroed before any P.V reads the stage, as the sm80 kernel's predicated loads do (paged
    // rows gathered with cp.async arrive zero filled). Every consumer warpgroup of the CTA runs the same range, so
    // the barrier over all of them is reached by each; it sits after the first block's Q.K^T and before any
    // ping-pong wait that could need another warpgroup to pass it first.
    // (FP8's transposed V holds zeros past each sequence's keys.)
    const bool zero_v_tail = !Traits::kVTransposed && !p.paged_rows &&
                             (varlen || p.seqused_k != nullptr || p.block_table != nullptr) && range.hi > range.lo &&
                             range.hi * kBlockN > tile.seq.len_k;
    auto zero_v_tail_rows = [&] {
      if constexpr (!Traits::kVTransposed) {
        constexpr int kChunk = Traits::kVecElems;  // 16-byte chunks stay contiguous under the swizzle
        constexpr int kChunksPerRow = Traits::kVecsPerRow;
        const int first = tile.seq.len_k - (range.hi - 1) * kBlockN;
        pipe_v.consumer_wait(v_read);  // waited for again before the P.V; the phase stays complete until released
        Tensor sVs = sV(_, _, v_read.index());
        for (int i = int(threadIdx.x) - kWgThreads; i < (kBlockN - first) * kChunksPerRow; i += kConsumerThreads)
          *reinterpret_cast<cute::uint128_t*>(
              raw_pointer_cast(&sVs(first + i / kChunksPerRow, i % kChunksPerRow * kChunk))) = cute::uint128_t{};
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, Barrier::kVTail);
      }
    };

    if (range.hi <= range.lo) {
      q_done();
      return;
    }
    // A warpgroup whose rows all lie past the sequence computes nothing, but still waits for and releases every K/V
    // stage, passes the ping-pong turn on and meets the V tail barrier, so that the producer and the other
    // warpgroups proceed as if it had run. Its O stays zero (no keys: softmax.finish gives 0 and LSE -inf) and none
    // of its rows is stored. Packed tiles only: the second warpgroup of every packed decode tile has no row (one
    // query of a 4-head group fills 4 of 128 rows), and skipping it read +1.5-7.5 % at decode batches 64-128 and
    // up to +1 % below (bench/results/2026-12-03_h200_session22, runs 1 and 3). Unpacked, skipping the idle
    // warpgroups of d64's 192-row tiles at 512 and 1k gained nothing measurable (run 1).
    if constexpr (Mech::kIdleSkip && kPackGQA) {
      if (m0_wg >= tile.seq.len_q * tile.rows_per_pos) {
        q_done();
        for (int n = range.hi - 1; n >= range.lo; --n) {
          pipe_k.consumer_wait(k_read);
          pingpong.wait();
          pingpong.signal();
          pipe_k.consumer_release(k_read);
          ++k_read;
          if (zero_v_tail && n == range.hi - 1) zero_v_tail_rows();
          pipe_v.consumer_wait(v_read);
          pipe_v.consumer_release(v_read);
          ++v_read;
        }
        return;
      }
    }
    float correction[kRowsPerThread];
    using Operands = typename Traits::Operands;
    Tensor tOrP = Operands::make_probs(partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{}));
    auto to_probs = [&](const auto& tSrS) { Operands::to_probs(tSrS, tOrP); };

    // S = Q.K^T of the next K stage, waited for (no P.V in flight beside it).
    auto qk_alone = [&](auto& tSrS) {
      pipe_k.consumer_wait(k_read);
      pingpong.wait();
      wgmma_gemm<true>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), tSrS);
      pingpong.signal();
      warpgroup_wait<0>();
      pipe_k.consumer_release(k_read);
      ++k_read;
    };
    // O += P.V of the next V stage, waited for.
    auto pv_alone = [&] {
      pipe_v.consumer_wait(v_read);
      wgmma_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
      warpgroup_wait<0>();
      pipe_v.consumer_release(v_read);
      ++v_read;
    };

    if constexpr (Mech::kIntraWgOverlap) {
      int n = range.hi - 1;
      // kRescaleUnderQk: a step's correction of O is applied in the next step, once its Q.K^T is issued and before
      // its P.V (FlashAttention-3's order), where the multiplies run beside the tensor cores' Q.K^T; O is not in
      // flight then (the step's P.V was waited for). EagerRescale applies it right after the P.V wait, between
      // that wait and the next step's GEMM issue: 1-3 % slower at 16k for d64/d128/d256, within 1 % below 2k (H100,
      // bench/results/2026-12-06_h100_session33/README.md).
      bool rescale_pending = false;
      {
        prob_mod.draw(cS_rc, m0_wg, n * kBlockN);
        Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{});
        qk_alone(tSrS);
        softmax_step(tSrS, n, cute::true_type{}, correction);
        to_probs(tSrS);
        if (zero_v_tail) zero_v_tail_rows();
      }
      for (--n; n >= range.lo; --n) {
        // The mask of block n, drawn once the GEMMs are issued (kDrawUnderGemms: its rounds beside S(n) and
        // P(n + 1).V(n + 1), whose registers the draw leaves alone) or at the step's top (S(n + 1) is P(n + 1)
        // already, S(n) not yet issued). Measured equal at d128 8k (bench/results/2026-12-04_h200_session29, run 1):
        // the draw's instructions cost the consumer warps' issue either way.
        if constexpr (!Mech::kDrawUnderGemms) prob_mod.draw(cS_rc, m0_wg, n * kBlockN);
        Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{});
        pipe_k.consumer_wait(k_read);
        pingpong.wait();
        wgmma_gemm<true>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), tSrS);
        if constexpr (Mech::kRescaleUnderQk)
          if (rescale_pending) softmax.rescale(o_rc, correction);
        pipe_v.consumer_wait(v_read);
        wgmma_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
        pingpong.signal();
        if constexpr (Mech::kDrawUnderGemms) prob_mod.draw(cS_rc, m0_wg, n * kBlockN);
        warpgroup_wait<1>();  // S(n) is ready; P(n+1).V(n+1) may still run
        pipe_k.consumer_release(k_read);
        ++k_read;
        const bool rescale = softmax_step(tSrS, n, cute::false_type{}, correction);
        if constexpr (Mech::kPinnedPvWait) {
          // The wait for P(n+1).V(n+1) has no data dependence on the softmax, and ptxas sm_90a (CUDA 13) schedules a
          // lone wgmma wait as early as it may: in the row max, before every exponential (SASS of the d128 kernels),
          // so the softmax ran after the P.V, not under it. In both branches on `rescale` (known only at the end
          // of the exponentiation), it stays after the block's softmax. The two waits differ in a PTX comment so
          // that they are not merged into one before the branch. Same-process A/B against the ablation
          // `plain_pv_wait`: +2-9 % at d128 from 2k keys (bench/results/2026-12-04_h200_session29, runs 2-3).
          if (rescale)
            warpgroup_wait<0>();
          else
            asm volatile("wgmma.wait_group.sync.aligned 0; // no rescale\n" ::: "memory");
        } else {
          warpgroup_wait<0>();
        }
        if constexpr (Mech::kRescaleUnderQk)
          rescale_pending = rescale;
        else if (rescale)
          softmax.rescale(o_rc, correction);
        pipe_v.consumer_release(v_read);
        ++v_read;
        to_probs(tSrS);
      }
      q_done();  // every Q.K^T has completed (the last wait above was warpgroup_wait<0>, or qk_alone's)
      if constexpr (Mech::kRescaleUnderQk)
        if (rescale_pending) softmax.rescale(o_rc, correction);
      pv_alone();
    } else {
      for (int n = range.hi - 1; n >= range.lo; --n) {
        prob_mod.draw(cS_rc, m0_wg, n * kBlockN);
        Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kWgRows>, Int<kBlockN>>{});
        qk_alone(tSrS);
        if (n == range.lo) q_done();
        const bool rescale = n == range.hi - 1 ? softmax_step(tSrS, n, cute::true_type{}, correction)
                                               : softmax_step(tSrS, n, cute::false_type{}, correction);
        if (rescale) softmax.rescale(o_rc, correction);
        to_probs(tSrS);
        if (zero_v_tail && n == range.hi - 1) zero_v_tail_rows();
        pv_alone();
      }
    }
  }
};

}  // namespace flashattn::cuda::sm90

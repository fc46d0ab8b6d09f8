// The mainloop collectives of the sm90 backward, run by both consumer warpgroups of a CTA over the query blocks
// that see its key block (bwd_traits.cuh lists the GEMMs). BwdMainloop (head dims up to 128), per step: S^T and
// dP^T issued together; P from S^T, its exponentials around dP^T's wait; dS = P (dP - D); dV (after dS) and dK
// accumulated from registers; dS to shared memory for dQ, whose tile the dQ writer warp adds into the fp32 workspace
// (bwd_epilogue.cuh) while the next step runs. BwdMainloopSplit (above 128) is in bwd_mainloop_split.cuh; both
// take their pipelines, tails and row statistics from BwdConsumer.
#pragma once

#include "cuda/common/dropout.cuh"
#include "cuda/sm90/bwd_load.cuh"
#include "cuda/sm90/bwd_mask_band.cuh"
#include "cuda/sm90/mechanisms.hpp"

namespace flashattn::cuda::sm90 {

// What one compiled backward kernel handles beyond the plain case, as named options (mechanisms.hpp's tags):
// BwdVariant<> is the plain kernel; variant::Dropout regenerates the forward's dropout mask.
template <class... Options>
struct BwdVariant {
  static constexpr bool kDropout = (false || ... || std::is_same_v<Options, variant::Dropout>);
};
template <bool kDropout>
using BwdVariantOf = BwdVariant<std::conditional_t<kDropout, variant::Dropout, void>>;

// The dropout mask of one step's S^T fragment (keys as rows, core/dropout.hpp), one bit per probability. With the
// mask the forward applied, dV += (P m)^T dO / (1 - p) (the factor once, on the accumulator: scale_dropout_dv) and
// dS = P (dP m / (1 - p) - D), where D = rowsum(dO O) already holds the mask. The mainloops draw a step's mask during
// the previous step's dQ GEMM: beside the step's own S^T, dP^T and dK/dV accumulators ptxas sm_90a spilled 112-208
// bytes at d128.
template <int kRows, int kCols>
struct BwdDropoutMask : KeepBits<kRows, kCols> {
  using KeepBits<kRows, kCols>::kept;
  template <class C>
  __device__ void draw(const BwdParams& p, const C& cS_rc, int64_t bh, int n0, int m0, int lane) {
    this->clear();
    dropout_key_rows(p.dropout, cS_rc, bh, n0, m0, lane, [&](int r, int c, bool k) { this->set(r, c, k); });
  }
  // P with the dropped probabilities zeroed, rounded to Element (the A operand of dV): the fragment `acc` of fp32 P,
  // converted element by element (a rounded pair at a time would keep a whole fp32 copy live beside P, which dS
  // still reads: ptxas spilled at d128).
  template <class Element, class Acc>
  __device__ auto kept_probs(const Acc& acc) const {
    Tensor out = make_tensor<Element>(acc.layout());
    Tensor in_rc = make_tensor(acc.data(), rows_cols(acc.layout()));
    Tensor out_rc = make_tensor(out.data(), rows_cols(out.layout()));
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) out_rc(r, c) = Element(kept(r, c) ? in_rc(r, c) : 0.f);
    }
    return out;
  }
  // The same from P already rounded (16-bit elements): the fp32 P then need not stay live beside its copies. (One
  // template for both, converting before the select, spilled more: 52 -> 152 bytes at d128, 0 -> 48 at d64, windowed.)
  template <class R>
  __device__ R kept_rounded(const R& rp) const {
    R out;
    Tensor in_rc = make_tensor(rp.data(), rows_cols(rp.layout()));
    Tensor out_rc = make_tensor(out.data(), rows_cols(out.layout()));
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) out_rc(r, c) = kept(r, c) ? in_rc(r, c) : typename R::value_type(0.f);
    }
    return out;
  }
  // dP m / (1 - p) of one probability.
  __device__ float dp(const BwdParams& p, int r, int c, float dp_rc) const {
    return kept(r, c) ? dp_rc * p.dropout.keep_scale : 0.f;
  }
};
// dV's 1 / (1 - p), once on the accumulator after the last step.
template <class Acc>
__device__ void scale_dropout_dv(const BwdParams& p, Acc& acc_dv) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dv); ++i) acc_dv(i) *= p.dropout.keep_scale;
}

// What both mainloops share: the consumer's pipeline states and the zeroed tails of the shared tiles. (The query
// rows' LSE and D arrive with their stage's Q and dO: bwd_load.cuh, BwdStatsLoad.)
template <class Traits, class Mask>
struct BwdConsumer {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using Block = BwdBlock<Traits, Mask>;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kWgThreads = Traits::kWgThreads, kConsumerThreads = Traits::kConsumerThreads;

  using AccKV = decltype(partition_fragment_C(typename Traits::TiledMmadKV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  __device__ static AccKV make_acc_kv() {
    return partition_fragment_C(typename Traits::TiledMmadKV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  }

  typename Traits::SharedStorage& ss;
  Pipeline& pipe_q;
  Pipeline& pipe_do;
  int ctid;  // consumer thread 0..255
  int wg, tid;
  PipelineState q_read, do_read;

  __device__ BwdConsumer(typename Traits::SharedStorage& ss_, Pipeline& q, Pipeline& d, int ctid_)
      : ss(ss_), pipe_q(q), pipe_do(d), ctid(ctid_), wg(ctid_ / kWgThreads), tid(ctid_ % kWgThreads) {}

  // The index of the warpgroup's first consumer thread, warp-uniform as the compiler sees it (a shuffle from lane
  // 0). The A and B operands of a wgmma are the same for every thread of a warpgroup; partitioned by this index
  // instead of ctid, their shared-memory descriptors stay in uniform registers. Partitioned by ctid (whose
  // warpgroup picks the K and V rows of S^T and dP^T), ptxas built them in vector registers and moved them over
  // (R2UR) before every wgmma: 4-5 instructions each, 32 wgmmas a step at d128 (SASS of the bf16 d128 kernel).
  __device__ int wg_thread0() const { return __shfl_sync(0xffffffffu, wg, 0) * kWgThreads; }

  // Rows [from, rows) of a (rows, d) shared-memory tile set to zero by every consumer thread (16-byte chunks stay
  // contiguous under the swizzle).
  template <class T>
  __device__ void zero_rows(T&& tile, int from, int rows) const {
    constexpr int kChunk = int(sizeof(cute::uint128_t) / sizeof(Element));
    constexpr int kChunksPerRow = kHeadDim / kChunk;
    for (int i = ctid; i < (rows - from) * kChunksPerRow; i += kConsumerThreads)
      *reinterpret_cast<cute::uint128_t*>(
          raw_pointer_cast(&tile(from + i / kChunksPerRow, i % kChunksPerRow * kChunk))) = cute::uint128_t{};
  }
  __device__ static void tails_visible() {
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kTails);
  }

  // Key rows past the sequence's keys that TMA did not zero-fill (varlen: the next sequence; seqused_k: stored
  // keys not used) would turn the zero P and dS of their masked scores into NaN (0 * Inf) in dQ = dS.K and, via
  // dP, in dS itself. Waits for K and V.
  __device__ void kv_tails(const BwdParams& p, const Block& blk) {
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    ss.barrier_kv.wait(0);
    if ((p.cu_seqlens_q != nullptr || p.seqused_k != nullptr) && blk.n0 + kBlockN > blk.seq.len_k) {
      zero_rows(sK, max(0, blk.seq.len_k - blk.n0), kBlockN);
      zero_rows(sV, max(0, blk.seq.len_k - blk.n0), kBlockN);
    }
    tails_visible();
  }
  // The same for the query rows past a varlen sequence (dV += P^T.dO and dK += dS^T.Q read them). Waits for this
  // step's Q and dO.
  __device__ void q_tails(int rows_here) {
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
    pipe_q.consumer_wait(q_read);
    pipe_do.consumer_wait(do_read);
    zero_rows(sQ(_, _, q_read.index()), max(rows_here, 0), kBlockM);
    zero_rows(sdO(_, _, do_read.index()), max(rows_here, 0), kBlockM);
    tails_visible();
  }
  // A step's mask: the band (mask_band) where the tile lies inside both sequences (the causal diagonal's steps but a
  // sequence's last partial block), else mask_probs.
  template <class TP, class TC>
  __device__ static void mask_step(TP&& s, const TC& cS_rc, const Block& blk, int m0, int rows_here, float hidden) {
    if (rows_here == kBlockM && blk.n0 <= blk.seq.len_k - kBlockN)  // not n0 + kBlockN: no wrap near INT_MAX
      mask_band<0>(s, cS_rc, diag_band(blk.mask), blk.n0 - m0, hidden);
    else
      mask_probs(s, cS_rc, blk, m0, hidden);
  }
  // Hidden scores (and queries past the sequence) get P = 0 by assignment (`hidden`: 0 for a probability, -inf for
  // an exponent before exp2): their LSE and inputs may be anything. dS = P (dP - D) is then 0 too: dP and D are finite
  // there (zeroed K/V/Q/dO tails, D read as 0). s and its coordinates cS_rc: (keys, queries) of the thread's S^T
  // fragment.
  template <class TP, class TC>
  __device__ static void mask_probs(TP&& s, const TC& cS_rc, const Block& blk, int m0, float hidden = 0.f) {
    constexpr int kRows = decltype(size<0>(cS_rc))::value, kCols = decltype(size<1>(cS_rc))::value;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int q = m0 + get<1>(cS_rc(0, c));
      const ColRange cr = q < blk.seq.len_q ? blk.mask.cols(q) : ColRange{0, 0};
      const int lo = cr.lo - blk.n0, hi = cr.hi - blk.n0;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int key = get<0>(cS_rc(r, 0));
        if (key < lo || key >= hi) s(r, c) = hidden;
      }
    }
  }
  __device__ void release_step() {
    pipe_q.consumer_release(q_read);
    ++q_read;
    pipe_do.consumer_release(do_read);
    ++do_read;
  }
};

template <class Traits, class Mask, class Opts>
struct BwdMainloop : BwdConsumer<Traits, Mask> {
  using Base = BwdConsumer<Traits, Mask>;
  static constexpr bool kDropout = Opts::kDropout;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kWgThreads, Base::kConsumerThreads;
  using Base::ss, Base::pipe_q, Base::pipe_do, Base::ctid, Base::wg, Base::tid, Base::q_read, Base::do_read;
  using typename Base::AccKV;
  using typename Base::Block;
  using typename Base::Element;
  using typename Base::Pipeline;
  static constexpr int kDqSyncThreads = kWgThreads + cutlass::NumThreadsPerWarp;  // a warpgroup and the dQ writer
  // Whether a warpgroup meets steps none of whose rows see its keys (run: wg_first_empty): under a causal mask at
  // block_q 64 (head dims 72-128), a key block's first step for its second warpgroup. At block_q 128 (d64) a causal
  // diagonal step has rows for both; without a mask only keys past the sequence do (odd lengths). There, and in the
  // dropout kernels, those steps keep the plain path: a test of every step cost ptxas 20/16 spilled bytes in the d128
  // kernel without a mask and 84/144 against 16/16 in the windowed dropout one (with the warpgroup index from ctid).
  static constexpr bool kSkipsEmptySteps = !std::is_same_v<Mask, KeyLengthMask> && kBlockM < kBlockN && !kDropout;
  using Base::Base;

  __device__ void run(const BwdParams& p, const Block& blk, AccKV& acc_dk, AccKV& acc_dv) {
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmadKV mma_dkv;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(ctid);  // accumulators
    const int wg0 = this->wg_thread0();             // operands (wg_thread0)
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
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdSt{});

    Tensor tSrK = wg_sdp.partition_fragment_A(sK);  // (MMA, 1, d/16)
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);  // (MMA, 1, d/16, stages)
    Tensor tdPrV = wg_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrdO = wg_dkv.partition_fragment_B(sdOt);  // (MMA, 1, M/16, stages)
    Tensor tdKrQ = wg_dkv.partition_fragment_B(sQt);
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);  // (MMA, 1, N/16, 2)
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);  // (MMA, 1, N/16)
    // dS^T rows (keys) of 8 queries are 16 contiguous bytes of the MN-major dS: stmatrix stores four 8 x 8 blocks
    // a warp instruction (8 instructions a thread at d64) where 4-byte stores took 32.
    auto copy_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto copy_ds_thr = copy_ds.get_thread_slice(ctid);
    // The swizzle applied to offsets, not to absolute addresses: ptxas then folds the thread's offsets into
    // constants once, where the address form redid 64-bit swizzle arithmetic for every stmatrix of every step.
    Tensor tdSsdS = copy_ds_thr.partition_D(as_position_independent_swizzle_tensor(sdSt));  // (CPY, CPY_N, CPY_M, 2)

    Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor cS_rc = make_tensor(cS.data(), rows_cols(cS.layout()));  // (keys, queries) of this thread
    constexpr int kRows = decltype(size<0>(cS_rc))::value, kCols = decltype(size<1>(cS_rc))::value;
    // At block_q 128 (32 columns per thread) the LSE stays in shared memory: 32, or even 16, more registers live
    // beside S^T, dP^T and dK/dV cost more than the stall they save (bench/results/2026-12-01_h200_session9/).
    constexpr bool kStatsInRegs = kCols <= 16;

    const bool varlen = p.cu_seqlens_q != nullptr;
    const int n0 = blk.n0, len_q = blk.seq.len_q;
    this->kv_tails(p, blk);
    const int64_t bh = int64_t(blk.batch) * p.heads_q + blk.head;  // the dropout mask's key
    const int lane = ctid % cutlass::NumThreadsPerWarp;
    [[maybe_unused]] BwdDropoutMask<kRows, kCols> drop;  // this step's; the next one's is drawn during dQ
    if constexpr (kDropout) drop.draw(p, cS_rc, bh, n0, blk.m_lo * kBlockM, lane);
    // Whether no row of the first step sees a key of this warpgroup's (query_rows: for a WindowMask exactly the rows
    // that see one). Under an aligned causal mask that is the step that matters: a key block's first step takes the
    // first rows that see any of its keys, which see the second warpgroup's from the next block of 64 rows on. Other
    // empty steps (every step of a last key block of at most 64 keys; later ones under a window bounded on the left)
    // keep the plain path, which masks them.
    [[maybe_unused]] bool wg_first_empty = false;
    if constexpr (kSkipsEmptySteps) {
      // The warpgroup from wg0, warp-uniform as the compiler sees it: from wg the predicate stayed in a vector
      // register across the loop and ptxas spilled 20/28 bytes in the windowed d128 kernel (0 this way).
      const RowRange r = query_rows(blk.mask, blk.seq, n0 + wg0 / kWgThreads * Traits::kWgRows, Traits::kWgRows);
      wg_first_empty = r.hi <= r.lo || r.lo >= (blk.m_lo + 1) * kBlockM;
    }

    for (int m = blk.m_lo, step = 0; m < blk.m_hi; ++m, ++step) {
      const int m0 = m * kBlockM;
      const int q_stage = q_read.index(), do_stage = do_read.index(), buf = step % 2;
      const bool has_next = m + 1 < blk.m_hi;
      const int rows_here = min(kBlockM, len_q - m0);
      const bool edge = rows_here < kBlockM || blk.mask.block_needs_mask(m0, rows_here, n0, kBlockN);
      if (varlen && rows_here < kBlockM) this->q_tails(rows_here);

      // A step no row of which sees a key of this warpgroup's: P = dS = 0 there and nothing adds to dV and dK, so the
      // warpgroup writes its zero dS for dQ and issues only dQ, leaving the tensor cores to the other warpgroup's
      // S^T, dP^T, dV and dK (H100, d128 causal: +0.6 % at 512 tokens, +0.8 % at 1k, even at 4k and without a mask;
      // bench/results/2026-12-07_h100_session53/run1_skip_wg_ab.tsv). Uniform over the warpgroup (its wgmmas stay
      // convergent); both warpgroups pass the step's named barriers once either way.
      if constexpr (kSkipsEmptySteps) {
        if (step == 0 && wg_first_empty) {
          pipe_q.consumer_wait(q_read);  // (released with the stage: the other warpgroup's reads decide when it frees)
          pipe_do.consumer_wait(do_read);
          Tensor zero = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
          clear(zero);
          cute::copy(copy_ds, copy_ds_thr.retile_S(convert_fragment<Element>(zero)), tdSsdS(_, _, _, buf));
          cutlass::arch::fence_view_async_shared();
          cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kdSReady);
          Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
          wgmma_gemm<true>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, acc_dq);
          warpgroup_wait<0>();
          stage_dq(acc_dq, step);
          this->release_step();
          continue;
        }
      }

      // The LSE of this thread's columns (it arrives with Q), read before the GEMMs where registers allow (block_q
      // 64: 16 columns): read after S^T's wait, each shared load queued behind the GEMMs' operand reads and the
      // exponentials stalled on them (ncu source counters, bench/results/2026-12-01_h200_session9/README.md).
      const float* lse = ss.lse.data() + q_stage * kBlockM;
      const float* dsum = ss.dsum.data() + do_stage * kBlockM;  // D arrives with dO
      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      pipe_q.consumer_wait(q_read);
      float lse_cols[kStatsInRegs ? kCols : 1];
      if constexpr (kStatsInRegs) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) lse_cols[c] = lse[get<1>(cS_rc(0, c))];
      }
      wgmma_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, q_stage), tSrS);
      pipe_do.consumer_wait(do_read);
      wgmma_gemm<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, do_stage), tdPrdP);

      Tensor s = make_tensor(tSrS.data(), rows_cols(tSrS.layout()));
      Tensor dp = make_tensor(tdPrdP.data(), rows_cols(tdPrdP.layout()));
      warpgroup_wait<1>();                        // S^T is ready; dP^T may still run
      float dsum_cols[kStatsInRegs ? kCols : 1];  // D of the columns, read while dP^T runs (as the LSE)
      if constexpr (kStatsInRegs) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) dsum_cols[c] = dsum[get<1>(cS_rc(0, c))];
      }
      // P: the exponents (base 2) first, hidden scores' set to -inf (exp2 gives exactly 0), then the exponentials,
      // half written before dP^T's wait and half after, with nothing between them and dS, so that ptxas can spread
      // them among dS's arithmetic (d128 SASS: 11 of a thread's 32 MUFU.EX2 before the wait without a mask, 1 with
      // the window mask, the rest among dS's FMULs). Written as one burst before the wait, with the mask's branch
      // and dV's issue after it, they ran bound by the MUFU pipe (ncu source counters: their stalls were the
      // kernel's largest, bench/results/2026-12-06_h100_session36). Where dS takes the rounded P
      // (kDsFromRoundedP), the source forms all of P before the wait; ptxas still issues 63 of the 64 exponentials
      // a thread after it (d64 SASS).
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const float lse_c = kStatsInRegs ? lse_cols[c] : lse[get<1>(cS_rc(0, c))];
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) s(r, c) = s(r, c) * p.scale_log2 - lse_c;
      }
      if (edge) Base::mask_step(s, cS_rc, blk, m0, rows_here, -INFINITY);
      constexpr int kColsEarly = Traits::kDsFromRoundedP ? kCols : kCols / 2;
      auto exp2_cols = [&](auto from, auto to) {  // columns [from, to), compile-time bounds
        CUTE_UNROLL
        for (int c = decltype(from)::value; c < decltype(to)::value; ++c) {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) s(r, c) = fast_exp2(s(r, c));
        }
      };
      exp2_cols(Int<0>{}, Int<kColsEarly>{});
      warpgroup_wait<0>();  // dP^T is ready
      exp2_cols(Int<kColsEarly>{}, Int<kCols>{});
      Tensor rP = convert_fragment<Element>(tSrS);
      // With 128 query rows (d64) the fp32 P would stay live beside dP, its bf16 copy and dK/dV (ptxas spilled):
      // dS takes the rounded P there, which dV uses too.
      Tensor p_rounded = make_tensor(rP.data(), rows_cols(rP.layout()));
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const float d_c = kStatsInRegs ? dsum_cols[c] : dsum[get<1>(cS_rc(0, c))];
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const float prob = Traits::kDsFromRoundedP ? float(p_rounded(r, c)) : s(r, c);
          const float dp_kept = kDropout ? drop.dp(p, r, c, dp(r, c)) : dp(r, c);
          dp(r, c) = prob * (dp_kept - d_c);
        }
      }
      Tensor rdS = convert_fragment<Element>(tdPrdP);
      Tensor tdKrdS = make_tensor(rdS.data(), acc_as_a_operand(rdS.layout()));

      // dS to shared memory (buffer buf: the other one may still be read by the other warpgroup's dQ of the
      // previous step), then dQ over both warpgroups' keys.
      cute::copy(copy_ds, copy_ds_thr.retile_S(rdS), tdSsdS(_, _, _, buf));
      // dV += P^T.dO once dS is formed (FlashAttention-3/4's order): issued before it, it needed every exponential
      // before dP^T's wait.
      if constexpr (kDropout) {
        // (kDsFromRoundedP: from the rounded P, which dS reads, so that the fp32 one dies here.)
        Tensor rPk = [&] {
          if constexpr (Traits::kDsFromRoundedP)
            return drop.kept_rounded(rP);
          else
            return drop.template kept_probs<Element>(tSrS);
        }();
        Tensor tdVrP = make_tensor(rPk.data(), acc_as_a_operand(rPk.layout()));
        wgmma_gemm<false>(mma_dkv, tdVrP, tdVrdO(_, _, _, do_stage), acc_dv);
      } else {
        Tensor tdVrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));
        wgmma_gemm<false>(mma_dkv, tdVrP, tdVrdO(_, _, _, do_stage), acc_dv);
      }
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, BwdBarrier::kdSReady);
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
      wgmma_gemm<true>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, acc_dq);
      // dK after dQ, so that the dQ tile is staged while dK runs (FlashAttention-3's order; staged after both, it
      // waited for dK: bench/results/2026-12-06_h100_session35, runs 3-4).
      wgmma_gemm<false>(mma_dkv, tdKrdS, tdKrQ(_, _, _, q_stage), acc_dk);
      if constexpr (kDropout)
        if (has_next) drop.draw(p, cS_rc, bh, n0, m0 + kBlockM, lane);
      warpgroup_wait<1>();  // dV and dQ are done; dK runs on while dQ is staged

      stage_dq(acc_dq, step);
      warpgroup_wait<0>();
      this->release_step();
    }
  }

  // dQ to this step's staging tile for the writer warp's bulk reduce-add (bwd_epilogue.cuh: BwdDqWriter); from the
  // second step on, the tile is free once the writer says so.
  template <class Acc>
  __device__ void stage_dq(const Acc& acc_dq, int step) const {
    float* sdq = ss.dq.data() + (wg * Traits::kDqStages + step % Traits::kDqStages) * Traits::kDqWgFloats;
    if (step > 0) cutlass::arch::NamedBarrier::sync(kDqSyncThreads, BwdBarrier::kDqEmpty + wg);
    static_assert(decltype(size(acc_dq))::value % 4 == 0);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 4)
      *reinterpret_cast<float4*>(sdq + (i / 4 * kWgThreads + tid) * 4) =
          make_float4(acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::arrive(kDqSyncThreads, BwdBarrier::kDqFull + wg);
  }
};

}  // namespace flashattn::cuda::sm90

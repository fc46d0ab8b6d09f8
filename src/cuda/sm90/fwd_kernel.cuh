// The sm90 forward kernel (FlashAttention-3 design), assembled from collectives with one job each:
//   tile_scheduler.cuh  which (query block, head, batch) tile a persistent CTA takes next (static / dynamic)
//   fwd_load.cuh        the producer warp: TMA loads of Q per tile and of K/V per key block into the pipeline
//   fwd_mainloop.cuh    each consumer warpgroup: Q.K^T, score and mask slots, online softmax, probability slot,
//                       P.V, with ping-pong and intra-warpgroup overlap
//   fwd_epilogue.cuh    normalised O and LSE to global memory (direct, TMA, varlen, packed-GQA stores)
// This file only orchestrates: shared storage and pipelines, the role split (setmaxnreg), the tile loop, and
// the Q buffers' hand-off between the consumers and the next tiles' Q loads. Masks (causal both alignments, window),
// softcap, ALiBi, GQA, varlen and seqused_k use the policies shared with the sm80 kernel
// (src/cuda/common/fwd_policies.cuh). Head dims below the compiled one: the TMA boxes are zero filled past the
// tensor's real head dim, and the stores are clipped (TMA) or predicated.
#pragma once

#include "cuda/sm90/fwd_epilogue.cuh"
#include "cuda/sm90/fwd_load.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"
#include "cuda/sm90/fwd_traits.cuh"
#include "cuda/sm90/tile_scheduler.cuh"

namespace flashattn::cuda::sm90 {

// Opts (a FwdVariant, mechanisms.hpp): variant::ScoreMods, softcap and/or ALiBi present (their own instantiation
// keeps the plain kernel's registers free); variant::Dropout, the mainloop's probability slot draws the dropout
// mask; variant::PackGQA, GQA query-head packing for query sequences shorter than a tile (fwd_tile.cuh). Its own
// instantiation: the row gathers and per-row addresses cost registers the plain kernels do not have to spare (d64 and
// 176-key d128 spilled with packing decided at run time).
template <class Traits, class Opts>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
    fwd_kernel(const __grid_constant__ KernelParams<Traits> kp) {
  using Pipeline = typename Traits::Pipeline;
  using Load = FwdLoad<Traits, Opts>;
  using Mainloop = FwdMainloop<Traits, Opts>;
  using Epilogue = FwdEpilogue<Traits, Opts>;
  using Tile = FwdTile<Traits, Opts>;

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
    if (p.block_table != nullptr && p.paged_box_rows == kPageBoxRows) {
      prefetch_tma_descriptor(kp.tma_k_page.get_tma_descriptor());
      prefetch_tma_descriptor(kp.tma_v_page.get_tma_descriptor());
    }
    CUTE_UNROLL
    for (int s = 0; s < Traits::kQStages; ++s) {
      ss.barrier_q[s].init(1);
      ss.empty_q[s].init(Traits::kConsumerThreads);
    }
    ss.follow_ack.init(Load::kRowWarps - 1);
    ss.claim_full.init(1);
    ss.claim_empty.init(1);
  }
  // A K/V stage is full when its TMA bytes have landed (the leader's arrival announces them; with row boxes each
  // producer warp's lane 0 announces its own), or, for paged rows gathered with cp.async (Load::load_rows), when each
  // lane of the producer warpgroup has arrived on completion of its copies.
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kTileBytesKV;
  pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  // Row boxes: each producer warp's lane 0 announces its own boxes' bytes (Load::load_boxes).
  const bool box_warps = Load::shares_blocks(p) && !p.paged_rows;
  pipe_params.is_leader = is_tma_thread && !Load::shares_blocks(p);
  pipe_params.num_producers = p.paged_rows ? Load::kRowThreads : box_warps ? Load::kRowWarps : 1;
  pipe_params.num_consumers = Traits::kConsumerThreads;
  Pipeline pipe_k(ss.pipeline_k, pipe_params, Shape<_1, _1, _1>{});
  // FP8 reads V from its transposed copy with TMA whatever K's paging (fwd_load.cuh).
  if constexpr (Traits::kVTransposed) {
    pipe_params.is_leader = is_tma_thread;
    pipe_params.num_producers = 1;
  }
  Pipeline pipe_v(ss.pipeline_v, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // every mbarrier is initialised before anyone waits on it

  const TileScheduler& sched = kp.sched;

  if (warp_group == 0) {
    // Producer warpgroup: gives its registers to the consumers; one warp issues the loads, and with paged rows or row
    // boxes the other three share each key block.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    // The dynamic schedule's claims come from warp 1 (TileClaims) unless warps 1-3 share the key blocks' loads.
    // The unmasked entries never run it (plan.cpp: the schedule is dynamic under causal/window only).
    constexpr bool kMayClaim =
        Traits::Mech::kClaimWarp && Traits::kEntry != FwdEntry::kWide && Traits::kEntry != FwdEntry::kShort;
    const bool claim_warp = kMayClaim && sched.counter != nullptr && !Load::shares_blocks(p);
    if (warp == 1 && claim_warp) {
      TileClaims::run(sched, ss);
      return;
    }
    if (warp != 0 && !Load::shares_blocks(p)) return;
    Load load(kp, ss, pipe_k, pipe_v, warp);
    load.claim_requests = claim_warp;
    if (warp != 0) {
      load.follow(sched);
      return;
    }
    for (int idx = blockIdx.x, k = 0; idx < sched.count(); ++k) {
      load.load(sched, idx);  // one call site: a second inlined copy of the loads spilled (24 registers)
      idx = claim_warp ? TileClaims::take(ss, k, is_tma_thread) : sched.next(idx, is_tma_thread);
    }
    load.finish(sched);
    return;
  }

  // Consumer warpgroups: the producer publishes each tile it loads (skipping empty varlen tiles) with its Q load,
  // and a final past-the-end index.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int wg = warp_group - 1;
  const int tid = int(threadIdx.x) % Traits::kWgThreads;
  Mainloop mainloop(ss, pipe_k, pipe_v, wg, tid);
  mainloop.pingpong.prime();
  QRing ring{0, Load::q_stages(p)};
  for (;;) {
    int q_stage;
    const int idx = next_published_tile(ss, ring, q_stage);
    if (idx >= sched.count()) break;
    const Tile tile(p, sched.tile(idx));

    // FP8's dequantisation factors of the tile's head (1 for 16-bit inputs, folded away); packed tiles (16-bit only)
    // have one KV head.
    const auto factors = Traits::Operands::factors(p, tile.t.batch, tile.head0(p));
    auto tOrO = Mainloop::make_acc_o();
    typename Mainloop::Softmax softmax;
    // With softcap the factor is inside the tanh (ScoreMods) and the logits leave it in logit units.
    const float logit_qk = Opts::kScoreMods && p.softcap > 0.f ? 1.f : factors.qk;
    // Unless O is staged in Q's space, the producer may load the next tile's Q as soon as this tile's last Q.K^T
    // has read it (kEarlyQRelease; LateQRelease: after the last P.V): the next Q then lands under the last P.V and
    // the epilogue instead of after them.
    constexpr bool kEarlyQ = Traits::Mech::kEarlyQRelease && !Epilogue::kOInQSpace;
    mainloop.run(p, tile, q_stage, tOrO, softmax, p.scale_log2 * logit_qk, factors.qk, [&] {
      if constexpr (kEarlyQ) Load::release_q_space(ss, q_stage);
    });
    if constexpr (!kEarlyQ && !Epilogue::kOInQSpace) Load::release_q_space(ss, q_stage);

    float lse[Mainloop::kRowsPerThread], sink[Mainloop::kRowsPerThread];
    Tensor o_rc = make_tensor(tOrO.data(), rows_cols(tOrO.layout()));
    Epilogue::row_sinks(p, tile, wg, tid, sink);
    softmax.finish(o_rc, p.logit_scale * logit_qk, lse, sink);
    Traits::Operands::scale_output(tOrO, factors);
    Mainloop::ProbMod::scale_output(p, tOrO);
    Epilogue::store(kp, ss, tile, tOrO, lse, wg, tid);
    if constexpr (Epilogue::kOInQSpace) {
      // O lived in this warpgroup's Q rows: the next Q may be loaded once every warpgroup's stores have read it.
      cutlass::arch::fence_view_async_shared();
      Load::release_q_space(ss, q_stage);
    }
  }
  Epilogue::drain(tid);
  mainloop.pingpong.drain();
}

}  // namespace flashattn::cuda::sm90

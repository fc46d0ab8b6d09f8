// The sm90 backward kernel (FlashAttention-3 design), assembled from collectives with one job each:
//   bwd_load.cuh      the producer warp: TMA loads of K/V once and of Q, dO per query block; the stats warp:
//                     the query rows' LSE and D into the same stages
//   bwd_mainloop.cuh  both consumer warpgroups: S^T, dP^T, P, dS, dV, dK in registers, dQ to staging tiles
//   bwd_mainloop_split.cuh  the same above head dim 128, the warpgroups splitting the head dim of dK/dV and dQ
//                     (P and dS through shared memory, dQ reduced from registers)
//   bwd_epilogue.cuh  the dQ writer warp (bulk reduce-adds of the consumers' dQ tiles, in descending key-block
//                     order in deterministic mode); dK/dV to global memory; the dQ postprocess kernel
// around the preprocess and GQA reduction kernels both families share (common/bwd_common.cuh). One CTA per
// (key block, query head, batch); masks (causal both alignments, window), GQA, varlen and seqused_k use the
// policies shared with the forward; dropout regenerates the forward's mask (variant::Dropout). Deterministic mode
// adds each dQ tile in descending key-block order (dq_order). Softcap and ALiBi run the sm80 backward (plan.cpp).
#pragma once

#include "cuda/sm90/bwd_epilogue.cuh"
#include "cuda/sm90/bwd_load.cuh"
#include "cuda/sm90/bwd_mainloop.cuh"
#include "cuda/sm90/bwd_mainloop_split.cuh"
#include "cuda/sm90/bwd_order.hpp"

namespace flashattn::cuda::sm90 {

// Opts: a BwdVariant (bwd_mainloop.cuh): dropout.
template <class Traits, class Mask, class Opts>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_kernel(const __grid_constant__ BwdKernelParams<Traits> kp) {
  using Pipeline = typename Traits::Pipeline;
  using Mainloop =
      std::conditional_t<Traits::kSplitHeadDim, BwdMainloopSplit<Traits, Mask, Opts>, BwdMainloop<Traits, Mask, Opts>>;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const BwdParams& p = kp.p;
  const int warp_group = cutlass::canonical_warp_group_idx();
  const bool is_tma_thread = threadIdx.x == 0;

  if (is_tma_thread) {
    prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kTileBytesQ;
  // A stage is full once the TMA producer's arrival (with the tile's bytes) and one from each lane of the stats warp
  // (after its LSE or D stores: BwdStatsLoad) are in.
  pipe_params.num_producers = 1 + cutlass::NumThreadsPerWarp;
  pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = is_tma_thread;
  pipe_params.num_consumers = Traits::kConsumerThreads;
  Pipeline pipe_q(ss.pipeline_q, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipe_do(ss.pipeline_do, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // every mbarrier is initialised before anyone waits on it

  // Deterministic mode adds each dQ tile in descending key-block order, so it launches the highest key block
  // first: a CTA waits only for CTAs launched before it (resident or done). Under a causal mask key block n + 1
  // starts on a later query block than key block n, so it reaches every tile they share first, and no CTA waits
  // for its turn once running. In ascending order every key block waited for all lower ones on its diagonal tile:
  // causal ran at 0.42-0.65x the default, descending at 0.82-1.00x (bench/results/2026-12-03_h200_session23/).
  // Otherwise the launch order, but key block major over the grid's last tail_pairs (head, batch) pairs under a causal
  // mask (bwd_order.hpp).
  const BwdCta cta = bwd_cta(int(blockIdx.x), int(blockIdx.y), int(blockIdx.z), int(gridDim.x), int(gridDim.y),
                             int(gridDim.z), p.tail_pairs, p.dq_ordered);
  const BwdBlock<Traits, Mask> blk(p, cta.n_block, cta.head, cta.batch);
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    const int warp = cutlass::canonical_warp_idx_sync();
    if (warp == 0) BwdLoad<Traits, Mask>{kp, ss, pipe_q, pipe_do}.load(blk);
    if (warp == 2) BwdStatsLoad<Traits, Mask>{p, ss, pipe_q, pipe_do}.load(blk);
    if constexpr (Traits::kDqStaged) {
      if (warp == 1) BwdDqWriter<Traits>::run(p, ss, blk);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int ctid = int(threadIdx.x) - Traits::kWgThreads;
  auto acc_dk = Mainloop::make_acc_kv();
  auto acc_dv = Mainloop::make_acc_kv();
  clear(acc_dk);
  clear(acc_dv);
  if (!blk.empty()) Mainloop(ss, pipe_q, pipe_do, ctid).run(p, blk, acc_dk, acc_dv);
  if constexpr (Opts::kDropout) scale_dropout_dv(p, acc_dv);
  BwdEpilogue<Traits>::store(kp, ss, blk.seq, blk.n_block, blk.head, blk.batch, acc_dk, acc_dv, ctid);
}

}  // namespace flashattn::cuda::sm90

// The load collectives of the sm90 backward: one producer warp issues the TMA loads of the CTA's K and V (once,
// completing on barrier_kv) and, per query block, of Q and of dO into two pipelines; the stats warp writes the
// query rows' LSE and D beside them, completing on the same stage barriers (BwdStatsLoad).
#pragma once

#include "cuda/sm90/bwd_traits.cuh"

namespace flashattn::cuda::sm90 {

// The key block a CTA owns and the query blocks [m_lo, m_hi) that see it.
template <class Traits, class Mask>
struct BwdBlock {
  int n_block, head, batch;
  BwdSeq seq;
  Mask mask;
  int n0, m_lo, m_hi;
  __device__ BwdBlock(const BwdParams& p, int n_block_, int head_, int batch_)
      : n_block(n_block_), head(head_), batch(batch_), seq(p, batch_), mask(p, seq), n0(n_block_ * Traits::kBlockN) {
    const QueryBlocks blocks = query_blocks(mask, seq, n0, Traits::kBlockN, Traits::kBlockM);
    m_lo = blocks.lo;
    m_hi = blocks.hi;
  }
  __device__ bool empty() const { return m_hi <= m_lo; }
  // Deterministic mode: how many key blocks add into query block m before this one (descending, last_key_block).
  __device__ int dq_turn(int m) const {
    return last_key_block(mask, seq, m * Traits::kBlockM, Traits::kBlockM, Traits::kBlockN) - n_block;
  }
};

template <class Traits, class Mask>
struct BwdLoad {
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;

  const BwdKernelParams<Traits>& kp;
  typename Traits::SharedStorage& ss;
  Pipeline& pipe_q;
  Pipeline& pipe_do;

  __device__ void load(const BwdBlock<Traits, Mask>& blk) {
    const BwdParams& p = kp.p;
    if (blk.empty()) return;
    const bool leader = threadIdx.x == 0;
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int b = varlen ? 0 : blk.batch;
    const int kv_head = blk.head / p.group;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});

    auto q_rows = make_coord(blk.seq.q_start, _0{});
    auto k_rows = make_coord(blk.seq.k_start, _0{});
    Tensor mQ = domain_offset(q_rows, kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, blk.head, b));
    Tensor mdO = domain_offset(q_rows, kp.tma_do.get_tma_tensor(kp.shape_do)(_, _, blk.head, b));
    Tensor mK = domain_offset(k_rows, kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, kv_head, b));
    Tensor mV = domain_offset(k_rows, kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, kv_head, b));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (M, d, m)
    Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(blk.n_block, _0{}));  // (N, d)
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(blk.n_block, _0{}));

    auto [tQg, tQs] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tdOg, tdOs] = tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    auto [tKg, tKs] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

    if (leader) {
      ss.barrier_kv.arrive_and_expect_tx(2 * Traits::kTileBytesKV);
      copy(kp.tma_k.with(reinterpret_cast<uint64_t&>(ss.barrier_kv)), tKg, tKs);
      copy(kp.tma_v.with(reinterpret_cast<uint64_t&>(ss.barrier_kv)), tVg, tVs);
    }
    PipelineState q_write = cutlass::make_producer_start_state<Pipeline>();
    PipelineState do_write = cutlass::make_producer_start_state<Pipeline>();
    for (int m = blk.m_lo; m < blk.m_hi; ++m) {
      pipe_q.producer_acquire(q_write);
      if (leader) {
        auto* bar = pipe_q.producer_get_barrier(q_write);
        copy(kp.tma_q.with(*bar), tQg(_, m), tQs(_, q_write.index()));
      }
      ++q_write;
      pipe_do.producer_acquire(do_write);
      if (leader) {
        auto* bar = pipe_do.producer_get_barrier(do_write);
        copy(kp.tma_do.with(*bar), tdOg(_, m), tdOs(_, do_write.index()));
      }
      ++do_write;
    }
  }
};

// The stats warp (a warp of the producer warpgroup): per query block, the rows' LSE (log2 units; 0 for a row that saw
// no key, whose scores are all masked) and D into the buffers of the block's Q and dO stages; then each lane arrives
// on both stages' full barriers, which expect these 32 arrivals beside the TMA producer's (bwd_kernel.cuh), so a
// consumer that waits for Q (dO) also has the LSE (D), and rows past the sequence read 0. (Not a TMA box: the rows of
// a varlen sequence, or of a batch of odd length, start at any 4-byte boundary. Not st.async either: it needs a
// cluster of two CTAs or more, compute-sanitizer memcheck.) The warp waits for a stage to be released as the TMA
// producer does. Loaded by the consumers a step ahead instead, the loads, conversion and stores cost each consumer
// thread about 45 instructions a step and a re-read of its thread index (S2R) that stalled the stores (ncu source
// counters, H100, d64 causal 1k: bench/results/2026-12-07_h100_session50/README.md).
template <class Traits, class Mask>
struct BwdStatsLoad {
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kChunks = kBlockM / 4;  // float4 chunks of one stage's LSE (or D)

  const BwdParams& p;
  typename Traits::SharedStorage& ss;
  Pipeline& pipe_q;
  Pipeline& pipe_do;

  // One float4 chunk (rows r0..r0 + 3 of the stage) of the LSE (kLse) or D; rows past the sequence read 0.
  template <bool kLse>
  __device__ void chunk(const float* src, int64_t stride, int q0, int len_q, float* dst) const {
    float v[4];
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) v[j] = q0 + j < len_q ? src[j * stride] : 0.f;
    if constexpr (kLse) {
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) v[j] = v[j] == -INFINITY ? 0.f : v[j] * kLog2e;
    }
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  }

  // Each lane's chunks are fixed for the block (block_q 64: lanes 0-15 the LSE's 16 chunks, 16-31 D's; block_q 128:
  // chunk `lane` of each), their row pointers advanced a query block a step. (A loop over chunks that picked LSE or
  // D per iteration kept both strides and pointers live: ptxas spilled 68 bytes at 24 registers, d128.)
  __device__ void load(const BwdBlock<Traits, Mask>& blk) {
    if (blk.empty()) return;
    static_assert(kChunks == 16 || kChunks == 32);
    const int lane = int(threadIdx.x) % cutlass::NumThreadsPerWarp;
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int c = kChunks == 32 ? lane : lane % 16, r0 = c * 4;
    const int64_t lse_row = p.lse_row;
    const float* lse_g = p.lse + (varlen ? int64_t(blk.seq.q_start) * lse_row : int64_t(blk.batch) * p.lse_batch) +
                         int64_t(blk.head) * p.lse_head + int64_t(blk.m_lo * kBlockM + r0) * lse_row;
    const float* dsum_g = p.dsum + int64_t(blk.head) * p.dsum_stride + blk.seq.q_row0 + blk.m_lo * kBlockM + r0;
    const int len_q = blk.seq.len_q;
    // Q's and dO's stages advance together (one of each per query block).
    PipelineState write = cutlass::make_producer_start_state<Pipeline>();
    for (int m = blk.m_lo; m < blk.m_hi; ++m) {
      pipe_q.producer_acquire(write);  // not the leader: waits for the stage's release only
      pipe_do.producer_acquire(write);
      const int q0 = m * kBlockM + r0, at = write.index() * kBlockM + r0;
      if (kChunks == 32 || lane < 16) chunk<true>(lse_g, lse_row, q0, len_q, ss.lse.data() + at);
      if (kChunks == 32 || lane >= 16) chunk<false>(dsum_g, 1, q0, len_q, ss.dsum.data() + at);
      mbarrier_arrive(pipe_q.producer_get_barrier(write));
      mbarrier_arrive(pipe_do.producer_get_barrier(write));
      ++write;
      lse_g += kBlockM * lse_row;
      dsum_g += kBlockM;
    }
  }
};

}  // namespace flashattn::cuda::sm90

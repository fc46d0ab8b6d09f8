// The load collective of the sm90 backward: one producer warp issues the TMA loads of the CTA's K and V (once,
// completing on barrier_kv) and, per query block, of Q and of dO into two pipelines. (The query rows' LSE and D
// are read by the consumers: a TMA box of them would start at any row of a varlen sequence, 4-byte aligned.)
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

}  // namespace flashattn::cuda::sm90

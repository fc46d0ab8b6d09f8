// What the backward kernels of both families read: the forward's parameters plus the gradients and the fp32
// workspace the host allocates per call (cudaMallocAsync on the caller's stream), sized by the plan (plan.cpp).
// Shared by host (.cpp) and device (.cu) code.
#pragma once

#include <cstdint>

#include "cuda/plan.hpp"
#include "cuda/fwd_params.hpp"

namespace flashattn::cuda {

struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t do_batch = 0, do_row = 0, do_head = 0;
  int64_t dq_batch = 0, dq_row = 0, dq_head = 0;
  int64_t dk_batch = 0, dk_row = 0, dk_head = 0;
  int64_t dv_batch = 0, dv_row = 0, dv_head = 0;

  float scale = 1.f;  // softmax scale (d logit / d raw score without softcap)
  int heads_kv = 0;
  // Rows of the fp32 workspace: batched batch * seqlen, varlen the rows of the tensor (global row index).
  int64_t rows_q = 0, rows_k = 0;

  // Workspace (fp32). dsum: D = rowsum(dO * O) per (query head, row), heads dsum_stride rows apart (rows_q rounded
  // up to 4, so that every head's rows start 16-byte aligned). dq_acc: dQ partial sums, one tile of
  // dq_tile floats per (split, query head, query block), each tile stored in the register order of the dQ MMA
  // (element i of thread t at i * threads + t) so that a warp's atomics hit 32 consecutive floats. Query block
  // m of sequence b is tile (q_row0_b + b * block_q) / block_q + m: sequences never share a tile, and
  // dq_blocks = rows_q / block_q + batch + 1 tiles per head cover every sequence. dq_splits > 1 only when
  // deterministic: split s is owned by one CTA per (head, batch) that visits key blocks s, s + splits, ... in
  // order and adds without atomics; the splits are summed in order afterwards (FA2's deterministic scheme).
  // dq_order (dq_ordered, the sm90 deterministic mode): one int per dQ tile (as dq_acc's tiles, without splits),
  // zeroed by the preprocess: how many key blocks have added into the tile so far. The CTA of key block n adds its
  // part of a tile once the higher key blocks that meet the tile have (last_key_block in bwd_common.cuh), then
  // counts itself, so the fp32 sums are formed in one order on every run.
  // dq_first_stores (the sm90 kernels that stage dQ, bwd_epilogue.cuh: BwdDqWriter): the first add into each dQ tile
  // is a plain store, so the preprocess does not zero dq_acc (a write of the whole accumulator, as long as reading
  // O and dO at d128). The first is turn 0 in deterministic mode (dq_order), otherwise the CTA that claims the tile:
  // dq_claim, one int per tile (as dq_order), zeroed by the preprocess: 0 untouched, 1 claimed, 2 stored. The dQ
  // postprocess writes zeros for a tile nobody stored (rows no key block meets).
  // dk_acc/dv_acc: per query head dK/dV for GQA (null when heads_q == heads_kv), reduced over each group in a
  // fixed order afterwards.
  float* dsum = nullptr;
  int64_t dsum_stride = 0;
  float* dq_acc = nullptr;
  float* dk_acc = nullptr;
  float* dv_acc = nullptr;
  int dq_splits = 1;
  int64_t dq_blocks = 0;
  int64_t dq_tile = 0;
  bool deterministic = false;
  bool dq_ordered = false;
  int* dq_order = nullptr;
  bool dq_first_stores = false;
  int* dq_claim = nullptr;
  float* dsinks = nullptr;  // the sinks' gradient (sink_grad.cu), optional
  int tail_pairs = 0;       // sm90: the last (head, batch) pairs whose CTAs run key block major (sm90/bwd_order.hpp)
};

// dsinks from the dsum workspace and lse, after the backward kernels (sm80/sink_grad.cu).
cudaError_t launch_sink_grad(const BwdParams& params, cudaStream_t stream);

// Workspace floats the backward needs for these parameters (dq_blocks, dq_tile, dq_splits set). Each section is
// rounded up to kWorkspaceAlign floats so that every section starts 256-byte aligned (vector stores).
constexpr int64_t kWorkspaceAlign = 64;
inline int64_t workspace_round(int64_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
struct BwdWorkspace {
  int64_t dsum = 0, dq_acc = 0, dq_order = 0, dq_claim = 0, dk_acc = 0, dv_acc = 0;        // dq_order, dq_claim: 4-byte
  int64_t total() const { return dsum + dq_acc + dq_order + dq_claim + dk_acc + dv_acc; }  // ints, counted as floats
};
inline int64_t dsum_stride(int64_t rows_q) { return (rows_q + 3) / 4 * 4; }
inline BwdWorkspace bwd_workspace(const BwdParams& p) {
  BwdWorkspace w;
  w.dsum = workspace_round(int64_t(p.heads_q) * p.dsum_stride);
  w.dq_acc = workspace_round(int64_t(p.dq_splits) * p.heads_q * p.dq_blocks * p.dq_tile);
  static_assert(sizeof(int) == sizeof(float));
  if (p.dq_ordered) w.dq_order = workspace_round(int64_t(p.heads_q) * p.dq_blocks);
  if (p.dq_first_stores && !p.dq_ordered) w.dq_claim = workspace_round(int64_t(p.heads_q) * p.dq_blocks);
  if (p.group > 1) {
    w.dk_acc = workspace_round(int64_t(p.heads_q) * p.rows_k * p.head_dim);
    w.dv_acc = workspace_round(int64_t(p.heads_q) * p.rows_k * p.head_dim_v);
  }
  return w;
}

}  // namespace flashattn::cuda

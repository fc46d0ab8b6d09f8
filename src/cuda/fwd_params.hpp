// What the forward kernels (sm80 and sm90) read: a plain struct built on the host from the validated Problem, passed by
// value as the kernel argument (no device allocation per call). Shared by host (.cpp) and device (.cu) code.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/descale.hpp"
#include "core/host_device.hpp"
#include "core/dropout.hpp"
#include "flashattn/flashattn.h"

namespace flashattn::cuda {

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // optional
  // Strides in elements. Batched: row (b, r, h) at b*batch + r*row + h*head; varlen: batch unused, row index
  // global (cu_seqlens[b] + r).
  int64_t q_batch = 0, q_row = 0, q_head = 0;
  int64_t k_batch = 0, k_row = 0, k_head = 0;
  int64_t v_batch = 0, v_row = 0, v_head = 0;
  int64_t o_batch = 0, o_row = 0, o_head = 0;
  int64_t lse_batch = 0, lse_row = 0, lse_head = 0;

  const int32_t* cu_seqlens_q = nullptr;  // both set: varlen
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;  // optional

  int batch = 0, heads_q = 0, group = 1;  // group = heads_q / heads_kv (GQA/MQA)
  int seqlen_q = 0, seqlen_k = 0;         // batched sizes; varlen: max_seqlen_q / max_seqlen_k
  int head_dim = 0, head_dim_v = 0;       // actual dims; the kernel's compiled dim may be larger (predicated)
  // Rows of the q and k/v tensors (batched: seqlen per batch entry; varlen: total rows): the extents of the
  // sm90 kernel's TMA descriptors.
  int64_t tensor_rows_q = 0, tensor_rows_k = 0;

  // Logits: s = logit_scale * (q.k) without softcap; with softcap c: s = c * tanh(q.k * scale / c), and
  // logit_scale = 1. The softmax runs in base 2: exp(s - m) = exp2(raw * scale_log2 - m * scale_log2).
  float softcap = 0.f;
  float softcap_in_scale = 0.f;  // scale / c
  float logit_scale = 1.f;
  float scale_log2 = 1.f;  // logit_scale * log2(e)

  bool bottom_right = true;                 // mask offset Sk - Sq (else 0)
  bool has_window = false;                  // causal or sliding window
  int window_left = -1, window_right = -1;  // -1 unbounded

  const float* alibi = nullptr;  // slopes, (Hq) or (B, Hq)
  int64_t alibi_batch_stride = 0;
  const float* sinks = nullptr;  // learnable sink logit per query head (natural-log units), optional
  // Dropout (the Dropout variants of both families): the mask rule of core/dropout.hpp, keyed by batch entry,
  // query head and the positions within the sequence.
  detail::DropoutRule dropout;

  // Paged K/V (sm90, plan.paged): key j of sequence b is slot j % page_size of page block_table[b *
  // block_table_stride + j / page_size]; k_batch / v_batch are then page strides and tensor_rows_k is page_size.
  // paged_box_rows: rows per TMA box, block_k (whole key blocks within one page) or kPageBoxRows (sm90/tiles.hpp);
  // paged_rows: the load gathers the rows with cp.async instead (page sizes that are no multiple of 16).
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int page_size = 0, num_pages = 0, paged_box_rows = 0;
  bool paged_rows = false;

  // Split-KV (sm90): each tile's key blocks divided into num_splits consecutive ranges, one CTA tile each; with
  // num_splits > 1 the epilogue writes normalised fp32 O and LSE partials (SplitPartials) instead of out/lse, and
  // a combine kernel merges them. At most kMaxKvSplits (the combine keeps each lane's kMaxKvSplits / 32 weights in
  // registers).
  static constexpr int kMaxKvSplits = 128;
  int num_splits = 1;
  float* lse_partial = nullptr;  // [split][head][row]
  float* o_partial = nullptr;    // [split][head][row][head_dim_v]
  int64_t partial_rows = 0;      // rows of the partials: batch * seqlen_q (batched) or total_q (varlen)
  // The merge fused into the sm90 forward (plan.fused_combine): one arrival counter per tile, zero at the launch and
  // left at zero; the tile's last arriving warpgroup merges its rows (sm90/fwd_epilogue.cuh). Null: the combine kernel.
  int* merge_counter = nullptr;

  // FP8 (sm90): the inputs' dequantisation factors (detail::Descale: factor of head h of batch entry b at
  // b * batch + (h / head_div) * head; null: 1), and V transposed into the plan's workspace by the launch
  // (sm90/fp8_v_transpose.cu): v_t[b][kv head][column][key], v_t_keys keys per row (a multiple of 16), the keys of
  // each 16 permuted as the P operand's registers hold them (fwd_traits.cuh, Fp8Operands).
  detail::Descale q_descale, k_descale, v_descale;
  void* v_t = nullptr;
  int64_t v_t_keys = 0;
};

// FP8's transposed V: where sequence b's keys start in a row of the copy. Batched calls have a row per batch entry
// (start 0). Varlen sequences share one row, each starting on a kVtSeqAlign boundary with its padding zeroed, so that
// no key block a kernel loads (block_k divides kVtSeqAlign) reaches into the next sequence's values.
constexpr int kVtSeqAlign = 384;  // a multiple of every FP8 block_k (sm90/tiles.hpp: 128, 192)
FA_HOST_DEVICE int64_t v_t_seq_start(const int32_t* cu_seqlens_k, int b) {
  return cu_seqlens_k == nullptr
             ? 0
             : int64_t(kVtSeqAlign) * ((int64_t(cu_seqlens_k[b]) + kVtSeqAlign - 1) / kVtSeqAlign + b);
}

}  // namespace flashattn::cuda

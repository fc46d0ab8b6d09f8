// The validated, normalised description of one attention call. validate.cpp builds it from the public
// params (one validation for every backend); backends read only this.
#pragma once

#include <cmath>
#include <limits>
#include <cstdint>
#include <string>
#include <vector>

#include "core/descale.hpp"
#include "core/dropout.hpp"
#include "core/mask_rule.hpp"
#include "flashattn/flashattn.h"

namespace flashattn::detail {

struct Error {
  fa_status code = FA_OK;
  std::string message;
  bool ok() const { return code == FA_OK; }
};

inline Error ok() { return {}; }
Error invalid(const std::string& argument, const std::string& rule);
Error unsupported(const std::string& what);
Error backend_error(const std::string& what);

// Where row r of head h of sequence b lives, in elements from the tensor's base pointer:
//   batched: b*batch + r*row + h*head;   varlen: (cu[b] + r)*row + h*head.
struct RowLayout {
  int64_t batch = 0, row = 0, head = 0;
  bool by_key = false;  // varlen rows indexed by cu_seqlens_k (k, v, dk, dv) rather than cu_seqlens_q
  bool paged = false;   // k, v of a paged call: `batch` is the page stride, rows go through the block table
};

// What a backend can take; the shared validation enforces it so that every backend reports the same way.
struct Requirements {
  int pointer_alignment_bytes = 0;  // 0: the element size
  int stride_bytes = 0;             // every non-unit stride a multiple of this many bytes (0: no rule)
  bool allows_float32 = true;
  const char* name = "cpu";
};

struct Problem {
  fa_dtype dtype = FA_FLOAT32;      // of q, k, v
  fa_dtype out_dtype = FA_FLOAT32;  // of out (and the backward's tensors): dtype, except bfloat16 for FP8 inputs
  fa_device device = FA_DEVICE_CPU;
  int device_index = 0;
  bool varlen = false;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  int64_t seqlen_q = 0, seqlen_k = 0;  // batched: the sizes; varlen: max_seqlen_q / max_seqlen_k
  int64_t total_q = 0, total_k = 0;    // rows of q / k over all sequences

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // optional in the forward
  RowLayout q_layout, k_layout, v_layout, out_layout, lse_layout;

  // Backward only.
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  RowLayout dout_layout, dq_layout, dk_layout, dv_layout;

  // Varlen offsets: device pointers as given, and host copies (always present once validated).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  std::vector<int32_t> host_cu_q, host_cu_k, host_used_k;

  // Paged K/V (flashattn.h): key j of sequence b is slot j % page_size of page block_table[b * block_table_stride
  // + j / page_size]; seqlen_k is max_pages * page_size. The table is device memory for CUDA calls (never read on
  // the host), host memory for CPU calls (validated there).
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0, page_size = 0, num_pages = 0, max_pages = 0;
  bool paged() const { return block_table != nullptr; }

  float scale = 1.f;
  float softcap = 0.f;
  bool causal = false;
  fa_causal_alignment alignment = FA_ALIGN_BOTTOM_RIGHT;
  int64_t window_left = -1, window_right = -1;  // causal folded in: window_right == 0
  const float* alibi = nullptr;
  int64_t alibi_batch_stride = 0;
  const float* sinks = nullptr;             // learnable sink logit per query head (flashattn.h, Semantics)
  float* dsinks = nullptr;                  // backward: their gradient (optional)
  DropoutRule dropout;                      // off unless dropout_p > 0
  Descale q_descale, k_descale, v_descale;  // FP8 only

  bool fp8() const { return dtype == FA_FLOAT8_E4M3; }

  int64_t group() const { return heads_q / heads_kv; }
  int64_t q_start(int64_t b) const { return varlen ? host_cu_q[b] : 0; }
  int64_t k_start(int64_t b) const { return varlen ? host_cu_k[b] : 0; }
  int64_t len_q(int64_t b) const { return varlen ? host_cu_q[b + 1] - host_cu_q[b] : seqlen_q; }
  int64_t len_k(int64_t b) const {
    int64_t n = varlen ? host_cu_k[b + 1] - host_cu_k[b] : seqlen_k;
    return host_used_k.empty() ? n : host_used_k[b];
  }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  // Element offset of (b, row r, head h) for a tensor with this layout.
  // (lse is (B, Hq, Sq) or (Hq, Tq); its RowLayout says so. Paged k/v read the block table: host memory, so CPU
  // calls and the reference only.)
  int64_t offset(const RowLayout& l, int64_t b, int64_t r, int64_t h) const {
    if (l.paged) {
      const int64_t page = block_table[b * block_table_stride + r / page_size];
      return page * l.batch + (r % page_size) * l.row + h * l.head;
    }
    if (!varlen) return b * l.batch + r * l.row + h * l.head;
    return (int64_t(l.by_key ? host_cu_k[b] : host_cu_q[b]) + r) * l.row + h * l.head;
  }
  float alibi_slope(int64_t b, int64_t h) const { return alibi ? alibi[b * alibi_batch_stride + h] : 0.f; }
  // The sink logit of query head h; -inf (no sink) without sinks.
  float sink(int64_t h) const { return sinks ? sinks[h] : -std::numeric_limits<float>::infinity(); }
};

// The mask of one sequence with (len_q, len_k): the rule of core/mask_rule.hpp, shared with the CUDA kernels.
using KeyRange = IndexRange<int64_t>;
inline MaskRule<int64_t> mask_rule(const Problem& p, int64_t len_q, int64_t len_k) {
  return MaskRule<int64_t>::make(p.alignment == FA_ALIGN_BOTTOM_RIGHT, p.window_left, p.window_right, len_q, len_k);
}
inline int64_t mask_offset(const Problem& p, int64_t len_q, int64_t len_k) {
  return mask_rule(p, len_q, len_k).diag_off;
}
// Key range [lo, hi) visible to query row i of a sequence with (len_q, len_k); empty when lo >= hi.
inline KeyRange visible_keys(const Problem& p, int64_t i, int64_t len_q, int64_t len_k) {
  return mask_rule(p, len_q, len_k).visible(i);
}

// fa_quantize_fp8 (flashattn.h), validated: x (B, S, H, D) -> out e4m3 (B, S, H, D), descale (B, H).
struct QuantizeProblem {
  fa_dtype dtype = FA_FLOAT32;  // of x
  fa_device device = FA_DEVICE_CPU;
  int device_index = 0;
  int64_t batch = 0, seqlen = 0, heads = 0, dim = 0;
  const void* x = nullptr;
  uint8_t* out = nullptr;
  float* descale = nullptr;
  int64_t x_batch = 0, x_row = 0, x_head = 0;  // element strides (the last one is 1)
  int64_t out_batch = 0, out_row = 0, out_head = 0;
  int64_t descale_batch = 0, descale_head = 0;
  bool hadamard = false;
  uint64_t seed = 0;
};
Error validate_quantize(const fa_quantize_params& params, QuantizeProblem* problem);

// fa_merge_partials (flashattn.h), validated: rows (batch, position) x heads of out (read and written) and out_b,
// their log-sum-exps in lse and lse_b. Element strides; varlen tensors have batch 1 and stride 0 there.
struct MergeProblem {
  fa_device device = FA_DEVICE_CPU;
  int device_index = 0;
  fa_dtype out_dtype = FA_FLOAT32, out_b_dtype = FA_FLOAT32;
  int64_t batch = 0, seqlen = 0, heads = 0, dim = 0;
  void* out = nullptr;
  const void* out_b = nullptr;
  float* lse = nullptr;
  const float* lse_b = nullptr;
  int64_t out_batch = 0, out_row = 0, out_head = 0;  // the last stride is 1
  int64_t out_b_batch = 0, out_b_row = 0, out_b_head = 0;
  int64_t lse_batch = 0, lse_head = 0, lse_row = 0;
  int64_t lse_b_batch = 0, lse_b_head = 0, lse_b_row = 0;
};
Error validate_merge(const fa_merge_params& params, MergeProblem* problem);

// fa_kvcache_append (flashattn.h), validated. Strides in elements, (outer, row, head) of each 4-D tensor (the last
// one is 1); paged: cache "rows" are pages and rows_per_page their slots.
struct KvcacheProblem {
  fa_dtype dtype = FA_FLOAT32;
  fa_device device = FA_DEVICE_CPU;
  int device_index = 0;
  int64_t batch = 0, new_tokens = 0, heads_kv = 0, dim = 0, dim_v = 0;
  int64_t capacity = 0;  // positions per sequence
  bool paged = false;
  int64_t page_size = 0, max_pages = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kc_stride[3] = {0, 0, 0}, vc_stride[3] = {0, 0, 0}, k_stride[3] = {0, 0, 0}, v_stride[3] = {0, 0, 0};
  const int32_t* seqlens = nullptr;
  int64_t seqlens_stride = 0;
  const int32_t* batch_idx = nullptr;  // contiguous only; null: sequence b writes row b
  int64_t batch_idx_stride = 0;
  const int32_t* block_table = nullptr;
  int64_t table_row = 0, table_col = 0;
  // Rotary: rot_half = rotary_dim / 2 column pairs (0: none).
  int64_t rot_half = 0, rot_rows = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t cos_row = 0, sin_row = 0;
  bool interleaved = true, q_per_token = false;
  void* q = nullptr;  // optional, rotated in place
  int64_t seqlen_q = 0, heads_q = 0;
  int64_t q_stride[3] = {0, 0, 0};
};
Error validate_kvcache(const fa_kvcache_params& params, KvcacheProblem* problem);

enum class Direction { kForward, kBackward };

// The one validation. `req` carries what the chosen backend accepts; for CUDA tensors the caller passes
// host copies of cu_seqlens/seqused_k (the validation needs their values).
Error validate(const fa_attention& attn, const fa_tensor& out, const fa_tensor& lse, const fa_tensor* dout,
               const fa_tensor* dq, const fa_tensor* dk, const fa_tensor* dv, Direction dir, const Requirements& req,
               const int32_t* host_cu_q, const int32_t* host_cu_k, const int32_t* host_used_k, Problem* problem,
               const fa_tensor* dsinks = nullptr);

}  // namespace flashattn::detail

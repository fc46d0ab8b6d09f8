// Device pieces both backward families share (sm80 FlashAttention-2 and sm90 FlashAttention-3 designs): the
// sequence a key block belongs to, the query rows a key block meets under each mask policy, and the kernels
// around the main one: the preprocess (D = rowsum(dO * O), the sm90 kernel's LSE in log2 units, the zeroed dQ
// accumulator) and the GQA reduction of per-query-head dK/dV.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/bwd_params.hpp"
#include "cuda/common/fwd_policies.cuh"

namespace flashattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): the forward's LSE is a natural log

// ------------------------------------------------------------------------------------------- sequences, masks
// The forward's SeqInfo plus the keys stored for the sequence: keys past seqused_k get zero gradients.
struct BwdSeq : SeqInfo {
  int rows_k;
  int64_t q_row0, k_row0;  // global row of the first query / key (fp32 workspace rows)
  __device__ BwdSeq(const BwdParams& p, int b) : SeqInfo(p, b) {
    const bool varlen = p.cu_seqlens_q != nullptr;
    rows_k = varlen ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
    len_k = min(len_k, rows_k);
    q_row0 = varlen ? int64_t(q_start) : int64_t(b) * p.seqlen_q;
    k_row0 = varlen ? int64_t(k_start) : int64_t(b) * p.seqlen_k;
  }
};

struct RowRange {
  int lo, hi;  // query rows [lo, hi)
};
// Query rows that see at least one key of [n0, n0 + block_n) (block skipping of the backward's loop). Host and
// device: tests/gpu/mask_policy_test.cu checks the block arithmetic below on the host.
__host__ __device__ inline RowRange query_rows(const KeyLengthMask& m, const SeqInfo& s, int n0, int /*block_n*/) {
  return n0 < m.len_k ? RowRange{0, s.len_q} : RowRange{0, 0};
}
// The mask rule read the other way: the rows i whose keys [i + off - left, i + off + right] meet the block.
__host__ __device__ inline RowRange query_rows(const WindowMask& m, const SeqInfo& s, int n0, int block_n) {
  const detail::MaskRule<int>& r = m.rule;
  if (n0 >= r.len_k) return {0, 0};
  const int last_key = min(n0 + block_n, r.len_k) - 1;
  const int lo = r.right >= 0 ? max(0, n0 - r.diag_off - r.right) : 0;
  const int hi = r.left >= 0 ? min(s.len_q, last_key - r.diag_off + r.left + 1) : s.len_q;
  return {lo, max(lo, hi)};
}
// The query blocks of block_m rows that the CTA of the key block at n0 walks: those holding a row of query_rows
// (none when it is empty).
struct QueryBlocks {
  int lo, hi;  // query blocks [lo, hi)
};
template <class Mask>
__host__ __device__ inline QueryBlocks query_blocks(const Mask& m, const SeqInfo& s, int n0, int block_n, int block_m) {
  const RowRange rows = query_rows(m, s, n0, block_n);
  const int lo = rows.lo / block_m;
  return {lo, rows.hi > rows.lo ? (rows.hi + block_m - 1) / block_m : lo};
}

// The last key block whose CTA walks query block m (rows [m0, m0 + block_m) of s): the forward's block range of the
// block's rows read as query_rows' inverse (its lo < the last row's end), so both name the same key blocks. Those
// are consecutive, since query_rows' bounds never decrease from one key block to the next; the sm90 deterministic
// mode adds a dQ tile in descending key-block order, the CTA of key block n (last_key_block - n)-th. The rows are
// the block's real ones: past len_q a key block's rows can be empty although the row bound says it meets the block.
template <class Mask>
__host__ __device__ inline int last_key_block(const Mask& mask, const SeqInfo& s, int m0, int block_m, int block_n) {
  return mask.blocks(m0, min(block_m, s.len_q - m0), block_n).hi - 1;
}

// ------------------------------------------------------------------------------------------- pre/postprocess
template <fa_dtype>
struct Native;
template <>
struct Native<FA_FLOAT16> {
  using T = __half;
  using T2 = __half2;
  static __device__ float2 to_float2(T2 x) { return __half22float2(x); }
  static __device__ T2 from_float2(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Native<FA_BFLOAT16> {
  using T = __nv_bfloat16;
  using T2 = __nv_bfloat162;
  static __device__ float2 to_float2(T2 x) { return __bfloat1622float2(x); }
  static __device__ T2 from_float2(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

constexpr int kAuxThreads = 256;  // preprocess / postprocess block size

// Element offset of global row g of a batched (g = b * seqlen + r) or varlen (g = global row) tensor.
__device__ inline int64_t global_row_offset(bool varlen, int64_t g, int64_t seqlen, int64_t batch_stride,
                                            int64_t row_stride) {
  return varlen ? g * row_stride : (g / seqlen) * batch_stride + (g % seqlen) * row_stride;
}

// D = rowsum(dO * O) in fp32 for every (query head, global row), kPreRowThreads threads per row reading 16-byte
// vectors; the same threads zero the fp32 dQ workspace (dq_floats of it: none where a tile's first add stores,
// dq_first_stores), as FA2 does, instead of a memset behind the kernel, and the dQ tiles' order counters or claims
// where there are any (dq_order, dq_claim). One warp per row with 4-byte
// loads, plus the memset, took 170 us where FA2 takes 73 at d64 and 16k tokens (H200,
// bench/results/2026-11-30_sm80_tiles/run5_profile_bwd.txt).
constexpr int kPreRowThreads = 8;
template <fa_dtype kDtype>
__global__ void __launch_bounds__(kAuxThreads) preprocess_kernel(const BwdParams p, int64_t dq_floats) {
  using N = Native<kDtype>;
  using T2 = typename N::T2;
  constexpr int kVec = int(sizeof(uint4) / sizeof(typename N::T));
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  float4* dq4 = reinterpret_cast<float4*>(p.dq_acc);  // 16-byte aligned workspace section
  for (int64_t i = t; i < dq_floats / 4; i += threads) dq4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (t < dq_floats % 4) p.dq_acc[dq_floats / 4 * 4 + t] = 0.f;
  for (int* tiles : {p.dq_order, p.dq_claim})
    if (tiles != nullptr)
      for (int64_t i = t; i < int64_t(p.heads_q) * p.dq_blocks; i += threads) tiles[i] = 0;

  const int64_t w = t / kPreRowThreads;
  const int sub = int(t % kPreRowThreads);
  const bool live = w < int64_t(p.heads_q) * p.rows_q;  // the shuffles below need every lane, live or not
  float acc = 0.f;
  if (live) {
    const int h = int(w / p.rows_q);
    const int64_t g = w % p.rows_q;
    const bool varlen = p.cu_seqlens_q != nullptr;
    const auto* o = static_cast<const typename N::T*>(p.out) +
                    global_row_offset(varlen, g, p.seqlen_q, p.o_batch, p.o_row) + int64_t(h) * p.o_head;
    const auto* d = static_cast<const typename N::T*>(p.dout) +
                    global_row_offset(varlen, g, p.seqlen_q, p.do_batch, p.do_row) + int64_t(h) * p.do_head;
    // Rows start 16-byte aligned and head_dim_v is a multiple of 8 (the backend's requirements).
    for (int c = sub * kVec; c < p.head_dim_v; c += kPreRowThreads * kVec) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + c), e = *reinterpret_cast<const uint4*>(d + c);
      const T2* a2 = reinterpret_cast<const T2*>(&a);
      const T2* e2 = reinterpret_cast<const T2*>(&e);
      CUTE_UNROLL
      for (int j = 0; j < kVec / 2; ++j) {
        const float2 x = N::to_float2(a2[j]), y = N::to_float2(e2[j]);
        acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
      }
    }
  }
  for (int m = kPreRowThreads / 2; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (live && sub == 0) p.dsum[w / p.rows_q * p.dsum_stride + w % p.rows_q] = acc;
}

// Rows of the workspace that belong to a sequence (varlen tensors may hold rows past the last sequence).
__device__ inline int64_t live_rows(const int32_t* cu, int batch, int64_t rows) { return cu ? cu[batch] : rows; }

// GQA: dK/dV of kv head hk = sum over its group of query heads, in ascending head order (deterministic).
template <fa_dtype kDtype>
__global__ void __launch_bounds__(kAuxThreads) dkdv_reduce_kernel(const BwdParams p) {
  using N = Native<kDtype>;
  const int width = max(p.head_dim, p.head_dim_v) / 2;  // column pairs
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(p.heads_kv) * p.rows_k * width) return;
  const int64_t w = idx / width;
  const int c = int(2 * (idx % width));
  const int hk = int(w / p.rows_k);
  const int64_t g = w % p.rows_k;
  if (g >= live_rows(p.cu_seqlens_k, p.batch, p.rows_k)) return;
  const bool varlen = p.cu_seqlens_k != nullptr;
  // Columns c, c + 1 of one gradient: its per-query-head fp32 rows (dim floats each) summed over the group.
  auto reduce = [&](const float* acc, int dim, void* out, int64_t batch_stride, int64_t row_stride,
                    int64_t head_stride) {
    if (c >= dim) return;
    float a = 0.f, e = 0.f;
    for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
      const float* src = acc + (int64_t(h) * p.rows_k + g) * dim + c;
      a += src[0];
      e += src[1];
    }
    auto* dst = static_cast<typename N::T*>(out) + global_row_offset(varlen, g, p.seqlen_k, batch_stride, row_stride) +
                int64_t(hk) * head_stride + c;
    *reinterpret_cast<typename N::T2*>(dst) = N::from_float2(a, e);
  };
  reduce(p.dk_acc, p.head_dim, p.dk, p.dk_batch, p.dk_row, p.dk_head);
  reduce(p.dv_acc, p.head_dim_v, p.dv, p.dv_batch, p.dv_row, p.dv_head);
}

inline unsigned aux_blocks(int64_t threads) { return unsigned((threads + kAuxThreads - 1) / kAuxThreads); }

// D and the zeroed dQ workspace (its dq_splits * heads_q * dq_blocks * dq_tile floats; none with dq_first_stores).
template <fa_dtype kDtype>
cudaError_t launch_preprocess(const BwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.heads_q) * p.rows_q;
  const int64_t dq_floats = p.dq_first_stores ? 0 : int64_t(p.dq_splits) * p.heads_q * p.dq_blocks * p.dq_tile;
  if (rows == 0 && dq_floats == 0) return cudaSuccess;
  preprocess_kernel<kDtype>
      <<<aux_blocks(std::max<int64_t>(rows * kPreRowThreads, 1)), kAuxThreads, 0, stream>>>(p, dq_floats);
  return cudaGetLastError();
}

// GQA: per-query-head dK/dV (fp32 workspace) summed over each group into dk/dv.
template <fa_dtype kDtype>
cudaError_t launch_dkdv_reduce(const BwdParams& p, cudaStream_t stream) {
  if (p.group > 1) {
    const int64_t n = int64_t(p.heads_kv) * p.rows_k * (std::max(p.head_dim, p.head_dim_v) / 2);
    if (n > 0) dkdv_reduce_kernel<kDtype><<<aux_blocks(n), kAuxThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace flashattn::cuda

// Backward of the sm80 backend: the FlashAttention-2 algorithm (Dao 2023, Alg. 2) in four kernels.
//   1. preprocess: D = rowsum(dO * O) per (query head, row) in fp32; zeroes the fp32 dQ accumulator.
//   2. main (dkdv_kernel): grid = key blocks x query heads x batch. K/V of the block stay in shared memory and
//      dK/dV in accumulator fragments (registers) while the CTA walks the query blocks that can see the block
//      (causal/window block skipping); per step P is recomputed from Q K^T and the saved LSE, dP = dO V^T,
//      dS = P (dP - D) times d logit / d raw score (scale, softcap derivative), dV += P^T dO, dK += dS^T Q, and
//      dQ += dS K goes into the fp32 accumulator with atomicAdd.
//   3. deterministic mode: the main kernel skips dQ and dq_kernel (grid = query blocks) recomputes P/dS and
//      sums dQ in registers over the key blocks in a fixed order: bit-identical results run to run.
//   4. postprocess: dQ accumulator -> output dtype; GQA: the per-query-head fp32 dK/dV summed over each group in
//      a fixed order -> output dtype.
// The five GEMMs of a step run on tensor cores (mma.sync m16n8k16, fp32 accumulation) through nvcuda::wmma
// 16x16x16 fragments read from padded shared-memory tiles; transposed operands (K^T, V^T, P^T, dS^T) are the same
// tiles read as column-major fragments, so nothing is transposed in memory. P and dS are rounded to the storage
// dtype for their MMAs (as FA2 does); S, dP and every accumulator stay fp32. Any head dim that is a multiple of 8
// up to the compiled one runs by zero-filled shared-memory columns and predicated stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/sm80/bwd_params.hpp"
#include "cuda/sm80/tiles.hpp"

namespace flashattn::cuda::sm80 {
namespace bwd {

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

constexpr int kWarpSize = 32;
constexpr int kVecElems = 8;  // one 16-byte vector of fp16/bf16 (pointers and strides are 16-byte aligned)

// 8 floats -> one 16-byte vector of the storage dtype.
template <fa_dtype kDtype>
__device__ inline uint4 pack8(const float* f) {
  using N = Native<kDtype>;
  uint4 v;
  auto* pairs = reinterpret_cast<typename N::T2*>(&v);
#pragma unroll
  for (int e = 0; e < kVecElems / 2; ++e) pairs[e] = N::from_float2(f[2 * e], f[2 * e + 1]);
  return v;
}
// One sequence of the batch: row ranges (global rows index the fp32 workspace), key length after seqused_k,
// and the diagonal offset of the masks.
struct SeqInfo {
  int64_t q_row0 = 0, k_row0 = 0;  // global row of the sequence's first query / key
  int len_q = 0, len_k = 0;        // len_k: keys used (seqused_k), the only keys that get gradient
  int rows_k = 0;                  // keys stored for the sequence (>= len_k); gradients written for all
  int off = 0;                     // mask diagonal: query i sits at key i + off
  bool varlen = false;
  int b = 0;
  __device__ SeqInfo(const BwdParams& p, int batch) : b(batch) {
    varlen = p.cu_seqlens_q != nullptr;
    if (varlen) {
      q_row0 = p.cu_seqlens_q[b];
      len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      k_row0 = p.cu_seqlens_k[b];
      rows_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    } else {
      q_row0 = int64_t(b) * p.seqlen_q;
      len_q = p.seqlen_q;
      k_row0 = int64_t(b) * p.seqlen_k;
      rows_k = p.seqlen_k;
    }
    len_k = p.seqused_k != nullptr ? min(p.seqused_k[b], rows_k) : rows_k;
    off = p.bottom_right ? len_k - len_q : 0;
  }
  // Element offset of row r (of this sequence) of head h in a tensor with these strides.
  __device__ int64_t q_offset(int64_t batch_stride, int64_t row_stride, int64_t head_stride, int r, int h) const {
    return varlen ? (q_row0 + r) * row_stride + int64_t(h) * head_stride
                  : int64_t(b) * batch_stride + int64_t(r) * row_stride + int64_t(h) * head_stride;
  }
  __device__ int64_t k_offset(int64_t batch_stride, int64_t row_stride, int64_t head_stride, int r, int h) const {
    return varlen ? (k_row0 + r) * row_stride + int64_t(h) * head_stride
                  : int64_t(b) * batch_stride + int64_t(r) * row_stride + int64_t(h) * head_stride;
  }
};

// Mask policy: which (query i, key j) pairs of a sequence are visible (keys past seqused_k never are), and the
// query/key ranges a block can see (block skipping for causal and sliding windows).
struct Visibility {
  int len_q, len_k, off, left, right;  // left/right < 0: unbounded side
  __device__ Visibility(const BwdParams& p, const SeqInfo& s)
      : len_q(s.len_q), len_k(s.len_k), off(s.off), left(p.has_window ? p.window_left : -1),
        right(p.has_window ? p.window_right : -1) {}
  __device__ bool operator()(int i, int j) const {
    if (i >= len_q || j >= len_k) return false;
    const int diag = i + off;
    return (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
  }
  // Query rows [begin, end) that see at least one key of [n0, n0 + block_n).
  __device__ int2 query_range(int n0, int block_n) const {
    int begin = 0, end = len_q;
    if (n0 >= len_k) return make_int2(0, 0);
    if (right >= 0) begin = max(begin, n0 - off - right);
    if (left >= 0) end = min(end, n0 + block_n - 1 - off + left + 1);
    return make_int2(begin, max(begin, end));
  }
  // Keys [begin, end) that rows [m0, m0 + rows) can see.
  __device__ int2 key_range(int m0, int rows) const {
    int begin = 0, end = len_k;
    if (left >= 0) begin = max(begin, m0 + off - left);
    if (right >= 0) end = min(end, m0 + rows - 1 + off + right + 1);
    return make_int2(begin, max(begin, end));
  }
};

// Copies rows [0, rows_valid) x columns [0, cols_valid) of a global tile into shared memory (pitch kPitch) in
// 16-byte vectors; everything else (rows past the sequence, columns past the head dim) becomes zero, so the dot
// products over the compiled head dim need no predicates.
template <class Tr, int kRows, class T>
__device__ void load_tile(T* smem, const T* gmem, int64_t row_stride, int rows_valid, int cols_valid) {
  constexpr int kChunks = (Tr::kPitch - kVecElems) / kVecElems;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += Tr::kThreads) {
    const int r = idx / kChunks, ch = idx % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows_valid && ch * kVecElems < cols_valid)
      v = *reinterpret_cast<const uint4*>(gmem + int64_t(r) * row_stride + ch * kVecElems);
    *reinterpret_cast<uint4*>(smem + r * Tr::kPitch + ch * kVecElems) = v;
  }
}

// Loads LSE and D of query rows [m0, m0 + kBlockM); rows past the sequence get LSE = -inf (P = 0).
template <class Tr>
__device__ void load_row_stats(const BwdParams& p, const SeqInfo& s, int h, int m0, float* lse, float* dsum) {
  for (int r = threadIdx.x; r < Tr::kBlockM; r += Tr::kThreads) {
    const int i = m0 + r;
    const bool valid = i < s.len_q;
    lse[r] = valid ? p.lse[s.q_offset(p.lse_batch, p.lse_row, p.lse_head, i, h)] : -INFINITY;
    dsum[r] = valid ? p.dsum[int64_t(h) * p.rows_q + s.q_row0 + i] : 0.f;
  }
}

__device__ inline float alibi_slope(const BwdParams& p, int b, int h) {
  return p.alibi != nullptr ? p.alibi[int64_t(b) * p.alibi_batch_stride + h] : 0.f;
}

namespace wmma = nvcuda::wmma;
constexpr int kFrag = 16;

template <int kHeadDim>
struct Traits {
  static constexpr BwdTiles kTiles = bwd_tiles(kHeadDim);
  static constexpr int kBlockM = kTiles.block_q;
  static constexpr int kBlockN = kTiles.block_k;
  static constexpr int kThreads = kTiles.threads;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kPitch = kHeadDim + kVecElems;       // storage-dtype tiles (multiple of 8: wmma ldm rule)
  static constexpr int kScorePitch = kBlockN + 4;           // fp32 S / dP (multiple of 4: wmma ldm rule)
  static constexpr int kProbPitch = kBlockN + kVecElems;    // storage-dtype P / dS
  static constexpr int kAccPitch = kHeadDim + 4;            // fp32 staging of dQ / dK / dV fragments
  static constexpr int kScoreJobs = 2 * (kBlockM / kFrag) * (kBlockN / kFrag);  // S and dP output fragments
  static constexpr int kKeyTiles = (kBlockN / kFrag) * (kHeadDim / kFrag);      // dK or dV fragments of a CTA
  static constexpr int kKeyTilesPerWarp = kKeyTiles / kWarps;
  static constexpr int kRowTiles = (kBlockM / kFrag) * (kHeadDim / kFrag);      // dQ fragments of a CTA
  static constexpr int kRowTilesPerWarp = kRowTiles / kWarps;
  static_assert(kKeyTiles % kWarps == 0 && kRowTiles % kWarps == 0, "fragments must split evenly over warps");
  static_assert(kBlockM == kBlockN, "dK/dV are staged in the dQ staging area (kBlockM rows)");
  static constexpr int kFloatRegion = 2 * kBlockM * kScorePitch > kBlockM * kAccPitch ? 2 * kBlockM * kScorePitch
                                                                                      : kBlockM * kAccPitch;
  static constexpr int kSmemBytes = (2 * kBlockM + 2 * kBlockN) * kPitch * 2 + 2 * kBlockM * kProbPitch * 2 +
                                    kFloatRegion * 4 + 2 * kBlockM * 4;
};

template <class T, int kHeadDim>
struct Smem {
  using Tr = Traits<kHeadDim>;
  T* q;
  T* dout;
  T* k;
  T* v;
  T* p;        // [kBlockM][kProbPitch] probabilities (storage dtype)
  T* ds;       // [kBlockM][kProbPitch] raw-score gradients (storage dtype)
  float* s;    // [kBlockM][kScorePitch] raw scores Q.K^T
  float* dp;   // [kBlockM][kScorePitch] dO.V^T
  float* acc;  // [kBlockM][kAccPitch] fragment staging; aliases s/dp (used only after they are consumed)
  float* lse;
  float* dsum;
  __device__ explicit Smem(unsigned char* base) {
    q = reinterpret_cast<T*>(base);
    dout = q + Tr::kBlockM * Tr::kPitch;
    k = dout + Tr::kBlockM * Tr::kPitch;
    v = k + Tr::kBlockN * Tr::kPitch;
    p = v + Tr::kBlockN * Tr::kPitch;
    ds = p + Tr::kBlockM * Tr::kProbPitch;
    s = reinterpret_cast<float*>(ds + Tr::kBlockM * Tr::kProbPitch);
    dp = s + Tr::kBlockM * Tr::kScorePitch;
    acc = s;
    lse = s + Tr::kFloatRegion;
    dsum = lse + Tr::kBlockM;
  }
};

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major>;
template <class T>
using FragAT = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::col_major>;
template <class T>
using FragB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::row_major>;
template <class T>
using FragBT = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// S = Q K^T and dP = dO V^T of the step into fp32 shared memory (one 16x16 output fragment per job).
template <class T, int kHeadDim>
__device__ void mma_scores(const Smem<T, kHeadDim>& sm) {
  using Tr = Traits<kHeadDim>;
  constexpr int kTilesN = Tr::kBlockN / kFrag, kPerMatrix = Tr::kScoreJobs / 2;
  for (int job = threadIdx.x / kWarpSize; job < Tr::kScoreJobs; job += Tr::kWarps) {
    const bool is_dp = job >= kPerMatrix;
    const int tile = job % kPerMatrix, tm = tile / kTilesN, tn = tile % kTilesN;
    const T* a = (is_dp ? sm.dout : sm.q) + tm * kFrag * Tr::kPitch;
    const T* b = (is_dp ? sm.v : sm.k) + tn * kFrag * Tr::kPitch;
    FragC c;
    wmma::fill_fragment(c, 0.f);
#pragma unroll 4
    for (int kk = 0; kk < kHeadDim; kk += kFrag) {
      FragA<T> fa;
      FragBT<T> fb;  // K^T (V^T): K rows read as a column-major B operand
      wmma::load_matrix_sync(fa, a + kk, Tr::kPitch);
      wmma::load_matrix_sync(fb, b + kk, Tr::kPitch);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync((is_dp ? sm.dp : sm.s) + tm * kFrag * Tr::kScorePitch + tn * kFrag, c, Tr::kScorePitch,
                            wmma::mem_row_major);
  }
}

// P and dS from S, dP, LSE and D (same math as scores_and_grads), rounded to the storage dtype.
template <fa_dtype kDtype, int kHeadDim>
__device__ void mma_probs(const BwdParams& p, const SeqInfo& s, const Visibility& vis, float slope, int m0, int n0,
                          const Smem<typename Native<kDtype>::T, kHeadDim>& sm) {
  using Tr = Traits<kHeadDim>;
  using T = typename Native<kDtype>::T;
  for (int idx = threadIdx.x; idx < Tr::kBlockM * Tr::kBlockN; idx += Tr::kThreads) {
    const int r = idx / Tr::kBlockN, jl = idx % Tr::kBlockN, i = m0 + r, j = n0 + jl;
    const float raw = sm.s[r * Tr::kScorePitch + jl], lse = sm.lse[r];
    float logit, dlogit;
    if (p.softcap > 0.f) {
      const float th = tanhf(raw * p.softcap_in_scale);
      logit = p.softcap * th;
      dlogit = p.scale * (1.f - th * th);
    } else {
      logit = raw * p.scale;
      dlogit = p.scale;
    }
    logit -= slope * fabsf(float(i + s.off - j));
    const bool live = vis(i, j) && lse != -INFINITY;
    const float prob = live ? expf(logit - lse) : 0.f;
    const float ds = prob != 0.f ? prob * (sm.dp[r * Tr::kScorePitch + jl] - sm.dsum[r]) * dlogit : 0.f;
    sm.p[r * Tr::kProbPitch + jl] = T(prob);
    sm.ds[r * Tr::kProbPitch + jl] = T(ds);
  }
}

// acc (rows x kHeadDim output, fragments tile = warp + kWarps * x) += A(rows x inner) * B(inner x kHeadDim), A
// read transposed (col-major) when kTransposeA. Used for dV += P^T dO, dK += dS^T Q, dQ += dS K.
template <class T, int kHeadDim, bool kTransposeA, int kTiles, int kInner>
__device__ void mma_accumulate(FragC (&acc)[kTiles], const T* a, int lda, const T* b) {
  using Tr = Traits<kHeadDim>;
  constexpr int kTilesC = kHeadDim / kFrag;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int x = 0; x < kTiles; ++x) {
    const int tile = warp + Tr::kWarps * x, tr = tile / kTilesC, tc = tile % kTilesC;
#pragma unroll
    for (int kk = 0; kk < kInner; kk += kFrag) {
      FragB<T> fb;
      wmma::load_matrix_sync(fb, b + kk * Tr::kPitch + tc * kFrag, Tr::kPitch);
      if constexpr (kTransposeA) {
        FragAT<T> fa;  // element (row, kk) of A^T lives at a[kk * lda + row]
        wmma::load_matrix_sync(fa, a + kk * lda + tr * kFrag, lda);
        wmma::mma_sync(acc[x], fa, fb, acc[x]);
      } else {
        FragA<T> fa;
        wmma::load_matrix_sync(fa, a + tr * kFrag * lda + kk, lda);
        wmma::mma_sync(acc[x], fa, fb, acc[x]);
      }
    }
  }
}

// Stages fragments into sm.acc (fp32, row-major kBlockM x kHeadDim).
template <class T, int kHeadDim, int kTiles>
__device__ void stage_fragments(const Smem<T, kHeadDim>& sm, const FragC (&acc)[kTiles]) {
  using Tr = Traits<kHeadDim>;
  constexpr int kTilesC = kHeadDim / kFrag;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int x = 0; x < kTiles; ++x) {
    const int tile = warp + Tr::kWarps * x, tr = tile / kTilesC, tc = tile % kTilesC;
    wmma::store_matrix_sync(sm.acc + tr * kFrag * Tr::kAccPitch + tc * kFrag, acc[x], Tr::kAccPitch,
                            wmma::mem_row_major);
  }
}

// Writes staged rows [0, rows) x columns [0, cols) to a storage-dtype tensor (row pointer by row index) or
// to an fp32 buffer, in 8-element chunks.
template <fa_dtype kDtype, int kHeadDim, class RowPtr>
__device__ void write_staged(const float* staged, int rows, int cols, RowPtr row_ptr) {
  using Tr = Traits<kHeadDim>;
  constexpr int kChunks = kHeadDim / kVecElems;
  for (int idx = threadIdx.x; idx < Tr::kBlockM * kChunks; idx += Tr::kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * kVecElems;
    if (r < rows && c < cols) row_ptr(r, c, staged + r * Tr::kAccPitch + c);
  }
}

template <fa_dtype kDtype, int kHeadDim, bool kAtomicDq>
__global__ void __launch_bounds__(Traits<kHeadDim>::kThreads) dkdv_kernel(const BwdParams p) {
  using Tr = Traits<kHeadDim>;
  using T = typename Native<kDtype>::T;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem<T, kHeadDim> sm(smem_raw);

  const int n0 = blockIdx.x * Tr::kBlockN, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo s(p, b);
  if (n0 >= s.rows_k) return;
  const int hk = h / p.group;
  const Visibility vis(p, s);
  const float slope = alibi_slope(p, b, h);
  load_tile<Tr, Tr::kBlockN>(sm.k, static_cast<const T*>(p.k) + s.k_offset(p.k_batch, p.k_row, p.k_head, n0, hk),
                             p.k_row, s.len_k - n0, p.head_dim);
  load_tile<Tr, Tr::kBlockN>(sm.v, static_cast<const T*>(p.v) + s.k_offset(p.v_batch, p.v_row, p.v_head, n0, hk),
                             p.v_row, s.len_k - n0, p.head_dim_v);

  FragC dk[Tr::kKeyTilesPerWarp], dv[Tr::kKeyTilesPerWarp];
#pragma unroll
  for (int x = 0; x < Tr::kKeyTilesPerWarp; ++x) {
    wmma::fill_fragment(dk[x], 0.f);
    wmma::fill_fragment(dv[x], 0.f);
  }
  const int2 rows = vis.query_range(n0, Tr::kBlockN);
  for (int m0 = rows.x; m0 < rows.y; m0 += Tr::kBlockM) {
    __syncthreads();  // the previous step's readers are done with every tile
    load_tile<Tr, Tr::kBlockM>(sm.q, static_cast<const T*>(p.q) + s.q_offset(p.q_batch, p.q_row, p.q_head, m0, h),
                               p.q_row, s.len_q - m0, p.head_dim);
    load_tile<Tr, Tr::kBlockM>(sm.dout,
                               static_cast<const T*>(p.dout) + s.q_offset(p.do_batch, p.do_row, p.do_head, m0, h),
                               p.do_row, s.len_q - m0, p.head_dim_v);
    load_row_stats<Tr>(p, s, h, m0, sm.lse, sm.dsum);
    __syncthreads();
    mma_scores<T, kHeadDim>(sm);
    __syncthreads();
    mma_probs<kDtype, kHeadDim>(p, s, vis, slope, m0, n0, sm);
    __syncthreads();
    mma_accumulate<T, kHeadDim, true, Tr::kKeyTilesPerWarp, Tr::kBlockM>(dv, sm.p, Tr::kProbPitch, sm.dout);
    mma_accumulate<T, kHeadDim, true, Tr::kKeyTilesPerWarp, Tr::kBlockM>(dk, sm.ds, Tr::kProbPitch, sm.q);
    if constexpr (kAtomicDq) {
      FragC dq[Tr::kRowTilesPerWarp];
#pragma unroll
      for (int x = 0; x < Tr::kRowTilesPerWarp; ++x) wmma::fill_fragment(dq[x], 0.f);
      mma_accumulate<T, kHeadDim, false, Tr::kRowTilesPerWarp, Tr::kBlockN>(dq, sm.ds, Tr::kProbPitch, sm.k);
      stage_fragments(sm, dq);  // sm.acc aliases S/dP, consumed before the last barrier
      __syncthreads();
      float* dst = p.dq_acc + (int64_t(h) * p.rows_q + s.q_row0 + m0) * p.head_dim;
      const int head_dim = p.head_dim;
      write_staged<kDtype, kHeadDim>(sm.acc, s.len_q - m0, head_dim, [&](int r, int c, const float* src) {
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) atomicAdd(dst + int64_t(r) * head_dim + c + e, src[e]);
      });
    }
  }

  // Epilogue: every stored key row of the block (keys past seqused_k hold zeros: no query saw them).
  const int rows_out = min(Tr::kBlockN, s.rows_k - n0);
  for (int which = 0; which < 2; ++which) {
    __syncthreads();  // sm.acc is free (previous readers done)
    if (which == 0)
      stage_fragments(sm, dk);
    else
      stage_fragments(sm, dv);
    __syncthreads();
    const int cols = which == 0 ? p.head_dim : p.head_dim_v;
    if (p.group == 1) {
      T* base = static_cast<T*>(which == 0 ? p.dk : p.dv);
      const int64_t bs = which == 0 ? p.dk_batch : p.dv_batch, rs = which == 0 ? p.dk_row : p.dv_row,
                    hs = which == 0 ? p.dk_head : p.dv_head;
      write_staged<kDtype, kHeadDim>(sm.acc, rows_out, cols, [&](int r, int c, const float* src) {
        *reinterpret_cast<uint4*>(base + s.k_offset(bs, rs, hs, n0 + r, h) + c) = pack8<kDtype>(src);
      });
    } else {
      float* base = (which == 0 ? p.dk_acc : p.dv_acc) + (int64_t(h) * p.rows_k + s.k_row0 + n0) * cols;
      write_staged<kDtype, kHeadDim>(sm.acc, rows_out, cols, [&](int r, int c, const float* src) {
        float* d = base + int64_t(r) * cols + c;
        reinterpret_cast<float4*>(d)[0] = make_float4(src[0], src[1], src[2], src[3]);
        reinterpret_cast<float4*>(d)[1] = make_float4(src[4], src[5], src[6], src[7]);
      });
    }
  }
}

template <fa_dtype kDtype, int kHeadDim>
__global__ void __launch_bounds__(Traits<kHeadDim>::kThreads) dq_kernel(const BwdParams p) {
  using Tr = Traits<kHeadDim>;
  using T = typename Native<kDtype>::T;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem<T, kHeadDim> sm(smem_raw);

  const int m0 = blockIdx.x * Tr::kBlockM, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo s(p, b);
  if (m0 >= s.len_q) return;
  const int hk = h / p.group;
  const Visibility vis(p, s);
  const float slope = alibi_slope(p, b, h);
  load_tile<Tr, Tr::kBlockM>(sm.q, static_cast<const T*>(p.q) + s.q_offset(p.q_batch, p.q_row, p.q_head, m0, h),
                             p.q_row, s.len_q - m0, p.head_dim);
  load_tile<Tr, Tr::kBlockM>(sm.dout,
                             static_cast<const T*>(p.dout) + s.q_offset(p.do_batch, p.do_row, p.do_head, m0, h),
                             p.do_row, s.len_q - m0, p.head_dim_v);
  load_row_stats<Tr>(p, s, h, m0, sm.lse, sm.dsum);

  FragC dq[Tr::kRowTilesPerWarp];
#pragma unroll
  for (int x = 0; x < Tr::kRowTilesPerWarp; ++x) wmma::fill_fragment(dq[x], 0.f);
  const int2 keys = vis.key_range(m0, min(Tr::kBlockM, s.len_q - m0));
  for (int n0 = keys.x; n0 < keys.y; n0 += Tr::kBlockN) {
    __syncthreads();
    load_tile<Tr, Tr::kBlockN>(sm.k, static_cast<const T*>(p.k) + s.k_offset(p.k_batch, p.k_row, p.k_head, n0, hk),
                               p.k_row, s.len_k - n0, p.head_dim);
    load_tile<Tr, Tr::kBlockN>(sm.v, static_cast<const T*>(p.v) + s.k_offset(p.v_batch, p.v_row, p.v_head, n0, hk),
                               p.v_row, s.len_k - n0, p.head_dim_v);
    __syncthreads();
    mma_scores<T, kHeadDim>(sm);
    __syncthreads();
    mma_probs<kDtype, kHeadDim>(p, s, vis, slope, m0, n0, sm);
    __syncthreads();
    mma_accumulate<T, kHeadDim, false, Tr::kRowTilesPerWarp, Tr::kBlockN>(dq, sm.ds, Tr::kProbPitch, sm.k);
  }
  __syncthreads();
  stage_fragments(sm, dq);
  __syncthreads();
  write_staged<kDtype, kHeadDim>(sm.acc, s.len_q - m0, p.head_dim, [&](int r, int c, const float* src) {
    *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + s.q_offset(p.dq_batch, p.dq_row, p.dq_head, m0 + r, h) + c) =
        pack8<kDtype>(src);
  });
}

constexpr int kAuxThreads = 256;  // preprocess / postprocess block size

// Decodes a global query/key row into (sequence offset terms) for the element offset of a batched tensor.
__device__ inline int64_t global_row_offset(bool varlen, int64_t g, int64_t seqlen, int64_t batch_stride,
                                            int64_t row_stride) {
  return varlen ? g * row_stride : (g / seqlen) * batch_stride + (g % seqlen) * row_stride;
}

// One warp per (query head, global row): D = sum_c dO * O in fp32; zeroes the row of the dQ accumulator.
template <fa_dtype kDtype>
__global__ void __launch_bounds__(kAuxThreads) preprocess_kernel(const BwdParams p) {
  using N = Native<kDtype>;
  using T2 = typename N::T2;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (w >= int64_t(p.heads_q) * p.rows_q) return;
  const int h = int(w / p.rows_q);
  const int64_t g = w % p.rows_q;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const T2* o = reinterpret_cast<const T2*>(static_cast<const typename N::T*>(p.out) +
                                            global_row_offset(varlen, g, p.seqlen_q, p.o_batch, p.o_row) +
                                            int64_t(h) * p.o_head);
  const T2* d = reinterpret_cast<const T2*>(static_cast<const typename N::T*>(p.dout) +
                                            global_row_offset(varlen, g, p.seqlen_q, p.do_batch, p.do_row) +
                                            int64_t(h) * p.do_head);
  float acc = 0.f;
  for (int c = lane; c < p.head_dim_v / 2; c += kWarpSize) {
    const float2 a = N::to_float2(o[c]), e = N::to_float2(d[c]);
    acc = fmaf(a.x, e.x, fmaf(a.y, e.y, acc));
  }
  for (int m = kWarpSize / 2; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (lane == 0) p.dsum[w] = acc;
  if (p.dq_acc != nullptr)
    for (int c = lane; c < p.head_dim; c += kWarpSize) p.dq_acc[w * p.head_dim + c] = 0.f;
}

// Rows of the workspace that belong to a sequence (varlen tensors may hold rows past the last sequence).
__device__ inline int64_t live_rows(const int32_t* cu, int batch, int64_t rows) { return cu ? cu[batch] : rows; }

// dQ accumulator -> output dtype (one thread per column pair).
template <fa_dtype kDtype>
__global__ void __launch_bounds__(kAuxThreads) dq_convert_kernel(const BwdParams p) {
  using N = Native<kDtype>;
  const int64_t pairs = p.head_dim / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(p.heads_q) * p.rows_q * pairs) return;
  const int64_t w = idx / pairs, c = 2 * (idx % pairs);
  const int h = int(w / p.rows_q);
  const int64_t g = w % p.rows_q;
  if (g >= live_rows(p.cu_seqlens_q, p.batch, p.rows_q)) return;
  const bool varlen = p.cu_seqlens_q != nullptr;
  auto* dst = static_cast<typename N::T*>(p.dq) + global_row_offset(varlen, g, p.seqlen_q, p.dq_batch, p.dq_row) +
              int64_t(h) * p.dq_head + c;
  const float* src = p.dq_acc + w * p.head_dim + c;
  *reinterpret_cast<typename N::T2*>(dst) = N::from_float2(src[0], src[1]);
}

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
  if (c < p.head_dim) {
    float a = 0.f, e = 0.f;
    for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
      const float* src = p.dk_acc + (int64_t(h) * p.rows_k + g) * p.head_dim + c;
      a += src[0];
      e += src[1];
    }
    auto* dst = static_cast<typename N::T*>(p.dk) + global_row_offset(varlen, g, p.seqlen_k, p.dk_batch, p.dk_row) +
                int64_t(hk) * p.dk_head + c;
    *reinterpret_cast<typename N::T2*>(dst) = N::from_float2(a, e);
  }
  if (c < p.head_dim_v) {
    float a = 0.f, e = 0.f;
    for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
      const float* src = p.dv_acc + (int64_t(h) * p.rows_k + g) * p.head_dim_v + c;
      a += src[0];
      e += src[1];
    }
    auto* dst = static_cast<typename N::T*>(p.dv) + global_row_offset(varlen, g, p.seqlen_k, p.dv_batch, p.dv_row) +
                int64_t(hk) * p.dv_head + c;
    *reinterpret_cast<typename N::T2*>(dst) = N::from_float2(a, e);
  }
}

inline unsigned aux_blocks(int64_t threads) { return unsigned((threads + kAuxThreads - 1) / kAuxThreads); }

template <class Kernel>
cudaError_t opt_in_smem(Kernel kernel, int bytes) {
  constexpr int kDefaultSmemLimit = 48 * 1024;  // larger dynamic smem must be opted into per kernel
  if (bytes <= kDefaultSmemLimit) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace bwd

template <fa_dtype kDtype, int kHeadDim>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Tr = bwd::Traits<kHeadDim>;
  const int64_t q_warps = int64_t(p.heads_q) * p.rows_q;
  if (q_warps > 0)
    bwd::preprocess_kernel<kDtype><<<bwd::aux_blocks(q_warps * bwd::kWarpSize), bwd::kAuxThreads, 0, stream>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  const dim3 key_grid(unsigned((p.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN), unsigned(p.heads_q), unsigned(p.batch));
  if (key_grid.x > 0) {
    if (p.deterministic) {
      auto kernel = &bwd::dkdv_kernel<kDtype, kHeadDim, false>;
      if (cudaError_t e = bwd::opt_in_smem(kernel, Tr::kSmemBytes); e != cudaSuccess) return e;
      kernel<<<key_grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
    } else {
      auto kernel = &bwd::dkdv_kernel<kDtype, kHeadDim, true>;
      if (cudaError_t e = bwd::opt_in_smem(kernel, Tr::kSmemBytes); e != cudaSuccess) return e;
      kernel<<<key_grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (p.deterministic) {
    const dim3 q_grid(unsigned((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM), unsigned(p.heads_q), unsigned(p.batch));
    auto kernel = &bwd::dq_kernel<kDtype, kHeadDim>;
    if (cudaError_t e = bwd::opt_in_smem(kernel, Tr::kSmemBytes); e != cudaSuccess) return e;
    if (q_grid.x > 0) kernel<<<q_grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  } else {
    const int64_t n = q_warps * (p.head_dim / 2);
    if (n > 0) bwd::dq_convert_kernel<kDtype><<<bwd::aux_blocks(n), bwd::kAuxThreads, 0, stream>>>(p);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (p.group > 1) {
    const int64_t n = int64_t(p.heads_kv) * p.rows_k * (std::max(p.head_dim, p.head_dim_v) / 2);
    if (n > 0) bwd::dkdv_reduce_kernel<kDtype><<<bwd::aux_blocks(n), bwd::kAuxThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace flashattn::cuda::sm80

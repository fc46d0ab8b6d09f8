// The FP8 forward's V transpose (sm90/fwd_traits.cuh, Fp8Operands): wgmma reads 8-bit B operands K-major only, so
// ahead of the kernel V is copied into the plan's workspace transposed, each 16 keys in the order the P operand's
// registers hold them (key 16g + i at column 16g + fp8_key_column(i)):
//   batched V (B, Sk, Hkv, Dv), or paged (its pages through the block table, Sk the capacity):
//     v_t[b][kv head][column][key];
//   varlen V (Tk, Hkv, Dv): v_t[kv head][column][key], sequence b's keys from v_t_seq_start.
// Keys at or past a sequence's length (seqused_k, clamped as the kernels do) are zeros up to the row's padding
// (batched and paged: v_t_keys; varlen: the next kVtSeqAlign boundary), so the kernel's P.V never meets stale or
// non-finite V (P is 0 there, and 0 * NaN would not be).
#include <algorithm>

#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/fwd_traits.cuh"

namespace flashattn::cuda::sm90 {

namespace {

constexpr int kKeys = 64;  // keys per CTA
constexpr int kThreads = 256;
constexpr int kMaxDim = 256;

__global__ void __launch_bounds__(kThreads) fp8_v_transpose_kernel(const __grid_constant__ FwdParams p) {
  // One extra 4-byte word per key row: the column reads of the second phase walk rows 4 words apart.
  __shared__ __align__(16) uint8_t tile[kKeys][kMaxDim + 16];
  const int heads_kv = p.heads_q / p.group;
  const int k0 = int(blockIdx.x) * kKeys;
  const int chunks = p.head_dim_v / 16;  // 16-byte chunks per V row (head_dim_v is a multiple of 16 here)
  const bool varlen = p.cu_seqlens_k != nullptr;
  for (int hb = int(blockIdx.y); hb < heads_kv * p.batch; hb += int(gridDim.y)) {
    const int h = hb % heads_kv, b = hb / heads_kv;
    const int full = varlen ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
    int len = full;
    if (p.seqused_k != nullptr) len = min(max(p.seqused_k[b], 0), len);
    // The keys of this sequence's span of the row: batched the whole row, varlen up to its next aligned boundary.
    const int64_t span = varlen ? (int64_t(full) + kVtSeqAlign - 1) / kVtSeqAlign * kVtSeqAlign : p.v_t_keys;
    if (k0 >= span) continue;  // uniform over the CTA: no barrier is skipped by some threads only
    const uint8_t* v = static_cast<const uint8_t*>(p.v) + int64_t(h) * p.v_head;
    // Key j's row: paged through the block table (a page index outside the cache reads as zeros, as the kernels
    // read it), varlen from the sequence's first row, else the batch entry's rows.
    auto row_of = [&](int j) -> const uint8_t* {
      if (p.block_table != nullptr) {
        const int page = p.block_table[int64_t(b) * p.block_table_stride + j / p.page_size];
        if (page < 0 || page >= p.num_pages) return nullptr;
        return v + int64_t(page) * p.v_batch + int64_t(j % p.page_size) * p.v_row;
      }
      if (varlen) return v + (int64_t(p.cu_seqlens_k[b]) + j) * p.v_row;
      return v + int64_t(b) * p.v_batch + int64_t(j) * p.v_row;
    };
    for (int i = int(threadIdx.x); i < kKeys * chunks; i += kThreads) {
      const int key = i / chunks, chunk = i % chunks;
      uint4 x = make_uint4(0, 0, 0, 0);
      const uint8_t* row = k0 + key < len ? row_of(k0 + key) : nullptr;
      if (row != nullptr) x = *reinterpret_cast<const uint4*>(row + chunk * 16);
      *reinterpret_cast<uint4*>(&tile[key][chunk * 16]) = x;
    }
    __syncthreads();
    uint8_t* out = static_cast<uint8_t*>(p.v_t) + (int64_t(varlen ? 0 : b) * heads_kv + h) * p.head_dim_v * p.v_t_keys +
                   v_t_seq_start(p.cu_seqlens_k, b);
    for (int i = int(threadIdx.x); i < p.head_dim_v * (kKeys / 16); i += kThreads) {
      const int c = i / (kKeys / 16), g = i % (kKeys / 16);
      if (k0 + 16 * g >= span) continue;
      uint8_t bytes[16];
#pragma unroll
      for (int key = 0; key < 16; ++key) bytes[fp8_key_column(key)] = tile[16 * g + key][c];
      uint4 x;
      memcpy(&x, bytes, 16);
      *reinterpret_cast<uint4*>(out + int64_t(c) * p.v_t_keys + k0 + 16 * g) = x;
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_fp8_v_transpose(const FwdParams& p, cudaStream_t stream) {
  if (p.head_dim_v % 16 != 0 || p.head_dim_v > kMaxDim) return cudaErrorInvalidValue;  // planned out (plan.cpp)
  // Key chunks of the longest row span: batched v_t_keys, varlen the longest sequence padded (max_seqlen_k).
  const int64_t span =
      p.cu_seqlens_k != nullptr ? (int64_t(p.seqlen_k) + kVtSeqAlign - 1) / kVtSeqAlign * kVtSeqAlign : p.v_t_keys;
  const int64_t blocks = (span + kKeys - 1) / kKeys;
  const int64_t pairs = int64_t(p.heads_q / p.group) * p.batch;
  if (blocks == 0 || pairs == 0) return cudaSuccess;
  const dim3 grid(unsigned(blocks), unsigned(std::min<int64_t>(pairs, 65535)));
  fp8_v_transpose_kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashattn::cuda::sm90

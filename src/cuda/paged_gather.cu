// The gather of a paged call that no kernel reads natively (PagedLoad::kGather, host_common.hpp): each
// sequence's used keys copied from their pages into contiguous (B, seqlen_k, Hkv, D) K and V. Rows past the
// used keys and rows of an out-of-range page are zeros, so that the contiguous kernels see finite values only.
// One thread per 16-byte vector (the CUDA backends' rule: 16-byte pointers, strides multiples of 8 elements).
#include <algorithm>

#include <cuda_runtime.h>

#include "cuda/host_common.hpp"

namespace flashattn::cuda {
namespace {

struct GatherArgs {
  const uint4* src = nullptr;
  uint4* dst = nullptr;
  const int32_t* table = nullptr;
  const int32_t* used = nullptr;  // seqused_k (optional), clamped as the kernels clamp it
  int64_t table_stride = 0, page_stride = 0, row_stride = 0, head_stride = 0;  // in vectors
  int batch = 0, seqlen = 0, heads = 0, vecs = 0, page_size = 0, num_pages = 0;
};

__global__ void paged_gather_kernel(const GatherArgs a) {
  const int64_t n = int64_t(a.batch) * a.seqlen * a.heads * a.vecs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i / a.vecs;
    const int x = int(i % a.vecs);
    const int h = int(t % a.heads);
    t /= a.heads;
    const int j = int(t % a.seqlen), b = int(t / a.seqlen);
    const int used = a.used != nullptr ? max(0, min(a.used[b], a.seqlen)) : a.seqlen;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j < used) {
      const int page = a.table[b * a.table_stride + j / a.page_size];
      if (page >= 0 && page < a.num_pages)
        v = a.src[page * a.page_stride + int64_t(j % a.page_size) * a.row_stride + h * a.head_stride + x];
    }
    a.dst[i] = v;
  }
}

cudaError_t gather(const detail::Problem& p, const void* src, const detail::RowLayout& l, int64_t dim, void* dst,
                   cudaStream_t stream) {
  constexpr int kVec = 8;  // 16-bit elements per 16-byte vector
  GatherArgs a;
  a.src = static_cast<const uint4*>(src);
  a.dst = static_cast<uint4*>(dst);
  a.table = p.block_table;
  a.used = p.seqused_k;
  a.table_stride = p.block_table_stride;
  a.page_stride = l.batch / kVec;
  a.row_stride = l.row / kVec;
  a.head_stride = l.head / kVec;
  a.batch = int(p.batch);
  a.seqlen = int(p.seqlen_k);
  a.heads = int(p.heads_kv);
  a.vecs = int(dim / kVec);
  a.page_size = int(p.page_size);
  a.num_pages = int(p.num_pages);
  const int64_t n = p.batch * p.seqlen_k * p.heads_kv * a.vecs;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = int(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 16));
  paged_gather_kernel<<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_paged_gather(const detail::Problem& p, void* k, void* v, cudaStream_t stream) {
  if (cudaError_t e = gather(p, p.k, p.k_layout, p.head_dim, k, stream); e != cudaSuccess) return e;
  return gather(p, p.v, p.v_layout, p.head_dim_v, v, stream);
}

}  // namespace flashattn::cuda

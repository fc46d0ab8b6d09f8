// The gradient of the learnable sinks after the backward (flashattn.h, Semantics):
//   dsink_h = -sum over query rows of e^(sink_h - lse) * D,   D = rowsum(dO * O) (the backward's dsum workspace).
// One CTA per query head, each thread summing a fixed stride of rows, then a fixed-shape tree: the same bits
// run to run (deterministic mode needs nothing more).
#include <cmath>

#include "cuda/bwd_params.hpp"

namespace flashattn::cuda {
namespace {

constexpr int kSinkThreads = 256;

__global__ void __launch_bounds__(kSinkThreads) sink_grad_kernel(const BwdParams p) {
  __shared__ double partial[kSinkThreads];
  const int h = int(blockIdx.x);
  const float sink = p.sinks[h];
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Varlen tensors may hold rows past the last sequence: their lse is not the forward's.
  const int64_t rows = varlen ? int64_t(p.cu_seqlens_q[p.batch]) : p.rows_q;
  double acc = 0.0;
  for (int64_t g = threadIdx.x; g < rows; g += kSinkThreads) {
    // Global row g: batched b * seqlen_q + i, varlen the token index.
    const int64_t b = varlen ? 0 : g / p.seqlen_q, i = varlen ? g : g % p.seqlen_q;
    const float lse = p.lse[b * p.lse_batch + i * p.lse_row + int64_t(h) * p.lse_head];
    if (lse != -INFINITY) acc += exp(double(sink) - double(lse)) * double(p.dsum[int64_t(h) * p.dsum_stride + g]);
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kSinkThreads / 2; s > 0; s /= 2) {
    if (int(threadIdx.x) < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[h] = float(-partial[0]);
}

}  // namespace

cudaError_t launch_sink_grad(const BwdParams& p, cudaStream_t stream) {
  sink_grad_kernel<<<p.heads_q, kSinkThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashattn::cuda

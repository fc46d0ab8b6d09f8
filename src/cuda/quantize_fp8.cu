// fa_quantize_fp8 on CUDA (flashattn.h), the same arithmetic as the CPU's (src/cpu/quantize.cpp): one warp per row
// of D values rotates it in shared memory (signs, then the Walsh-Hadamard butterflies in the order of
// detail::walsh_hadamard) and takes |x'|'s maximum; four launches in stream order: zero the factors, their maxima
// (atomicMax on the bits of non-negative floats, whose order is the integers'), the factors, and the rows rounded to
// e4m3 against them (round to nearest even, saturating: cvt.rn.satfinite as the CPU's float_to_e4m3).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/hadamard.hpp"
#include "core/problem.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"

namespace flashattn::cuda {

namespace {

constexpr int kWarps = 8;  // rows in flight per CTA
constexpr int kMaxDim = 256;

__device__ float load_value(fa_dtype t, const void* base, int64_t off) {
  switch (t) {
    case FA_FLOAT16: return __half2float(static_cast<const __half*>(base)[off]);
    case FA_BFLOAT16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[off]);
    default: return static_cast<const float*>(base)[off];
  }
}

// max of non-negative values where NaN wins (fmaxf would drop it), as the CPU's NaN factor says.
__device__ float nan_max(float a, float b) { return isnan(a) || isnan(b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

__device__ float& descale_at(const detail::QuantizeProblem& p, int64_t b, int64_t h) {
  return p.descale[b * p.descale_batch + h * p.descale_head];
}

// Row (b, s, h) rotated into `row` (D floats of this warp's shared memory); every lane returns after the last write.
__device__ void rotate_row(const detail::QuantizeProblem& p, int64_t b, int64_t s, int64_t h, float* row) {
  const int lane = int(threadIdx.x) % 32;
  const int d = int(p.dim);
  const int64_t base = b * p.x_batch + s * p.x_row + h * p.x_head;
  for (int c = lane; c < d; c += 32)
    row[c] = load_value(p.dtype, p.x, base + c) * (p.hadamard ? float(detail::hadamard_sign(p.seed, c)) : 1.f);
  __syncwarp();
  if (!p.hadamard) return;
  for (int half = 1; half < d; half *= 2) {
    for (int k = lane; k < d / 2; k += 32) {  // butterfly k: j = its pair's first index
      const int j = (k / half) * 2 * half + k % half;
      const float a = row[j], x = row[j + half];
      row[j] = a + x;
      row[j + half] = a - x;
    }
    __syncwarp();
  }
  const float inv_sqrt = 1.f / sqrtf(float(d));
  for (int c = lane; c < d; c += 32) row[c] *= inv_sqrt;
  __syncwarp();
}

__global__ void zero_kernel(const detail::QuantizeProblem p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.batch * p.heads;
       i += int64_t(gridDim.x) * blockDim.x)
    descale_at(p, i / p.heads, i % p.heads) = 0.f;
}

// Rows of one (b, h): blockIdx.y; rows s = blockIdx.x * kWarps + warp, strided by the grid.
__global__ void __launch_bounds__(kWarps * 32) amax_kernel(const detail::QuantizeProblem p) {
  __shared__ float rows[kWarps][kMaxDim];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int64_t bh = blockIdx.y; bh < p.batch * p.heads; bh += gridDim.y) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    float amax = 0.f;
    for (int64_t s = int64_t(blockIdx.x) * kWarps + warp; s < p.seqlen; s += int64_t(gridDim.x) * kWarps) {
      rotate_row(p, b, s, h, rows[warp]);
      for (int c = lane; c < p.dim; c += 32) {
        const float x = fabsf(rows[warp][c]);
        amax = nan_max(amax, x);
      }
      __syncwarp();
    }
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, amax, o);
      amax = nan_max(amax, other);
    }
    if (lane == 0) atomicMax(reinterpret_cast<int*>(&descale_at(p, b, h)), __float_as_int(amax));
  }
}

__global__ void factor_kernel(const detail::QuantizeProblem p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.batch * p.heads;
       i += int64_t(gridDim.x) * blockDim.x) {
    float& f = descale_at(p, i / p.heads, i % p.heads);
    f = isnan(f) ? f : detail::fp8_descale_of(f);
  }
}

__global__ void __launch_bounds__(kWarps * 32) quantize_kernel(const detail::QuantizeProblem p) {
  __shared__ float rows[kWarps][kMaxDim];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int64_t bh = blockIdx.y; bh < p.batch * p.heads; bh += gridDim.y) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const float descale = descale_at(p, b, h);
    for (int64_t s = int64_t(blockIdx.x) * kWarps + warp; s < p.seqlen; s += int64_t(gridDim.x) * kWarps) {
      rotate_row(p, b, s, h, rows[warp]);
      uint8_t* out = p.out + b * p.out_batch + s * p.out_row + h * p.out_head;
      for (int c = lane; c < p.dim; c += 32)
        out[c] = uint8_t(__nv_cvt_float_to_fp8(rows[warp][c] / descale, __NV_SATFINITE, __NV_E4M3));
      __syncwarp();
    }
  }
}

}  // namespace

}  // namespace flashattn::cuda

namespace flashattn::detail {

Error quantize_fp8_cuda(const QuantizeProblem& p, void* stream_ptr) {
  using namespace flashattn::cuda;
  if (p.batch == 0 || p.heads == 0) return detail::ok();
  if (p.dim > kMaxDim) return detail::unsupported("x: the CUDA quantisation takes head dims up to 256");
  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  // Empty tensors may hold any pointer; the rest must be memory of the device (a host pointer labelled CUDA would
  // fault in the kernels).
  if (p.seqlen > 0 && p.dim > 0) {
    if (Error e = check_device_pointer("x", p.x, p.device_index); !e.ok()) return e;
    if (Error e = check_device_pointer("out", p.out, p.device_index); !e.ok()) return e;
  }
  if (Error e = check_device_pointer("descale", p.descale, p.device_index); !e.ok()) return e;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t pairs = p.batch * p.heads;
  const unsigned small = unsigned(std::min<int64_t>((pairs + 255) / 256, 65535));
  const dim3 rows_grid(unsigned(std::clamp<int64_t>((p.seqlen + kWarps - 1) / kWarps, 1, 1024)),
                       unsigned(std::min<int64_t>(pairs, 65535)));
  zero_kernel<<<small, 256, 0, stream>>>(p);
  if (p.seqlen > 0) amax_kernel<<<rows_grid, kWarps * 32, 0, stream>>>(p);
  factor_kernel<<<small, 256, 0, stream>>>(p);
  if (p.seqlen > 0) quantize_kernel<<<rows_grid, kWarps * 32, 0, stream>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return runtime_error("fa_quantize_fp8 kernel launch", e);
  return detail::ok();
}

}  // namespace flashattn::detail

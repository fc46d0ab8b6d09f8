// The cuda-sm80 backend: turns the validated Problem into kernel parameters and picks the compiled kernel.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"
#include "cuda/sm80/bwd_params.hpp"
#include "cuda/sm80/fwd_params.hpp"
#include "cuda/sm80/tiles.hpp"

namespace flashattn::cuda::sm80 {

// Declarations of the generated instantiations (sm80_fwd_kernels.inc lists them).
#define FA_SM80_FWD(dtype, hdim)                                                       \
  extern template cudaError_t launch_fwd<dtype, hdim>(const FwdParams&, cudaStream_t); \
  extern template cudaError_t fwd_attributes<dtype, hdim>(cudaFuncAttributes*);
#include "sm80_fwd_kernels.inc"
#undef FA_SM80_FWD
#define FA_SM80_BWD(dtype, hdim) extern template cudaError_t launch_bwd<dtype, hdim>(const BwdParams&, cudaStream_t);
#include "sm80_bwd_kernels.inc"
#undef FA_SM80_BWD

namespace {

struct FwdKernel {
  fa_dtype dtype;
  int head_dim;  // compiled head dim; serves every problem with max(d, dv) <= it
  cudaError_t (*launch)(const FwdParams&, cudaStream_t);
  cudaError_t (*attributes)(cudaFuncAttributes*);
};

constexpr FwdKernel kFwdKernels[] = {
#define FA_SM80_FWD(dtype, hdim) {dtype, hdim, &launch_fwd<dtype, hdim>, &fwd_attributes<dtype, hdim>},
#include "sm80_fwd_kernels.inc"
#undef FA_SM80_FWD
};

// The smallest compiled head dim of `table` that covers the problem (less predicated-away math), or null.
template <class Kernel, size_t kCount>
const Kernel* pick_kernel(const Kernel (&table)[kCount], const detail::Problem& p) {
  const int64_t need = std::max(p.head_dim, p.head_dim_v);
  const Kernel* best = nullptr;
  for (const Kernel& k : table)
    if (k.dtype == p.dtype && k.head_dim >= need && (best == nullptr || k.head_dim < best->head_dim)) best = &k;
  return best;
}

const char* dtype_name(fa_dtype t) { return t == FA_FLOAT16 ? "float16" : t == FA_BFLOAT16 ? "bfloat16" : "float32"; }

std::string built_list() {
  std::string s;
  for (const FwdKernel& k : kFwdKernels)
    s += (s.empty() ? "" : ", ") + std::string(dtype_name(k.dtype)) + "/d" + std::to_string(k.head_dim);
  return s;
}

constexpr int kMaxGridYZ = 65535;  // CUDA grid limit of the heads (y) and batch (z) dimensions

FwdParams make_params(const detail::Problem& p) { return make_fwd_params(p); }

detail::Error forward(const detail::Problem& p, const fa_exec& exec) {
  const FwdKernel* kernel = pick_kernel(kFwdKernels, p);
  if (kernel == nullptr)
    return detail::unsupported("q: the cuda-sm80 backend has no kernel for " + std::string(dtype_name(p.dtype)) +
                               " with head_dim " + std::to_string(p.head_dim) + ", head_dim_v " +
                               std::to_string(p.head_dim_v) + " in this build (built: " + built_list() +
                               "; FLASHATTN_KERNELS=default or all builds more)");
  if (p.heads_q > kMaxGridYZ || p.batch > kMaxGridYZ)
    return detail::unsupported("q: the cuda-sm80 backend supports at most " + std::to_string(kMaxGridYZ) +
                               " heads and batch entries (got " + std::to_string(p.heads_q) + " heads, batch " +
                               std::to_string(p.batch) + ")");
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return detail::ok();  // nothing to compute

  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  if (detail::Error e = check_device_pointer("q", p.q, p.device_index); !e.ok()) return e;
  if (detail::Error e = check_device_pointer("k", p.k, p.device_index); !e.ok()) return e;
  if (detail::Error e = check_device_pointer("v", p.v, p.device_index); !e.ok()) return e;
  if (detail::Error e = check_device_pointer("out", p.out, p.device_index); !e.ok()) return e;
  if (detail::Error e = check_device_pointer("lse", p.lse, p.device_index); !e.ok()) return e;
  if (detail::Error e = check_device_pointer("alibi_slopes", p.alibi, p.device_index); !e.ok()) return e;

  const FwdParams params = make_params(p);
  if (cudaError_t e = kernel->launch(params, static_cast<cudaStream_t>(exec.stream)); e != cudaSuccess)
    return runtime_error("cuda-sm80 forward kernel launch", e);
  return detail::ok();
}

struct BwdKernel {
  fa_dtype dtype;
  int head_dim;  // compiled head dim; serves every problem with max(d, dv) <= it
  cudaError_t (*launch)(const BwdParams&, cudaStream_t);
};

constexpr BwdKernel kBwdKernels[] = {
#define FA_SM80_BWD(dtype, hdim) {dtype, hdim, &launch_bwd<dtype, hdim>},
#include "sm80_bwd_kernels.inc"
#undef FA_SM80_BWD
};

BwdParams make_bwd_params(const detail::Problem& p, bool deterministic) {
  BwdParams k;
  static_cast<FwdParams&>(k) = make_params(p);
  k.dout = p.dout;
  k.dq = p.dq;
  k.dk = p.dk;
  k.dv = p.dv;
  k.do_batch = p.dout_layout.batch, k.do_row = p.dout_layout.row, k.do_head = p.dout_layout.head;
  k.dq_batch = p.dq_layout.batch, k.dq_row = p.dq_layout.row, k.dq_head = p.dq_layout.head;
  k.dk_batch = p.dk_layout.batch, k.dk_row = p.dk_layout.row, k.dk_head = p.dk_layout.head;
  k.dv_batch = p.dv_layout.batch, k.dv_row = p.dv_layout.row, k.dv_head = p.dv_layout.head;
  k.scale = p.scale;
  k.heads_kv = int(p.heads_kv);
  k.rows_q = p.varlen ? p.total_q : p.batch * p.seqlen_q;
  k.rows_k = p.varlen ? p.total_k : p.batch * p.seqlen_k;
  k.deterministic = deterministic;
  return k;
}

detail::Error backward(const detail::Problem& p, const fa_exec& exec) {
  const BwdKernel* kernel = pick_kernel(kBwdKernels, p);
  if (kernel == nullptr)
    return detail::unsupported("q: the cuda-sm80 backend has no backward kernel for " +
                               std::string(dtype_name(p.dtype)) + " with head_dim " + std::to_string(p.head_dim) +
                               ", head_dim_v " + std::to_string(p.head_dim_v) + " in this build");
  if (p.heads_q > kMaxGridYZ || p.batch > kMaxGridYZ)
    return detail::unsupported("q: the cuda-sm80 backend supports at most " + std::to_string(kMaxGridYZ) +
                               " heads and batch entries (got " + std::to_string(p.heads_q) + " heads, batch " +
                               std::to_string(p.batch) + ")");
  if (p.batch == 0 || p.heads_q == 0) return detail::ok();  // nothing to compute

  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  const std::pair<const char*, const void*> tensors[] = {{"q", p.q},     {"k", p.k},   {"v", p.v},
                                                         {"out", p.out}, {"lse", p.lse}, {"dout", p.dout},
                                                         {"dq", p.dq},   {"dk", p.dk}, {"dv", p.dv},
                                                         {"alibi_slopes", p.alibi}};
  for (const auto& [name, ptr] : tensors)
    if (detail::Error e = check_device_pointer(name, ptr, p.device_index); !e.ok()) return e;

  BwdParams params = make_bwd_params(p, exec.deterministic != 0);
  // dQ workspace geometry (see BwdParams::dq_acc). Deterministic: enough splits (CTAs per head and batch) to fill
  // the GPU once, never more than there are key blocks.
  const BwdTiles tiles = bwd_tiles(kernel->head_dim);
  params.dq_tile = int64_t(tiles.block_q) * kernel->head_dim;
  params.dq_blocks = params.rows_q / tiles.block_q + p.batch + 1;
  if (params.deterministic) {
    int sms = 0;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, int(p.device_index));
        e != cudaSuccess)
      return runtime_error("cudaDeviceGetAttribute(multiProcessorCount)", e);
    const int64_t ctas = std::max<int64_t>(1, p.batch * p.heads_q);
    const int64_t key_blocks = std::max<int64_t>(1, (p.seqlen_k + tiles.block_k - 1) / tiles.block_k);
    params.dq_splits = int(std::min(key_blocks, (sms + ctas - 1) / ctas));
  }
  const BwdWorkspace ws = bwd_workspace(params);
  const auto stream = static_cast<cudaStream_t>(exec.stream);
  void* buffer = nullptr;
  if (ws.total() > 0) {
    if (cudaError_t e = cudaMallocAsync(&buffer, size_t(ws.total()) * sizeof(float), stream); e != cudaSuccess)
      return runtime_error("cuda-sm80 backward workspace (cudaMallocAsync of " +
                               std::to_string(ws.total() * int64_t(sizeof(float))) + " bytes)",
                           e);
  }
  float* base = static_cast<float*>(buffer);
  params.dsum = ws.dsum ? base : nullptr;
  params.dq_acc = ws.dq_acc ? base + ws.dsum : nullptr;
  params.dk_acc = ws.dk_acc ? base + ws.dsum + ws.dq_acc : nullptr;
  params.dv_acc = ws.dv_acc ? base + ws.dsum + ws.dq_acc + ws.dk_acc : nullptr;
  const cudaError_t launched = kernel->launch(params, stream);
  const cudaError_t freed = buffer ? cudaFreeAsync(buffer, stream) : cudaSuccess;
  if (launched != cudaSuccess) return runtime_error("cuda-sm80 backward kernel launch", launched);
  if (freed != cudaSuccess) return runtime_error("cuda-sm80 backward workspace cudaFreeAsync", freed);
  return detail::ok();
}

detail::TileShape tile_shape(const detail::Problem& p) {
  const FwdKernel* kernel = pick_kernel(kFwdKernels, p);
  if (kernel == nullptr) return {};
  const FwdTiles t = fwd_tiles(kernel->head_dim, fwd_compact(kernel->head_dim, p.has_window(), p.seqlen_k));
  return {t.block_q, t.block_k};
}

}  // namespace

cudaError_t kernels_runnable(int /*device*/) {
  cudaFuncAttributes a{};
  return kFwdKernels[0].attributes(&a);
}

// 16-byte pointers and strides in multiples of 8 elements: every row of a tile starts on a 16-byte boundary,
// so the kernels move whole 128-bit vectors (cp.async 16 B) without alignment checks.
constexpr int kVectorBytes = 16;
constexpr int kVectorElems = kVectorBytes / 2;  // fp16/bf16 only

const detail::Backend& backend() {
  static const detail::Backend b{"cuda-sm80", detail::Requirements{kVectorBytes, kVectorElems, false, "cuda-sm80"},
                                 forward, backward, tile_shape};
  return b;
}

}  // namespace flashattn::cuda::sm80

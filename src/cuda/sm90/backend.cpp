// The cuda-sm90 backend: Hopper forward kernels (FlashAttention-3 design); the backward runs the sm80 kernels
// until the Hopper backward exists. Problems the TMA descriptors cannot describe (a broadcast stride of 0 along
// a dimension of extent > 1) or head dims not compiled for sm90 run the sm80 forward when the caller asked for
// AUTO, and are reported unsupported when the caller asked for cuda-sm90 explicitly.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"
#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda::sm90 {

#define FA_SM90_FWD(dtype, hdim, mods)                                                                   \
  extern template cudaError_t launch_fwd<dtype, hdim, mods, Mechanisms<>>(const FwdParams&, cudaStream_t); \
  extern template cudaError_t fwd_attributes<dtype, hdim, mods, Mechanisms<>>(cudaFuncAttributes*);
#include "sm90_fwd_kernels.inc"
#undef FA_SM90_FWD

#define FA_SM90_ABLATION(name, ...) \
  extern template cudaError_t launch_fwd<FA_BFLOAT16, 128, false, __VA_ARGS__>(const FwdParams&, cudaStream_t);
#include "sm90_fwd_ablations.inc"
#undef FA_SM90_ABLATION

namespace {

// Ablation builds (FLASHATTN_SM90_ABLATIONS): FLASHATTN_SM90_MECHANISMS=<variant> makes bf16 d128 forwards without
// softcap/ALiBi run that variant of the kernel (one mechanism changed), read at every call so that a benchmark can
// switch between variants in one process. Empty in default builds.
struct Ablation {
  const char* name;
  cudaError_t (*launch)(const FwdParams&, cudaStream_t);
};
const Ablation kAblations[] = {
#define FA_SM90_ABLATION(name, ...) {#name, &launch_fwd<FA_BFLOAT16, 128, false, __VA_ARGS__>},
#include "sm90_fwd_ablations.inc"
#undef FA_SM90_ABLATION
    {nullptr, nullptr}};

// The problems the default table serves with its bf16 d128 kernel: max(d, dv) in (64, 128] (d64 is the next
// smaller compiled head dim), no softcap/ALiBi.
cudaError_t (*ablation_launch(const detail::Problem& p))(const FwdParams&, cudaStream_t) {
  constexpr int kAblationHeadDim = 128, kNextSmallerHeadDim = 64;
  const int64_t need = std::max(p.head_dim, p.head_dim_v);
  if (kAblations[0].name == nullptr || p.dtype != FA_BFLOAT16 || need > kAblationHeadDim ||
      need <= kNextSmallerHeadDim || p.softcap > 0.f || p.alibi != nullptr)
    return nullptr;
  const char* want = std::getenv("FLASHATTN_SM90_MECHANISMS");
  if (want == nullptr) return nullptr;
  for (const Ablation& a : kAblations)
    if (a.name != nullptr && std::strcmp(a.name, want) == 0) return a.launch;
  return nullptr;
}

struct FwdKernel {
  fa_dtype dtype;
  int head_dim;  // compiled head dim; serves every problem with max(d, dv) <= it
  bool score_mods;
  cudaError_t (*launch)(const FwdParams&, cudaStream_t);
  cudaError_t (*attributes)(cudaFuncAttributes*);
};

constexpr FwdKernel kFwdKernels[] = {
#define FA_SM90_FWD(dtype, hdim, mods) \
  {dtype, hdim, mods, &launch_fwd<dtype, hdim, mods, Mechanisms<>>, &fwd_attributes<dtype, hdim, mods, Mechanisms<>>},
#include "sm90_fwd_kernels.inc"
#undef FA_SM90_FWD
};

bool needs_score_mods(const detail::Problem& p) { return p.softcap > 0.f || p.alibi != nullptr; }

// The smallest compiled head dim that covers the problem (less zero-filled math), or null.
const FwdKernel* pick_kernel(const detail::Problem& p) {
  const int64_t need = std::max(p.head_dim, p.head_dim_v);
  const bool mods = needs_score_mods(p);
  const FwdKernel* best = nullptr;
  for (const FwdKernel& k : kFwdKernels)
    if (k.dtype == p.dtype && k.score_mods == mods && k.head_dim >= need &&
        (best == nullptr || k.head_dim < best->head_dim))
      best = &k;
  return best;
}

// TMA strides must be positive multiples of 16 bytes (the validation already requires multiples of 8
// elements); a zero stride is only harmless along a dimension of extent 1. Returns the offending argument.
const char* tma_incompatible(const detail::Problem& p) {
  const int64_t rows_q = p.varlen ? p.total_q : p.seqlen_q, rows_k = p.varlen ? p.total_k : p.seqlen_k;
  const int64_t batch = p.varlen ? 1 : p.batch;
  auto bad = [](const detail::RowLayout& l, int64_t rows, int64_t heads, int64_t batch) {
    return (rows > 1 && l.row == 0) || (heads > 1 && l.head == 0) || (batch > 1 && l.batch == 0);
  };
  if (bad(p.q_layout, rows_q, p.heads_q, batch)) return "q";
  if (bad(p.k_layout, rows_k, p.heads_kv, batch)) return "k";
  if (bad(p.v_layout, rows_k, p.heads_kv, batch)) return "v";
  if (bad(p.out_layout, rows_q, p.heads_q, batch)) return "out";
  return nullptr;
}

constexpr int kMaxTmaCoord = (1u << 31) - 1;  // TMA coordinates and our tile indices are 32-bit

detail::Error forward(const detail::Problem& p, const fa_exec& exec) {
  const bool explicit_request = exec.backend == FA_BACKEND_CUDA_SM90;
  const FwdKernel* kernel = pick_kernel(p);
  const char* tma_arg = tma_incompatible(p);
  // Tiles are numbered with 32-bit ints: at most ceil(seqlen_q / 64) query blocks per (batch, head).
  const int64_t max_tiles = (p.seqlen_q + kWarpgroupRows - 1) / kWarpgroupRows * p.heads_q * p.batch;
  const bool too_large = std::max(p.varlen ? p.total_q : p.batch * p.seqlen_q, p.varlen ? p.total_k : p.batch * p.seqlen_k) >
                             kMaxTmaCoord ||
                         max_tiles > kMaxTmaCoord;
  if (kernel == nullptr || tma_arg != nullptr || too_large) {
    if (!explicit_request) return sm80::backend().forward(p, exec);
    if (kernel == nullptr)
      return detail::unsupported("q: the cuda-sm90 backend has no kernel for this dtype with head_dim " +
                                 std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
                                 (needs_score_mods(p) ? " and softcap/ALiBi" : "") +
                                 " in this build (use FA_BACKEND_AUTO to fall back to cuda-sm80)");
    if (tma_arg != nullptr)
      return detail::unsupported(std::string(tma_arg) + ": the cuda-sm90 backend loads tensors with TMA, which needs "
                                 "non-zero strides along every dimension of extent > 1 (use FA_BACKEND_AUTO to fall "
                                 "back to cuda-sm80)");
    return detail::unsupported("q: the cuda-sm90 backend addresses at most 2^31-1 rows per tensor and 2^31-1 "
                               "(query block, head, batch) tiles");
  }
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return detail::ok();  // nothing to compute

  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  const std::pair<const char*, const void*> tensors[] = {{"q", p.q},     {"k", p.k},     {"v", p.v},
                                                         {"out", p.out}, {"lse", p.lse}, {"alibi_slopes", p.alibi}};
  for (const auto& [name, ptr] : tensors)
    if (detail::Error e = check_device_pointer(name, ptr, p.device_index); !e.ok()) return e;

  const FwdParams params = make_fwd_params(p);
  auto launch = ablation_launch(p);
  if (launch == nullptr) launch = kernel->launch;
  if (cudaError_t e = launch(params, static_cast<cudaStream_t>(exec.stream)); e != cudaSuccess)
    return runtime_error("cuda-sm90 forward kernel launch", e);
  return detail::ok();
}

detail::Error backward(const detail::Problem& p, const fa_exec& exec) { return sm80::backend().backward(p, exec); }

detail::TileShape tile_shape(const detail::Problem& p) {
  const FwdKernel* kernel = pick_kernel(p);
  if (kernel == nullptr) return sm80::backend().tile_shape(p);
  const FwdTiles t = fwd_tiles(kernel->head_dim, p.has_window());
  return {t.block_q(), t.block_k};
}

}  // namespace

cudaError_t kernels_runnable(int /*device*/) {
  cudaFuncAttributes a{};
  return kFwdKernels[0].attributes(&a);
}

const detail::Backend& backend() {
  // The same requirements as cuda-sm80 (it serves this backend's backward and fallbacks): 16-byte pointers and
  // strides in multiples of 8 elements, which TMA needs as well.
  static const detail::Backend b = [] {
    detail::Requirements r = sm80::backend().requirements;
    r.name = "cuda-sm90";
    return detail::Backend{"cuda-sm90", r, forward, backward, tile_shape};
  }();
  return b;
}

}  // namespace flashattn::cuda::sm90

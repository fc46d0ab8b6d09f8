// The CUDA hooks of core/backend.hpp: backend selection by architecture, the two CUDA backends (each plans the
// call, then runs the family the plan names), and reading varlen offsets.
#include <string>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "cuda/device.hpp"
#include "cuda/host_common.hpp"
#include "cuda/workspace.hpp"

namespace flashattn::cuda {

detail::Error device_arch(int device, int* arch) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || (e == cudaSuccess && count == 0))
    return detail::unsupported("q: CUDA tensors given but no CUDA device is available (" +
                               std::string(e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  if (e != cudaSuccess) return runtime_error("cudaGetDeviceCount", e);
  if (device < 0 || device >= count)
    return detail::invalid("q", "device_index " + std::to_string(device) + " is not a CUDA device (" +
                                    std::to_string(count) + " present)");
  int major = 0, minor = 0;
  if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess)
    return runtime_error("cudaDeviceGetAttribute", e);
  if ((e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) != cudaSuccess)
    return runtime_error("cudaDeviceGetAttribute", e);
  *arch = major * 10 + minor;
  return detail::ok();
}

namespace {

// Device pointers every launch reads or writes: checked once here for both families.
detail::Error check_pointers(const detail::Problem& p, bool backward) {
  const std::pair<const char*, const void*> forward_tensors[] = {{"q", p.q},
                                                                 {"k", p.k},
                                                                 {"v", p.v},
                                                                 {"out", p.out},
                                                                 {"lse", p.lse},
                                                                 {"alibi_slopes", p.alibi},
                                                                 {"sinks", p.sinks},
                                                                 {"q_descale", p.q_descale.data},
                                                                 {"k_descale", p.k_descale.data},
                                                                 {"v_descale", p.v_descale.data},
                                                                 {"dropout_rng", p.dropout.rng}};
  const std::pair<const char*, const void*> backward_tensors[] = {
      {"dout", p.dout}, {"dq", p.dq}, {"dk", p.dk}, {"dv", p.dv}, {"dsinks", p.dsinks}};
  for (const auto& [name, ptr] : forward_tensors)
    if (detail::Error e = check_device_pointer(name, ptr, p.device_index); !e.ok()) return e;
  if (backward)
    for (const auto& [name, ptr] : backward_tensors)
      if (detail::Error e = check_device_pointer(name, ptr, p.device_index); !e.ok()) return e;
  return detail::ok();
}

// The plan's kernels on `workspace` (plan.workspace_bytes): a gathered paged call first copies its keys into the
// workspace's start and runs the contiguous problem over them.
detail::Error run_forward_plan(const detail::Problem& p, const FwdPlan& plan, char* workspace, int* counter,
                               cudaStream_t stream) {
  if (plan.paged == PagedLoad::kGather) {
    GatherLayout layout;
    if (!gather_layout(p, &layout)) return detail::backend_error("paged K/V gather: the plan's layout overflows");
    char* k = workspace;
    char* v = workspace + layout.v_offset;
    if (cudaError_t e = launch_paged_gather(p, k, v, stream); e != cudaSuccess)
      return runtime_error("paged K/V gather kernel launch", e);
    FwdPlan contiguous = plan;
    contiguous.paged = PagedLoad::kNone;
    contiguous.workspace_bytes -= plan.gather_bytes;
    return run_forward_plan(contiguous_kv(p, k, v), contiguous, workspace + plan.gather_bytes, counter, stream);
  }
  switch (plan.family) {
    case Family::kSm80: return sm80::run_forward(p, plan, stream);
    case Family::kSm90:
#ifdef FLASHATTN_WITH_SM90
      return sm90::run_forward(p, plan, workspace, counter, stream);
#else
      break;
#endif
  }
  return detail::backend_error("forward plan names a kernel family this build does not have");
}

template <Family kSelected>
detail::Error forward(const detail::Problem& p, const fa_exec& exec) {
  FwdPlan plan;
  if (detail::Error e = plan_forward(p, exec, kSelected, &plan); !e.ok()) return e;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return detail::ok();  // nothing to compute
  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  if (detail::Error e = check_pointers(p, false); !e.ok()) return e;
  if (detail::Error e = check_device_pointer("block_table", p.block_table, p.device_index); !e.ok()) return e;
  const auto stream = static_cast<cudaStream_t>(exec.stream);
  Workspace ws;
  if (detail::Error e = ws.acquire(p.device_index, stream, size_t(plan.workspace_bytes), plan.counter_ints); !e.ok())
    return e;
  const detail::Error launched = run_forward_plan(p, plan, static_cast<char*>(ws.data()), ws.counter(), stream);
  const detail::Error released = ws.release();
  return launched.ok() ? released : launched;
}

template <Family kSelected>
detail::Error backward(const detail::Problem& p, const fa_exec& exec) {
  BwdPlan plan;
  if (detail::Error e = plan_backward(p, exec, kSelected, &plan); !e.ok()) return e;
  DeviceGuard guard(p.device_index);
  if (guard.status() != cudaSuccess) return runtime_error("cudaSetDevice", guard.status());
  if (p.batch == 0 || p.heads_q == 0) {
    // Nothing to compute, but dsinks has heads_q entries even without batches: the sum over no rows is 0.
    if (p.dsinks == nullptr || p.heads_q == 0) return detail::ok();
    if (detail::Error e = check_device_pointer("dsinks", p.dsinks, p.device_index); !e.ok()) return e;
    const cudaError_t zeroed =
        cudaMemsetAsync(p.dsinks, 0, size_t(p.heads_q) * sizeof(float), static_cast<cudaStream_t>(exec.stream));
    return zeroed == cudaSuccess ? detail::ok() : runtime_error("cudaMemsetAsync(dsinks)", zeroed);
  }
  if (detail::Error e = check_pointers(p, true); !e.ok()) return e;
#ifdef FLASHATTN_WITH_SM90
  if (plan.family == Family::kSm90) return sm90::run_backward(p, plan, static_cast<cudaStream_t>(exec.stream));
#endif
  return sm80::run_backward(p, plan, static_cast<cudaStream_t>(exec.stream));
}

template <Family kSelected>
detail::TileShape tile_shape(const detail::Problem& p) {
  FwdPlan plan;
  fa_exec exec{};
  exec.backend = FA_BACKEND_AUTO;
  if (!plan_forward(p, exec, kSelected, &plan).ok()) return {};
  return {plan.block_q, plan.block_k};
}

template <Family kSelected>
detail::Error plan_info(const detail::Problem& p, const fa_exec& exec, detail::Direction dir, detail::PlanInfo* out) {
  *out = detail::PlanInfo{};
  auto common = [&](const auto& plan) {  // the fields both plans have
    out->kernels = family_name(plan.family);
    out->block_q = plan.block_q;
    out->block_k = plan.block_k;
    out->workspace_bytes = plan.workspace_bytes;
  };
  if (dir == detail::Direction::kForward) {
    FwdPlan plan;
    if (detail::Error e = plan_forward(p, exec, kSelected, &plan); !e.ok()) return e;
    common(plan);
    out->num_splits = plan.num_splits;
    out->pack_gqa = plan.pack_gqa;
  } else {
    BwdPlan plan;
    if (detail::Error e = plan_backward(p, exec, kSelected, &plan); !e.ok()) return e;
    common(plan);
  }
  return detail::ok();
}

// 16-byte pointers and strides in multiples of 16 bytes (8 fp16/bf16 elements, 16 fp8 ones): every row of a tile
// starts on a 16-byte boundary, so the sm80 kernels move whole 128-bit vectors (cp.async 16 B) without alignment
// checks, and TMA (sm90) needs 16-byte strides as well. Both backends need the same, since either may run the sm80
// kernels.
constexpr int kVectorBytes = 16;

template <Family kFamily>
const detail::Backend& make_backend() {
  static const detail::Backend b{
      family_name(kFamily), detail::Requirements{kVectorBytes, kVectorBytes, false, family_name(kFamily)},
      forward<kFamily>,     backward<kFamily>,
      tile_shape<kFamily>,  plan_info<kFamily>};
  return b;
}

}  // namespace

const detail::Backend& backend(Family f) {
  return f == Family::kSm90 ? make_backend<Family::kSm90>() : make_backend<Family::kSm80>();
}

}  // namespace flashattn::cuda

namespace flashattn::detail {

namespace {
// The FlashAttention-2 kernels need mma.sync m16n8k16 for bf16 and cp.async: sm80.
constexpr int kSm80MinArch = 80;
// The FlashAttention-3 kernels are sm_90a code (wgmma, setmaxnreg): they run on compute capability 9.0 only.
constexpr int kSm90Arch = 90;

#ifdef FLASHATTN_WITH_SM90
constexpr bool kSm90Built = true;
#else
constexpr bool kSm90Built = false;
#endif
}  // namespace

Error select_cuda_backend(fa_backend requested, int device_index, const Backend** out) {
  int arch = 0;
  if (Error e = cuda::device_arch(device_index, &arch); !e.ok()) return e;
  const std::string device_desc = "device " + std::to_string(device_index) + " is sm" + std::to_string(arch);
  if (requested == FA_BACKEND_CUDA_SM90) {
    if (!kSm90Built)
      return unsupported(
          "exec.backend: this build of flashattn has no cuda-sm90 (Hopper) kernels (configure with "
          "FLASHATTN_CUDA_ARCHS including 90a); use FA_BACKEND_CUDA_SM80 or FA_BACKEND_AUTO");
    if (arch != kSm90Arch)
      return unsupported("exec.backend: the cuda-sm90 backend needs a compute capability 9.0 GPU (" + device_desc +
                         ")");
  }
  // AUTO prefers the Hopper kernels on sm90 when they are built; SM80 and everything else land on the
  // FlashAttention-2 kernels (they run on sm80 through sm90).
  const bool want_sm90 = kSm90Built && arch == kSm90Arch && requested != FA_BACKEND_CUDA_SM80;
  if (arch < kSm80MinArch)
    return unsupported("q: the CUDA backends need compute capability 8.0 or newer (" + device_desc + ")");
  cuda::DeviceGuard guard(device_index);
  if (guard.status() != cudaSuccess) return cuda::runtime_error("cudaSetDevice", guard.status());
  if (want_sm90) {
    if (cudaError_t e = cuda::sm90::kernels_runnable(device_index); e == cudaSuccess) {
      *out = &cuda::backend(cuda::Family::kSm90);
      return ok();
    } else if (requested == FA_BACKEND_CUDA_SM90) {
      cudaGetLastError();
      return unsupported("q: the cuda-sm90 kernels cannot run on this GPU (" + device_desc +
                         "): " + cudaGetErrorString(e));
    }
    cudaGetLastError();
  }
  if (cudaError_t e = cuda::sm80::kernels_runnable(device_index); e != cudaSuccess) {
    cudaGetLastError();  // the failed query is recorded as the last error; clear it for the caller
    return unsupported("q: the cuda-sm80 kernels were not built for this GPU (" + device_desc +
                       "; rebuild with FLASHATTN_SM80_ARCHS including " + std::to_string(arch) +
                       "): " + cudaGetErrorString(e));
  }
  *out = &cuda::backend(cuda::Family::kSm80);
  return ok();
}

Error copy_int32_to_host(const fa_tensor& t, void* stream_ptr, std::vector<int32_t>* out) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  cuda::DeviceGuard guard(t.device_index);
  if (guard.status() != cudaSuccess) return cuda::runtime_error("cudaSetDevice", guard.status());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    return cuda::runtime_error("cudaStreamIsCapturing", e);
  if (capture != cudaStreamCaptureStatusNone)
    return invalid("exec.stream",
                   "is capturing a CUDA graph: varlen offsets (cu_seqlens_q/cu_seqlens_k/seqused_k) "
                   "live on the device and cannot be read for validation during capture");
  out->assign(size_t(t.shape[0]), 0);
  if (out->empty()) return ok();
  if (cudaError_t e =
          cudaMemcpyAsync(out->data(), t.data, out->size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess)
    return cuda::runtime_error("reading varlen offsets (cudaMemcpyAsync)", e);
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return cuda::runtime_error("reading varlen offsets (cudaStreamSynchronize)", e);
  return ok();
}

bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace flashattn::detail

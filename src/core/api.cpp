// The C ABI entry points: pick the backend, run the one validation, hand the Problem to the backend.
// No exception crosses into a C caller: every entry point catches them (an allocation failure becomes
// FA_ERROR_BACKEND with a message).
#include <cmath>
#include <new>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/hadamard.hpp"
#include "flashattn/flashattn.h"

namespace flashattn::detail {
namespace {

thread_local std::string g_last_error;
// Set instead of g_last_error when even the message could not be allocated.
thread_local const char* g_static_error = nullptr;

fa_status record(const Error& e) {
  g_last_error = e.message;
  return e.code;
}

fa_status record_static(const char* message) noexcept {
  g_last_error.clear();  // never allocates
  g_static_error = message;
  return FA_ERROR_BACKEND;
}

// Runs an entry point's body; whatever it throws becomes FA_ERROR_BACKEND and the last error.
template <class F>
fa_status guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return record_static("out of memory: a host allocation failed");
  } catch (const std::exception& e) {
    try {
      return record(backend_error(std::string("internal error: ") + e.what()));
    } catch (...) {
      return record_static("internal error (an exception was thrown)");
    }
  } catch (...) {
    return record_static("internal error (an exception was thrown)");
  }
}

// The frame of the entry points that report through the last error: it is cleared, params (any of them non-null)
// checked, exec defaulted; body(exec) returns the call's Error, which becomes the status and the last error.
template <class F>
fa_status entry_call(const void* params, const fa_exec* exec, F&& body) {
  return guarded([&] {
    g_static_error = nullptr;
    g_last_error.clear();
    if (params == nullptr) return record(invalid("params", "null pointer"));
    const Error e = body(exec ? *exec : fa_exec_default());
    return e.ok() ? FA_OK : record(e);
  });
}

Error backend_code(const fa_exec& exec) {
  if (exec.backend < FA_BACKEND_AUTO || exec.backend > FA_BACKEND_CUDA_SM90)
    return invalid("exec.backend", "unknown backend code " + std::to_string(int(exec.backend)));
  return ok();
}
// exec.backend against the device of the tensors (`name`: the argument whose device decides).
Error device_rule(const fa_exec& exec, fa_device device, const char* name) {
  if (device == FA_DEVICE_CPU) {
    if (exec.backend != FA_BACKEND_AUTO && exec.backend != FA_BACKEND_CPU)
      return invalid("exec.backend", std::string("a CUDA backend needs CUDA tensors (") + name + " is on the CPU)");
    return ok();
  }
  if (device != FA_DEVICE_CUDA) return invalid(name, "unknown device code " + std::to_string(int(device)));
  if (exec.backend == FA_BACKEND_CPU)
    return invalid("exec.backend", std::string("the CPU backend needs CPU tensors (") + name + " is on CUDA)");
  return ok();
}

Error pick_backend(const fa_tensor& q, const fa_exec& exec, const Backend** out) {
  if (Error e = backend_code(exec); !e.ok()) return e;
  if (Error e = device_rule(exec, q.device, "q"); !e.ok()) return e;
  if (q.device == FA_DEVICE_CPU) {
    *out = &cpu_backend();
    return ok();
  }
#ifdef FLASHATTN_WITH_CUDA
  return select_cuda_backend(exec.backend, q.device_index, out);
#else
  return unsupported("q: CUDA tensors given but this build of flashattn has no CUDA backend");
#endif
}

// The validation needs the values of the varlen offsets; CUDA tensors are copied to the host first.
Error host_int32(const fa_tensor& t, const fa_exec& exec, std::vector<int32_t>* storage, const int32_t** out) {
  *out = nullptr;
  if (t.data == nullptr || t.dtype != FA_INT32 || t.ndim != 1 || t.shape[0] < 0) return ok();
  if (t.device == FA_DEVICE_CPU) {
    if (t.stride[0] != 1 && t.shape[0] > 1) return ok();  // validation reports the stride
    *out = static_cast<const int32_t*>(t.data);
    return ok();
  }
#ifdef FLASHATTN_WITH_CUDA
  if (t.stride[0] != 1 && t.shape[0] > 1) return ok();
  if (Error e = copy_int32_to_host(t, exec.stream, storage); !e.ok()) return e;
  *out = storage->data();
#else
  (void)exec;
  (void)storage;
#endif
  return ok();
}

Error prepare(const fa_attention& a, const fa_tensor& out, const fa_tensor& lse, const fa_tensor* dout,
              const fa_tensor* dq, const fa_tensor* dk, const fa_tensor* dv, Direction dir, const fa_exec& exec,
              const Backend** backend, Problem* problem, const fa_tensor* dsinks = nullptr) {
  if (Error e = pick_backend(a.q, exec, backend); !e.ok()) return e;
  if (exec.num_threads < 0) return invalid("exec.num_threads", "must be >= 0, 0 = all hardware threads");
  if (exec.num_splits < 0) return invalid("exec.num_splits", "must be >= 0, 0 = the plan picks, 1 = no split-KV");
  std::vector<int32_t> cu_q, cu_k, used;
  const int32_t *hq = nullptr, *hk = nullptr, *hu = nullptr;
  // Each offset tensor is read where it lives when that is q's device; an absent one (data == NULL, device
  // field left at CPU) or one on another device is left to the validation to report.
  auto read = [&](const fa_tensor& t, std::vector<int32_t>* storage, const int32_t** out) -> Error {
    if (t.data == nullptr || t.device != a.q.device) return ok();
    return host_int32(t, exec, storage, out);
  };
  if (Error e = read(a.cu_seqlens_q, &cu_q, &hq); !e.ok()) return e;
  if (Error e = read(a.cu_seqlens_k, &cu_k, &hk); !e.ok()) return e;
  // seqused_k is read for CPU calls only (validate.cpp: the CUDA kernels clamp its entries).
  if (a.q.device == FA_DEVICE_CPU)
    if (Error e = read(a.seqused_k, &used, &hu); !e.ok()) return e;
  return validate(a, out, lse, dout, dq, dk, dv, dir, (*backend)->requirements, hq, hk, hu, problem, dsinks);
}

// The calls beside the attention (fa_quantize_fp8, fa_kvcache_append, fa_merge_partials): their validation, then the
// implementation for the tensors' device, under the rules of exec.backend. `tensor` names the argument whose device
// decides; cuda is null in builds without CUDA.
template <class Params, class P>
fa_status run_beside_attention(const Params* params, const fa_exec* exec, const char* tensor,
                               Error (*validate_params)(const Params&, P*), Error (*cpu)(const P&),
                               Error (*cuda)(const P&, void*)) {
  return entry_call(params, exec, [&](const fa_exec& x) {
    if (Error e = backend_code(x); !e.ok()) return e;
    P problem;
    if (Error e = validate_params(*params, &problem); !e.ok()) return e;
    if (Error e = device_rule(x, problem.device, tensor); !e.ok()) return e;
    return problem.device == FA_DEVICE_CPU ? cpu(problem)
           : cuda != nullptr ? cuda(problem, x.stream)
                             : unsupported(std::string(tensor) +
                                           ": CUDA tensors given but this build of flashattn has no CUDA backend");
  });
}

// fa_forward and fa_forward_probs: the forward's one validation into a Problem, then `body` with it.
template <class Body>
fa_status forward_call(const fa_fwd_params* params, const fa_exec* exec, Body&& body) {
  return entry_call(params, exec, [&](const fa_exec& x) {
    const Backend* backend = nullptr;
    Problem problem;
    if (Error e = prepare(params->attn, params->out, params->lse, nullptr, nullptr, nullptr, nullptr,
                          Direction::kForward, x, &backend, &problem);
        !e.ok())
      return e;
    return body(*backend, problem, x);
  });
}

// fa_forward_probs' output: host float32 (B, Hq, Sq, Sk), contiguous; host inputs (the reference reads them).
Error validate_probs(const fa_tensor* probs, const Problem& p) {
  if (probs == nullptr) return invalid("probs", "null pointer");
  if (p.device != FA_DEVICE_CPU)
    return unsupported("q: fa_forward_probs reads host (CPU) tensors; copy q, k, v to the host first");
  const int64_t want[4] = {p.batch, p.heads_q, p.seqlen_q, p.seqlen_k};
  const std::string shape = "(" + std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " +
                            std::to_string(want[2]) + ", " + std::to_string(want[3]) + ")";
  const bool empty = want[0] * want[1] * want[2] * want[3] == 0;
  if (probs->data == nullptr && !empty) return invalid("probs", "null data pointer");
  if (probs->dtype != FA_FLOAT32) return invalid("probs", "must be float32");
  if (probs->device != FA_DEVICE_CPU) return invalid("probs", "must be host (CPU) memory");
  if (probs->ndim != 4) return invalid("probs", "must have 4 dimensions (B, Hq, Sq, Sk) " + shape);
  int64_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    if (probs->shape[d] != want[d]) return invalid("probs", "must have shape (B, Hq, Sq, Sk) " + shape);
    if (!empty && want[d] > 1 && probs->stride[d] != stride) return invalid("probs", "must be contiguous");
    stride *= want[d];
  }
  return ok();
}

// fa_kvcache_append has no CUDA implementation yet.
Error kvcache_cuda_missing(const KvcacheProblem&, void*) {
  return unsupported(
      "k_cache: fa_kvcache_append takes CPU tensors in this version (CUDA caches: flashattn.flash_attn_with_kvcache "
      "appends from Python)");
}

}  // namespace
}  // namespace flashattn::detail

using namespace flashattn::detail;

extern "C" {

fa_attention fa_attention_default(void) {
  fa_attention a{};
  a.causal_alignment = FA_ALIGN_BOTTOM_RIGHT;
  a.window_left = -1;
  a.window_right = -1;
  return a;
}

fa_exec fa_exec_default(void) {
  fa_exec e{};
  e.backend = FA_BACKEND_AUTO;
  return e;
}

const char* fa_last_error(void) { return g_static_error ? g_static_error : g_last_error.c_str(); }

fa_status fa_forward(const fa_fwd_params* params, const fa_exec* exec) {
  return forward_call(params, exec,
                      [](const Backend& backend, const Problem& p, const fa_exec& x) { return backend.forward(p, x); });
}

fa_status fa_forward_probs(const fa_fwd_params* params, const fa_tensor* probs, const fa_exec* exec) {
  return forward_call(params, exec, [probs](const Backend&, const Problem& p, const fa_exec&) {
    if (Error e = validate_probs(probs, p); !e.ok()) return e;
    return forward_probs_cpu(p, static_cast<float*>(probs->data));
  });
}

fa_status fa_backward(const fa_bwd_params* params, const fa_exec* exec) {
  return entry_call(params, exec, [&](const fa_exec& x) {
    const Backend* backend = nullptr;
    Problem problem;
    if (Error e = prepare(params->attn, params->out, params->lse, &params->dout, &params->dq, &params->dk, &params->dv,
                          Direction::kBackward, x, &backend, &problem, &params->dsinks);
        !e.ok())
      return e;
    if (backend->backward == nullptr)
      return unsupported(std::string("backward is not implemented by the ") + backend->name + " backend yet");
    return backend->backward(problem, x);
  });
}

namespace {
fa_status plan_of(const fa_fwd_params* fwd, const fa_bwd_params* bwd, const fa_exec* exec, fa_plan_info* info) {
  return entry_call(fwd ? static_cast<const void*>(fwd) : bwd, exec, [&](const fa_exec& x) {
    if (info == nullptr) return invalid("info", "null pointer");
    const Backend* backend = nullptr;
    Problem problem;
    const Direction dir = bwd ? Direction::kBackward : Direction::kForward;
    const Error prepared =
        bwd ? prepare(bwd->attn, bwd->out, bwd->lse, &bwd->dout, &bwd->dq, &bwd->dk, &bwd->dv, dir, x, &backend,
                      &problem, &bwd->dsinks)
            : prepare(fwd->attn, fwd->out, fwd->lse, nullptr, nullptr, nullptr, nullptr, dir, x, &backend, &problem);
    if (!prepared.ok()) return prepared;
    if (dir == Direction::kBackward && backend->backward == nullptr)
      return unsupported(std::string("backward is not implemented by the ") + backend->name + " backend yet");
    PlanInfo plan;
    if (Error e = backend->plan(problem, x, dir, &plan); !e.ok()) return e;
    *info = fa_plan_info{plan.kernels,    plan.block_q,          plan.block_k,
                         plan.num_splits, plan.pack_gqa ? 1 : 0, plan.workspace_bytes};
    return ok();
  });
}
}  // namespace

fa_status fa_forward_plan(const fa_fwd_params* params, const fa_exec* exec, fa_plan_info* info) {
  return plan_of(params, nullptr, exec, info);
}

fa_status fa_backward_plan(const fa_bwd_params* params, const fa_exec* exec, fa_plan_info* info) {
  return plan_of(nullptr, params, exec, info);
}

const char* fa_backend_name(const fa_fwd_params* params, const fa_exec* exec) {
  const char* name = "none";
  guarded([&] {
    const fa_exec x = exec ? *exec : fa_exec_default();
    const Backend* backend = nullptr;
    if (params != nullptr && pick_backend(params->attn.q, x, &backend).ok()) name = backend->name;
    return FA_OK;
  });
  return name;
}

void fa_forward_tile_shape(const fa_fwd_params* params, const fa_exec* exec, int* block_q, int* block_k) {
  int bq = 0, bk = 0;
  guarded([&] {
    const fa_exec x = exec ? *exec : fa_exec_default();
    const Backend* backend = nullptr;
    Problem problem;
    if (params == nullptr || !prepare(params->attn, params->out, params->lse, nullptr, nullptr, nullptr, nullptr,
                                      Direction::kForward, x, &backend, &problem)
                                  .ok())
      return FA_OK;
    TileShape t = backend->tile_shape(problem);
    bq = t.block_q;
    bk = t.block_k;
    return FA_OK;
  });
  if (block_q) *block_q = bq;
  if (block_k) *block_k = bk;
}

fa_tensor fa_make_tensor(void* data, fa_dtype dtype, fa_device device, int ndim, const int64_t* shape) {
  fa_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = ndim;
  if (shape == nullptr && ndim > 0) {
    t.ndim = -1;  // no shape to copy: the validation reports the rank of the argument
    return t;
  }
  int64_t stride = 1;
  for (int i = (ndim < FA_MAX_DIMS ? ndim : FA_MAX_DIMS) - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride;
    // Saturates instead of wrapping: the validation then reports the tensor as too large to address.
    if (__builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 1, &stride)) stride = INT64_MAX;
  }
  return t;
}

fa_status fa_quantize_fp8(const fa_quantize_params* params, const fa_exec* exec) {
#ifdef FLASHATTN_WITH_CUDA
  Error (*cuda)(const QuantizeProblem&, void*) = quantize_fp8_cuda;
#else
  Error (*cuda)(const QuantizeProblem&, void*) = nullptr;
#endif
  return run_beside_attention(params, exec, "x", validate_quantize, quantize_fp8_cpu, cuda);
}

fa_status fa_kvcache_append(const fa_kvcache_params* params, const fa_exec* exec) {
  return run_beside_attention(params, exec, "k_cache", validate_kvcache, kvcache_append_cpu, kvcache_cuda_missing);
}

fa_status fa_merge_partials(const fa_merge_params* params, const fa_exec* exec) {
#ifdef FLASHATTN_WITH_CUDA
  Error (*cuda)(const MergeProblem&, void*) = merge_partials_cuda;
#else
  Error (*cuda)(const MergeProblem&, void*) = nullptr;
#endif
  return run_beside_attention(params, exec, "out", validate_merge, merge_partials_cpu, cuda);
}

int fa_hadamard_sign(uint64_t seed, int c) { return hadamard_sign(seed, c); }

int fa_cuda_available(void) {
#ifdef FLASHATTN_WITH_CUDA
  return cuda_device_present() ? 1 : 0;
#else
  return 0;
#endif
}

}  // extern "C"

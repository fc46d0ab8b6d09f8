// C++ API over the C ABI in flashattn.h: the same parameter structs, a Status that carries the message,
// and helpers to describe tensors. No exceptions cross this boundary; nothing here needs torch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

using Tensor = fa_tensor;
using Attention = fa_attention;
using Exec = fa_exec;
using FwdParams = fa_fwd_params;
using BwdParams = fa_bwd_params;

struct Status {
  fa_status code = FA_OK;
  std::string message;
  bool ok() const { return code == FA_OK; }
  explicit operator bool() const { return ok(); }
};

inline Status forward(const FwdParams& p, const Exec& e = fa_exec_default()) {
  fa_status c = fa_forward(&p, &e);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

// The attention probabilities of a forward call, dropout as their sign (flashattn.h, fa_forward_probs).
inline Status forward_probs(const FwdParams& p, const fa_tensor& probs, const Exec& e = fa_exec_default()) {
  fa_status c = fa_forward_probs(&p, &probs, &e);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

inline Status backward(const BwdParams& p, const Exec& e = fa_exec_default()) {
  fa_status c = fa_backward(&p, &e);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

using QuantizeParams = fa_quantize_params;

// FP8 quantisation of x into out and descale (flashattn.h, fa_quantize_fp8).
inline Status quantize_fp8(const QuantizeParams& p, const Exec& e = fa_exec_default()) {
  fa_status c = fa_quantize_fp8(&p, &e);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

using KvcacheParams = fa_kvcache_params;

// The new tokens (rotated with rotary_cos/sin when given) into the KV cache, q rotated in place (flashattn.h,
// fa_kvcache_append); then forward() over the cache with seqused_k = cache_seqlens + new tokens.
inline Status kvcache_append(const KvcacheParams& p, const Exec& e = fa_exec_default()) {
  fa_status c = fa_kvcache_append(&p, &e);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

using MergeParams = fa_merge_params;

// (out_b, lse_b) merged into (out, lse) in place: the attention over both parts' keys (flashattn.h,
// fa_merge_partials).
inline Status merge_partials(const MergeParams& p, const Exec& e = fa_exec_default()) {
  fa_status c = fa_merge_partials(&p, &e);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

using PlanInfo = fa_plan_info;

// The plan of a call (which kernels, tiles, splits, workspace) without running it.
inline Status forward_plan(const FwdParams& p, PlanInfo* info, const Exec& e = fa_exec_default()) {
  fa_status c = fa_forward_plan(&p, &e, info);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

inline Status backward_plan(const BwdParams& p, PlanInfo* info, const Exec& e = fa_exec_default()) {
  fa_status c = fa_backward_plan(&p, &e, info);
  return {c, c == FA_OK ? std::string() : std::string(fa_last_error())};
}

// A contiguous (row-major) view of `data` with the given shape.
inline Tensor make_tensor(void* data, fa_dtype dtype, std::initializer_list<int64_t> shape,
                          fa_device device = FA_DEVICE_CPU) {
  int64_t dims[FA_MAX_DIMS] = {0, 0, 0, 0};
  int n = 0;
  for (int64_t s : shape) {
    if (n < FA_MAX_DIMS) dims[n] = s;
    ++n;
  }
  return fa_make_tensor(data, dtype, device, n, dims);
}

inline FwdParams make_fwd_params() {
  FwdParams p{};
  p.attn = fa_attention_default();
  return p;
}

inline BwdParams make_bwd_params() {
  BwdParams p{};
  p.attn = fa_attention_default();
  return p;
}

inline std::size_t dtype_size(fa_dtype t) {
  return t == FA_FLOAT8_E4M3 ? 1 : t == FA_FLOAT16 || t == FA_BFLOAT16 ? 2 : t == FA_INT64 ? 8 : 4;
}

// The one name of each dtype (numpy's and torch's spelling), for messages and reports, in the library and its tools.
inline const char* dtype_name(fa_dtype t) {
  switch (t) {
    case FA_FLOAT32: return "float32";
    case FA_FLOAT16: return "float16";
    case FA_BFLOAT16: return "bfloat16";
    case FA_INT32: return "int32";
    case FA_INT64: return "int64";
    case FA_FLOAT8_E4M3: return "float8_e4m3fn";
  }
  return "unknown";
}

// The short spelling (bf16, fp16, fp32) of the command line, the benchmark tables and the test case names.
inline const char* dtype_short_name(fa_dtype t) {
  switch (t) {
    case FA_FLOAT32: return "fp32";
    case FA_FLOAT16: return "fp16";
    case FA_BFLOAT16: return "bf16";
    case FA_INT32: return "int32";
    case FA_INT64: return "int64";
    case FA_FLOAT8_E4M3: return "fp8";
  }
  return "unknown";
}

}  // namespace flashattn

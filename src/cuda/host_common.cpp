// Host helpers shared by the CUDA backends.
#include "cuda/host_common.hpp"

#include <cmath>
#include <string>

namespace flashattn::cuda {

// A tensor the kernel will read must be device memory of the device it runs on (a host pointer labelled
// CUDA would otherwise fault the context).
detail::Error check_device_pointer(const char* name, const void* ptr, int device) {
  if (ptr == nullptr) return detail::ok();
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return detail::invalid(name, "is not a valid CUDA pointer (" + std::string(cudaGetErrorString(e)) + ")");
  }
  const bool on_device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  if (!on_device) return detail::invalid(name, "must point to CUDA device memory (got host memory)");
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    return detail::invalid(name, "lives on CUDA device " + std::to_string(a.device) + " but device_index says " +
                                     std::to_string(device));
  return detail::ok();
}

const char* dtype_name(fa_dtype t) { return t == FA_FLOAT16 ? "float16" : t == FA_BFLOAT16 ? "bfloat16" : "float32"; }

FwdParams make_fwd_params(const detail::Problem& p) {
  FwdParams k;
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.out = p.out;
  k.lse = p.lse;
  k.q_batch = p.q_layout.batch, k.q_row = p.q_layout.row, k.q_head = p.q_layout.head;
  k.k_batch = p.k_layout.batch, k.k_row = p.k_layout.row, k.k_head = p.k_layout.head;
  k.v_batch = p.v_layout.batch, k.v_row = p.v_layout.row, k.v_head = p.v_layout.head;
  k.o_batch = p.out_layout.batch, k.o_row = p.out_layout.row, k.o_head = p.out_layout.head;
  k.lse_batch = p.lse_layout.batch, k.lse_row = p.lse_layout.row, k.lse_head = p.lse_layout.head;
  if (p.varlen) {
    k.cu_seqlens_q = p.cu_seqlens_q;
    k.cu_seqlens_k = p.cu_seqlens_k;
  }
  k.seqused_k = p.seqused_k;
  k.batch = int(p.batch);
  k.heads_q = int(p.heads_q);
  k.group = int(p.group());
  k.seqlen_q = int(p.seqlen_q);
  k.seqlen_k = int(p.seqlen_k);
  k.head_dim = int(p.head_dim);
  k.head_dim_v = int(p.head_dim_v);
  k.tensor_rows_q = p.varlen ? p.total_q : p.seqlen_q;
  k.tensor_rows_k = p.varlen ? p.total_k : p.seqlen_k;
  const float log2e = float(1.0 / std::log(2.0));
  if (p.softcap > 0.f) {
    k.softcap = p.softcap;
    k.softcap_in_scale = p.scale / p.softcap;
    k.logit_scale = 1.f;
  } else {
    k.logit_scale = p.scale;
  }
  k.scale_log2 = k.logit_scale * log2e;
  k.bottom_right = p.alignment == FA_ALIGN_BOTTOM_RIGHT;
  k.has_window = p.has_window();
  k.window_left = int(p.window_left);
  k.window_right = int(p.window_right);
  k.alibi = p.alibi;
  k.alibi_batch_stride = p.alibi_batch_stride;
  k.sinks = p.sinks;
  return k;
}

}  // namespace flashattn::cuda

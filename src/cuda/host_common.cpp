// Host helpers shared by the CUDA backends.
#include "cuda/host_common.hpp"

#include "cuda/device.hpp"

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
    return detail::invalid(
        name, "lives on CUDA device " + std::to_string(a.device) + " but device_index says " + std::to_string(device));
  return detail::ok();
}

bool gather_layout(const detail::Problem& p, GatherLayout* layout) {
  constexpr int64_t kAlign = 256, kMax = int64_t(1) << 60;
  auto copy_bytes = [&](int64_t dim) {
    int64_t n = 2;  // 16-bit storage
    for (int64_t f : {p.batch, p.seqlen_k, p.heads_kv, dim})
      if (__builtin_mul_overflow(n, f, &n) || n > kMax) return int64_t(-1);
    return (n + kAlign - 1) / kAlign * kAlign;
  };
  const int64_t k = copy_bytes(p.head_dim), v = copy_bytes(p.head_dim_v);
  if (k < 0 || v < 0) return false;
  *layout = GatherLayout{k, k + v};
  return true;
}

detail::Problem contiguous_kv(const detail::Problem& p, void* k, void* v) {
  detail::Problem c = p;
  c.block_table = nullptr;
  c.block_table_stride = c.page_size = c.num_pages = c.max_pages = 0;
  c.k = k;
  c.v = v;
  c.k_layout = detail::RowLayout{p.seqlen_k * p.heads_kv * p.head_dim, p.heads_kv * p.head_dim, p.head_dim, true};
  c.v_layout = detail::RowLayout{p.seqlen_k * p.heads_kv * p.head_dim_v, p.heads_kv * p.head_dim_v, p.head_dim_v, true};
  c.total_k = p.batch * p.seqlen_k;
  return c;
}

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
  if (p.paged()) {
    k.block_table = p.block_table;
    k.block_table_stride = p.block_table_stride;
    k.page_size = int(p.page_size);
    k.num_pages = int(p.num_pages);
    k.tensor_rows_k = p.page_size;
  }
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
  k.dropout = p.dropout;
  k.q_descale = p.q_descale;
  k.k_descale = p.k_descale;
  k.v_descale = p.v_descale;
  return k;
}

BwdParams make_bwd_params(const detail::Problem& p, const BwdPlan& plan) {
  BwdParams k;
  static_cast<FwdParams&>(k) = make_fwd_params(p);
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
  k.dsum_stride = dsum_stride(k.rows_q);
  k.deterministic = plan.deterministic;
  k.dq_ordered = plan.dq_ordered;
  k.dq_first_stores = plan.dq_first_stores;
  k.dq_tile = plan.dq_tile;
  k.dq_blocks = plan.dq_blocks;
  k.dq_splits = plan.dq_splits;
  k.tail_pairs = plan.tail_pairs;
  return k;
}

detail::Error run_backward_in_workspace(const detail::Problem& p, const BwdPlan& plan, const char* family,
                                        BwdLaunch launch, cudaStream_t stream) {
  BwdParams params = make_bwd_params(p, plan);
  const BwdWorkspace ws = bwd_workspace(params);
  void* buffer = nullptr;
  if (ws.total() > 0) {
    if (cudaError_t e = cudaMallocAsync(&buffer, size_t(ws.total()) * sizeof(float), stream); e != cudaSuccess)
      return runtime_error(std::string(family) + " backward workspace (cudaMallocAsync of " +
                               std::to_string(ws.total() * int64_t(sizeof(float))) + " bytes)",
                           e);
  }
  float* at = static_cast<float*>(buffer);
  auto section = [&](int64_t floats) {
    float* s = floats ? at : nullptr;
    at += floats;
    return s;
  };
  params.dsum = section(ws.dsum);
  params.dq_acc = section(ws.dq_acc);
  params.dq_order = reinterpret_cast<int*>(section(ws.dq_order));
  params.dq_claim = reinterpret_cast<int*>(section(ws.dq_claim));
  params.dk_acc = section(ws.dk_acc);
  params.dv_acc = section(ws.dv_acc);
  params.dsinks = p.dsinks;
  cudaError_t launched = launch(params, plan, stream);
  if (launched == cudaSuccess && p.dsinks != nullptr) launched = launch_sink_grad(params, stream);
  const cudaError_t freed = buffer ? cudaFreeAsync(buffer, stream) : cudaSuccess;
  if (launched != cudaSuccess) return runtime_error(std::string(family) + " backward kernel launch", launched);
  if (freed != cudaSuccess) return runtime_error(std::string(family) + " backward workspace cudaFreeAsync", freed);
  return detail::ok();
}

}  // namespace flashattn::cuda

// What a backend provides to the dispatcher in api.cpp. Backends see only the validated Problem.
#pragma once

#include "core/problem.hpp"

namespace flashattn::detail {

struct TileShape {
  int block_q = 0, block_k = 0;
};

// What a call's plan says (fa_forward_plan / fa_backward_plan in flashattn.h).
struct PlanInfo {
  const char* kernels = "";  // the kernel family that runs: "cpu", "cuda-sm80", "cuda-sm90"
  int block_q = 0, block_k = 0;
  int num_splits = 1;
  bool pack_gqa = false;
  int64_t workspace_bytes = 0;
};

struct Backend {
  const char* name;
  Requirements requirements;
  Error (*forward)(const Problem&, const fa_exec&);
  Error (*backward)(const Problem&, const fa_exec&);
  TileShape (*tile_shape)(const Problem&);
  Error (*plan)(const Problem&, const fa_exec&, Direction, PlanInfo*);
};

const Backend& cpu_backend();
// fa_quantize_fp8 on the CPU (src/cpu/quantize.cpp).
Error quantize_fp8_cpu(const QuantizeProblem& p);
// fa_kvcache_append on the CPU (src/cpu/kvcache.cpp).
Error kvcache_append_cpu(const KvcacheProblem& p);
// fa_forward_probs on the host (src/cpu/probs.cpp): probs (B, Hq, Sq, Sk) contiguous float32.
Error forward_probs_cpu(const Problem& p, float* probs);
// fa_merge_partials on the CPU (src/cpu/merge.cpp).
Error merge_partials_cpu(const MergeProblem& p);

#ifdef FLASHATTN_WITH_CUDA
// src/cuda/dispatch.cu: the CUDA backend for `requested` (AUTO picks by the device's architecture), or an
// error naming why none fits (no device, architecture too old, backend not built).
Error select_cuda_backend(fa_backend requested, int device_index, const Backend** out);
// Copies a small int32 device tensor (cu_seqlens, seqused_k) to the host, for validation and scheduling.
Error copy_int32_to_host(const fa_tensor& t, void* stream, std::vector<int32_t>* out);
bool cuda_device_present();
// fa_quantize_fp8 on CUDA (src/cuda/quantize_fp8.cu), in stream order.
Error quantize_fp8_cuda(const QuantizeProblem& p, void* stream);
// fa_merge_partials on CUDA (src/cuda/merge.cu), in stream order.
Error merge_partials_cuda(const MergeProblem& p, void* stream);
#endif

}  // namespace flashattn::detail

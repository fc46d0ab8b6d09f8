// Pieces of the `flashattn` CLI: problem description, buffers on the chosen device, timing, checking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace flashattn::cli {

struct Shape {
  int64_t batch = 1, seqlen_q = 1024, seqlen_k = 1024, heads = 8, heads_kv = 0, head_dim = 64, head_dim_v = 0;
  fa_dtype dtype = FA_BFLOAT16;
  bool causal = false, top_left = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool alibi = false;
  int64_t hkv() const { return heads_kv > 0 ? heads_kv : heads; }
  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  std::string describe() const;
};

struct Options {
  bool backward = false, check = false;
  int threads = 0, iters = 0, warmup = 1;
  fa_backend backend = FA_BACKEND_AUTO;
  uint64_t seed = 0;
};

struct RunResult {
  std::string backend;
  bool ok = false;
  std::string error;
  double fwd_ms = 0, bwd_ms = 0;  // medians
  double fwd_tflops = 0, bwd_tflops = 0;
  double max_err = 0, mean_err = 0, tol = 0;  // forward check (sampled rows)
  double dq_max_err = 0, dq_tol = 0;          // backward check (sampled dq rows)
  bool check_passed = true;
  int checked_rows = 0;  // 0: nothing to compare (an empty problem)
  int block_q = 0, block_k = 0;
  // The plan the library reports for the call (fa_forward_plan / fa_backward_plan): what the kernels that ran
  // were, their tiles, splits, GQA packing and workspace. ok = false when the library refused the call.
  fa_plan_info fwd_plan{}, bwd_plan{};
  bool fwd_plan_ok = false, bwd_plan_ok = false;
};

// FLOPs by the standard convention: 4*B*H*Sq*Sk*D forward (D = mean of qk and v dims), halved when
// causal; windows count the pairs they keep; the backward is 2.5x.
double forward_flops(const Shape& s);

// Bytes a standard implementation (QK^T, softmax, PV as separate kernels, S and P in memory) moves vs
// what the tiled kernel moves with its real tile sizes, for the forward.
struct IoPicture {
  double standard_bytes = 0, fused_bytes = 0;
};
IoPicture io_picture(const Shape& s, int block_q, int block_k);

RunResult run_attention(const Shape& s, const Options& o);

std::string human_bytes(double b);

}  // namespace flashattn::cli

// One attention test problem on the host: random inputs, poisoned outputs, the params for the API, and the
// comparison of what a backend wrote against the float64 reference (FlashAttention acceptance rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cpu/reference.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {

struct Case {
  int64_t batch = 1, seqlen_q = 17, seqlen_k = 17, heads_q = 2, heads_kv = 2, head_dim = 64, head_dim_v = 0;
  fa_dtype dtype = FA_BFLOAT16;
  bool causal = false, top_left = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool alibi = false;
  bool sinks = false;  // learnable sink logits (and their gradient in the backward)
  float dropout_p = 0.f;
  uint64_t dropout_seed = 42, dropout_offset = 0;
  std::vector<int32_t> varlen_q, varlen_k;  // per-sequence lengths: varlen when non-empty
  std::vector<int32_t> seqused_k;           // optional
  bool lse = true;
  int64_t head_pad = 0;  // extra elements between heads: non-contiguous strides
  uint64_t seed = 1;
  int threads = 0;

  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool varlen() const { return !varlen_q.empty(); }
  std::string name() const;
};

struct Accuracy {
  reference::Comparison out, lse, dq, dk, dv, dsinks;
  explicit Accuracy(fa_dtype t) : out(t), lse(FA_FLOAT32), dq(t), dk(t), dv(t), dsinks(t) {}
};

// Host tensors of one case. Storage stays alive as long as the object.
class Problem {
 public:
  explicit Problem(const Case& c);
  FwdParams fwd() const;
  BwdParams bwd() const;
  fa_exec exec() const;
  // Runs the forward (and optionally backward) through the public API; returns the status.
  Status run_forward();
  Status run_backward();
  // Validated view for the reference (host requirements).
  detail::Problem view() const;
  // Compares every written value with the float64 reference.
  Accuracy check_forward() const;
  Accuracy check_backward() const;

  const Case c;
  std::vector<uint8_t> q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse, alibi, sinks, dsinks;
  std::vector<int32_t> cu_q, cu_k, used_k;
  int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;

 private:
  fa_tensor qkv_tensor(const std::vector<uint8_t>& buf, bool key_rows, int64_t heads, int64_t dim) const;
};

// A default case with these sequence lengths.
inline Case with_lengths(int64_t seqlen_q, int64_t seqlen_k) {
  Case c;
  c.seqlen_q = seqlen_q;
  c.seqlen_k = seqlen_k;
  return c;
}

// Runs the forward (and the backward when asked) through the public API on the CPU backend and expects
// every output to pass the FlashAttention rule against the float64 reference (GoogleTest expectations).
void expect_matches_reference(const Case& c, bool backward);

}  // namespace flashattn::testing

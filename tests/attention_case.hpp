// One attention test problem on the host: a Case (tests/case.hpp) turned into random inputs, poisoned outputs and
// the params for the API, and the comparison of what a backend wrote against the float64 reference (the rule of
// docs/testing.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "case.hpp"
#include "core/problem.hpp"
#include "cpu/reference.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {

struct Accuracy {
  Comparison out, lse, dq, dk, dv, dsinks;
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
  std::vector<float> q_descale, k_descale, v_descale;  // FP8 factors (Case::descale)
  std::vector<int32_t> cu_q, cu_k, used_k;
  std::vector<uint64_t> dropout_rng;  // (seed, offset) when c.dropout_rng
  int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;

 private:
  fa_tensor qkv_tensor(const std::vector<uint8_t>& buf, bool key_rows, int64_t heads, int64_t dim) const;
  int64_t sequences() const;
  int64_t row_elems(int64_t heads, int64_t dim) const;  // elements per (batch, row) of a q/k/v/out tensor
  void poison_unused_keys();
};

// A default case with these sequence lengths.
inline Case with_lengths(int64_t seqlen_q, int64_t seqlen_k) {
  Case c;
  c.sq = seqlen_q;
  c.sk = seqlen_k;
  return c;
}

// Runs the forward (and the backward when asked) through the public API on the CPU backend and expects
// every output to pass the FlashAttention rule against the float64 reference (GoogleTest expectations).
void expect_matches_reference(const Case& c, bool backward);

}  // namespace flashattn::testing

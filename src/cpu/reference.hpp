// Naive attention in float64 that materialises the scores: the ground truth for tests and `--check`.
// With Rounding::kStorage it becomes "a plain low-precision implementation" (scores, probabilities and
// outputs rounded to the storage dtype and sums accumulated in fp32, as an unfused framework computes them),
// whose error against the exact reference sets the tolerance (the FlashAttention convention: ours <= 2x that
// error).
#pragma once

#include <string>
#include <vector>

#include "core/problem.hpp"

namespace flashattn::reference {

enum class Rounding { kExact, kStorage };

// Rows are global: batched b * seqlen_q + r, varlen cu_seqlens_q[b] + r (keys likewise).
struct Forward {
  std::vector<double> out;  // [heads_q][rows_q][head_dim_v]
  std::vector<double> lse;  // [heads_q][rows_q]
};
struct Grads {
  std::vector<double> dq;      // [heads_q][rows_q][head_dim]
  std::vector<double> dk;      // [heads_kv][rows_k][head_dim]
  std::vector<double> dv;      // [heads_kv][rows_k][head_dim_v]
  std::vector<double> dsinks;  // [heads_q] (zeros without sinks)
  // Rounding::kExact only (empty otherwise): per element of dq/dk, twice the noise an fp32 evaluation of
  // dS = P * (dP - D) carries from its dot products alone: each dS term's u32 * sqrt(head_dim_v) * its magnitude
  // (P * (|dO|.|V| + sum_k P_k |dO|.|V_k|) * scale), times |K| or |Q|, summed in squares (independent roundings).
  // Where the exact gradient is 0 by cancellation (one visible key: dP = D) an implementation that forms
  // D = rowsum(dO * O), as FlashAttention does, keeps that noise while the plain implementation's D = sum(P dP)
  // cancels exactly, so the 2x rule alone would refuse a correct fp32 backward there. For 16-bit storage also the
  // error D takes from the stored O (one ulp per element): with dropout one visible key gives O = v / (1 - p),
  // which fp16 / bf16 do not hold exactly.
  std::vector<double> dq_noise, dk_noise;
};

void forward(const detail::Problem& p, Rounding rounding, Forward* result);
// The exact softmax probabilities of one query row over keys 0 .. len_k(b) (masked keys 0; sinks in the
// denominator; no dropout), as the forward's P.V uses them.
void probs_row(const detail::Problem& p, int64_t b, int64_t h, int64_t i, double* probs);
// One query row (for sampled checks of large problems).
void forward_row(const detail::Problem& p, Rounding rounding, int64_t b, int64_t h, int64_t i, double* out_row,
                 double* lse);
void backward(const detail::Problem& p, Rounding rounding, Grads* result);
// dQ of one query row; dq_noise (kExact, optional): its rounding noise allowance as in Grads.
void backward_dq_row(const detail::Problem& p, Rounding rounding, int64_t b, int64_t h, int64_t i, double* dq_row,
                     double* dq_noise = nullptr);

// The tolerance rule of every suite (docs/testing.md: the CPU and GPU C++ suites, `flashattn run --check`; the
// Python suites state the same rule in bench/gpu/common.py and tests/python/fa_reference.py). It reads only
// numbers, never a kernel: the float64 reference above stays the independent judge.
// Accumulates the FlashAttention acceptance rule over many elements: max |ours - exact| must be at most
// 2x max |plain - exact| (plain = Rounding::kStorage) plus a floor of one storage ulp at the largest
// reference magnitude; any NaN where the reference is finite fails. Equal infinities (fully masked rows'
// -inf LSE) count as exact. An element's `noise` (Grads::dq_noise / dk_noise) is subtracted from its error
// before the rule: rounding an fp32 accumulator cannot avoid is never a defect.
class Comparison {
 public:
  explicit Comparison(fa_dtype dtype) : dtype_(dtype) {}
  void add(double ours, double exact, double plain, double noise = 0);
  double max_err() const { return max_err_; }
  double mean_err() const { return count_ ? sum_err_ / double(count_) : 0.0; }
  double plain_max_err() const { return plain_max_err_; }
  double tolerance() const;
  bool nan_seen() const { return nan_; }
  bool passed() const { return !nan_ && max_excess_ <= tolerance(); }
  std::string summary() const;

 private:
  fa_dtype dtype_;
  double max_err_ = 0, sum_err_ = 0, plain_max_err_ = 0, ref_max_abs_ = 0;
  double max_excess_ = 0, max_noise_ = 0;  // max (error - noise) over the elements; the largest noise allowance
  int64_t count_ = 0;
  bool nan_ = false;
};

// Reads element (b, r, h, c) of a tensor of the problem as double.
double load(const detail::Problem& p, const void* base, const detail::RowLayout& l, int64_t b, int64_t r, int64_t h,
            int64_t c);

}  // namespace flashattn::reference

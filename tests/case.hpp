// The one vocabulary of the attention test suites: a Case describes a problem (shape, dtype, mask, score
// modifiers, sequence layout, strides, execution), whoever builds its tensors. The CPU suites build host
// tensors from it (tests/attention_case.*), the GPU suites device tensors (tests/gpu/gpu_support.hpp), and the
// Python GPU suite's Case (bench/gpu/check.py) uses the same field names. docs/testing.md has the table and
// the tolerance rule; the rule itself is reference::Comparison (src/cpu/reference.hpp), so that the suites,
// the GPU binary and `flashattn run --check` judge with one implementation against one float64 reference.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/reference.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {

// The backend a case asks for by name, as fa_backend_name reports it (nullptr for AUTO: the library picks).
inline const char* backend_label(fa_backend b) {
  switch (b) {
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA_SM80: return "cuda-sm80";
    case FA_BACKEND_CUDA_SM90: return "cuda-sm90";
    default: return nullptr;
  }
}

// ALiBi slopes: none, one per query head (Hq), or one per sequence and query head (B, Hq).
enum class Alibi { kNone, kHeads, kBatch };

struct Case {
  // The GPU suites' gtest parameter name (their seed is derived from it); CPU cases leave it empty and are named
  // by label().
  std::string name;
  fa_dtype dtype = FA_BFLOAT16;
  // Shape: sequences, query/key lengths, query/key heads (hq % hkv == 0: GQA/MQA), head dims (dv 0: dv = d).
  int64_t batch = 1, sq = 17, sk = 17, hq = 2, hkv = 2, d = 64, dv = 0;
  // Mask: causal (bottom-right unless top_left), sliding window reaches (-1: unbounded).
  bool causal = false, top_left = false;
  int64_t wl = -1, wr = -1;
  // Score modifiers and probabilities.
  float softcap = 0.f;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;  // learnable sink logits, one per query head (and their gradient in the backward)
  float dropout_p = 0.f;
  uint64_t dropout_seed = 42, dropout_offset = 0;
  bool dropout_rng = false;  // seed and offset passed as attn.dropout_rng, an int64 tensor on the call's device
  // FP8 (dtype FA_FLOAT8_E4M3): the dequantisation factors given, none, per KV head (q_descale (B, Hkv), as
  // FlashAttention-3) or with q_descale per query head (B, Hq).
  enum class Descale { kNone, kKvHeads, kQueryHeads } descale = Descale::kKvHeads;
  // Q drawn from N(0, q_gain^2) (FP8: its dequantisation factors times q_gain): large gains spread the logits over
  // tens of binary orders, so that a row's running max jumps between key blocks and the kernels' rescale of O runs.
  float q_gain = 1.f;
  // Sequences: varlen when lens_q is non-empty (one entry per sequence, lens_k alike; batch, sq, sk unused).
  std::vector<int32_t> lens_q, lens_k;
  std::vector<int32_t> seqused_k;  // keys used per sequence (a KV cache); empty: all
  bool nan_past_used = false;      // K/V rows past seqused_k hold NaN: unwritten cache slots must not leak
  // Layout: extra elements between heads (CPU suites) or at the end of each row (GPU suites); both make the
  // strides non-contiguous in a different dimension.
  int64_t head_pad = 0, row_pad = 0;
  bool lse = true;  // the forward is asked for the LSE
  // Execution (fa_exec): backend, split-KV hint, deterministic backward, CPU threads; seed of the CPU inputs.
  fa_backend backend = FA_BACKEND_AUTO;
  int num_splits = 0;
  bool deterministic = false;
  int threads = 0;
  uint64_t seed = 1;

  int64_t value_dim() const { return dv > 0 ? dv : d; }
  // What out (and the backward's tensors) are stored in: bfloat16 for FP8 inputs.
  fa_dtype out_dtype() const { return dtype == FA_FLOAT8_E4M3 ? FA_BFLOAT16 : dtype; }
  bool varlen() const { return !lens_q.empty(); }
  // The name (when set), then every field that differs from a plain problem: what a failure message shows.
  std::string label() const;
};

inline std::string Case::label() const {
  std::ostringstream s;
  if (!name.empty()) s << name << ": ";
  s << dtype_name(dtype);
  if (varlen()) {
    s << " varlen";
    for (size_t b = 0; b < lens_q.size(); ++b) s << (b ? "," : " ") << lens_q[b] << "x" << lens_k.at(b);
  } else {
    s << " B" << batch << " q" << sq << " k" << sk;
  }
  s << " h" << hq << ":" << hkv << " d" << d;
  if (value_dim() != d) s << "/" << value_dim();
  if (causal) s << (top_left ? " causal-tl" : " causal");
  if (wl >= 0 || wr >= 0) s << " win(" << wl << "," << wr << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (alibi != Alibi::kNone) s << (alibi == Alibi::kBatch ? " alibi(B,Hq)" : " alibi");
  if (sinks) s << " sinks";
  if (dropout_p > 0.f) s << " dropout " << dropout_p << (dropout_rng ? " (rng tensor)" : "");
  if (dtype == FA_FLOAT8_E4M3)
    s << (descale == Descale::kNone ? " no-descale" : descale == Descale::kQueryHeads ? " q-descale(B,Hq)" : "");
  if (q_gain != 1.f) s << " q_gain" << q_gain;
  if (!seqused_k.empty()) s << (nan_past_used ? " seqused(NaN tail)" : " seqused");
  if (head_pad || row_pad) s << " strided";
  if (const char* b = backend_label(backend)) s << " " << b;
  if (num_splits) s << " splits" << num_splits;
  if (deterministic) s << " deterministic";
  return s.str();
}

// The tolerance rule of every suite (docs/testing.md): per tensor, max |ours - exact| <= 2 * max |plain - exact|
// + one storage ulp at the largest reference magnitude, NaN never passing. One name for the suites to use.
using Comparison = reference::Comparison;

}  // namespace flashattn::testing

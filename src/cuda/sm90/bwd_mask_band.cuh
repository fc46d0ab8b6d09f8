// The causal/window mask of the sm90 backward's tiles that lie inside both sequences, as a band of key - query
// offsets (the rule of core/mask_rule.hpp, held by the mask policies of common/fwd_policies.cuh, in another form).
// Only the sm90 backward includes it: the forward keeps apply_mask (below, mask_band's comment says why), and the
// sm80 units do not rebuild when it changes.
#pragma once

#include <climits>

#include <cute/tensor.hpp>

#include "cuda/common/fwd_policies.cuh"

namespace flashattn::cuda {

// The keys inside the sequence that a query sees, as offsets key - query in [lo, hi], each side bounded only where
// the mask has it (causal: hi alone). Within a tile whose keys and queries all lie inside the sequences, this is the
// whole mask, and a thread's element (r, c) has the offset of its first element plus a compile-time constant of the
// fragment's layout: a test compares that constant with one scalar per tile (mask_band).
struct DiagBand {
  int lo, hi;
  bool has_lo, has_hi;
};

__host__ __device__ inline DiagBand diag_band(const KeyLengthMask&) { return {0, 0, false, false}; }
// WindowMask::cols() as offsets key - query, for keys below len_k. The validation bounds windows by the sequence
// lengths, so the offsets, and mask_band's differences with them, stay inside int for sequences below 2^30 (cols()
// has the same bound).
__host__ __device__ inline DiagBand diag_band(const WindowMask& m) {
  return {m.rule.diag_off - m.rule.left, m.rule.diag_off + m.rule.right, m.rule.left >= 0, m.rule.right >= 0};
}

// The mask of a tile inside both sequences through its band: sets s(r, c) to `hidden` where the band hides it.
// coords: each element's position in the tile, the key in mode kKeyMode (1: (query, key) tiles, 0: the backward's
// (key, query) S^T); n0_m0: the tile's first key minus its first query. An element's key - query is the thread's
// first element's plus a compile-time constant of the fragment's layout, so each test compares that constant with
// one scalar per tile, and ptxas shares the compares of equal offsets (d128 backward SASS: 6 compares for every
// 10-12 probabilities and a select each, about 2 instructions a probability, against about 10 through cols(), whose
// columns are the backward's queries). The sm90 forward keeps apply_mask (3.5 instructions a score): there ptxas
// spilled 92 bytes in the d128 176-key kernel and 116 in the d64 causal one to hold the shared compares.
// Measured against cols() in the backward (H100, bf16, 16k tokens): causal d64 +6-8 %, d128 +0.5-4 % at 512-4k,
// non-causal unchanged (bench/results/2026-12-07_h100_session47/README.md, run 2).
template <int kKeyMode, class S, class C>
__host__ __device__ void mask_band(S& s, const C& coords, const DiagBand& band, int n0_m0, float hidden) {
  constexpr int kQueryMode = 1 - kKeyMode;
  const int key0 = cute::get<kKeyMode>(coords(0, 0)), q0 = cute::get<kQueryMode>(coords(0, 0));
  const int base = n0_m0 + key0 - q0;
  const int hi = band.has_hi ? band.hi - base : INT_MAX, lo = band.has_lo ? band.lo - base : INT_MIN;
  CUTE_UNROLL
  for (int i = 0; i < cute::size(s); ++i) {
    const int off = (cute::get<kKeyMode>(coords(i)) - key0) - (cute::get<kQueryMode>(coords(i)) - q0);
    if (off > hi || off < lo) s(i) = hidden;
  }
}

}  // namespace flashattn::cuda

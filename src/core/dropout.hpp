// The dropout mask as a pure function of its coordinates, shared by the float64 reference, the CPU backend and
// the CUDA kernels. Element (b, h, i, j) of a call with (seed, offset) belongs to the group of eight
//   queries {i0, i0 + 8} x keys {j0, j0 + 1, j0 + 8, j0 + 9},   i0 % 16 < 8, j0 % 16 in {0, 2, 4, 6},
// whose four 32-bit words are Philox4x32-7(counter = (key_group(j), query_group(i), b * heads_q + h, offset_lo),
// key = (seed_lo, seed_hi ^ offset_hi)); (seed, offset) are the call's integers or its dropout_rng tensor. The element
// draws the 16-bit half (low for even j, high for odd j) of word
// ((i >> 3) & 1) | ((j >> 3) & 1) << 1 and is kept when that draw is below floor((1 - p) * 2^16) (so p resolves to
// 2^-16: at p = 0.1 the keep rate is 1 - p - 6e-6). b is the batch entry (varlen: the sequence), h the query head,
// i and j the query and key positions within that sequence. Kept probabilities are scaled by 1 / (1 - p). No
// state, no order: the backward regenerates the forward's mask, any tiling gives the same one, and nothing N x N is
// stored.
// Why this grouping: a group is exactly what one thread holds of a 16 x 16 tile of the accumulators of mma.sync
// m16n8k16 (two adjacent n8 atoms) and wgmma m64nNk16 with queries as rows, so the sm90 forward spends one Philox
// call on every eight probabilities; its backward (keys as rows) holds half of two groups per thread and swaps the
// halves with the neighbouring lane (cuda/common/dropout.cuh). 16-bit draws (rather than 32) halve the calls per
// element; 8-bit ones (FlashAttention-2's) would leave the keep rate off by up to 1/256.
// Why seven rounds: the rounds are most of the mask's instructions in the sm90 kernels (two wide multiplies and
// two three-way XORs per round per eight probabilities; about 5 of the mask's 7.5 instructions per probability in
// ncu, bench/results/2026-12-04_h200_session29). Seven is the fewest rounds Philox's authors found Crush-resistant
// (Salmon et al., SC'11: Philox4x32-7 passes TestU01's BigCrush), and FlashAttention-2's dropout uses seven; ten
// (cuRAND's default) adds their safety margin. Measured against ten: the sm90 dropout kernels 3.5-7 % faster
// forward, 1 % backward (same results file).
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace flashattn::detail {

struct PhiloxWords {
  uint32_t w[4];
};

// The 32 x 32 -> 64-bit product as (high, low) words. On the device in 32-bit instructions: written with uint64_t,
// NVVM kept the rounds in 64-bit shifts, masks and multiplies (mul.lo.s64), several times the instructions.
FA_HOST_DEVICE void mul_wide(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  lo = a * b;
#else
  const uint64_t p = uint64_t(a) * b;
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
#endif
}

// Philox4x32 with kRounds rounds (Salmon et al., SC'11; ten is cuRAND's and torch's CUDA generator's count).
// tests/test_cpu_backward.cpp checks it against the authors' known answers for 7 and 10 rounds.
template <int kRounds>
FA_HOST_DEVICE PhiloxWords philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u, kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kRounds; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_wide(kMul0, c0, hi0, lo0);
    mul_wide(kMul1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    k0 += kWeyl0, k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// The rounds of the dropout rule (see the top of this file for why seven).
inline constexpr int kDropoutPhiloxRounds = 7;

// The three words of the Philox call that (seed, offset) decide: key (k0, k1) and the counter's last word c3.
struct PhiloxKey {
  uint32_t k0, k1, c3;
};

struct DropoutRule {
  uint64_t seed = 0, offset = 0;
  // CUDA calls given attn.dropout_rng: (seed, offset) in device memory, read by the kernels in place of the fields
  // above, so that a captured CUDA graph draws a new mask whenever the tensor is refilled (flashattn.h). Never set
  // for host calls: the validation reads a host tensor into the fields.
  const uint64_t* rng = nullptr;
  uint32_t threshold = 0;  // keep when a 16-bit draw is below it: floor((1 - p) * 2^16), at most 2^16 - 1
  float keep_scale = 1.f;  // 1 / (1 - p)
  bool on = false;

  DropoutRule() = default;
  DropoutRule(float p, uint64_t seed_, uint64_t offset_) : seed(seed_), offset(offset_), on(p > 0.f) {
    const double t = (1.0 - double(p)) * 65536.0;
    threshold = t >= 65535.0 ? 65535u : uint32_t(t);
    keep_scale = on ? float(1.0 / (1.0 - double(p))) : 1.f;
  }

  // The group of query i (within its 16-row block: rows i % 8 and i % 8 + 8) and of key j (within its 16-column
  // block: the pair (j % 8) / 2, both halves of the block).
  FA_HOST_DEVICE static uint32_t query_group(int64_t i) { return uint32_t(((i >> 4) << 3) | (i & 7)); }
  FA_HOST_DEVICE static uint32_t key_group(int64_t j) { return uint32_t(((j >> 4) << 2) | ((j >> 1) & 3)); }
  // The call's key words. On the device from rng when given: a volatile load each time (one per fragment walk, an
  // L1 hit), so that the compiler keeps no (seed, offset) registers live across the mainloops; the tensor is not
  // written while a kernel that reads it runs.
  FA_HOST_DEVICE PhiloxKey key() const {
    uint64_t s = seed, o = offset;
#if defined(__CUDA_ARCH__)
    if (rng != nullptr) {
      asm volatile("ld.global.nc.u64 %0, [%1];" : "=l"(s) : "l"(rng));
      asm volatile("ld.global.nc.u64 %0, [%1];" : "=l"(o) : "l"(rng + 1));
    }
#endif
    return {uint32_t(s), uint32_t(s >> 32) ^ uint32_t(o >> 32), uint32_t(o)};
  }
  // The four words of a group of (batch entry b, query head h); bh = b * heads_q + h.
  FA_HOST_DEVICE static PhiloxWords group_words(const PhiloxKey& key, int64_t bh, uint32_t query_grp,
                                                uint32_t key_grp) {
    return philox4x32<kDropoutPhiloxRounds>(key_grp, query_grp, uint32_t(bh), key.c3, key.k0, key.k1);
  }
  // Which of its group's words element (i, j) draws from (its half: j & 1).
  FA_HOST_DEVICE static int word_of(int64_t i, int64_t j) { return int(((i >> 3) & 1) | (((j >> 3) & 1) << 1)); }
  // Whether the high (odd key) / low (even key) half of a word keeps its element, compared in 32 bits: a half h is
  // below the threshold exactly when h * 2^16 is below threshold * 2^16.
  FA_HOST_DEVICE bool keeps_high(uint32_t word) const { return word < (threshold << 16); }
  FA_HOST_DEVICE bool keeps_low(uint32_t word) const { return (word << 16) < (threshold << 16); }
  FA_HOST_DEVICE bool keeps_half(uint32_t word, bool high) const { return high ? keeps_high(word) : keeps_low(word); }
  // The factor of probability (b, h, i, j): 0 (dropped) or 1 / (1 - p); 1 without dropout.
  FA_HOST_DEVICE float factor(int64_t b, int64_t heads_q, int64_t h, int64_t i, int64_t j) const {
    if (!on) return 1.f;
    const PhiloxWords w = group_words(key(), b * heads_q + h, query_group(i), key_group(j));
    return keeps_half(w.w[word_of(i, j)], (j & 1) != 0) ? keep_scale : 0.f;
  }
};

}  // namespace flashattn::detail
